"""Distributed sampling and feature fetching against the single-machine reference, on real gloo ranks.

Each partition folder is sampled by one spawned job (start-up of torch on 2 cores is the
dominant cost) whose ranks run every check and return plain arrays in *original* ids;
the tests compare those with :class:`samplers.NeighborSampler` and the feature matrix of
the dataset the folder was written from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor
from scipy import stats

from distributed_helpers import RankFailure, partition_dataset, return_rank_or_fail, return_rank_or_hang, run_ranks
from gnnscale.data.dataset import GraphDataset
from gnnscale.data.loaders import load_dataset
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
from samplers import NeighborSampler, SamplerConfig

# Sampled fanouts of the validity check (input side first, as on the command line).
SAMPLED_FANOUTS = [4, 3]
# Frequency check: draws of one high-degree node owned by rank 1, sampled from rank 0.
HUB_FANOUT, HUB_DRAWS = 8, 300
NUM_RANDOM_SEEDS = 40
NUM_TABLE_IDS = 300
SAMPLER_CONFIGS = {"plain": SamplerConfig(fanouts=[-1, -1]),
                   "self_loops": SamplerConfig(fanouts=[-1, -1], self_loops=True),
                   "gcn": SamplerConfig(fanouts=[-1, -1], gcn_norm=True)}


# ---------------------------------------------------------------------- what every rank runs
def blocks_in_original_ids(batch: Any, book: Any) -> list[dict[str, np.ndarray | None]]:
    """A mini-batch's blocks as numpy arrays, with ``src_ids`` mapped to original ids."""
    return [{"indptr": b.indptr.numpy(), "indices": b.indices.numpy(),
             "src_ids": book.to_original(b.src_ids.numpy()),
             "edge_weight": None if b.edge_weight is None else b.edge_weight.numpy()} for b in batch.blocks]


def halo_in_rounds(graph: Any, halo_ids: torch.Tensor, offsets: torch.Tensor, exchanger: Any,
                   halo: Any) -> tuple[bool, int]:
    """The halo copy fetched in rounds of 256 bytes: whether it equals ``halo`` (one round), and how many
    exchanges it took."""
    import samplers.distributed as sd

    before, saved = exchanger.stats.exchanges, sd.HALO_ROUND_BYTES
    sd.HALO_ROUND_BYTES = 256
    try:
        rounds = sd.fetch_halo(graph, halo_ids, offsets, exchanger, with_edges=True, budget_bytes=float("inf"))
    finally:
        sd.HALO_ROUND_BYTES = saved
    same = all(np.array_equal(getattr(rounds, name), getattr(halo, name))
               for name in ("indptr", "halo_indices", "halo_edge_ids"))
    widths = (halo.halo_indices.dtype.name, halo.halo_edge_ids.dtype.name, halo.indices[:halo.indices.size].dtype.name)
    return same, exchanger.stats.exchanges - before, widths


def sampler_checks(rank: int, part_dir: str, hub: int) -> dict[str, Any]:
    """Rank ``rank``'s side of every check on ``part_dir``; ``hub`` is a new global id owned by rank 1."""
    from types import SimpleNamespace

    from gnnscale.distributed.comm import Exchanger
    from gnnscale.distributed.env import init_runtime, read_env
    from gnnscale.distributed.feature_store import DistTable, edge_source_counts
    from partition.load import load_partition
    from samplers.distributed import LocalGraph, fetch_halo, replicate_structure

    part = load_partition(part_dir, rank)
    runtime = init_runtime(read_env(), timeout=60.0)
    try:
        book, (start, end) = part.book, part.node_range
        exchanger = Exchanger(runtime.sample_group, rank, runtime.world_size)
        offsets = torch.from_numpy(np.asarray(book.offsets))
        edge_start = sum(int(p["num_edges"]) for p in part.manifest["parts"][:rank])
        graph = LocalGraph(np.array(part.indptr), np.array(part.indices), start=start, edge_start=edge_start)
        # As the trainer builds it: owned degrees, the halo's cached, so GCN weights need no extra round.
        degrees = DistTable(graph.degree.to(torch.float32), offsets, exchanger)
        halo_ids, halo_counts = edge_source_counts(part.indices, start, end)
        degrees.fill_cache(halo_ids)
        rng = np.random.default_rng(rank)
        seed_sets = {
            "train": torch.from_numpy(np.flatnonzero(part.train_masks[0]).astype(np.int64) + start),
            # Any ids, owned by any rank: the sampler routes seeds to their owners like frontier nodes.
            "random": torch.from_numpy(rng.choice(book.num_nodes, NUM_RANDOM_SEEDS, replace=False).astype(np.int64)),
        }
        whole = replicate_structure(graph, exchanger)
        halo = fetch_halo(graph, halo_ids, offsets, exchanger, with_edges=True, budget_bytes=float("inf"))
        out: dict[str, Any] = {"halo_edge_ids": halo_edge_check(halo, whole, book),
                               "halo_in_rounds": halo_in_rounds(graph, halo_ids, offsets, exchanger, halo)}
        # Over the budget on one rank: no rank holds a copy (the ranks must agree on which hops exchange).
        out["halo_over_budget"] = fetch_halo(graph, halo_ids, offsets, exchanger, with_edges=False,
                                             budget_bytes=1.0 if rank == 0 else float("inf"))
        ctx = SimpleNamespace(rank=rank, book=book, graph=graph, whole=whole, halo=halo, offsets=offsets,
                              exchanger=exchanger, degrees=degrees, seed_sets=seed_sets, rng=rng)
        full_fanout_checks(ctx, out)
        sampled_checks(ctx, hub, out)
        features = DistTable(torch.from_numpy(np.array(part.features, dtype=np.float32)), offsets, exchanger)
        table_checks(ctx, features, halo_ids, halo_counts, out)
        return out
    finally:
        runtime.close()


def full_fanout_checks(ctx: Any, out: dict[str, Any]) -> None:
    """Full-fanout blocks of every topology and seed set, with the exchanges each sample made."""
    from samplers.distributed import DistNeighborSampler

    out["full"], out["halo_exchanges"] = {}, {}
    graph, offsets, exchanger, degrees = ctx.graph, ctx.offsets, ctx.exchanger, ctx.degrees
    for name, config in SAMPLER_CONFIGS.items():
        samplers = {"partitioned": DistNeighborSampler(graph, offsets, exchanger, config, degrees),
                    "replicated": DistNeighborSampler(ctx.whole, offsets, exchanger, config, replicated=True)}
        for which, seeds in ctx.seed_sets.items():
            # Owned seeds: both hops inside the halo copy, no exchange; any seeds: owners asked beyond it.
            samplers["halo"] = DistNeighborSampler(graph, offsets, exchanger, config, degrees, halo=ctx.halo,
                                                   local_hops=2 if which == "train" else 0)
            for topology, sampler in samplers.items():
                before = exchanger.stats.exchanges
                batch = sampler.sample(seeds, rng=ctx.rng)
                out["halo_exchanges"][name, topology, which] = exchanger.stats.exchanges - before
                out["full"][name, topology, which] = (ctx.book.to_original(seeds.numpy()),
                                                      blocks_in_original_ids(batch, ctx.book))


def sampled_checks(ctx: Any, hub: int, out: dict[str, Any]) -> None:
    """Sampled fanouts on each topology (each owner draws its nodes' neighbours from the caller's generator),
    a hop promised local that is not, and many draws of one remote hub."""
    from samplers.distributed import DistNeighborSampler

    config, train, rank = SamplerConfig(fanouts=SAMPLED_FANOUTS), ctx.seed_sets["train"], ctx.rank
    samplers = {"sampled": DistNeighborSampler(ctx.graph, ctx.offsets, ctx.exchanger, config),
                "sampled_replicated": DistNeighborSampler(ctx.whole, ctx.offsets, ctx.exchanger, config,
                                                          replicated=True),
                "sampled_halo": DistNeighborSampler(ctx.graph, ctx.offsets, ctx.exchanger, config, halo=ctx.halo,
                                                    local_hops=2)}
    for i, (key, sampler) in enumerate(samplers.items()):
        batch = sampler.sample(train, rng=np.random.default_rng(1000 * (i + 1) + rank))
        out[key] = (ctx.book.to_original(train.numpy()), blocks_in_original_ids(batch, ctx.book))
    try:  # a node beyond the halo on a hop promised local: a clear error, not a wrong sample
        samplers["sampled_halo"].sample(ctx.seed_sets["random"], rng=ctx.rng)
        out["beyond_halo_error"] = None
    except RuntimeError as err:
        out["beyond_halo_error"] = str(err)
    hub_draws = []
    for _ in range(HUB_DRAWS):
        # A collective: every rank calls, only rank 0 asks (for a node that rank 1 samples).
        seeds = torch.tensor([hub] if rank == 0 else [], dtype=torch.int64)
        block = samplers["sampled"].sample(seeds, [HUB_FANOUT], rng=ctx.rng).blocks[0]
        if rank == 0:
            hub_draws.append(ctx.book.to_original(block.src_ids[block.indices].numpy()))
    out["hub_draws"] = hub_draws


def table_checks(ctx: Any, features: Any, halo_ids: Tensor, halo_counts: Tensor, out: dict[str, Any]) -> None:
    """Feature table: random ids of the whole graph, repeats included, without then with a cache."""
    book, (start, end) = ctx.book, (ctx.graph.start, ctx.graph.start + ctx.graph.num_owned)
    ids = torch.from_numpy(ctx.rng.integers(0, book.num_nodes, NUM_TABLE_IDS))
    uncached = features.gather(ids)
    stats_uncached = vars(features.stats).copy()
    features.fill_cache_by_counts(halo_ids, halo_counts, max(1, halo_ids.numel() // 2))
    cached = features.gather(ids)
    out["table"] = {"ids": ids.numpy(), "orig_ids": book.to_original(ids.numpy()), "start": start, "end": end,
                    "uncached": uncached.numpy(), "cached": cached.numpy(), "cache_ids": features.cache_ids.numpy(),
                    "stats_uncached": stats_uncached, "stats_cached": vars(features.stats).copy()}
    not_cached = np.setdiff1d(np.setdiff1d(np.arange(book.num_nodes), np.arange(start, end)),
                              features.cache_ids.numpy())
    try:
        features.lookup(torch.from_numpy(not_cached[:1]))
        out["lookup_error"] = None
    except KeyError as err:
        out["lookup_error"] = str(err)


def halo_edge_check(halo: Any, whole: Any, book: Any) -> dict[str, np.ndarray]:
    """Every halo node's copied in-edges as ``(dst, src)`` in original node ids, and the sources that the
    whole structure (partitions concatenated in rank order: global edge order) stores at their edge ids."""
    src, counts, edges = halo.sample(halo.halo_ids, -1, False, None, with_edges=True)
    dst = np.repeat(halo.halo_ids.numpy(), counts.numpy())
    return {"dst": book.to_original(dst), "src": book.to_original(src.numpy()),
            "src_at_edge_id": book.to_original(whole.indices[edges.numpy()])}


# ---------------------------------------------------------------------- jobs, one per folder
@dataclass
class Job:
    """A partition folder, the dataset it came from, and what its ranks returned."""

    name: str
    dataset: GraphDataset
    part_dir: Path
    world_size: int
    hub: int
    """New global id of the highest-degree node of partition 1."""
    hub_orig: int
    results: list[dict[str, Any]]


def synthetic_dataset() -> GraphDataset:
    return generate_synthetic(SyntheticConfig(num_nodes=2000, avg_degree=8, num_classes=4, feat_dim=8, seed=3))


def run_job(name: str, dataset: GraphDataset, part_dir: Path, world_size: int) -> Job:
    from partition.load import load_partition

    partition_dataset(dataset, part_dir, world_size)
    part1 = load_partition(part_dir, 1)
    start = part1.node_range[0]
    hub = start + int(np.argmax(np.diff(np.asarray(part1.indptr))))
    results = run_ranks(sampler_checks, world_size, str(part_dir), hub, timeout=240.0)
    return Job(name, dataset, part_dir, world_size, hub, int(part1.book.to_original(np.array([hub]))[0]), results)


JOBS = ["cora2", "cora4", "synthetic3"]


@pytest.fixture(scope="module", params=JOBS)
def job(request: pytest.FixtureRequest, dataset_dir, tmp_path_factory: pytest.TempPathFactory) -> Job:
    name: str = request.param
    if name.startswith("cora"):
        dataset = load_dataset("cora", dataset_dir("cora"))
    else:
        dataset = synthetic_dataset()
    world_size = int(name[-1])
    return run_job(name, dataset, tmp_path_factory.mktemp("parts") / name, world_size)


@pytest.fixture(scope="module")
def dataset_dir():  # module scope: the job fixture above is module-scoped
    from conftest import shared_dataset_dir

    return shared_dataset_dir


# ---------------------------------------------------------------------- full fanout: exact
def assert_blocks_equal(got: list[dict], want: Any, *, what: str) -> None:
    assert len(got) == len(want.blocks), what
    for layer, (g, w) in enumerate(zip(got, want.blocks)):
        where = f"{what}, block {layer}"
        np.testing.assert_array_equal(g["src_ids"], w.src_ids.numpy(), err_msg=f"{where}: src_ids")
        np.testing.assert_array_equal(g["indptr"], w.indptr.numpy(), err_msg=f"{where}: indptr")
        np.testing.assert_array_equal(g["indices"], w.indices.numpy(), err_msg=f"{where}: indices")
        if w.edge_weight is None:
            assert g["edge_weight"] is None, f"{where}: unexpected edge weights"
        else:
            np.testing.assert_allclose(g["edge_weight"], w.edge_weight.numpy(), rtol=1e-6, atol=1e-7,
                                       err_msg=f"{where}: edge_weight")


@pytest.mark.parametrize("topology", ["partitioned", "replicated", "halo"])
@pytest.mark.parametrize("config", sorted(SAMPLER_CONFIGS))
def test_full_fanout_blocks_equal_the_single_machine_blocks(job: Job, config: str, topology: str) -> None:
    """Partitioned and replicated topologies both give the single machine's blocks, hence each other's."""
    reference = NeighborSampler(job.dataset.indptr, job.dataset.indices, SAMPLER_CONFIGS[config])
    compared_edges = 0
    for rank, result in enumerate(job.results):
        for which in ("train", "random"):
            seeds_orig, blocks = result["full"][config, topology, which]
            want = reference.sample(torch.from_numpy(seeds_orig), rng=np.random.default_rng(0))
            assert_blocks_equal(blocks, want, what=f"{job.name} rank {rank} {which} seeds, {config}, {topology}")
            compared_edges += sum(b.num_edges for b in want.blocks)
    assert compared_edges > job.dataset.num_edges // 10  # the comparison covered a real share of the graph


# ---------------------------------------------------------------------- sampled fanout: distribution
@pytest.mark.parametrize("topology", ["partitioned", "replicated", "halo"])
def test_sampled_blocks_hold_true_neighbours_min_fanout_without_repeats(job: Job, topology: str) -> None:
    ds = job.dataset
    for rank, result in enumerate(job.results):
        seeds_orig, blocks = result[{"partitioned": "sampled", "replicated": "sampled_replicated",
                                     "halo": "sampled_halo"}[topology]]
        assert len(blocks) == len(SAMPLED_FANOUTS)
        np.testing.assert_array_equal(blocks[-1]["src_ids"][:len(seeds_orig)], seeds_orig)
        for block, fanout in zip(blocks, SAMPLED_FANOUTS):
            num_dst = block["indptr"].shape[0] - 1
            dst_orig = block["src_ids"][:num_dst]
            degree = ds.indptr[dst_orig + 1] - ds.indptr[dst_orig]
            np.testing.assert_array_equal(np.diff(block["indptr"]), np.minimum(degree, fanout),
                                          err_msg=f"{job.name} rank {rank}: sampled count != min(fanout, degree)")
            src_orig = block["src_ids"][block["indices"]]
            for i, v in enumerate(dst_orig):
                sampled = src_orig[block["indptr"][i]:block["indptr"][i + 1]]
                true = ds.indices[ds.indptr[v]:ds.indptr[v + 1]]
                assert np.isin(sampled, true).all(), f"{job.name} rank {rank}: {sampled} not all in-neighbours of {v}"
                # Without replacement, a neighbour is drawn at most as often as it is stored.
                values, counts = np.unique(sampled, return_counts=True)
                stored = np.array([(true == u).sum() for u in values])
                assert (counts <= stored).all(), f"{job.name} rank {rank}: node {v} got repeats {sampled}"


def test_owned_seeds_with_the_halo_copy_sample_without_any_exchange(job: Job) -> None:
    """Two hops from owned seeds stay in the owned nodes and their halo: no request; any seeds still ask."""
    for rank, result in enumerate(job.results):
        for config in ("plain", "self_loops"):
            assert result["halo_exchanges"][config, "halo", "train"] == 0, f"{job.name} rank {rank} {config}"
            assert result["halo_exchanges"][config, "partitioned", "train"] == 4, f"{job.name} rank {rank} {config}"
        # GCN weights need the degrees of the second hop's sources, beyond the halo: read from the degree table.
        exchanges = result["halo_exchanges"]
        assert exchanges["gcn", "halo", "train"] < exchanges["gcn", "partitioned", "train"], f"{job.name} rank {rank}"
        assert result["halo_exchanges"]["plain", "halo", "random"] == 4  # two rounds per hop beyond the halo
        assert "neither owned by this rank nor in its halo" in result["beyond_halo_error"]


def test_halo_copy_fetched_in_many_small_rounds_is_the_same_copy(job: Job) -> None:
    for rank, result in enumerate(job.results):
        same, exchanges, widths = result["halo_in_rounds"]
        assert same, f"{job.name} rank {rank}: the copy fetched in rounds differs"
        assert exchanges > 10, f"{job.name} rank {rank}: {exchanges} exchanges, so not many rounds"
        # Sources held as int32 (ids of this graph fit), edge ids as int64, and read back as int64.
        assert widths == ("int32", "int64", "int64"), f"{job.name} rank {rank}: {widths}"


def test_halo_copy_holds_each_halo_nodes_in_edges_with_their_edge_ids(job: Job) -> None:
    ds = job.dataset
    assert all(result["halo_over_budget"] is None for result in job.results)
    for rank, result in enumerate(job.results):
        got = result["halo_edge_ids"]
        assert got["dst"].size > 0, f"{job.name} rank {rank}: an empty halo tests nothing"
        for v in np.unique(got["dst"]):
            mine = got["dst"] == v
            np.testing.assert_array_equal(np.sort(got["src"][mine]), np.sort(ds.indices[ds.indptr[v]:ds.indptr[v + 1]]),
                                          err_msg=f"{job.name} rank {rank}: in-edges of halo node {v}")
        # Edge ids are global: the whole structure holds each copied edge's source at its id.
        np.testing.assert_array_equal(got["src_at_edge_id"], got["src"], err_msg=f"{job.name} rank {rank}: edge ids")


def test_remote_hub_neighbours_are_drawn_uniformly(job: Job) -> None:
    ds = job.dataset
    draws = job.results[0]["hub_draws"]
    assert len(draws) == HUB_DRAWS
    hub = job.hub_orig
    neighbours = ds.indices[ds.indptr[hub]:ds.indptr[hub + 1]]
    assert np.unique(neighbours).size == neighbours.size, "the test assumes a simple graph"
    degree = neighbours.size
    assert degree > 2 * HUB_FANOUT, f"{job.name}: hub {hub} has degree {degree}, too low to test the distribution"
    for draw in draws:
        assert draw.size == HUB_FANOUT and np.unique(draw).size == HUB_FANOUT
        assert np.isin(draw, neighbours).all()
    counts = np.array([(np.concatenate(draws) == u).sum() for u in neighbours])
    # Uniform without replacement: each neighbour is in a draw with probability fanout / degree.
    # Pearson's statistic over-counts a little (draws are not independent within a sample), so
    # the bound is loose; a sampler that favoured the first stored neighbours would fail it by far.
    expected = HUB_DRAWS * HUB_FANOUT / degree
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    p_value = float(stats.chi2.sf(chi2, degree - 1))
    assert p_value > 1e-6, f"{job.name}: neighbour frequencies of hub {hub} are not uniform (chi2 {chi2:.1f}, " \
                           f"dof {degree - 1}, p {p_value:.2g}): {counts.tolist()}"


# ---------------------------------------------------------------------- feature table
def test_gather_with_and_without_cache_equals_the_feature_rows(job: Job) -> None:
    features = job.dataset.features
    for rank, result in enumerate(job.results):
        table = result["table"]
        want = features[table["orig_ids"]]
        np.testing.assert_array_equal(table["uncached"], want, err_msg=f"{job.name} rank {rank}: gather, no cache")
        np.testing.assert_array_equal(table["cached"], want, err_msg=f"{job.name} rank {rank}: gather, cache")
        ids, start, end = table["ids"], table["start"], table["end"]
        owned = (ids >= start) & (ids < end)
        in_cache = ~owned & np.isin(ids, table["cache_ids"])
        assert table["stats_uncached"] == {"local_rows": int(owned.sum()), "cache_hits": 0,
                                           "remote_rows": int((~owned).sum())}
        assert table["stats_cached"] == {"local_rows": int(owned.sum()), "cache_hits": int(in_cache.sum()),
                                         "remote_rows": int((~owned & ~in_cache).sum())}
        assert in_cache.any() and (~owned & ~in_cache).any()  # both paths of the cached gather ran
        assert not np.isin(table["cache_ids"], np.arange(start, end)).any()  # owned rows are never cached


def test_lookup_on_ranks_refuses_uncached_remote_rows(job: Job) -> None:
    for rank, result in enumerate(job.results):
        assert result["lookup_error"] is not None, f"{job.name} rank {rank}: lookup of a remote row did not raise"
        assert f"is neither owned by rank {rank}" in result["lookup_error"]


def test_lookup_serves_owned_and_cached_rows_and_names_a_missing_one() -> None:
    from gnnscale.distributed.comm import Exchanger
    from gnnscale.distributed.feature_store import DistTable

    every = torch.arange(20, dtype=torch.float32).reshape(10, 2)
    # Rank 0 of two owns [0, 5); lookup never communicates, so no process group is needed.
    table = DistTable(every[:5], torch.tensor([0, 5, 10]), Exchanger(None, 0, 2))
    table.cache_ids, table.cache_rows = torch.tensor([6, 8]), every[[6, 8]]
    torch.testing.assert_close(table.lookup(torch.tensor([8, 1, 6, 4])), every[[8, 1, 6, 4]])
    assert (table.stats.local_rows, table.stats.cache_hits) == (2, 2)
    with pytest.raises(KeyError, match=r"global id 7 is neither owned by rank 0 \(\[0, 5\)\) nor cached"):
        table.lookup(torch.tensor([1, 6, 7]))


# ---------------------------------------------------------------------- the harness itself
def test_run_ranks_returns_in_rank_order() -> None:
    assert run_ranks(return_rank_or_fail, 3, -1, timeout=60.0) == [0, 1, 2]


def test_run_ranks_surfaces_a_rank_traceback() -> None:
    with pytest.raises(RankFailure, match=r"rank 1 raised \(exit code 1\):\n(.|\n)*ValueError: planted failure"):
        run_ranks(return_rank_or_fail, 2, 1, timeout=60.0)


def test_run_ranks_kills_a_hung_rank() -> None:
    with pytest.raises(RankFailure, match=r"rank 1 did not finish within 4 s \(a hang\?\): killed; its threads "
                       r"were at:\n(.|\n)*in return_rank_or_hang"):
        run_ranks(return_rank_or_hang, 2, 1, timeout=4.0)


def test_run_ranks_rejects_an_empty_world() -> None:
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        run_ranks(return_rank_or_fail, 0, -1)


def test_collective_tensors_outlive_their_exchanger_until_released() -> None:
    """The tensors of a collective stay referenced after the Exchanger that sent them is freed (a trainer
    gone before the job is left): a gloo thread must never drop the last reference while the process
    group is being destroyed (a deadlock on the GIL); ``release_kept`` lets go after the destroy."""
    import gc
    import weakref

    from gnnscale.distributed import comm

    exchanger = comm.Exchanger(None, 0, 1)
    sent = torch.arange(4)
    exchanger._keep(sent)
    alive = weakref.ref(sent)
    del exchanger, sent
    gc.collect()
    assert alive() is not None
    comm.release_kept()
    gc.collect()
    assert alive() is None


def test_edge_ids_need_a_halo_copy_fetched_with_them() -> None:
    """A sampler asked for edge ids over a halo copy without them is refused at once, naming the fix."""
    from gnnscale.distributed.comm import Exchanger
    from samplers.distributed import DistNeighborSampler, HaloGraph, LocalGraph

    owned = LocalGraph(np.array([0, 1, 2]), np.array([2, 3]), start=0)
    halo = HaloGraph(owned, torch.tensor([2, 3]), np.array([0, 1, 1]), np.array([0]), None)
    with pytest.raises(ValueError, match=r"config.edge_ids needs a halo copy fetched with its edge ids"):
        DistNeighborSampler(owned, torch.tensor([0, 2, 4]), Exchanger(None, 0, 1),
                            SamplerConfig(fanouts=[2], edge_ids=True), halo=halo)
    with pytest.raises(RuntimeError, match=r"fetched without edge ids"):
        halo.sample(torch.tensor([2]), -1, False, None, with_edges=True)
    # Owned and halo rows in one draw: node 2 (halo) has the in-edge 0 -> 2, node 0 (owned) 2 -> 0.
    src, counts = halo.sample(torch.tensor([2, 0]), -1, False, None)
    assert src.tolist() == [0, 2] and counts.tolist() == [1, 1]
