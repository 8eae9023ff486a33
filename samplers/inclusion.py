"""Vertex inclusion probabilities: how likely each node is to be an input of a sampled mini-batch.

SALIENT++ (Kaler et al., MLSys 2023) caches the remote feature rows a rank is most likely to need,
ranked by this probability, computed from the graph and the sampler's fanouts alone.  A frontier
node ``v`` included with probability ``p(v)`` draws each of its ``deg(v)`` in-neighbours with
probability ``min(1, f / deg(v))`` (uniform without replacement, fanout ``f``; ``-1`` = all).
Treating draws of different frontier nodes as independent, a node ``u`` is in the next frontier
unless it was not in this one and no frontier node drew it::

    p_next(u) = 1 - (1 - p(u)) * prod over in-edges u -> v of (1 - p(v) * min(1, f / deg(v)))

(blocks keep their destinations among their sources, hence the ``1 - p(u)`` factor).  Starting from
the seed distribution and applying one step per layer, seeds outward, gives each node's probability
of being among a mini-batch's input nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from samplers.distributed import HaloGraph

_EDGE_BLOCK = 1 << 24  # edges per step: bounded temporary memory on big graphs


def inclusion_probabilities(indptr: np.ndarray, indices: np.ndarray, seed_probability: np.ndarray,
                            fanouts: Sequence[int], *,
                            source_rows: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """float64 [num_nodes]: each node's probability of being an input node of one mini-batch.

    Args:
        indptr, indices: the whole graph's CSC (in-edges of node ``v``: ``indices[indptr[v]:indptr[v+1]]``).
        seed_probability: float64 [num_nodes], each node's probability of being a seed of the batch.
        fanouts: the sampler's fanouts, input side first (as ``SamplerConfig.fanouts``).
        source_rows: maps a slice of ``indices`` to node rows, where ``indices`` holds other ids (a partition's
            global ids, :func:`halo_inclusion`); None: ``indices`` are rows.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    degree = np.diff(indptr)
    p = np.clip(np.asarray(seed_probability, dtype=np.float64), 0.0, 1.0)
    for fanout in reversed(list(fanouts)):
        share = np.ones_like(p) if fanout < 0 else np.minimum(1.0, fanout / np.maximum(degree, 1))
        draw = np.clip(p * share, 0.0, 1.0 - 1e-12)  # P(v draws a given in-neighbour); 1 would make log1p -inf
        log_missed = np.log1p(-p.clip(max=1.0 - 1e-12))
        log_missed += _sum_over_out_edges(indptr, indices, np.log1p(-draw), p.shape[0], source_rows)
        p = -np.expm1(log_missed)
    return p


def _sum_over_out_edges(indptr: np.ndarray, indices: np.ndarray, per_dst: np.ndarray, num_nodes: int,
                        source_rows: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """For every node ``u``, the sum of ``per_dst[v]`` over its out-edges ``u -> v`` (in-edges of ``v``)."""
    total = np.zeros(num_nodes, dtype=np.float64)
    degree = np.diff(indptr)
    lo = 0
    while lo < num_nodes:  # destination ranges of about _EDGE_BLOCK edges: bounded temporary memory
        hi = int(np.searchsorted(indptr, indptr[lo] + _EDGE_BLOCK, side="right"))
        hi = min(max(hi - 1, lo + 1), num_nodes)
        sources = np.asarray(indices[indptr[lo]:indptr[hi]])
        if source_rows is not None:
            sources = source_rows(sources)
        total += np.bincount(sources, weights=np.repeat(per_dst[lo:hi], degree[lo:hi]), minlength=num_nodes)
        lo = hi
    return total


def halo_inclusion(halo: HaloGraph, seed_probability: np.ndarray, fanouts: Sequence[int]) -> tuple[np.ndarray,
                                                                                                 np.ndarray]:
    """``(ids, p)``: every non-owned node a batch of owned seeds can reach within two hops (ascending ids), with
    its inclusion probability, from a partition's owned in-edges and its copy of the halo's (no whole-graph
    structure).

    Exact for one or two layers (the frontiers of both hops lie in the owned nodes and their halo); for more,
    the nodes beyond the second hop are missing (their frontier's in-edges are not held).

    Args:
        halo: the rank's :class:`samplers.distributed.HaloGraph`.
        seed_probability: float64 [num_owned] each owned node's probability of being a seed of one batch.
        fanouts: the sampler's fanouts, input side first.
    """
    import torch

    owned = halo.owned
    sources = np.unique(halo.halo_indices).astype(np.int64)  # unique first: the copy's sources may be int32
    beyond = sources[~halo.known(torch.from_numpy(sources))[1].numpy()]
    known_rows = owned.num_owned + halo.halo_ids.numel()

    def rows(ids: np.ndarray) -> np.ndarray:
        local, known = halo.known(torch.from_numpy(ids))
        out = local.numpy().copy()
        out[~known.numpy()] = known_rows + np.searchsorted(beyond, ids[~known.numpy()])
        return out

    indptr = np.concatenate([halo.indptr, np.full(beyond.size, halo.indptr[-1], dtype=np.int64)])
    p0 = np.zeros(known_rows + beyond.size, dtype=np.float64)
    p0[:owned.num_owned] = seed_probability
    p = inclusion_probabilities(indptr, halo.indices, p0, fanouts, source_rows=rows)[owned.num_owned:]
    ids = np.concatenate([halo.halo_ids.numpy(), beyond])
    reached = np.flatnonzero(p > 0)
    order = np.argsort(ids[reached])
    return ids[reached][order], p[reached][order]
