"""Assign every node to a partition: multi-constraint METIS (through pymetis), KaMinPar, or seeded random.

METIS wants an undirected graph: a symmetric CSR adjacency without self loops.  Our CSC
(in-edges grouped by destination) of a symmetric graph *is* that CSR, so for the usual
undirected dataset the arrays are handed to METIS as they are, without a copy (pymetis
reads int64 buffers in place when METIS' ``idx_t`` is 64-bit, as in the wheel installed
here; int32 input would be converted into a new int64 copy, so it would not save memory).
Only a directed graph, or one with self loops, is symmetrised into a new CSR first.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np

from gnnscale.data.dataset import GraphDataset, csc_from_edges
from gnnscale.data.pages import release_rows
from partition.config import PartitionConfig
from partition.rebalance import rebalance
from partition.segments import node_chunks

log = logging.getLogger("partition")

def assign_parts(dataset: GraphDataset, config: PartitionConfig) -> tuple[np.ndarray, dict]:
    """Partition id of every node.

    Returns:
        ``(parts, info)``: int64 [num_nodes] with values in ``[0, num_parts)``, and facts for the
        manifest (method, constraints actually used, METIS options and its own cut count).
    """
    if config.num_parts == 1:
        return np.zeros(dataset.num_nodes, dtype=np.int64), {"method": config.method, "balance": []}
    if config.method == "random":
        if config.balance:
            log.info("--method random balances node counts exactly; --balance %s is not used",
                     ",".join(config.balance))
        return random_parts(dataset.num_nodes, config.num_parts, config.seed, _shares(config)), \
            {"method": "random", "balance": []}
    return metis_parts(dataset, config)  # METIS or KaMinPar


def random_parts(num_nodes: int, num_parts: int, seed: int, shares: np.ndarray | None = None) -> np.ndarray:
    """int64 [num_nodes]: a random permutation dealt into ``num_parts`` blocks whose sizes differ by at most one,
    or, given ``shares`` (float64 [num_parts], summing to 1), are ``round(cumsum(shares) * num_nodes)`` apart."""
    parts = np.empty(num_nodes, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(num_nodes)
    if shares is None:
        parts[order] = np.arange(num_nodes, dtype=np.int64) * num_parts // num_nodes
    else:
        ends = np.rint(np.cumsum(shares[:-1]) * num_nodes).astype(np.int64)
        parts[order] = np.searchsorted(ends, np.arange(num_nodes, dtype=np.int64), side="right")
    return parts


def metis_parts(dataset: GraphDataset, config: PartitionConfig) -> tuple[np.ndarray, dict]:
    """Partition ``dataset`` with ``config.method`` (METIS or KaMinPar) through :func:`partition_csr`: the
    symmetrised graph, one vertex-weight column per ``--balance`` constraint."""
    xadj, adjncy = metis_adjacency(dataset.indptr, dataset.indices)
    weights, used = vertex_weights(dataset, config.balance, config.split)
    return partition_csr(xadj, adjncy, weights, used, config)


def partition_csr(xadj: np.ndarray, adjncy: np.ndarray, weights: np.ndarray, used: tuple[str, ...],
                  config: PartitionConfig, scratch_dir: str | Path | None = None) -> tuple[np.ndarray, dict]:
    """The seam every graph partitioner goes through: k-way partition a symmetric CSR without self loops
    with ``config.method`` (``"metis"`` or ``"kaminpar"``), then (``config.rebalance``)
    :func:`~partition.rebalance.rebalance` where the partitioner misses the tolerance ``1 + ufactor/1000``;
    with ``config.part_weights`` every constraint's tolerance is relative to each partition's share.

    The arrays may be memory-mapped (an on-disk CSR): they are read, never written.

    Args:
        xadj, adjncy: int64 symmetric CSR adjacency without self loops (:func:`metis_adjacency`).
        weights: int64 [N, ncon] vertex weights, one column per constraint in ``used``.
        scratch_dir: where KaMinPar's graph file is written (and removed); None: the system's temporary folder.

    Returns:
        ``(parts, info)``: int64 [N], and the facts for the manifest (method, options, the partitioner's
        own cut and balance, nodes moved by the rebalance pass).
    """
    shares = _shares(config)
    if config.method == "kaminpar":
        from partition.kaminpar_parts import kaminpar_parts  # noqa: PLC0415 - an optional dependency

        parts, info = kaminpar_parts(xadj, adjncy, weights, config, shares, scratch_dir)
    else:
        parts, info = _pymetis_parts(xadj, adjncy, weights, config, shares)
    own_balance = dict(zip(used, np.round(max_over_mean(parts, weights, config.num_parts, shares), 4).tolist()))
    parts, moved = _rebalance_if_needed(parts, weights, xadj, adjncy, config, shares, own_balance)
    return parts, {"method": config.method, "balance": list(used), "split": config.split, **info,
                   f"{config.method}_balance": own_balance, "rebalanced_nodes": moved}


def _pymetis_parts(xadj: np.ndarray, adjncy: np.ndarray, weights: np.ndarray, config: PartitionConfig,
                   shares: np.ndarray | None) -> tuple[np.ndarray, dict]:
    """METIS k-way (pymetis) with one vertex-weight column per constraint; its options and cut for the manifest."""
    import pymetis  # noqa: PLC0415 - only this method needs it

    options = pymetis.Options(seed=config.seed, ufactor=config.ufactor, niter=config.niter)
    # k-way rather than pymetis' default for K <= 8 (recursive bisection): on the 1M-node
    # benchmark graph k-way is about a quarter faster and cuts 13.8% of edges instead of 14.8%.
    if shares is None:
        result = pymetis.part_graph(config.num_parts, pymetis.CSRAdjacency(xadj, adjncy), vweights=weights.ravel(),
                                    recursive=False, options=options)
    else:
        # pymetis (2025.2.2) calls METIS with ncon = 1 whatever vweights holds, and refuses a tpwgts of
        # K x ncon entries: METIS gets one column, the constraints summed at equal totals, and K target
        # shares of it; rebalance() then brings every constraint to within the tolerance of its share.
        result = pymetis.part_graph(config.num_parts, pymetis.CSRAdjacency(xadj, adjncy),
                                    vweights=combined_weights(weights), tpwgts=shares.tolist(), recursive=False,
                                    options=options)
    parts = np.asarray(result.vertex_part, dtype=np.int64)
    return parts, {"metis_options": {"ufactor": config.ufactor, "niter": config.niter, "seed": config.seed,
                                     "objective": "edge cut", "scheme": "k-way"},
                   "metis_cut_undirected_edges": int(result.edge_cuts)}


def _rebalance_if_needed(parts: np.ndarray, weights: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray,
                         config: PartitionConfig, shares: np.ndarray | None,
                         own_balance: dict[str, float]) -> tuple[np.ndarray, int]:
    """:func:`~partition.rebalance.rebalance` where the partitioner left a constraint outside its band; logs it."""
    tolerance = 1 + config.ufactor / 1000
    # Weighted shares are kept from below too: a partition short of its share is a fast rank left idle.
    floor = 0.0 if shares is None else 2 - tolerance
    below = shares is not None and share_ratios(parts, weights, config.num_parts, shares).min() < floor
    if not (config.rebalance and (max(own_balance.values()) > tolerance or below)):
        return parts, 0
    parts, moved = rebalance(parts, weights, xadj, adjncy, config.num_parts, tolerance, shares=shares, floor=floor)
    reached = dict(zip(own_balance, np.round(max_over_mean(parts, weights, config.num_parts, shares), 4).tolist()))
    name = "METIS" if config.method == "metis" else "KaMinPar"
    if shares is None:
        log.info("%s left balance %s, above its tolerance %.3f: moved %d nodes to reach %s", name, own_balance,
                 tolerance, moved, reached)
    else:
        log.info("%s left max achieved/requested share %s, outside [%.3f, %.3f]: moved %d nodes to reach %s", name,
                 own_balance, floor, tolerance, moved, reached)
    return parts, moved


def max_over_mean(parts: np.ndarray, weights: np.ndarray, num_parts: int,
                  shares: np.ndarray | None = None) -> np.ndarray:
    """float64 [ncon]: for each column of ``weights`` (int64 [N, ncon]), the largest partition total
    over the mean partition total, partitions given by ``parts`` (int64 [N]); given ``shares``
    (float64 [num_parts]), the largest ratio of a partition's total to its target ``share * sum``."""
    if shares is not None:
        return share_ratios(parts, weights, num_parts, shares).max(axis=1)
    totals = np.stack([np.bincount(parts, weights=weights[:, c], minlength=num_parts)
                       for c in range(weights.shape[1])])
    return totals.max(axis=1) / np.maximum(totals.mean(axis=1), 1e-300)


def share_ratios(parts: np.ndarray, weights: np.ndarray, num_parts: int, shares: np.ndarray) -> np.ndarray:
    """float64 [ncon, num_parts]: each partition's total of each column of ``weights`` (int64 [N, ncon]) over
    its target, ``shares[p]`` times the column's sum."""
    totals = np.stack([np.bincount(parts, weights=weights[:, c], minlength=num_parts)
                       for c in range(weights.shape[1])])
    return totals / np.maximum(shares[None, :] * totals.sum(axis=1, keepdims=True), 1e-300)


def combined_weights(weights: np.ndarray) -> np.ndarray:
    """int64 [N]: the columns of ``weights`` (int64 [N, ncon], none all zero), each scaled to a mean of 100
    per node, summed and rounded: one METIS constraint in which every column counts alike."""
    combined = np.zeros(weights.shape[0], dtype=np.float64)
    for c in range(weights.shape[1]):
        combined += weights[:, c] * (100 * weights.shape[0] / weights[:, c].sum())
    return np.rint(combined).astype(np.int64)


def _shares(config: PartitionConfig) -> np.ndarray | None:
    return None if config.part_weights is None else np.asarray(config.part_weights, dtype=np.float64)


def vertex_weights(dataset: GraphDataset, balance: tuple[str, ...], split: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """The METIS vertex weights: int64 [num_nodes, ncon], one column per constraint.

    A constraint whose weights are all zero (``edges`` on a graph without edges) cannot be
    balanced and would make METIS divide by zero; it is dropped with a warning.

    Returns:
        ``(weights, constraints used)``.
    """
    columns, used = [], []
    for name in balance:
        if name == "nodes":
            column = np.ones(dataset.num_nodes, dtype=np.int64)
        elif name == "train":
            column = dataset.split(split)[0].astype(np.int64)
        else:
            column = dataset.in_degrees()
        if not column.any():
            warnings.warn(f"balance constraint {name!r} has no effect: every node's weight is 0 on {dataset.name}",
                          stacklevel=3)
            continue
        columns.append(column)
        used.append(name)
    if not columns:
        columns, used = [np.ones(dataset.num_nodes, dtype=np.int64)], ["nodes"]
    return np.stack(columns, axis=1), tuple(used)


def metis_adjacency(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric CSR ``(xadj, adjncy)`` without self loops, both int64: the input itself when it is one.

    Args:
        indptr: int64 [N + 1] CSC offsets.
        indices: int64 [E] sources of each destination's in-edges.
    """
    if is_symmetric_without_loops(indptr, indices):
        return indptr, indices
    num_nodes = indptr.shape[0] - 1
    log.info("the graph is directed or has self loops: symmetrising a copy for METIS")
    dst = np.repeat(np.arange(num_nodes, dtype=np.int64), np.diff(indptr))
    return csc_from_edges(indices, dst, num_nodes, symmetrize=True, remove_self_loops=True, dedup=True)


def is_symmetric_without_loops(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Whether every edge ``u -> v`` has its reverse, with no self loops and no repeated edge.

    Exact for loops and repeats; symmetry compares an order-independent hash of the edge set,
    ``sum(splitmix(v * N + u))`` modulo 2**64, with that of the reversed edges (two edge sets
    collide with probability about 2**-64): no sort and no per-edge array, unlike a transpose.
    Sources must ascend within each destination, as every loader stores them; unsorted ones
    answer ``False`` and the caller symmetrises a copy, which is still correct.

    Args:
        indptr: int64 [N + 1] CSC offsets.
        indices: int64 [E] sources of each destination's in-edges.
    """
    num_nodes = indptr.shape[0] - 1
    degrees = np.diff(indptr)
    if not np.array_equal(out_degrees(indices, num_nodes), degrees):
        return False  # some node's out-degree differs from its in-degree
    forward = reverse = 0  # Python ints reduced modulo 2**64: numpy scalars warn when they wrap
    previous = -1
    # Cache-sized chunks, hashed in place: this pass costs about as much as reading the edges twice.
    for lo, hi in node_chunks(indptr, max_edges=1 << 20):
        dst = np.repeat(np.arange(lo, hi, dtype=np.int64), degrees[lo:hi])
        src = np.array(indices[indptr[lo]:indptr[hi]])
        release_rows(indices, int(indptr[lo]), int(indptr[hi]))  # an on-disk CSC: its pages back to the cache
        if src.size == 0:
            continue
        if np.any(src == dst):
            return False
        keys = dst * num_nodes
        keys += src
        # Strictly increasing dst-major keys: sorted sources and no repeated edge (which METIS would count twice).
        if keys[0] <= previous or np.any(keys[1:] <= keys[:-1]):
            return False
        previous = int(keys[-1])
        scratch = np.empty_like(keys)
        forward = (forward + _hash_sum(keys, scratch)) % 2**64
        np.multiply(src, num_nodes, out=keys)
        keys += dst
        reverse = (reverse + _hash_sum(keys, scratch)) % 2**64
    return forward == reverse


def out_degrees(indices: np.ndarray, num_nodes: int, chunk: int = 1 << 26) -> np.ndarray:
    """int64 [N]: how often each node appears in ``indices``, counted a chunk at a time (an on-disk CSC's pages
    go back to the page cache as the count leaves them)."""
    counts = np.zeros(num_nodes, dtype=np.int64)
    for lo in range(0, indices.shape[0], chunk):
        counts += np.bincount(indices[lo:lo + chunk], minlength=num_nodes)
        release_rows(indices, lo, lo + chunk)
    return counts


def _hash_sum(keys: np.ndarray, scratch: np.ndarray) -> int:
    """Sum of splitmix64's finaliser over int64 ``keys`` (overwritten), modulo 2**64; ``scratch`` is a temporary."""
    z, tmp = keys.view(np.uint64), scratch.view(np.uint64)
    z += np.uint64(0x9E3779B97F4A7C15)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        np.right_shift(z, np.uint64(shift), out=tmp)
        z ^= tmp
        z *= np.uint64(factor)
    np.right_shift(z, np.uint64(31), out=tmp)
    z ^= tmp
    return int(z.sum(dtype=np.uint64))
