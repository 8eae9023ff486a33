"""Multi-layer neighbour sampling on DGL's C++ kernels, returning plain-tensor :class:`MiniBatch` es."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

# DGL prints a backend notice on import unless told which backend to use; the choice is not a setting of ours.
os.environ.setdefault("DGLBACKEND", "pytorch")
import dgl  # noqa: E402

from gnnscale.batch import Block, MiniBatch  # noqa: E402


@contextmanager
def dgl_single_thread() -> Iterator[None]:
    """Run DGL's random kernels on the calling thread only.

    DGL seeds each OpenMP thread's random engine with ``seed + index``, where the index is
    handed out in the order threads first touch the engine: with several threads that order is
    a race, and one seed samples differently from run to run (observed: a two-process digest
    test that failed about one time in three under load).  One thread keeps a seed's batches
    identical; parallel sampling comes from ranks and prefetch workers instead.
    """
    previous = dgl.utils.get_num_threads()
    if previous == 1:
        yield
        return
    dgl.utils.set_num_threads(1)
    try:
        yield
    finally:
        dgl.utils.set_num_threads(previous)


def seed_sampling(seed: int) -> None:
    """Seed DGL's sampling on the calling thread (see :func:`dgl_single_thread`)."""
    with dgl_single_thread():
        dgl.seed(seed)


@dataclass(kw_only=True)
class SamplerConfig:
    """How to sample a mini-batch's computation graph."""

    fanouts: list[int] = field(default_factory=lambda: [15, 10, 5])
    """Neighbours sampled per node, one entry per layer from the input side (as on the
    command line: ``15,10,5`` samples 5 for the seeds' layer); ``-1`` takes all neighbours."""
    replace: bool = False
    """Sample with replacement."""
    self_loops: bool = False
    """Append a ``v -> v`` edge for every destination of every block (GAT, GCN), after sampling,
    so a node always sees itself whatever the fanout."""
    gcn_norm: bool = False
    """Attach Kipf & Welling edge weights ``1/sqrt(d~_u d~_v)`` from full-graph degrees
    (``d~ = degree + 1``), scaled by ``degree / sampled`` so a sampled sum is unbiased for the
    full one. Implies ``self_loops``."""

    def __post_init__(self) -> None:
        self.fanouts = [int(f) for f in self.fanouts]
        if not self.fanouts:
            raise ValueError("fanouts is empty; give one fanout per layer, e.g. 15,10,5")
        bad = [f for f in self.fanouts if f == 0 or f < -1]
        if bad:
            raise ValueError(f"fanout {bad[0]} is invalid; use a positive number of neighbours or -1 for all")
        if self.gcn_norm:
            self.self_loops = True


class NeighborSampler:
    """Samples in-neighbours layer by layer, seeds outward, on a CSC graph.

    Args:
        indptr: int64 [num_nodes + 1] CSC offsets.
        indices: int64 [num_edges] source of each in-edge.
        config: sampling settings.
    """

    def __init__(self, indptr: np.ndarray | Tensor, indices: np.ndarray | Tensor, config: SamplerConfig) -> None:
        self.config = config
        indptr = torch.as_tensor(indptr, dtype=torch.int64)
        indices = torch.as_tensor(indices, dtype=torch.int64)
        self.num_nodes = indptr.numel() - 1
        self.indptr, self.indices = indptr, indices
        empty = torch.empty(0, dtype=torch.int64)
        self.graph = dgl.graph(("csc", (indptr, indices, empty)), num_nodes=self.num_nodes)
        self.degree = (indptr[1:] - indptr[:-1]).to(torch.float32)
        # DGL picks the fastest format per operation; keeping only CSC avoids a second full copy of the graph.
        self.graph = self.graph.formats("csc")

    def sample(self, seeds: Tensor, fanouts: Sequence[int] | None = None) -> MiniBatch:
        """Sample the computation graph of ``seeds`` (int64 [batch]) with ``fanouts`` (default: the config's)."""
        fanouts = list(self.config.fanouts if fanouts is None else fanouts)
        seeds = torch.as_tensor(seeds, dtype=torch.int64)
        blocks: list[Block] = []
        dst = seeds
        for fanout in reversed(fanouts):
            if fanout == -1:
                src, counts = self._all_in_edges(dst)
            else:
                with dgl_single_thread():
                    frontier = dgl.sampling.sample_neighbors(self.graph, dst, fanout, replace=self.config.replace)
                src, counts = _grouped_by_dst(frontier, dst)
            # Our own compaction instead of dgl.to_block: DGL's parallel hash map numbers new source
            # nodes in a thread-dependent order, so two identical runs would train on permuted blocks.
            src_ids, local_src = compact(dst, src)
            indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64)
            torch.cumsum(counts, 0, out=indptr[1:])
            block = Block(indptr=indptr, indices=local_src, src_ids=src_ids, num_dst=dst.numel())
            if self.config.self_loops:
                block = add_self_loops(block)
            if self.config.gcn_norm:
                block.edge_weight = gcn_weights(block, self.degree[block.src_ids])
            blocks.insert(0, block)
            dst = block.src_ids
        return MiniBatch(seeds=seeds, blocks=blocks)

    def _all_in_edges(self, dst: Tensor) -> tuple[Tensor, Tensor]:
        """All in-neighbours of ``dst``, grouped by destination: ``(src int64 [E], counts int64 [num_dst])``."""
        # Sliced from the CSC rather than sample_neighbors(-1), whose per-node order depends on threading.
        starts = self.indptr[dst]
        counts = self.indptr[dst + 1] - starts
        return segment_gather(self.indices, starts, counts), counts


def gcn_weights(block: Block, degree: Tensor) -> Tensor:
    """Kipf weights ``1/sqrt(d~_u d~_v)`` scaled by ``degree/sampled`` (see ``SamplerConfig.gcn_norm``).

    Args:
        block: a block whose self-loops sit last in each destination's segment (``add_self_loops``).
        degree: float [num_src] full-graph in-degree of each source node (destinations first).
    """
    inv_sqrt = torch.rsqrt(degree + 1.0)
    dst_local = block.dst_index()
    weight = inv_sqrt[block.indices] * inv_sqrt[dst_local]
    sampled = (block.in_degrees() - 1).to(torch.float32)
    scale = degree[:block.num_dst] / sampled.clamp(min=1.0)
    is_self = torch.zeros(block.num_edges, dtype=torch.bool)
    is_self[block.indptr[1:] - 1] = True
    return torch.where(is_self, weight, weight * scale[dst_local])


def segment_gather(values: Tensor, starts: Tensor, counts: Tensor) -> Tensor:
    """``cat([values[s:s + c] for s, c in zip(starts, counts)])``, vectorised."""
    total = int(counts.sum())
    shift = torch.repeat_interleave(starts - (torch.cumsum(counts, 0) - counts), counts, output_size=total)
    return values[torch.arange(total) + shift]


def _grouped_by_dst(frontier: dgl.DGLGraph, dst: Tensor) -> tuple[Tensor, Tensor]:
    """The frontier's edges as ``(src, counts)`` grouped in the order of ``dst``."""
    src, edge_dst = frontier.edges()
    counts = frontier.in_degrees(dst)
    if not torch.equal(edge_dst, torch.repeat_interleave(dst, counts, output_size=edge_dst.numel())):
        # DGL emits each seed's sample contiguously and in seed order; re-group should that ever change.
        sorted_dst, perm = torch.sort(dst)
        local = perm[torch.searchsorted(sorted_dst, edge_dst)]
        src = src[torch.sort(local, stable=True).indices]
    return src, counts


def compact(dst: Tensor, src: Tensor) -> tuple[Tensor, Tensor]:
    """Number the nodes of a block: ``dst`` first, then new sources in order of first appearance.

    Args:
        dst: int64 [num_dst] unique global ids of the destinations.
        src: int64 [num_edges] global id of each edge's source.

    Returns:
        ``(src_ids, local_src)``: int64 [num_src] global ids with ``src_ids[:num_dst] == dst``,
        and int64 [num_edges] position of each ``src`` in ``src_ids``.
    """
    # One quicksort (numpy's argsort, about 4x faster than torch.unique on CPU); the first
    # occurrence of each id is the minimum position in its group, and since first positions are
    # distinct, bucketing them gives first-appearance order without a second sort (~2x faster
    # than np.unique(return_index=True), which needs a stable mergesort plus an argsort).
    num_dst = dst.numel()
    every = np.concatenate([dst.numpy(), src.numpy()])
    perm = np.argsort(every)
    ordered = every[perm]
    new_group = np.empty(every.size, dtype=bool)
    new_group[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new_group[1:])
    starts = np.flatnonzero(new_group)
    first = np.minimum.reduceat(perm, starts) if starts.size else starts
    slot = np.full(every.size, -1, dtype=np.int64)
    slot[first] = np.arange(starts.size)
    order = slot[slot >= 0]
    rank = np.empty(starts.size, dtype=np.int64)
    rank[order] = np.arange(starts.size)
    local = np.empty(every.size, dtype=np.int64)
    local[perm] = rank[np.cumsum(new_group) - 1]
    return torch.from_numpy(ordered[starts][order]), torch.from_numpy(local[num_dst:])


def add_self_loops(block: Block) -> Block:
    """Return ``block`` with one ``v -> v`` edge appended to each destination's in-edges."""
    num_dst = block.num_dst
    counts = block.in_degrees() + 1
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    indices = torch.empty(int(indptr[-1]), dtype=torch.int64)
    is_self = torch.zeros(indices.numel(), dtype=torch.bool)
    is_self[indptr[1:] - 1] = True
    indices[is_self] = torch.arange(num_dst)
    indices[~is_self] = block.indices
    return Block(indptr=indptr, indices=indices, src_ids=block.src_ids, num_dst=num_dst)


class NodeLoader:
    """Iterates over mini-batches of ``seeds`` in a shuffled (or fixed) order.

    Args:
        sampler: the neighbour sampler.
        seeds: int64 [num_seeds] node ids to cover once per epoch.
        batch_size: seeds per mini-batch (the last batch may be smaller).
        shuffle: reshuffle the seeds each epoch.
        seed: seed of the shuffling order; epoch ``e`` uses ``seed + e``.
        fanouts: override the sampler's fanouts (e.g. ``[-1]`` for one full-neighbour hop).
    """

    def __init__(self, sampler: NeighborSampler, seeds: Tensor, batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, fanouts: Sequence[int] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.sampler = sampler
        self.seeds = torch.as_tensor(seeds, dtype=torch.int64)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.fanouts = fanouts
        self.epoch = 0

    def __len__(self) -> int:
        return (self.seeds.numel() + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[MiniBatch]:
        order = self.seeds
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = self.seeds[torch.randperm(self.seeds.numel(), generator=generator)]
        self.epoch += 1
        for start in range(0, order.numel(), self.batch_size):
            yield self.sampler.sample(order[start:start + self.batch_size], self.fanouts)
