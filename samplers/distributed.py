"""Neighbour sampling over a partitioned graph: owned frontier nodes locally, the rest by their owners.

Each rank holds the in-edges of the nodes it owns (a CSC over local destination ids whose sources are new
global ids).  For every layer the frontier is split by owner; each rank sends the ids it does not own to
their owners in one all-to-all round, samples its own frontier and every request with
:func:`samplers.neighbor.sample_in_edges` -- the kernel of a single machine -- drawing from the batch's
generator, and returns the sampled sources (with their counts) in a second round.  A node's neighbours
therefore have the single-machine distribution; in a world of one the blocks are exactly those of
:class:`~samplers.neighbor.NeighborSampler` with the same generator, and with fanout ``-1`` they equal
the single-machine blocks on any number of ranks.

Every rank must call :meth:`DistNeighborSampler.sample` the same number of times (the
trainer runs the same number of steps on every rank).

With a replicated topology (SALIENT++'s choice where the structure fits in memory) every rank holds
the in-edges of the whole graph (:func:`replicate_structure`, one all-gather at start-up) and samples
any frontier locally with the same kernel: no request crosses the network, and only feature rows
move.  At fanout ``-1`` its blocks equal the partitioned sampler's.

A partitioned rank can also hold a copy of its halo's in-edges (:func:`fetch_halo`, once at start-up: the
in-edges of every non-owned node with an edge into an owned one, O(halo) memory).  A hop whose frontier lies
in the owned nodes and their halo is then sampled here: with seeds that are owned nodes (node
classification), the first two hops -- both of a two-layer model -- send no request (``local_hops``), and on
any hop only nodes beyond the halo are asked of their owners.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from gnnscale.batch import MiniBatch
from gnnscale.distributed.comm import Exchanger, split_by_owner
from gnnscale.distributed.feature_store import DistTable
from samplers.neighbor import (SamplerConfig, drop_excluded, exclusion_keys, make_block, sample_in_edges,
                               segment_gather)


class LocalGraph:
    """The owned in-edges of one partition.

    Args (resident arrays: a read-only memory map would page in from disk on every batch):
        indptr: int64 [n + 1] CSC offsets over owned local ids.
        indices: int64 [num_edges] source new global ids.
        start: new global id of local node 0.
        edge_ids: int64 [num_edges] the global id of every stored edge, where they are not consecutive from
            ``edge_start`` (a structure with some edges removed); None: consecutive.
    """

    def __init__(self, indptr: np.ndarray | Tensor, indices: np.ndarray | Tensor, *, start: int,
                 edge_start: int = 0, edge_ids: np.ndarray | None = None) -> None:
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.start = start
        self.edge_start = edge_start
        """Global id of the first stored edge: edge ``i`` of ``indices`` is global edge ``edge_start + i``."""
        self.edge_ids = None if edge_ids is None else torch.as_tensor(np.asarray(edge_ids, dtype=np.int64))
        if self.edge_ids is not None and self.edge_ids.numel() != self.indices.size:
            raise ValueError(f"edge_ids must hold one id per stored edge ({self.indices.size}), got "
                             f"{self.edge_ids.numel()}")
        self.num_owned = self.indptr.size - 1
        self.degree = torch.from_numpy(self.indptr[1:] - self.indptr[:-1])

    def sample(self, global_dst: Tensor, fanout: int, replace: bool, rng: np.random.Generator | None, *,
               with_edges: bool = False) -> tuple[Tensor, ...]:
        """In-neighbours of owned ``global_dst``: ``(src global ids, counts per dst)``, grouped in dst order,
        drawing from ``rng`` (``None`` only with fanout ``-1``, which draws nothing); with ``with_edges`` also
        the global edge ids.  A node listed twice (two ranks asked for it) gets two independent samples."""
        sampled = sample_in_edges(self.indptr, self.indices, global_dst.numpy() - self.start, fanout, replace, rng,
                                  with_edges=with_edges)
        if with_edges:
            return sampled[0], sampled[1], self.global_edge_ids(sampled[2])
        return sampled

    def global_edge_ids(self, positions: Tensor) -> Tensor:
        """int64 global ids of the stored edges at ``positions`` (indices into ``indices``)."""
        if self.edge_ids is not None:
            return self.edge_ids.index_select(0, positions)
        return positions + self.edge_start


def structure_bytes(num_nodes: int, num_edges: int) -> int:
    """Bytes of a whole-graph CSC as :class:`LocalGraph` holds it (int64 offsets and sources)."""
    return 8 * (num_nodes + 1) + 8 * num_edges


def replicate_structure(graph: LocalGraph, exchanger: Exchanger) -> LocalGraph:
    """The in-edges of the whole graph, from every rank's own (a collective; partitions own contiguous
    id ranges in rank order, so concatenating them in rank order is the whole CSC in global ids)."""
    degrees = exchanger.all_gather_rows(graph.degree)
    indices = exchanger.all_gather_rows(torch.from_numpy(graph.indices))
    indptr = np.zeros(degrees.numel() + 1, dtype=np.int64)
    np.cumsum(degrees.numpy(), out=indptr[1:])
    return LocalGraph(indptr, indices.numpy(), start=0)


class HaloGraph:
    """Owned in-edges plus a copy of the halo's: the nodes this rank samples without asking.

    Rows ``0 .. num_owned - 1`` are the owned nodes (``owned``'s CSC), rows from ``num_owned`` on the halo
    nodes in ``halo_ids`` order; halo edges sit after the owned ones in one virtual edge list, so
    :func:`samplers.neighbor.sample_in_edges` draws from both with one call.

    Args:
        owned: this rank's owned in-edges.
        halo_ids: int64 [h] sorted global ids of the halo nodes.
        indptr: int64 [h + 1] CSC offsets of the halo nodes' in-edges.
        indices: int32 (int64 where a global id may pass int32) [halo edges] their sources (global ids).
        edge_ids: int64 [halo edges] their global edge ids, or None (not fetched).
    """

    def __init__(self, owned: LocalGraph, halo_ids: Tensor, indptr: np.ndarray, indices: np.ndarray,
                 edge_ids: np.ndarray | None) -> None:
        self.owned, self.halo_ids = owned, halo_ids
        self.halo_indices, self.halo_edge_ids = indices, edge_ids
        owned_edges = owned.indices.size
        self.indptr = np.concatenate([owned.indptr, owned_edges + indptr[1:]])
        self.indices = JoinedArray(owned.indices, indices)

    @property
    def has_edge_ids(self) -> bool:
        return self.halo_edge_ids is not None

    @property
    def nbytes(self) -> int:
        """Bytes held beyond ``owned``."""
        return self.bytes_for(self.owned.num_owned, self.halo_ids.numel(), self.halo_indices.size, self.has_edge_ids,
                              self.halo_indices.itemsize)

    @staticmethod
    def bytes_for(num_owned: int, num_halo: int, num_edges: int, with_edges: bool, source_bytes: int = 8) -> int:
        """Bytes of a copy of ``num_halo`` nodes' ``num_edges`` in-edges: their ids and the joined offsets (owned
        and halo), int64, the sources, ``source_bytes`` each, and the edge ids, int64."""
        return 8 * (num_owned + 2 * num_halo + 1 + num_edges * with_edges) + source_bytes * num_edges

    def known(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(rows, known)``: each global id's row here (owned or halo; 0 where unknown) and whether it has one."""
        owned = (ids >= self.owned.start) & (ids < self.owned.start + self.owned.num_owned)
        if not self.halo_ids.numel():
            return torch.where(owned, ids - self.owned.start, 0), owned
        slot = torch.searchsorted(self.halo_ids, ids).clamp_(max=self.halo_ids.numel() - 1)
        in_halo = ~owned & (self.halo_ids.index_select(0, slot) == ids)
        rows = torch.where(owned, ids - self.owned.start, torch.where(in_halo, slot + self.owned.num_owned, 0))
        return rows, owned | in_halo

    def sample(self, global_dst: Tensor, fanout: int, replace: bool, rng: np.random.Generator | None, *,
               with_edges: bool = False) -> tuple[Tensor, ...]:
        """As :meth:`LocalGraph.sample`, for any owned or halo ``global_dst``."""
        rows, known = self.known(global_dst)
        if not bool(known.all()):
            unknown = int(global_dst[~known][0])
            raise RuntimeError(f"node {unknown} is neither owned by this rank nor in its halo: it must be asked of "
                               f"its owner")
        sampled = sample_in_edges(self.indptr, self.indices, rows.numpy(), fanout, replace, rng,
                                  with_edges=with_edges)
        if with_edges:
            return sampled[0], sampled[1], self.global_edge_ids(sampled[2])
        return sampled

    def global_edge_ids(self, positions: Tensor) -> Tensor:
        if not self.has_edge_ids:
            raise RuntimeError("this halo copy was fetched without edge ids")
        owned_edges = self.owned.indices.size
        inside = positions < owned_edges
        ids = torch.empty_like(positions)
        ids[inside] = self.owned.global_edge_ids(positions[inside])
        ids[~inside] = torch.from_numpy(self.halo_edge_ids)[positions[~inside] - owned_edges]
        return ids


class JoinedArray:
    """Two integer arrays read as one (``first`` then ``second``) by an integer index array, without copying them;
    what is read has ``first``'s dtype (``second`` may be narrower)."""

    def __init__(self, first: np.ndarray, second: np.ndarray) -> None:
        self.first, self.second = first, second
        self.size = first.size + second.size

    def __getitem__(self, positions: np.ndarray | slice) -> np.ndarray:
        if isinstance(positions, slice):  # a copy of the range (a view where it lies in one array)
            lo, hi, _ = positions.indices(self.size)
            split = self.first.size
            if hi <= split:
                return self.first[lo:hi]
            if lo >= split:
                return self.second[lo - split:hi - split].astype(self.first.dtype, copy=False)
            return np.concatenate([self.first[lo:], self.second[:hi - split]])
        out = np.empty(positions.shape, dtype=self.first.dtype)
        inside = positions < self.first.size
        out[inside] = self.first[positions[inside]]
        outside = ~inside
        out[outside] = self.second[positions[outside] - self.first.size]
        return out


HALO_ROUND_BYTES = 32 * 2**20
"""About this many bytes of halo in-edges travel to and from a rank per round of :func:`fetch_halo`: what its
start-up holds beyond the copy itself (at once, 4 ranks of a 3M-node graph held 3 times the copy's bytes)."""


def fetch_halo(graph: LocalGraph, halo_ids: Tensor, offsets: Tensor, exchanger: Exchanger, *, with_edges: bool,
               budget_bytes: float) -> HaloGraph | None:
    """A copy of the in-edges of ``halo_ids`` (sorted, non-owned global ids) from their owners, joined with
    ``graph`` (:class:`HaloGraph`); None on every rank when any rank's copy would exceed its ``budget_bytes``.
    A collective: owners first send the halo's degrees, the ranks agree whether every copy fits, then the edges
    travel in rounds of about :data:`HALO_ROUND_BYTES` through one pair of buffers, each round written into
    its place in the copy."""
    owner = torch.searchsorted(offsets, halo_ids, right=True) - 1
    sizes = torch.bincount(owner, minlength=exchanger.world_size).tolist()
    requests = exchanger.exchange(list(halo_ids.split(sizes)))
    served = [graph.degree.index_select(0, ids - graph.start) for ids in requests]
    degrees = torch.cat(exchanger.exchange(served, recv_sizes=sizes))
    num_edges = int(degrees.sum())
    # Sources as int32 where every global id fits: the copy is most of what a rank holds beyond its partition.
    narrow = np.int32 if int(offsets[-1]) <= np.iinfo(np.int32).max else np.int64
    need = HaloGraph.bytes_for(graph.num_owned, halo_ids.numel(), num_edges, with_edges, np.dtype(narrow).itemsize)
    fits = torch.tensor([int(need <= budget_bytes)], dtype=torch.int64)
    if not int(exchanger.all_reduce(fits, op=dist.ReduceOp.MIN)[0]):
        return None
    width = 2 if with_edges else 1  # sources, then edge ids
    load = 8 * width * max(num_edges, sum(int(d.sum()) for d in served))
    rounds = torch.tensor([max(1, -(-load // HALO_ROUND_BYTES))], dtype=torch.int64)
    rounds = int(exchanger.all_reduce(rounds, op=dist.ReduceOp.MAX)[0])
    indptr = np.zeros(halo_ids.numel() + 1, dtype=np.int64)
    np.cumsum(degrees.numpy(), out=indptr[1:])
    sources = np.empty(num_edges, dtype=narrow)
    edge_ids = np.empty(num_edges, dtype=np.int64) if with_edges else None
    asked = degrees.split(sizes)  # the degrees of what this rank asked each owner for
    firsts = np.concatenate([[0], np.cumsum(sizes)])
    send_buffer = recv_buffer = None
    for r in range(rounds):
        cuts = [_cut(len(ids), r, rounds) for ids in requests]
        replies = [_in_edges(graph, ids[lo:hi], with_edges) for ids, (lo, hi) in zip(requests, cuts)]
        mine = [_cut(len(d), r, rounds) for d in asked]
        recv_sizes = [width * int(d[lo:hi].sum()) for d, (lo, hi) in zip(asked, mine)]
        send_sizes = [reply.numel() for reply in replies]
        if send_buffer is None:  # one pair for every round: what the collectives keep is these
            most_sent = max(_round_totals(served, rounds, width))
            most_received = max(_round_totals(asked, rounds, width))
            send_buffer, recv_buffer = torch.empty(most_sent, dtype=torch.int64), torch.empty(most_received,
                                                                                           dtype=torch.int64)
        send = torch.cat(replies, out=send_buffer[:sum(send_sizes)])
        received = recv_buffer[:sum(recv_sizes)]
        exchanger.exchange_into(send, send_sizes, received, recv_sizes)
        for part, (lo, hi), first in zip(received.split(recv_sizes), mine, firsts):
            start, end = indptr[first + lo], indptr[first + hi]
            part = part.view(width, -1).numpy()
            sources[start:end] = part[0]
            if edge_ids is not None:
                edge_ids[start:end] = part[1]
    return HaloGraph(graph, halo_ids, indptr, sources, edge_ids)


def _in_edges(graph: LocalGraph, ids: Tensor, with_edges: bool) -> Tensor:
    """The sources of every in-edge of owned ``ids``, in order, then (``with_edges``) their global edge ids."""
    src, _, *edges = graph.sample(ids, -1, False, None, with_edges=with_edges)
    return torch.cat([src, *edges])


def _cut(n: int, r: int, rounds: int) -> tuple[int, int]:
    """Round ``r``'s run ``[lo, hi)`` of ``n`` nodes cut into ``rounds`` near-equal runs: the same on the
    rank that asks and on the owner that answers."""
    return n * r // rounds, n * (r + 1) // rounds


def _round_totals(degrees: list[Tensor], rounds: int, width: int) -> list[int]:
    """Rows of int64 per round: each rank's ``degrees`` cut into ``rounds`` near-equal runs of nodes."""
    return [width * sum(int(d[slice(*_cut(len(d), r, rounds))].sum()) for d in degrees) for r in range(rounds)]


class DistNeighborSampler:
    """Samples :class:`MiniBatch` es over a partitioned graph (ids are new global ids).

    Args:
        graph: this rank's owned in-edges.
        offsets: int64 [world_size + 1] id ranges of the partitions.
        exchanger: the sampling group's collective channel.
        config: fanouts, replacement, self-loops, GCN weights.
        degrees: full-graph in-degree table (needed for ``gcn_norm``), cached for the halo.
        replicated: ``graph`` is the whole graph (:func:`replicate_structure`): every frontier is sampled
            here, and GCN degrees are read from it (``degrees`` is then not needed).
        halo: ``graph`` with a copy of its halo's in-edges (:func:`fetch_halo`): nodes in it are sampled here.
        local_hops: how many hops, from the seeds, every rank samples without any exchange; the caller
            promises that every rank's seeds are owned nodes (1 hop), and with ``halo`` that these hops'
            frontiers lie in it (2 hops).  The same on every rank.
    """

    def __init__(self, graph: LocalGraph, offsets: Tensor, exchanger: Exchanger, config: SamplerConfig,
                 degrees: DistTable | None = None, *, replicated: bool = False, halo: HaloGraph | None = None,
                 local_hops: int = 0) -> None:
        if config.gcn_norm and degrees is None and not replicated:
            raise ValueError("gcn_norm needs the degree table of the whole graph; pass degrees=")
        self.graph, self.config, self.exchanger = graph, config, exchanger
        self.offsets = torch.as_tensor(offsets, dtype=torch.int64)
        if replicated and graph.num_owned != int(self.offsets[-1]):
            raise ValueError(f"a replicated sampler needs the whole graph ({int(self.offsets[-1])} nodes), "
                             f"got {graph.num_owned}")
        if halo is not None and config.edge_ids and not halo.has_edge_ids:
            raise ValueError("config.edge_ids needs a halo copy fetched with its edge ids (with_edges=True)")
        self.degrees = degrees
        self.replicated = replicated
        self.halo = halo
        self.local_hops = local_hops
        self.world_size = exchanger.world_size

    def sample(self, seeds: Tensor, fanouts: Sequence[int] | None = None, *, rng: np.random.Generator,
               exclude: Tensor | None = None) -> MiniBatch:
        """The computation graph of ``seeds`` (int64 [batch] global ids), drawing from ``rng``.  A collective.

        ``exclude``: int64 [2, k] global ``(src, dst)`` edges dropped from every hop's draw, remote hops
        included (the owners sample as usual; the requester filters what comes back, see
        :func:`samplers.neighbor.exclusion_keys`)."""
        fanouts = list(self.config.fanouts if fanouts is None else fanouts)
        num_nodes = int(self.offsets[-1])
        excluded = exclusion_keys(exclude, num_nodes)
        seeds = torch.as_tensor(seeds, dtype=torch.int64)
        degrees = self.degrees.gather if self.degrees is not None else None
        if self.replicated:
            degrees = self.local_degrees
        blocks = []
        dst = seeds
        for hop, fanout in enumerate(reversed(fanouts)):
            src, counts, edges = self._sample_frontier(dst, fanout, rng, hop)
            src, counts, edges = drop_excluded(dst, src, counts, excluded, num_nodes, edges)
            block = make_block(dst, src, counts, self.config, degrees, edges)
            blocks.insert(0, block)
            dst = block.src_ids
        return MiniBatch(seeds=seeds, blocks=blocks)

    def local_degrees(self, ids: Tensor) -> Tensor:
        """Full-graph in-degrees (float) of any ``ids``, read from a replicated graph."""
        return self.graph.degree.index_select(0, ids).to(torch.float32)

    def _sample_frontier(self, dst: Tensor, fanout: int, rng: np.random.Generator,
                         hop: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Sampled in-neighbours of any ``dst`` (the frontier of hop ``hop``, 0 at the seeds): those owned or in
        the halo here, the others by their owners; with ``config.edge_ids`` also the sampled edges' global
        ids (else None)."""
        with_edges = self.config.edge_ids
        here = self.halo if self.halo is not None else self.graph
        if self.world_size == 1 or self.replicated or hop < self.local_hops:
            src, counts, *edges = here.sample(dst, fanout, self.config.replace, rng, with_edges=with_edges)
            return src, counts, edges[0] if edges else None
        rank = self.exchanger.rank
        owner = torch.searchsorted(self.offsets, dst, right=True) - 1
        if self.halo is not None:
            owner.masked_fill_(self.halo.known(dst)[1], rank)
        order, sizes = split_by_owner(owner, self.world_size)
        outgoing = list(dst[order].split(sizes))
        # The own chunk stays here; every other rank's requests arrive in one round.
        requests = self.exchanger.exchange([c if r != rank else c[:0] for r, c in enumerate(outgoing)])
        requests[rank] = outgoing[rank]
        served = torch.cat(requests)
        src, counts, *edges = here.sample(served, fanout, self.config.replace, rng, with_edges=with_edges)
        # Reply to rank r: the counts of its requests, then their sources (then their edge ids), in one int64
        # message.
        request_sizes = [r.numel() for r in requests]
        count_parts = counts.split(request_sizes)
        edge_counts = [int(c.sum()) for c in count_parts]
        columns = [src.split(edge_counts), *(e.split(edge_counts) for e in edges)]
        replies = [torch.cat([count_parts[r], *(column[r] for column in columns)]) for r in range(len(requests))]
        received = self.exchanger.exchange([m if r != rank else m[:0] for r, m in enumerate(replies)])
        received[rank] = replies[rank]
        # Back in the order of dst: each rank's answers arrive in the order its requests went out.
        counts_by_pos = torch.empty(dst.numel(), dtype=torch.int64)
        arrived_counts = [message[:sizes[r]] for r, message in enumerate(received)]
        grouped_counts = torch.cat(arrived_counts)
        counts_by_pos[order] = grouped_counts
        grouped = [[] for _ in columns]
        for r, message in enumerate(received):
            total = int(arrived_counts[r].sum())
            for column in range(len(columns)):
                grouped[column].append(message[sizes[r] + column * total: sizes[r] + (column + 1) * total])
        src, *edges = (regroup(torch.cat(parts), grouped_counts, order, counts_by_pos) for parts in grouped)
        return src, counts_by_pos, edges[0] if edges else None


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
