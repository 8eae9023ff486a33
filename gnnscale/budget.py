"""``memory_budget``: what one rank may hold above the interpreter, and the decisions sized to it.

The budget (MiB per rank, ``--memory-budget`` of the training command, ``memory_budget=`` of
:class:`gnnscale.Graph`, :func:`gnnscale.open_graph` and :class:`gnnscale.CacheConfig`) covers the structures
of the memory account (:mod:`gnnscale.memory`).  It is spent in this order, every decision logged with its size:

1. **The partition itself** (owned in-edges, their degrees, labels, split ids, the halo list): it must be in
   memory.  A budget below it is an error that names the minimum.
2. **Owned feature rows** (the graph handle): resident when they fit :data:`FEATURE_SHARE` of what is left,
   else memory-mapped (:mod:`gnnscale.distributed.mapped`) with a hot cache of :data:`HOT_SHARE` of it.
3. **Evaluation's blocks** are reserved (12 bytes per owned in-edge, their ids kept as int32).
4. **The loader's buffer slots**: ``prefetch`` lowered until the slots fit :data:`PIPELINE_SHARE` of what is
   left (a slot's rows are estimated from the fanouts, the average degree and the graph's size: an upper
   estimate).
5. **The topology**: the whole structure is replicated only when it fits :data:`TOPOLOGY_SHARE` of what is
   left (``topology="auto"``); ``replicated`` over the budget is refused by the graph as before.  Partitioned,
   the copy of the halo's in-edges is made when it fits that share, and what it takes comes out of the cache.
6. **The feature cache** (``cache_mb="auto"``, or a number capped to it): what is left.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

log = logging.getLogger("gnnscale.budget")

MIB = 2**20
FEATURE_SHARE = 0.5
"""Owned feature rows stay resident when they need at most this share of the budget left by the partition."""
HOT_SHARE = 0.1
"""A mapped table's hot cache: this share of the budget left by the partition."""
PIPELINE_SHARE = 0.5
"""The loader's buffer slots: at most this share of the budget left after the graph's structures."""
TOPOLOGY_SHARE = 0.5
"""The replicated structure: at most this share of the budget left after the pipeline."""
INFERENCE_EDGE_BYTES = 12
"""Layer-wise inference's kept blocks, bytes per owned in-edge (int32 source positions, global ids and rows)."""
LIMIT_SHARE = 0.6
"""Under a small memory cgroup limit and no ``--memory-budget``, the training command's budget per rank: this
share of the memory the limit leaves at start (:func:`gnnscale.memory.available_bytes`), split among the
machine's ranks.  The rest is for what no budget plans: a step's temporaries, evaluation's halo rows, the
allocator's holes (measured on 4 emulated machines of 1800 MiB: ``scripts/bench_memory_limited.py``)."""


def check_budget(value: Any, name: str = "memory_budget") -> float | None:
    """``value`` as MiB (None: no budget).

    Raises:
        ValueError: not a positive number.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive number of MiB per rank, got {value!r}")
    return float(value)


def partition_bytes(part: Any) -> int:
    """Bytes a rank must hold for its partition: in-edges (int64 offsets and sources), degrees, labels, split
    ids (at most three int64 per owned node), the halo list and its edge counts, edge features."""
    n, edges, halo = int(part.indptr.shape[0] - 1), int(part.indices.shape[0]), int(part.halo_ids.shape[0])
    labels = int(np.prod(part.labels.shape)) * 8
    edge_features = 0 if part.edge_features is None else int(np.prod(part.edge_features.shape)) * 4
    return 8 * (n + 1) + 8 * edges + 8 * n + labels + 3 * 8 * n + 16 * halo + edge_features


@dataclass(kw_only=True)
class GraphBudget:
    """What the graph handle decided under a budget (MiB)."""

    budget_mb: float
    minimum_mb: float
    features_mb: float
    features_mapped: bool
    hot_rows: int
    release_mb: float
    """A mapped table's pages leave the RSS after about this many MiB were read: the share resident features would
    have had, less the hot cache (at least 16)."""
    left_mb: float
    """What the graph leaves to its loaders."""
    decisions: list[str] = field(default_factory=list)


def plan_graph(part: Any, budget_mb: float, rank: int = 0) -> GraphBudget:
    """The graph handle's decisions for partition ``part`` under ``budget_mb`` MiB.

    Raises:
        ValueError: the budget is below what the partition itself needs (the message names the minimum).
    """
    minimum = partition_bytes(part) / MIB
    if budget_mb < minimum:
        need = math.ceil(minimum)
        raise ValueError(f"memory_budget={budget_mb:g} MiB is below the {minimum:.1f} MiB rank {rank}'s partition "
                         f"needs in memory (in-edges, labels, split and halo ids): give at least {need} MiB "
                         f"(--memory-budget {need}), or partition into more parts")
    left = budget_mb - minimum
    row_bytes = int(np.prod(part.features.shape[1:])) * 4
    features = part.features.shape[0] * row_bytes / MIB
    mappable = isinstance(part.features, np.memmap)
    mapped = features > FEATURE_SHARE * left and mappable
    hot_rows = int(min(part.features.shape[0], HOT_SHARE * left * MIB // max(1, row_bytes))) if mapped else 0
    held = hot_rows * row_bytes / MIB if mapped else features
    decisions = [f"partition {minimum:.1f} MiB (the minimum)"]
    if mapped:
        decisions.append(f"owned features {features:.1f} MiB over {FEATURE_SHARE:.0%} of the {left:.1f} MiB left: "
                         f"memory-mapped, hot cache {hot_rows} rows ({held:.1f} MiB)")
    elif features > FEATURE_SHARE * left:
        decisions.append(f"owned features {features:.1f} MiB over {FEATURE_SHARE:.0%} of the {left:.1f} MiB left, "
                         f"but already in memory (not read from a partition folder): resident")
    else:
        decisions.append(f"owned features {features:.1f} MiB: resident")
    release_mb = max(16.0, FEATURE_SHARE * left - held) if mapped else 0.0
    if mapped:
        decisions.append(f"mapped pages released after about {release_mb:.1f} MiB read")
    return GraphBudget(budget_mb=budget_mb, minimum_mb=minimum, features_mb=features, features_mapped=mapped,
                       hot_rows=hot_rows, release_mb=release_mb, left_mb=max(0.0, left - held - release_mb),
                       decisions=decisions)


def inference_blocks_mb(graph: Any) -> float:
    """MiB of layer-wise inference's kept full-neighbour blocks over every owned node (measured: 12.1 bytes per
    in-edge at 1M nodes and 15M edges, 23.7 while they were int64; 12 planned)."""
    return INFERENCE_EDGE_BYTES * graph.structure.indices.size / MIB


def keeps_inference_blocks(graph: Any) -> bool:
    """Whether layer-wise inference keeps its blocks between layers and evaluations: where the graph's memory
    budget leaves room for them; else (no budget, or too little left) it builds them a batch at a time, every
    layer.  Kept, they make a repeated evaluation about a fifth faster and cost 12 bytes an in-edge on top of
    training's peak (1M nodes, 15M edges: 216 MiB of one process's peak, 1.1 s of a 5.2 s evaluation), so a run
    whose memory is not given keeps evaluation's peak near training's: docs/memory.md."""
    return graph.budget is not None and inference_blocks_mb(graph) <= graph.budget.left_mb


def slot_rows(num_nodes: int, num_edges: int, batch_size: int, fanouts: list[int]) -> int:
    """Upper estimate of a batch's input rows: ``batch_size`` seeds, each layer drawing ``min(fanout, average
    degree)`` neighbours per node, distinct draws over ``num_nodes`` (a draw of ``k`` ids keeps about
    ``N (1 - exp(-k / N))``), plus the destinations a grouped gather repeats."""
    degree = num_edges / max(1, num_nodes)
    frontier = float(batch_size)
    for fanout in reversed(fanouts):
        width = degree if fanout < 0 else min(fanout, degree)
        drawn = frontier * (1 + width)
        frontier = num_nodes * (1 - math.exp(-drawn / max(1, num_nodes)))
    return int(min(num_nodes, frontier) + batch_size)


@dataclass(kw_only=True)
class LoaderBudget:
    """What a loader decided under a budget."""

    cache: Any
    """The :class:`~gnnscale.CacheConfig` with ``topology_budget_mb`` and ``cache_mb`` sized."""
    prefetch: int
    decisions: list[str] = field(default_factory=list)


def plan_loader(graph: Any, cache: Any, *, batch_size: int, fanouts: list[int], num_workers: int,
                prefetch: int) -> LoaderBudget:
    """A loader's decisions for ``graph`` under ``cache.memory_budget`` (or the graph's budget)."""
    from samplers.distributed import structure_bytes

    plan = graph.budget or plan_graph(graph.part, cache.memory_budget, graph.world.rank)
    left = plan.left_mb
    evaluation = inference_blocks_mb(graph)
    if keeps_inference_blocks(graph):  # the graph's budget (not the loader's) decides for inference
        left = max(0.0, left - evaluation)
        decisions = [f"evaluation blocks {evaluation:.1f} MiB reserved"]
    elif graph.budget is None:
        decisions = [f"evaluation blocks {evaluation:.1f} MiB: built a batch at a time at every evaluation, not kept "
                     f"(the graph has no memory budget to keep them in)"]
    else:
        decisions = [f"evaluation blocks {evaluation:.1f} MiB over the {left:.1f} MiB left: built a batch at a time "
                     f"at every evaluation, not kept"]
    num_edges = int(graph.part.manifest.get("num_edges", graph.structure.indices.size))
    row_bytes = int(np.prod(graph.features.row_shape)) * graph.features.rows.element_size()
    slot = slot_rows(graph.num_nodes, num_edges, batch_size, fanouts) * (row_bytes + 8) * 1.25 / MIB
    slots = lambda p: p + num_workers + 2 if num_workers else 2  # noqa: E731 - PrefetchLoader's count
    chosen = prefetch
    while chosen > 0 and slots(chosen) * slot > PIPELINE_SHARE * left:
        chosen -= 1
    pipeline = slots(chosen) * slot
    decisions.append(f"pipeline {slots(chosen)} slots of about {slot:.1f} MiB = {pipeline:.1f} MiB (prefetch "
                     f"{chosen}{f', lowered from {prefetch}' if chosen < prefetch else ''})")
    left = max(0.0, left - pipeline)
    whole = structure_bytes(graph.num_nodes, num_edges) / MIB
    topology_mb = min(cache.topology_budget_mb, TOPOLOGY_SHARE * left)
    replicated = graph.world.size > 1 and cache.topology != "partitioned" and whole <= topology_mb
    if graph.world.size > 1:
        decisions.append(f"whole structure {whole:.1f} MiB against {topology_mb:.1f} MiB: "
                         f"{'replicated' if replicated else 'partitioned'} topology")
    if graph.world.size > 1 and not replicated:
        # Its size is known once the owners send the halo's degrees (samplers.distributed.fetch_halo): what it
        # takes comes out of the feature cache's MiB (gnnscale.sampling.fill_feature_cache).
        decisions.append(f"copy of the halo's in-edges if within {topology_mb:.1f} MiB, out of the feature cache's")
    left = max(0.0, left - (whole if replicated else 0.0))
    cache_mb = left if cache.cache_mb == "auto" else min(float(cache.cache_mb), left)
    if graph.world.size > 1:
        decisions.append(f"feature cache {cache_mb:.1f} MiB" + ("" if cache.cache_mb == "auto" or
                         cache_mb == float(cache.cache_mb) else f" (capped from {float(cache.cache_mb):g} MiB)"))
    return LoaderBudget(cache=replace(cache, topology_budget_mb=topology_mb, cache_mb=cache_mb), prefetch=chosen,
                        decisions=decisions)


def log_decisions(rank: int, budget_mb: float, decisions: list[str]) -> None:
    log.info("rank %d memory budget %g MiB: %s", rank, budget_mb, "; ".join(decisions))
