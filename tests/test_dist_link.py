"""Seed-edge exclusion and link batches on real gloo ranks over a partition folder, against one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from distributed_helpers import partition_dataset, run_ranks
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
from samplers import NeighborSampler, SamplerConfig
from test_dist_sampler import assert_blocks_equal, blocks_in_original_ids

EDGES_PER_RANK = 24


def link_checks(rank: int, part_dir: str, edges_orig: np.ndarray) -> dict[str, Any]:
    """Rank ``rank`` samples link batches over its share of ``edges_orig`` (original ids) on both topologies."""
    from gnnscale.distributed.comm import Exchanger
    from gnnscale.distributed.env import init_runtime, read_env
    from partition.load import load_partition
    from gnnscale.distributed.feature_store import edge_source_counts
    from samplers.distributed import DistNeighborSampler, LocalGraph, fetch_halo, replicate_structure
    from samplers.link import LinkSampler, NegativeSampler

    part = load_partition(part_dir, rank)
    runtime = init_runtime(read_env(), timeout=60.0)
    try:
        book = part.book
        exchanger = Exchanger(runtime.sample_group, rank, runtime.world_size)
        offsets = torch.from_numpy(np.asarray(book.offsets))
        graph = LocalGraph(np.array(part.indptr), np.array(part.indices), start=part.node_range[0])
        whole = replicate_structure(graph, exchanger)
        mine = edges_orig[:, rank * EDGES_PER_RANK:(rank + 1) * EDGES_PER_RANK]
        edges_new = torch.from_numpy(np.asarray(book.orig2new)[mine])
        out: dict[str, Any] = {}
        start, end = part.node_range
        # With the halo copy: seeds and negatives lie anywhere, so every hop asks owners for what is beyond it.
        halo = fetch_halo(graph, edge_source_counts(part.indices, start, end)[0], offsets, exchanger,
                          with_edges=False, budget_bytes=float("inf"))
        for topology, kwargs, g in (("partitioned", {}, graph), ("replicated", {"replicated": True}, whole),
                                    ("halo", {"halo": halo}, graph)):
            for fanouts in ([-1, -1], [3, 2]):
                nodes = DistNeighborSampler(g, offsets, exchanger, SamplerConfig(fanouts=fanouts), **kwargs)
                sampler = LinkSampler(nodes.sample, edges_new, NegativeSampler(book.num_nodes, 2), exclude="reverse")
                runs = [sampler(torch.arange(EDGES_PER_RANK), rng=np.random.default_rng((rank, 9))) for _ in range(2)]
                out[topology, fanouts[0]] = [{"seeds": book.to_original(b.seeds.numpy()),
                                              "pos": book.to_original(b.seeds[b.pos].numpy()),
                                              "blocks": blocks_in_original_ids(b, book)} for b in runs]
        return out
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    dataset = generate_synthetic(SyntheticConfig(num_nodes=600, avg_degree=6, num_classes=3, feat_dim=4, seed=5))
    part_dir = partition_dataset(dataset, tmp_path_factory.mktemp("parts") / "link2", 2)
    src, dst = dataset.edges()
    rng = np.random.default_rng(0)
    edges = np.stack([src, dst])[:, rng.choice(src.size, 2 * EDGES_PER_RANK, replace=False)]
    return dataset, run_ranks(link_checks, 2, str(part_dir), edges, timeout=240.0)


def edge_set(blocks: list[dict]) -> set[tuple[int, int]]:
    pairs = set()
    for b in blocks:
        dst = np.repeat(np.arange(b["indptr"].size - 1), np.diff(b["indptr"]))
        pairs.update(zip(b["src_ids"][b["indices"]].tolist(), b["src_ids"][dst].tolist()))
    return pairs


@pytest.mark.parametrize("topology", ["partitioned", "replicated", "halo"])
def test_full_fanout_link_blocks_equal_the_single_machine_blocks(job, topology: str) -> None:
    dataset, results = job
    reference = NeighborSampler(dataset.indptr, dataset.indices, SamplerConfig(fanouts=[-1, -1]))
    for rank, result in enumerate(results):
        got = result[topology, -1][0]
        pos = torch.from_numpy(got["pos"])
        exclude = torch.cat([pos, pos.flip(0)], dim=1)
        want = reference.sample(torch.from_numpy(got["seeds"]), rng=None, exclude=exclude)
        assert_blocks_equal(got["blocks"], want, what=f"rank {rank}, {topology}")
        assert not edge_set(got["blocks"]) & set(zip(*exclude.tolist()))


@pytest.mark.parametrize("topology", ["partitioned", "replicated", "halo"])
def test_sampled_link_blocks_exclude_seed_edges_and_repeat(job, topology: str) -> None:
    _, results = job
    for rank, result in enumerate(results):
        first, second = result[topology, 3]
        excluded = set(zip(*first["pos"].tolist())) | set(zip(*first["pos"][::-1].tolist()))
        assert not edge_set(first["blocks"]) & excluded, f"rank {rank}: a seed edge was sampled"
        assert_blocks_equal(second["blocks"], _as_batch(first["blocks"]), what=f"rank {rank} repeat, {topology}")


def _as_batch(blocks: list[dict]) -> Any:
    from gnnscale.batch import Block, MiniBatch

    return MiniBatch(seeds=torch.empty(0, dtype=torch.int64),
                     blocks=[Block(indptr=torch.from_numpy(b["indptr"]), indices=torch.from_numpy(b["indices"]),
                                   src_ids=torch.from_numpy(b["src_ids"]), num_dst=b["indptr"].size - 1)
                             for b in blocks])
