"""Edge features carried in blocks and used by GAT: sampled edges keep their global ids on 1..N ranks, and a
graph whose labels only its edge features tell is learned with them and not without."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from distributed_helpers import partition_dataset, run_ranks


def edge_signal_dataset() -> Any:
    """Every node has a colour (its features: the colour's one-hot plus noise) and a label drawn independently
    of it; its 8 in-neighbours hold 2 of each colour, and the one feature of an edge says (noisily) whether its
    source's colour is the destination's label.  Nothing about a node's own features or its neighbours' mix of
    colours tells its label; attending by the edge feature does."""
    from gnnscale.data.dataset import GraphDataset, csc_from_edges

    rng = np.random.default_rng(0)
    n, classes = 1200, 4
    colours, labels = np.arange(n) % classes, rng.integers(0, classes, n)
    by_colour = [np.flatnonzero(colours == c) for c in range(classes)]
    dst = np.repeat(np.arange(n), 2 * classes)
    src = np.concatenate([rng.choice(by_colour[c], (n, 2)) for c in range(classes)], 1).reshape(-1)
    indptr, indices = csc_from_edges(src, dst, n, dedup=False)
    dst_sorted = np.repeat(np.arange(n), np.diff(indptr))
    flagged = (colours[indices] == labels[dst_sorted]).astype(np.float32)
    edge_features = (flagged + rng.normal(0, 0.2, flagged.shape))[:, None].astype(np.float32)
    features = (np.eye(classes)[colours] + rng.normal(0, 0.3, (n, classes))).astype(np.float32)
    masks = rng.random(n)
    return GraphDataset(name="edge-signal", indptr=indptr, indices=indices, features=features, labels=labels,
                        edge_features=edge_features, train_masks=masks < 0.6, val_masks=(masks >= 0.6) & (masks < 0.8),
                        test_masks=masks >= 0.8, num_classes=classes)


def train(rank: int, parts: str, use_edges: bool) -> float:
    import gnnscale as gs
    from gnnscale.train.trainer import TrainConfig
    from samplers import SamplerConfig

    with gs.init() as world:
        graph = gs.open_graph(parts, world)
        # One layer, no self-loops: a node sees only its neighbours, never its own features.
        model = gs.ModelConfig(model="gat", num_layers=1, heads=4, out_heads=4, attn_dropout=0.0,
                               edge_features=use_edges)
        trainer = gs.Trainer(graph, model_config=model, sampler_config=SamplerConfig(fanouts=[-1]),
                             config=TrainConfig(epochs=20, batch_size=128, lr=0.05, num_workers=0))
        return trainer.fit().test


@pytest.mark.parametrize("ranks", [1, 2])
def test_gat_learns_from_edge_features(tmp_path: Path, ranks: int) -> None:
    parts = partition_dataset(edge_signal_dataset(), tmp_path / "parts", ranks)
    with_edges = run_ranks(train, ranks, str(parts), True, timeout=300.0)
    without = run_ranks(train, ranks, str(parts), False, timeout=300.0)
    # Chance is 0.25: only attention by the edge feature tells the class.
    assert with_edges[0] == with_edges[-1] > 0.8 and without[0] < 0.5, (with_edges, without)


def sample_ids(rank: int, parts: str, topology: str) -> list[Any]:
    import gnnscale as gs
    from gnnscale.sampling import CacheConfig

    with gs.init() as world:
        graph = gs.open_graph(parts, world)
        loader = gs.NodeLoader(graph, graph.train_ids, fanouts=[3, 3], batch_size=64, self_loops=True,
                                              edge_features=True, num_workers=0, cache=CacheConfig(topology=topology))
        batch = next(iter(loader))
        block = batch.blocks[0]
        return [block.src_ids[block.indices].tolist(), block.dst_ids[block.dst_index()].tolist(),
                block.edge_ids.tolist(), block.edge_attr.tolist()]


@pytest.mark.parametrize("topology", ["partitioned", "replicated"])
def test_sampled_edges_carry_their_own_features(tmp_path: Path, topology: str) -> None:
    """Every sampled edge's id names an edge with its endpoints, and its features are that edge's."""
    data = edge_signal_dataset()
    parts = partition_dataset(data, tmp_path / "parts", 2)
    from partition import load_partition

    book = load_partition(parts, 0).book
    src_orig, dst_orig = data.edges()
    pairs = {}
    for rank, (src, dst, ids, attr) in enumerate(run_ranks(sample_ids, 2, str(parts), topology, timeout=240.0)):
        for u, v, edge, row in zip(src, dst, ids, attr):
            if edge < 0:
                assert u == v and row == [0.0]  # an added self-loop: no features
                continue
            pairs[(u, v)] = row
    assert len(pairs) > 50
    features: dict[tuple[int, int], list[float]] = {}  # a repeated edge has a row per copy
    for i, (u, v) in enumerate(zip(src_orig, dst_orig)):
        features.setdefault((int(book.orig2new[u]), int(book.orig2new[v])), []).append(float(data.edge_features[i, 0]))
    for (u, v), row in pairs.items():
        assert min(abs(row[0] - f) for f in features[(u, v)]) < 1e-6, (u, v, row, features[(u, v)])


def test_edge_features_without_them_are_refused() -> None:
    import gnnscale as gs

    rng = np.random.default_rng(0)
    graph = gs.Graph.from_arrays(rng.integers(0, 20, 60), rng.integers(0, 20, 60), features=rng.random((20, 3)),
                                 labels=rng.integers(0, 2, 20), train_mask=np.ones(20, bool),
                                 val_mask=np.ones(20, bool), test_mask=np.ones(20, bool))
    with pytest.raises(ValueError, match="edge_features=True needs a graph with edge features"):
        gs.NodeLoader(graph, fanouts=[2], edge_features=True)
    with pytest.raises(ValueError, match="edge_features=True needs a graph with edge features"):
        gs.LinkLoader(graph, torch.tensor([[0], [1]]), fanouts=[2], edge_features=True)
    with pytest.raises(ValueError, match="edge_features are used by the gat model only"):
        gs.ModelConfig(model="sage", edge_features=True)
    with_edges = gs.Graph.from_arrays(np.array([0, 1, 2, 2]), np.array([1, 2, 0, 2]), features=rng.random((3, 2)),
                                      labels=np.array([0, 1, 0]), train_mask=np.ones(3, bool),
                                      val_mask=np.ones(3, bool), test_mask=np.ones(3, bool),
                                      edge_features=np.array([[1.0], [2.0], [3.0], [9.0]]))
    # The self-loop 2 -> 2 is dropped with its row; each node's in-edge keeps its own.
    assert with_edges.structure.indices.tolist() == [2, 0, 1]
    assert with_edges.edge_features.rows.flatten().tolist() == [3.0, 1.0, 2.0]
    with pytest.raises(ValueError, match=r"edge_features must be \[num_edges, D\] = \[4, D\], got \[3, 1\]"):
        gs.Graph.from_arrays(np.array([0, 1, 2, 2]), np.array([1, 2, 0, 2]), features=rng.random((3, 2)),
                             labels=np.array([0, 1, 0]), train_mask=np.ones(3, bool), val_mask=np.ones(3, bool),
                             test_mask=np.ones(3, bool), edge_features=np.ones((3, 1)))


def endpoint_featured_dataset() -> Any:
    """edge_signal_dataset's graph whose every edge's features are its own endpoints (original ids)."""
    import dataclasses

    data = edge_signal_dataset()
    src, dst = data.edges()
    return dataclasses.replace(data, edge_features=np.stack([src, dst], 1).astype(np.float32))


def link_edge_rows(rank: int, parts: str, topology: str) -> tuple[int, int]:
    """(edges checked, edges whose features are not their endpoints') over a training and a scoring epoch
    of LinkLoaders whose held-out edges were removed from the structure."""
    import gnnscale as gs
    from gnnscale.sampling import CacheConfig

    with gs.init() as world:
        graph = gs.open_graph(parts, world)
        split = gs.split_edges(graph, seed=1)
        task = gs.LinkTask(graph, split, fanouts=[3, 3], batch_size=64, self_loops=True, edge_features=True,
                           num_workers=1, cache=CacheConfig(topology=topology))
        checked = wrong = 0
        for loader in (task.train, task.scorers["test"][0]):
            for batch in loader:
                for block in batch.blocks:
                    real = block.edge_ids >= 0
                    ends = torch.stack([block.src_ids[block.indices], block.src_ids[block.dst_index()]])[:, real]
                    attr = block.edge_attr[real]
                    checked += int(real.sum())
                    wrong += int((graph.to_original(ends).T.float() != attr).any(1).sum())
                    assert (block.edge_attr[~real] == 0).all()  # added self-loops have none
        return checked, wrong


@pytest.mark.parametrize("ranks,topology", [(1, "partitioned"), (2, "partitioned"), (2, "replicated")])
def test_link_loader_edges_keep_their_features_with_held_out_edges_removed(tmp_path: Path, ranks: int,
                                                                            topology: str) -> None:
    parts = partition_dataset(endpoint_featured_dataset(), tmp_path / "parts", ranks)
    results = run_ranks(link_edge_rows, ranks, str(parts), topology, timeout=240.0)
    assert all(checked > 1000 for checked, _ in results), results
    assert all(wrong == 0 for _, wrong in results), results


def test_link_trainer_trains_gat_with_edge_features(tmp_path: Path) -> None:
    """--task link's trainer takes the edge-aware encoder: its edge projection gets gradients."""
    import gnnscale as gs
    from gnnscale.train.link import LinkConfig, LinkTrainer
    from gnnscale.train.trainer import TrainConfig
    from samplers import SamplerConfig

    with gs.init() as world:
        graph = gs.Graph.from_dataset(endpoint_featured_dataset(), world)
        model = gs.ModelConfig(model="gat", num_layers=1, hidden=8, heads=2, out_heads=1, edge_features=True)
        trainer = LinkTrainer(graph, model_config=model, sampler_config=SamplerConfig(fanouts=[4]),
                              config=TrainConfig(epochs=1, batch_size=256, num_workers=0), link=LinkConfig())
        before = {k: v.clone() for k, v in trainer.encoder.state_dict().items() if "edge" in k}
        result = trainer.fit()
        assert before and all(not torch.equal(v, trainer.encoder.state_dict()[k]) for k, v in before.items())
        assert 0 <= result.test <= 1


def test_explicit_edge_ids_must_match_the_edges() -> None:
    from samplers.distributed import LocalGraph

    graph = LocalGraph(np.array([0, 2, 3]), np.array([1, 0, 0]), start=0, edge_ids=np.array([7, 9, 4]))
    src, counts, ids = graph.sample(torch.tensor([0, 1]), -1, False, None, with_edges=True)
    assert ids.tolist() == [7, 9, 4] and src.tolist() == [1, 0, 0]
    with pytest.raises(ValueError, match=r"edge_ids must hold one id per stored edge \(3\), got 2"):
        LocalGraph(np.array([0, 2, 3]), np.array([1, 0, 0]), start=0, edge_ids=np.array([7, 9]))
