"""``gnnscale.LinkLoader`` and ``LinkTask``: argument checks, determinism, held-out and seed edges kept out of
messages, one process against two gloo ranks, and the example under python and torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from distributed_helpers import partition_dataset, run_ranks
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "link_prediction.py")


def small_dataset():
    return generate_synthetic(SyntheticConfig(num_nodes=400, avg_degree=6, num_classes=3, feat_dim=8, seed=2))


@pytest.fixture(scope="module")
def graph():
    import gnnscale as gs

    world = gs.init()
    yield gs.Graph.from_dataset(small_dataset(), world)
    world.close()


def edge_pairs(batch) -> set[tuple[int, int]]:
    pairs = set()
    for block in batch.blocks:
        pairs.update(zip(block.src_ids[block.indices].tolist(), block.src_ids[block.dst_index()].tolist()))
    return pairs


def test_link_loader_batches_are_deterministic_and_keep_seed_and_held_out_edges_out(graph):
    import gnnscale as gs

    split = gs.split_edges(graph, seed=1)
    held_out = torch.from_numpy(split.held_out("train"))
    banned = set(zip(*held_out.tolist()))
    edges = gs.rank_share(split.train_pos, graph)
    runs = []
    for workers in (0, 2):
        loader = gs.LinkLoader(graph, edges, fanouts=[5, 5], batch_size=64, num_negatives=3, held_out=held_out,
                               negative_sampling="degree", num_workers=workers, seed=4)
        loader.set_epoch(2)
        runs.append([(b.pos.clone(), b.neg.clone(), b.seeds.clone(), edge_pairs(b)) for b in loader])
        assert len(runs[-1]) == len(loader) == -(-edges.shape[1] // 64)
    for (pos, neg, seeds, seen), (pos2, neg2, seeds2, seen2) in zip(*runs):
        assert torch.equal(pos, pos2) and torch.equal(neg, neg2) and torch.equal(seeds, seeds2) and seen == seen2
        assert neg.shape[1] == 3 * pos.shape[1]
        seed_edges = set(zip(*seeds[pos].tolist()))
        assert not seen & banned
        assert not seen & (seed_edges | {(v, u) for u, v in seed_edges})


@pytest.mark.parametrize("kwargs, error, message", [
    ({"graph": "cora"}, TypeError, "graph must be a gnnscale.Graph"),
    ({"edges": torch.zeros(3, 2, dtype=torch.int64)}, ValueError, r"edges must be an integer tensor \[2, k\]"),
    ({"edges": torch.tensor([[0], [400]])}, ValueError, r"edges holds node ids outside \[0, 400\)"),
    ({"held_out": torch.zeros(5)}, ValueError, r"held_out must be an integer tensor"),
    ({"num_negatives": -1}, ValueError, "num_negatives must be an int >= 0"),
    ({"negative_sampling": "hard"}, ValueError, "negative_sampling must be one of uniform, degree, global"),
    ({"exclude": "reverse_id"}, ValueError, "exclude must be one of reverse, self, none"),
    ({"fanouts": [0]}, ValueError, "fanout 0 is invalid"),
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
    ({"edges": torch.zeros(2, 0, dtype=torch.int64)}, ValueError, "there are no seed edges on any rank"),
])
def test_link_loader_argument_errors(graph, kwargs, error, message):
    import gnnscale as gs

    args = {"graph": graph, "edges": torch.tensor([[0, 1], [1, 2]]), "fanouts": [3], **kwargs}
    with pytest.raises(error, match=message):
        gs.LinkLoader(args.pop("graph"), args.pop("edges"), **args)


def test_set_epoch_and_stage_errors(graph):
    import gnnscale as gs

    loader = gs.LinkLoader(graph, torch.tensor([[0, 1], [1, 2]]), fanouts=[3])
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        loader.set_epoch(-1)
    task = gs.LinkTask(graph, gs.split_edges(graph), fanouts=[3], batch_size=64)
    with pytest.raises(ValueError, match="stage must be 'val' or 'test'"):
        task.evaluate(torch.nn.Identity(), gs.DotDecoder(), "train")


# ---------------------------------------------------------------------- one process against two ranks
def rank_test_scores(rank: int, part_dir: str | None) -> dict[str, Any]:
    """Full-neighbour test scores of a fixed GCN on this rank's share of the split, keyed by original pair."""
    import gnnscale as gs

    with gs.init() as world:
        graph = gs.open_graph(part_dir, world) if part_dir else gs.Graph.from_dataset(small_dataset(), world)
        split = gs.split_edges(graph, seed=3)
        task = gs.LinkTask(graph, split, fanouts=[4, 4], batch_size=32, gcn_norm=True)
        torch.manual_seed(0)
        model = gs.GNN(gs.ModelConfig(model="gcn", num_layers=2, hidden=16, dropout=0.0), graph.feature_dim, 8)
        loader, num_pos = task.scorers["test"]
        from gnnscale.link_loader import score_pairs

        scores = score_pairs(loader, model.eval(), gs.DotDecoder())
        pairs = graph.to_original(loader.edges).numpy()
        positive, negative = task.scores(model, gs.DotDecoder(), "test")
        if world.size > 1:
            with pytest.raises(ValueError, match="num_workers=2 needs a world of one"):
                gs.LinkLoader(graph, loader.edges, fanouts=[2], num_workers=2)
        return {"scores": {tuple(p): s for p, s in zip(pairs.T.tolist(), scores.tolist())}, "num_pos": num_pos,
                "all": (np.sort(positive.numpy()), np.sort(negative.numpy())),
                "train": graph.to_original(torch.from_numpy(split.train_pos)).numpy()}


def test_two_ranks_score_every_pair_as_one_process(tmp_path):
    single = run_ranks(rank_test_scores, 1, None, timeout=240.0)[0]
    part_dir = partition_dataset(small_dataset(), tmp_path / "parts", 2)
    ranks = run_ranks(rank_test_scores, 2, str(part_dir), timeout=240.0)
    merged = {**ranks[0]["scores"], **ranks[1]["scores"]}
    assert merged.keys() == single["scores"].keys()
    for pair, score in single["scores"].items():
        assert merged[pair] == pytest.approx(score, rel=1e-4, abs=1e-4), pair
    for rank in ranks:  # every rank holds every score after the gather
        np.testing.assert_allclose(rank["all"][0], single["all"][0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(rank["all"][1], single["all"][1], rtol=1e-4, atol=1e-4)
    # The split is drawn over original ids: the same edges whatever the number of ranks.
    assert set(zip(*ranks[0]["train"].tolist())) == set(zip(*single["train"].tolist()))


# ---------------------------------------------------------------------- the example
def run_example(command: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("ranks", [1, 2])
def test_example_runs_under_python_and_torchrun(ranks):
    if ranks == 1:
        command = [sys.executable, EXAMPLE, "--epochs", "2"]
    else:
        command = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2", EXAMPLE,
                   "--epochs", "2"]
    out = run_example(command)
    last = out.strip().splitlines()[-1]
    assert last.startswith("test ROC-AUC") and "Hits@50" in last, out
    assert float(last.split()[2]) > 0.6, out  # two epochs already beat chance clearly
