"""What every loader of a graph sets up before its first batch: the structure it samples from (replicated or
partitioned), the neighbour sampler, and which remote feature rows each rank caches.

Shared by :class:`gnnscale.NodeLoader` and the link loader, so that a graph's loaders decide alike.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from gnnscale.budget import LoaderBudget, check_budget, log_decisions, plan_loader
from gnnscale.distributed import wire
from gnnscale.distributed.feature_store import DistTable, auto_cache_mb, cache_rows_for
from gnnscale.graph import Graph
from gnnscale.pipeline import PrefetchLoader, split_batches
from samplers.distributed import DistNeighborSampler, LocalGraph
from samplers.inclusion import halo_inclusion, inclusion_probabilities
from samplers.neighbor import SamplerConfig

log = logging.getLogger("gnnscale.sampling")

CACHE_POLICIES = ("auto", "degree", "presample", "vip")


@dataclass(kw_only=True)
class CacheConfig:
    """Which remote feature rows each rank keeps, and how remote rows travel (more than one rank only)."""

    cache_mb: float | str = "auto"
    """MiB of remote feature rows each rank caches (0 disables the cache), or ``auto``: every row the policy
    ranks (with vip: every remote row a batch can reach) while they fit a quarter of the memory available
    at start, shared among the machine's ranks (:func:`~gnnscale.distributed.feature_store.auto_cache_mb`)."""
    cache_policy: str = "auto"
    """``degree`` (most frequent sources of owned nodes' in-edges), ``presample`` (most requested
    while sampling ``presample_batches`` mini-batches), ``vip`` (highest probability of being a batch's
    input, SALIENT++'s; needs the replicated topology, or the partitioned one's halo copy with seeds that are
    owned nodes and at most two layers) or ``auto`` (vip where it can be ranked, else degree)."""
    presample_batches: int = 8
    """Mini-batches sampled to count requests with the ``presample`` policy."""
    wire_dtype: str = "float32"
    """How feature rows (cache fill included) and evaluation's halo embeddings cross the wire: ``float32``
    exactly, or ``float16``/``bfloat16``/``int8`` within the bounds of :mod:`gnnscale.distributed.wire`.
    GCN degrees always travel exactly."""
    topology: str = "auto"
    """``replicated``: every rank holds the whole graph structure and samples without requests (only
    feature rows move); ``partitioned``: each rank holds its own in-edges and asks owners for the rest;
    ``auto``: replicated when the whole structure fits ``topology_budget_mb``.  A partitioned rank also holds
    a copy of its halo's in-edges where it fits ``topology_budget_mb``: hops within the halo send no request."""
    topology_budget_mb: float = 1024.0
    """MiB each rank may spend on the whole graph structure (int64 offsets and sources)."""
    memory_budget: float | None = None
    """MiB each rank may hold above the interpreter (:mod:`gnnscale.budget`): the topology, the cache and the
    loader's buffer slots are sized to it (each decision logged); None: no budget."""

    def __post_init__(self) -> None:
        wire.check_wire_dtype(self.wire_dtype)
        check_budget(self.memory_budget)
        if self.topology not in ("auto", "partitioned", "replicated"):
            raise ValueError(f"topology must be auto, partitioned or replicated, got {self.topology!r}")
        if not self.topology_budget_mb >= 0:
            raise ValueError(f"topology_budget_mb must be >= 0, got {self.topology_budget_mb}")
        if isinstance(self.cache_mb, str) and self.cache_mb != "auto":
            raise ValueError(f"cache_mb must be a number of MiB or auto, got {self.cache_mb!r}")
        if not isinstance(self.cache_mb, str) and not self.cache_mb >= 0:
            raise ValueError(f"cache_mb must be >= 0, got {self.cache_mb}")
        if self.cache_policy not in CACHE_POLICIES:
            raise ValueError(f"cache_policy must be one of {', '.join(CACHE_POLICIES)}, got {self.cache_policy!r}")
        if self.presample_batches < 0:
            raise ValueError(f"presample_batches must be >= 0, got {self.presample_batches}")


def budgeted(graph: Graph, cache: CacheConfig, *, batch_size: int, fanouts: list[int], num_workers: int,
             prefetch: int) -> LoaderBudget:
    """``cache`` and ``prefetch`` sized to the memory budget (the graph's, else ``cache.memory_budget``), each
    decision logged; as they are without a budget."""
    if graph.budget is None and cache.memory_budget is None:
        return LoaderBudget(cache=cache, prefetch=prefetch)
    plan = plan_loader(graph, cache, batch_size=batch_size, fanouts=fanouts, num_workers=num_workers,
                       prefetch=prefetch)
    log_decisions(graph.world.rank, graph.budget.budget_mb if graph.budget else cache.memory_budget, plan.decisions)
    return plan


def make_sampler(graph: Graph, config: SamplerConfig, cache: CacheConfig, *,
                 owned_seeds: bool = False) -> DistNeighborSampler:
    """The neighbour sampler of ``graph`` over the topology ``cache`` asks for (a collective on N ranks).

    A partitioned sampler gets a copy of the halo's in-edges where it fits ``cache.topology_budget_mb``; with
    ``owned_seeds`` (every rank's seeds are its own nodes) its first hops then make no exchange."""
    structure, replicated = graph.sampling_structure(cache.topology, cache.topology_budget_mb)
    degrees = graph.degree_table() if config.gcn_norm and not replicated else None
    halo = None if replicated else graph.halo_structure(with_edges=config.edge_ids,
                                                        budget_mb=cache.topology_budget_mb)
    local_hops = (2 if halo is not None else 1) if owned_seeds else 0
    return DistNeighborSampler(structure, graph.offsets, graph.world.exchanger, config, degrees,
                               replicated=replicated, halo=halo, local_hops=local_hops)


@dataclass(kw_only=True)
class CachePlan:
    """What a rank's batches will ask for: its seeds, cut into ``steps`` batches per epoch, sampled with
    ``seed``; ``seed_probability`` (or None: ``1 / steps`` per seed) is each node's chance of being a
    seed of one of this rank's batches."""

    seeds: Tensor
    steps: int
    batch_size: int
    seed: int
    seed_probability: np.ndarray | None = None


def fill_feature_cache(graph: Graph, sampler: DistNeighborSampler, cache: CacheConfig, plan: CachePlan) -> str:
    """Fill ``graph.features``' cache of remote rows by ``cache``'s policy; returns what was done, for the log.
    A collective; nothing happens in a world of one."""
    table, world = graph.features, graph.world
    if world.size == 1:
        return "no cache (a world of one)"
    # 4 bytes per node of the graph (capped by DistTable.WHERE_MAP_BYTES; the sampler's compaction table is
    # 8): a third of the search-and-sort gather's time on either topology.
    table.use_id_map = True
    auto = cache.cache_mb == "auto"
    budget_mb = auto_cache_mb(world.runtime.env.local_world_size) if auto else float(cache.cache_mb)
    copy_mb = 0.0
    if sampler.halo is not None and (graph.budget is not None or cache.memory_budget is not None):
        copy_mb = sampler.halo.nbytes / 2**20  # the budget's cache is what was left: the halo copy comes out of it
        budget_mb = max(0.0, budget_mb - copy_mb)
    rows = cache_rows_for(budget_mb, table.row_shape, table.rows.dtype)
    policy = cache.cache_policy if cache.cache_policy != "auto" else "vip" if vip_reach_known(sampler) else "degree"
    candidates, counts = graph.halo()
    if policy == "presample" and rows:
        candidates, counts = _presample_counts(graph, sampler, plan, cache.presample_batches)
    elif policy == "vip" and rows:
        candidates, counts = _inclusion_scores(graph, sampler, plan)
    table.fill_cache_by_counts(candidates, counts, min(rows, candidates.numel()))
    # vip's candidates are every node a batch of this rank can reach: cached whole on every rank, the batches
    # need no exchange (and the ranks no lockstep but the gradient sum).
    whole = policy == "vip" and rows >= candidates.numel()
    table.cache_complete = bool(world.exchanger.all_reduce(torch.tensor([int(whole)]), op=dist.ReduceOp.MIN)[0])
    return (f"feature cache {table.cache_ids.numel()} rows ({table.cache_bytes / 2**20:.1f} MiB of "
            f"{budget_mb:.0f} MiB{' auto' if auto else ''}"
            f"{f' after the halo copy {copy_mb:.2f} MiB' if copy_mb else ''}, {policy}"
            f"{', every reachable remote row: batches make no exchange' if table.cache_complete else ''})")


def vip_reach_known(sampler: DistNeighborSampler) -> bool:
    """Whether this rank knows every node its batches can reach (what vip ranks): with the whole structure, or
    with a copy of the halo's in-edges when its seeds are owned nodes and the model has one or two layers."""
    return sampler.replicated or (sampler.halo is not None and sampler.local_hops >= 2
                                  and len(sampler.config.fanouts) <= 2)


def _inclusion_scores(graph: Graph, sampler: DistNeighborSampler, plan: CachePlan) -> tuple[Tensor, Tensor]:
    """Non-owned nodes with their probability of being an input of one of this rank's mini-batches
    (SALIENT++'s vertex inclusion probability, :mod:`samplers.inclusion`), from the whole structure or from
    the owned and halo in-edges (:func:`vip_reach_known`)."""
    if not vip_reach_known(sampler):
        raise ValueError("cache_policy='vip' needs every node a batch can reach: the whole graph structure "
                         "(topology='replicated', or auto within topology_budget_mb), or a copy of the halo's "
                         "in-edges with owned seeds and at most two layers; or use another cache_policy")
    if not sampler.replicated:
        probability = np.zeros(graph.num_owned, dtype=np.float64)
        probability[plan.seeds.numpy() - graph.start] = 1.0 / plan.steps
        ids, p = halo_inclusion(sampler.halo, probability, sampler.config.fanouts)
        return torch.from_numpy(ids), torch.from_numpy(p)
    whole: LocalGraph = sampler.graph
    probability = plan.seed_probability
    if probability is None:
        probability = np.zeros(whole.num_owned, dtype=np.float64)
        probability[plan.seeds.numpy()] = 1.0 / plan.steps  # each own seed: one step per epoch
    p = inclusion_probabilities(whole.indptr, whole.indices, probability, sampler.config.fanouts)
    p[graph.start:graph.end] = 0.0
    candidates = np.flatnonzero(p > 0)
    return torch.from_numpy(candidates), torch.from_numpy(p[candidates])


def _presample_counts(graph: Graph, sampler: DistNeighborSampler, plan: CachePlan,
                      num_batches: int) -> tuple[Tensor, Tensor]:
    """Non-owned input nodes of the first epoch's first few batches, with how often each was needed."""
    batches = split_batches(plan.seeds, plan.batch_size, False, plan.steps)
    needed = []
    for step in range(min(num_batches, len(batches))):
        rng = np.random.default_rng((plan.seed, 0, step, graph.world.rank))
        ids = sampler.sample(batches[step], rng=rng).input_ids
        needed.append(ids[(ids < graph.start) | (ids >= graph.end)])
    if not needed:
        return plan.seeds[:0], plan.seeds[:0]
    return torch.unique(torch.cat(needed), return_counts=True)


def agreed_steps(graph: Graph, num_seeds: int, batch_size: int, what: str = "seeds") -> tuple[int, Tensor]:
    """Batches per epoch that every rank takes (the rank with the most seeds sets it), and the number of seeds
    of each step summed over ranks (float32 [steps]).  A collective.

    Raises:
        ValueError: no rank has a seed, or a rank has fewer seeds than steps.
    """
    counts = graph.world.exchanger.all_gather_counts(num_seeds)
    if sum(counts) == 0:
        raise ValueError(f"there are no {what} on any rank, so there is nothing to iterate over; give a non-empty "
                         f"set")
    steps = None if graph.world.size == 1 else max(-(-n // batch_size) for n in counts)
    short = [r for r, n in enumerate(counts) if steps is not None and n < steps]
    if short:
        raise ValueError(f"rank {short[0]} has {counts[short[0]]} {what} but every rank takes {steps} steps per "
                         f"epoch; give every rank at least {steps} (re-partition balancing training nodes), or "
                         f"raise batch_size")
    sizes = [[len(b) for b in split_batches(torch.arange(n), batch_size, False, steps)] for n in counts]
    return len(sizes[0]), torch.tensor(np.sum(sizes, axis=0), dtype=torch.float32)


class EpochPasses:
    """What the node and link loaders share of their passes: ``_loader`` (a :class:`PrefetchLoader`), ``steps``
    and ``sampler``, set by the loader."""

    _loader: "PrefetchLoader"
    steps: int
    sampler: DistNeighborSampler

    @property
    def replicated(self) -> bool:
        """The sampler draws from the whole graph structure held by this rank."""
        return self.sampler.replicated

    @property
    def stats(self):
        """Where the last epoch's time went (:class:`gnnscale.pipeline.PassStats`)."""
        return self._loader.stats

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter(loader)`` epoch ``epoch`` (its order and sampling); any epoch can be replayed."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._loader.epoch = epoch

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        return self.steps
