"""Row-partitioned tables: owned rows read locally, remote rows fetched through collectives.

A :class:`DistTable` holds the rows of the nodes its rank owns (new global ids
``[start, end)``) and answers ``gather(ids)`` for any ids: owned rows by ``index_select``,
cached remote rows from the cache, the rest from their owners in one all-to-all round
(ids out, rows back).  Node features are one table; the trainer also uses tables for
degrees (GCN weights) and for each layer's embeddings during layer-wise evaluation.

The cache holds remote rows chosen by expected access, sized by the user:

* ``"degree"``: remote nodes ranked by how many in-edges of owned nodes they are the
  source of -- the nodes a 1-hop sample from this partition draws most often.
* ``"presample"``: ranked by how often they were requested while sampling a number of
  mini-batches before training (``fill_cache_by_counts``).

A float32 table may send its rows in a smaller wire dtype (``wire_dtype``, see
:mod:`gnnscale.distributed.wire` for the bytes and error bounds): each owner encodes the rows it
was asked for, and they are decoded to float32 on arrival.  The cache is filled through the same
exchange, so it holds decoded rows too: every remote row a rank reads carries the same error,
cached or not.  Owned rows are read as they are.  Tables that must stay exact (ids, GCN degrees)
keep the default, float32.
"""

from __future__ import annotations

import contextlib
import dataclasses

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from gnnscale.batch import MiniBatch
from gnnscale.distributed import wire
from gnnscale.distributed.comm import Exchanger, split_by_owner
from gnnscale.memory import available_bytes
from gnnscale.pipeline.native import gather_rows

log = logging.getLogger("gnnscale.distributed")


@dataclass
class TableStats:
    """Rows served per source, reset at every epoch."""

    local_rows: int = 0
    cache_hits: int = 0
    remote_rows: int = 0

    @property
    def cache_hit_rate(self) -> float:
        """Share of non-owned rows found in the cache."""
        wanted = self.cache_hits + self.remote_rows
        return self.cache_hits / wanted if wanted else 0.0

    def reset(self) -> None:
        self.local_rows = self.cache_hits = self.remote_rows = 0


class DistTable:
    """One rank's shard of a ``[num_nodes, ...]`` table, partitioned by contiguous id ranges.

    Args:
        rows: [n_owned, ...] the owned rows, in local order (row ``i`` is global id ``offsets[rank] + i``).
        offsets: int64 [world_size + 1], partition ``p`` owns ``[offsets[p], offsets[p + 1])``.
        exchanger: the collective channel (its rank and world size are this table's).
        wire_dtype: how rows sent to other ranks travel, one of :data:`wire.WIRE_DTYPES`; anything
            but ``"float32"`` (the rows as they are) needs float32 ``rows``.

    Raises:
        ValueError: an unknown ``wire_dtype``.
        TypeError: a lossy ``wire_dtype`` for rows that are not float32.
    """

    WHERE_MAP_BYTES = 256 * 2**20
    """Largest id map (4 bytes per node of the graph) :meth:`gather_grouped` builds; beyond it, it sorts."""

    def __init__(self, rows: Tensor, offsets: Tensor, exchanger: Exchanger, *, wire_dtype: str = "float32") -> None:
        self.wire_dtype = wire.check_wire_dtype(wire_dtype)
        if wire_dtype != "float32" and rows.dtype != torch.float32:
            raise TypeError(f"wire dtype {wire_dtype} encodes float32 tables only, and this one holds {rows.dtype}; "
                            f"give it wire_dtype='float32' (ids and other exact rows travel as they are)")
        self.rows = rows
        self.offsets = torch.as_tensor(offsets, dtype=torch.int64)
        self.exchanger = exchanger
        self.rank, self.world_size = exchanger.rank, exchanger.world_size
        self.start, self.end = int(self.offsets[self.rank]), int(self.offsets[self.rank + 1])
        assert rows.shape[0] == self.end - self.start, (rows.shape, self.start, self.end)
        self.cache_ids = torch.empty(0, dtype=torch.int64)
        self.cache_rows = rows.new_empty((0, *rows.shape[1:]))
        self.stats = TableStats()
        self._where: Tensor | None = None
        self._where_for: Tensor | None = None
        self._joined = rows
        self.use_id_map = False
        """Find rows through an int32 map of every global id (4 bytes per node of the graph: for a rank that
        holds whole-graph arrays anyway, i.e. the replicated topology); else by search and sort."""
        self.cache_complete = False
        """Set (by every rank alike) when each rank's cache holds every remote row its batches can need:
        :meth:`gather_grouped` then makes no exchange at all."""
        self._scratch: dict[str, Tensor] | None = None

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(self.rows.shape[1:])

    mapped = False
    """Whether the owned rows stay in a file mapping (:class:`gnnscale.distributed.mapped.MappedTable`)."""

    def read_owned(self, local: Tensor, out: Tensor | None = None) -> Tensor:
        """Owned rows by local id (int64 [k], ``global - start``) into ``out`` (or a new [k, ...]); no
        communication.  Every read of owned rows goes through here (a mapped table sorts them)."""
        return torch.index_select(self.rows, 0, local, out=out) if out is not None else self.rows.index_select(0, local)

    def owner(self, ids: Tensor) -> Tensor:
        """int64, same shape: the rank owning each global id."""
        return torch.searchsorted(self.offsets, ids, right=True) - 1

    # ------------------------------------------------------------------ reads
    def gather(self, ids: Tensor) -> Tensor:
        """Rows of ``ids`` (int64 [k] global ids): [k, ...].  A collective: every rank calls it in step."""
        ids = torch.as_tensor(ids, dtype=torch.int64)
        if self.world_size == 1:  # everything is owned, and no collective is needed
            self.stats.local_rows += ids.numel()
            return self.read_owned(ids - self.start)
        out = self.rows.new_empty((ids.numel(), *self.row_shape))
        where = torch.nonzero(self._fill_local_and_cached(ids, out)).squeeze(1)
        missing = ids.index_select(0, where)
        order, sizes = split_by_owner(self.owner(missing), self.world_size)
        requests = self.exchanger.exchange(list(missing.index_select(0, order).split(sizes)))
        self._answer_in_rounds(requests, list(where.index_select(0, order).split(sizes)), out)
        self.stats.remote_rows += int(missing.numel())
        return out

    ROUND_BYTES = 16 * 2**20
    """At most this many bytes of rows leave a rank (and arrive at it) in one all-to-all of :meth:`gather`.  A
    large gather (the halo's rows in evaluation, a cache fill) runs in rounds through two buffers this size; in
    one exchange it held every reply, their concatenation, the received rows and their copy at once (about
    880 MiB a rank above the result, 210k halo rows x 256 features on 4 ranks)."""

    @contextlib.contextmanager
    def reusing_buffers(self) -> Iterator[None]:
        """The :meth:`gather` calls inside share their round buffers (evaluation's halo rows, gathered a wave at a
        time): the collectives' tensors that :func:`~gnnscale.distributed.comm.keep` holds then pin one set of
        buffers, where each gather's own set stayed held until 16 later tensors pushed it out (2-3 earlier waves'
        32 MiB each)."""
        self._scratch = {}
        try:
            yield
        finally:
            self._scratch = None

    def _buffer(self, name: str, make: Callable[[int], Tensor], rows: int) -> Tensor:
        """``rows`` rows of a buffer ``make(n)`` makes: inside :meth:`reusing_buffers`, one kept per ``name`` and
        grown as needed."""
        if self._scratch is None:
            return make(rows)
        held = self._scratch.get(name)
        if held is None or held.shape[0] < rows:
            held = self._scratch[name] = make(rows)
        return held[:rows]

    def _answer_in_rounds(self, requests: list[Tensor], places: list[Tensor], out: Tensor) -> None:
        """Send every rank the rows it requested (``requests[r]``: owned global ids), and write the rows this
        rank requested from rank ``r`` into ``out[places[r]]``, in rounds of :attr:`ROUND_BYTES`.  A collective:
        one all-reduce (the number of rounds) and one all-to-all per round."""
        width = math.prod(self.row_shape)
        encoded = self.wire_dtype != "float32"

        def payload(rows: int) -> Tensor:  # what travels: the table's own rows, or their encoding
            return wire.empty_payload(rows, self.wire_dtype, width) if encoded else self.rows.new_empty((rows, width))
        one = payload(1)
        row_bytes = one.numel() * one.element_size()
        per_peer = max(1, self.ROUND_BYTES // (self.world_size * row_bytes))
        largest = max([r.numel() for r in requests] + [p.numel() for p in places])
        rounds = int(self.exchanger.all_reduce(torch.tensor([-(-largest // per_peer)]), op=dist.ReduceOp.MAX)[0])
        most = per_peer * self.world_size
        send_rows = self._buffer("send_rows", lambda rows: self.rows.new_empty((rows, width)),
                                 min(most, sum(r.numel() for r in requests)))
        send = self._buffer("send", payload, send_rows.shape[0]) if encoded else send_rows
        arrived = self._buffer("arrived", payload, min(most, out.shape[0]))
        for start in range(0, rounds * per_peer, per_peer):
            asked = [r[start:start + per_peer] for r in requests]
            into = [p[start:start + per_peer] for p in places]
            sent, got = sum(a.numel() for a in asked), sum(i.numel() for i in into)
            rows = self.read_owned(torch.cat(asked) - self.start, out=send_rows[:sent].view(-1, *self.row_shape))
            if encoded:
                send[:sent] = wire.encode(rows.view(-1, width), self.wire_dtype)
            self.exchanger.exchange_into(send[:sent], [a.numel() for a in asked], arrived[:got],
                                         [i.numel() for i in into])
            rows = wire.decode(arrived[:got], self.wire_dtype, width) if encoded else arrived[:got]
            out.index_copy_(0, torch.cat(into), rows.view(-1, *self.row_shape))

    def gather_grouped(self, ids: Tensor, out: Tensor) -> Tensor:
        """Rows of ``ids`` into ``out`` in an order of this table's choosing; returns that order.

        ``out[i]`` becomes the row of ``ids[order[i]]``: owned rows first, then cached, then
        fetched (in ascending id order, grouped by owner).  Every group is then one sequential write
        (``index_select`` into a slice, the fetched rows straight from the all-to-all), where
        :meth:`gather`'s caller-ordered result needs a scatter per group (about a third of a
        mini-batch's fetch time at 56k rows x 100 features).  Categories are found by search and
        sort; with the id map, :meth:`gather_ordered` is cheaper.  A collective.

        Args:
            ids: int64 [k] global ids, no repeats.
            out: [k, ...] contiguous, this table's dtype.
        """
        ids = torch.as_tensor(ids, dtype=torch.int64)
        local = (ids >= self.start) & (ids < self.end)
        category = torch.where(local, 0, 2)
        slot = None
        if self.cache_ids.numel():
            slot = torch.searchsorted(self.cache_ids, ids).clamp_(max=self.cache_ids.numel() - 1)
            category[~local & (self.cache_ids.index_select(0, slot) == ids)] = 1
        order = torch.argsort(category * int(self.offsets[-1]) + ids)
        num_local, num_cached, num_missing = torch.bincount(category, minlength=3).tolist()
        ordered = ids.index_select(0, order)
        self.read_owned(ordered[:num_local] - self.start, out=out[:num_local])
        if num_cached:
            assert slot is not None
            cached = order[num_local:num_local + num_cached]
            torch.index_select(self.cache_rows, 0, slot.index_select(0, cached), out=out[num_local:num_local + num_cached])
        self._fetch_missing(ordered[num_local + num_cached:], out[num_local + num_cached:])
        self._count(num_local, num_cached, num_missing)
        return order

    def gather_ordered(self, ids: Tensor, out: Tensor) -> None:
        """Rows of ``ids`` into ``out`` in the caller's order, through the id map (:attr:`use_id_map`).

        Owned and cached rows sit in one table (:meth:`_where_map` joins them), so one gather
        writes every row that is here in order; rows fetched from their owners (ascending ids,
        grouped by owner) are then scattered into their places, a few percent of a batch once a
        cache holds most of what it reads.  ``scripts/bench_gather.py``: 6.2-7.2 ms for the 62k input
        rows (x 100 float32) of 1000 seeds at fanouts 10,25 on the 1M-node graph, one thread, against
        3.6-5.3 for one process's plain gather and 17-22 for :meth:`gather_grouped` by search and sort
        with a renumbered first block.  A collective (unless the cache is complete).

        Args:
            ids: int64 [k] global ids.
            out: [k, ...] contiguous, this table's dtype.
        """
        where = self._where_map()
        if where is None:
            raise ValueError("gather_ordered needs the id map: set use_id_map on a table whose graph fits "
                             f"{self.WHERE_MAP_BYTES // 2**20} MiB at 4 bytes a node")
        ids = torch.as_tensor(ids, dtype=torch.int64)
        found = where.index_select(0, ids).long()
        missing_pos = torch.nonzero(found < 0).squeeze(1)
        num_missing = missing_pos.numel()
        num_cached = int((found >= self.rows.shape[0]).sum())
        found.index_fill_(0, missing_pos, 0)  # any row here: overwritten by the fetched one below
        gather_rows(self._joined, found, out)
        missing, by_id = torch.sort(ids.index_select(0, missing_pos))
        fetched = out.new_empty((num_missing, *out.shape[1:]))
        self._fetch_missing(missing, fetched)
        out.index_copy_(0, missing_pos.index_select(0, by_id), fetched)
        self._count(ids.numel() - num_cached - num_missing, num_cached, num_missing)

    def _count(self, local: int, cached: int, remote: int) -> None:
        self.stats.local_rows += local
        self.stats.cache_hits += cached
        self.stats.remote_rows += remote

    def _fetch_missing(self, missing: Tensor, out: Tensor) -> None:
        """Rows of ``missing`` (ascending remote ids) from their owners into ``out``: a collective, except
        with a complete cache, where every rank skips it (and ``missing`` must be empty)."""
        if self.cache_complete:
            if missing.numel():  # the peers make no exchange: asking would hang them
                raise RuntimeError(f"rank {self.rank} needs {missing.numel()} remote rows (e.g. global id "
                                   f"{int(missing[0])}) that a complete cache should hold")
            return
        sizes = torch.bincount(self.owner(missing), minlength=self.world_size).tolist()
        requests = self.exchanger.exchange(list(missing.split(sizes)))
        self._answer(requests, sizes, out=out)

    def _where_map(self) -> Tensor | None:
        """int32 [num_nodes]: each global id's row in the joined table (owned rows, then cached), or -1; built
        on first use after each cache fill.  None without :attr:`use_id_map` or over :attr:`WHERE_MAP_BYTES`."""
        num_nodes = int(self.offsets[-1])
        if not self.use_id_map or 4 * num_nodes > self.WHERE_MAP_BYTES:
            return None
        if self._where is None or self._where_for is not self.cache_ids:
            self._join_rows()
            owned = self.rows.shape[0]
            where = torch.full((num_nodes,), -1, dtype=torch.int32)
            where[self.start:self.end] = torch.arange(owned, dtype=torch.int32)
            where[self.cache_ids] = owned + torch.arange(self.cache_ids.numel(), dtype=torch.int32)
            self._where, self._where_for = where, self.cache_ids
        return self._where

    def _join_rows(self) -> None:
        """Owned then cached rows in one contiguous table; :attr:`rows` and :attr:`cache_rows` become its
        two views (the separate copies are freed; while joining, both exist once)."""
        if not self.cache_rows.numel():
            self._joined = self.rows
            return
        joined = torch.cat([self.rows, self.cache_rows])
        self.rows, self.cache_rows = joined[:self.rows.shape[0]], joined[self.rows.shape[0]:]
        self._joined = joined

    def _answer(self, requests: list[Tensor], sizes: list[int], out: Tensor | None = None) -> Tensor:
        """Send every rank the rows it requested and receive those this rank requested: a collective.

        Args:
            requests: int64 global ids (owned here) that rank ``r`` asked for, one tensor per rank.
            sizes: how many rows each rank sends here (this rank's own requests, by owner).
            out: contiguous [sum(sizes), ...] buffer for the received rows; float32 lands there
                straight from the all-to-all, other wire dtypes are decoded into it.

        Returns:
            The received rows [sum(sizes), ...] in rank order, in this table's dtype (``out`` when given).
        """
        if self.wire_dtype == "float32":
            replies = [self.read_owned(req - self.start) for req in requests]
            received = self.exchanger.exchange(replies, out=out, recv_sizes=sizes)
            return out if out is not None else torch.cat(received)
        width = math.prod(self.row_shape)
        rows = self.read_owned(torch.cat(requests) - self.start)
        payload = wire.encode(rows.view(rows.shape[0], width), self.wire_dtype)
        arrived = wire.empty_payload(sum(sizes), self.wire_dtype, width)
        self.exchanger.exchange(list(payload.split([r.numel() for r in requests])), out=arrived, recv_sizes=sizes)
        if out is None:
            out = self.rows.new_empty((arrived.shape[0], *self.row_shape))
        wire.decode(arrived, self.wire_dtype, width, out=out.view(out.shape[0], width))
        return out

    def gather_batch(self, batch: MiniBatch, out: Callable[[int, Tensor], Tensor]) -> tuple[MiniBatch, Tensor]:
        """The input rows of ``batch`` in ``out(rows, template)``, and the batch renumbered to match them.

        With the id map (:meth:`gather_ordered`) the rows come in the block's own order and the batch
        is returned as it is.  Without it, :meth:`gather_grouped` returns rows in its own order; rather
        than scattering them back into the block's source order, the first block is renumbered: its
        destinations are copied to the front (a layer reads them as ``x[:num_dst]``) and its edges point
        into the table's order.  A destination that is also a source thus appears twice, with equal
        rows; every layer computes the same result.  A collective.
        """
        first = batch.blocks[0]
        num_dst, num_src = first.num_dst, first.num_src
        if self._where_map() is not None:  # rows in the block's own order: nothing to renumber
            x = out(num_src, self.rows)
            self.gather_ordered(first.src_ids, x)
            return batch, x
        x = out(num_dst + num_src, self.rows)
        order = self.gather_grouped(first.src_ids, out=x[num_dst:])
        position = torch.empty_like(order)
        position[order] = torch.arange(num_src)
        torch.index_select(x[num_dst:], 0, position[:num_dst], out=x[:num_dst])
        # Only the numbering changes: edge weights, ids and features stay with their edges.
        renumbered = dataclasses.replace(first, indices=position.index_select(0, first.indices) + num_dst,
                                         src_ids=torch.cat([first.dst_ids, first.src_ids.index_select(0, order)]))
        # replace() keeps the batch's own type and fields (a LinkMiniBatch keeps its pairs).
        return dataclasses.replace(batch, blocks=[renumbered, *batch.blocks[1:]]), x

    def lookup(self, ids: Tensor) -> Tensor:
        """Rows of ``ids`` that are all owned or cached; no communication.

        Raises:
            KeyError: an id is neither owned nor cached.
        """
        ids = torch.as_tensor(ids, dtype=torch.int64)
        out = self.rows.new_empty((ids.numel(), *self.row_shape))
        remote = self._fill_local_and_cached(ids, out)
        if remote.any():
            raise KeyError(f"global id {int(ids[remote][0])} is neither owned by rank {self.rank} "
                           f"([{self.start}, {self.end})) nor cached")
        return out

    def _fill_local_and_cached(self, ids: Tensor, out: Tensor) -> Tensor:
        """Write owned and cached rows into ``out``; returns the bool mask of the rest."""
        local = (ids >= self.start) & (ids < self.end)
        local_pos = torch.nonzero(local).squeeze(1)
        out.index_copy_(0, local_pos, self.read_owned(ids.index_select(0, local_pos) - self.start))
        remote = ~local
        self.stats.local_rows += int(local_pos.numel())
        if self.cache_ids.numel() and local_pos.numel() < ids.numel():
            remote_pos = torch.nonzero(remote).squeeze(1)
            wanted = ids.index_select(0, remote_pos)
            slot = torch.searchsorted(self.cache_ids, wanted).clamp_(max=self.cache_ids.numel() - 1)
            hit = self.cache_ids.index_select(0, slot) == wanted
            hit_pos = remote_pos[hit]
            out.index_copy_(0, hit_pos, self.cache_rows.index_select(0, slot[hit]))
            remote[hit_pos] = False
            self.stats.cache_hits += int(hit_pos.numel())
        return remote

    # ------------------------------------------------------------------ cache
    def fill_cache(self, ids: Tensor) -> None:
        """Cache the rows of ``ids`` (non-owned global ids).  A collective: every rank calls it."""
        ids = torch.unique(torch.as_tensor(ids, dtype=torch.int64))
        assert not ((ids >= self.start) & (ids < self.end)).any(), "owned rows are never cached"
        self.cache_ids = torch.empty(0, dtype=torch.int64)
        rows = self.gather(ids)
        self.cache_ids, self.cache_rows = ids, rows
        self._where_map()  # with the id map: built (owned and cached rows joined) now, not in a batch
        self.stats.reset()

    def fill_cache_by_counts(self, candidates: Tensor, counts: Tensor, max_rows: int) -> None:
        """Cache the ``max_rows`` candidates with the largest counts (ties: smaller id first).  A collective."""
        if max_rows <= 0 or candidates.numel() == 0:
            self.fill_cache(candidates[:0])
            return
        # Stable sort by descending count keeps ascending ids among equals: the choice is deterministic.
        order = torch.sort(-counts, stable=True).indices[:max_rows]
        self.fill_cache(candidates[order])

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_rows.numel() * self.cache_rows.element_size())


def edge_source_counts(indices: np.ndarray, start: int, end: int) -> tuple[Tensor, Tensor]:
    """Non-owned sources of a partition's in-edges and how many edges each one starts.

    Args:
        indices: int64 [num_edges] source global ids of the owned nodes' in-edges.

    Returns:
        ``(ids, counts)``: sorted unique int64 non-owned ids, int64 edge counts.
    """
    ids_parts, count_parts = [], []
    step = 1 << 24  # bounded temporary memory on big partitions
    for lo in range(0, indices.shape[0], step):
        block = np.asarray(indices[lo:lo + step])
        block = block[(block < start) | (block >= end)]
        ids, counts = np.unique(block, return_counts=True)
        ids_parts.append(ids)
        count_parts.append(counts)
    if not ids_parts:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
    every = np.concatenate(ids_parts)
    weights = np.concatenate(count_parts)
    ids, inverse = np.unique(every, return_inverse=True)
    counts = np.bincount(inverse, weights=weights, minlength=ids.shape[0]).astype(np.int64)
    return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(counts)


AUTO_CACHE_MEMORY_SHARE = 0.25
"""``--cache-mb auto``: the share of the memory available at start that one machine's ranks may cache."""


def auto_cache_mb(local_ranks: int) -> float:
    """``--cache-mb auto``'s budget per rank, in MiB: a quarter of the memory available now (within the
    process's memory cgroup, where it has a limit: :func:`gnnscale.memory.available_bytes`), split among the
    ``local_ranks`` ranks of this machine."""
    return available_bytes() * AUTO_CACHE_MEMORY_SHARE / max(1, local_ranks) / 2**20


def cache_rows_for(cache_mb: float, row_shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """How many rows of ``row_shape``/``dtype`` fit in ``cache_mb`` MiB."""
    row_bytes = max(1, int(np.prod(row_shape)) * torch.empty(0, dtype=dtype).element_size())
    return int(cache_mb * 2**20 // row_bytes)
