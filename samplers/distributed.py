"""Neighbour sampling over a partitioned graph: owned frontier nodes locally, the rest by their owners.

Each rank holds the in-edges of the nodes it owns (a CSC over local destination ids whose
sources are new global ids).  For every layer the frontier is split by owner; each rank
sends the ids it does not own to their owners in one all-to-all round, samples its own
frontier and every request in a single DGL call on its partition, and returns the
sampled sources (with their counts) in a second round.  A node's neighbours are drawn by
the same kernel, with the same fanout, as on one machine, so the sampled neighbourhoods
have the single-machine distribution; with fanout ``-1`` every in-edge is taken in stored
order, and the blocks equal the single-machine blocks exactly.

Every rank must call :meth:`DistNeighborSampler.sample` the same number of times (the
trainer runs the same number of steps on every rank).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

os.environ.setdefault("DGLBACKEND", "pytorch")
import dgl  # noqa: E402

from gnnscale.batch import Block, MiniBatch  # noqa: E402
from gnnscale.distributed.comm import Exchanger, split_by_owner  # noqa: E402
from gnnscale.distributed.feature_store import DistTable  # noqa: E402
from samplers.neighbor import (SamplerConfig, add_self_loops, compact, dgl_single_thread, gcn_weights,  # noqa: E402
                               segment_gather)


class LocalGraph:
    """The owned in-edges of one partition, sampled with DGL's kernels.

    Args:
        indptr: int64 [n + 1] CSC offsets over owned local ids.
        indices: int64 [num_edges] source new global ids.
        start: new global id of local node 0.
        num_nodes: nodes of the whole graph (the range of source ids).
    """

    def __init__(self, indptr: np.ndarray | Tensor, indices: np.ndarray | Tensor, *, start: int,
                 num_nodes: int) -> None:
        # Copied out of the read-only memory maps: DGL and torch need writable, resident arrays.
        self.indptr = torch.from_numpy(np.array(indptr, dtype=np.int64))
        self.indices = torch.from_numpy(np.array(indices, dtype=np.int64))
        self.start = start
        self.num_owned = self.indptr.numel() - 1
        empty = torch.empty(0, dtype=torch.int64)
        # A bipartite relation (all sources -> owned destinations) keeps the CSC as it is: no
        # array of the whole graph's size is made, and sampled sources come back as global ids.
        self.graph = dgl.heterograph({("src", "in", "dst"): ("csc", (self.indptr, self.indices, empty))},
                                     num_nodes_dict={"src": num_nodes, "dst": self.num_owned}).formats("csc")
        self.degree = (self.indptr[1:] - self.indptr[:-1])

    def sample(self, global_dst: Tensor, fanout: int, replace: bool) -> tuple[Tensor, Tensor]:
        """In-neighbours of owned ``global_dst``: ``(src global ids, counts per dst)``, grouped in dst order.

        A node listed twice (two ranks asked for it) is sampled once and answered twice.
        """
        local = global_dst - self.start
        if fanout == -1:
            starts = self.indptr[local]
            counts = self.indptr[local + 1] - starts
            return segment_gather(self.indices, starts, counts), counts
        unique, inverse = torch.unique(local, return_inverse=True)
        with dgl_single_thread():
            frontier = dgl.sampling.sample_neighbors(self.graph, {"dst": unique}, fanout, replace=replace)
        src, edge_dst = frontier.edges()
        counts = frontier.in_degrees(unique, etype="in")
        if not torch.equal(edge_dst, torch.repeat_interleave(unique, counts, output_size=edge_dst.numel())):
            # DGL emits each seed's sample contiguously in seed order; re-group should that ever change.
            src = src[torch.sort(torch.searchsorted(unique, edge_dst), stable=True).indices]
        if unique.numel() == local.numel() and torch.equal(unique, local):
            return src, counts
        starts = torch.cumsum(counts, 0) - counts
        return segment_gather(src, starts[inverse], counts[inverse]), counts[inverse]


class DistNeighborSampler:
    """Samples :class:`MiniBatch` es over a partitioned graph (ids are new global ids).

    Args:
        graph: this rank's owned in-edges.
        offsets: int64 [world_size + 1] id ranges of the partitions.
        exchanger: the sampling group's collective channel.
        config: fanouts, replacement, self-loops, GCN weights.
        degrees: full-graph in-degree table (needed for ``gcn_norm``), cached for the halo.
    """

    def __init__(self, graph: LocalGraph, offsets: Tensor, exchanger: Exchanger, config: SamplerConfig,
                 degrees: DistTable | None = None) -> None:
        if config.gcn_norm and degrees is None:
            raise ValueError("gcn_norm needs the degree table of the whole graph; pass degrees=")
        self.graph, self.config, self.exchanger = graph, config, exchanger
        self.offsets = torch.as_tensor(offsets, dtype=torch.int64)
        self.degrees = degrees
        self.world_size = exchanger.world_size

    def sample(self, seeds: Tensor, fanouts: Sequence[int] | None = None) -> MiniBatch:
        """The computation graph of owned ``seeds`` (int64 [batch] global ids).  A collective."""
        fanouts = list(self.config.fanouts if fanouts is None else fanouts)
        seeds = torch.as_tensor(seeds, dtype=torch.int64)
        blocks: list[Block] = []
        dst = seeds
        for fanout in reversed(fanouts):
            src, counts = self._sample_frontier(dst, fanout)
            block = self.make_block(dst, src, counts, lookup_degrees=self._gathered_degrees)
            blocks.insert(0, block)
            dst = block.src_ids
        return MiniBatch(seeds=seeds, blocks=blocks)

    def _sample_frontier(self, dst: Tensor, fanout: int) -> tuple[Tensor, Tensor]:
        """Sampled in-neighbours of any ``dst``: owned ones here, the others by their owners."""
        owner = torch.searchsorted(self.offsets, dst, right=True) - 1
        order, sizes = split_by_owner(owner, self.world_size)
        rank = self.exchanger.rank
        outgoing = list(dst[order].split(sizes))
        # The own chunk stays here; every other rank's requests arrive in one round.
        requests = self.exchanger.exchange([c if r != rank else c[:0] for r, c in enumerate(outgoing)])
        requests[rank] = outgoing[rank]
        served = torch.cat(requests)
        src, counts = self.graph.sample(served, fanout, self.config.replace)
        # Reply to rank r: the counts of its requests, then their sources, in one int64 message.
        request_sizes = [r.numel() for r in requests]
        count_parts = counts.split(request_sizes)
        src_parts = src.split([int(c.sum()) for c in count_parts])
        replies = [torch.cat([c, s]) if r != rank else c[:0] for r, (c, s) in enumerate(zip(count_parts, src_parts))]
        received = self.exchanger.exchange(replies)
        received[rank] = torch.cat([count_parts[rank], src_parts[rank]])
        # Back in the order of dst: each rank's answers arrive in the order its requests went out.
        counts_by_pos = torch.empty(dst.numel(), dtype=torch.int64)
        arrived_counts, arrived_src = [], []
        for r, message in enumerate(received):
            arrived_counts.append(message[:sizes[r]])
            arrived_src.append(message[sizes[r]:])
        grouped_counts = torch.cat(arrived_counts)
        grouped_src = torch.cat(arrived_src)
        counts_by_pos[order] = grouped_counts
        return regroup(grouped_src, grouped_counts, order, counts_by_pos), counts_by_pos

    def _gathered_degrees(self, ids: Tensor) -> Tensor:
        assert self.degrees is not None
        return self.degrees.gather(ids)

    def make_block(self, dst: Tensor, src: Tensor, counts: Tensor, *, lookup_degrees) -> Block:
        """Compact ``(dst, src, counts)`` into a block, with self-loops and GCN weights as configured.

        ``lookup_degrees(ids) -> float [k]`` gives full-graph in-degrees (GCN only); the sampler
        passes the table's collective ``gather``, evaluation its local ``lookup``.
        """
        src_ids, local_src = compact(dst, src)
        indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        block = Block(indptr=indptr, indices=local_src, src_ids=src_ids, num_dst=dst.numel())
        if self.config.self_loops:
            block = add_self_loops(block)
        if self.config.gcn_norm:
            block.edge_weight = gcn_weights(block, lookup_degrees(block.src_ids).to(torch.float32))
        return block


def regroup(values: Tensor, counts: Tensor, order: Tensor, counts_by_pos: Tensor) -> Tensor:
    """Reorder variable-length segments from grouped order to position order.

    Args:
        values: the concatenated segments, segment ``i`` belonging to position ``order[i]``.
        counts: int64 [n] length of segment ``i`` (grouped order).
        order: int64 [n] the position of each segment.
        counts_by_pos: int64 [n] the same lengths indexed by position.

    Returns:
        The segments concatenated in position order.
    """
    starts_by_pos = torch.empty_like(counts)
    starts_by_pos[order] = torch.cumsum(counts, 0) - counts
    return segment_gather(values, starts_by_pos, counts_by_pos)
