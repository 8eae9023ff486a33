"""Temporal neighbour sampling and negative destinations for link prediction over an event stream (TGN).

An event stream is ``src`` int64 [E], ``dst`` int64 [E], ``t`` float64 [E] with ``t`` non-decreasing;
event ``e`` is row ``e``.  :class:`TemporalGraph` indexes every node's incident events by time once;
:class:`TemporalNeighborSampler` then answers "which events did node ``v`` take part in before time
``t``" for a whole batch of ``(v, t)`` queries with a few vectorised passes, never a per-node loop.

Leakage guarantee: a query at time ``t`` sees only events with ``t_event < t`` (strictly), so a batch
of events that share a timestamp never sees itself or each other.  The negative samplers follow the
same rule: historical negatives come from events strictly before the batch's first time.

Everything here is numpy on the CPU, and every random draw comes from the ``numpy.random.Generator``
the caller passes to ``sample``, so a batch's draws are a function of (data, batch, generator) alone.
The arrays go to the model as tensors afterwards (``gnnscale.temporal.tgn.Neighborhood``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

Strategy = Literal["recent", "uniform"]

PAD_NEIGHBOR = 0
"""Neighbour id written into padding slots (a valid index, so ``memory[neighbors]`` needs no masking)."""
PAD_TIME = 0.0
"""Time written into padding slots."""
PAD_EVENT = -1
"""Event id written into padding slots (never a real event: clamp before indexing edge features)."""


def _as_ids(name: str, values: object) -> np.ndarray:
    """``values`` as a 1-D int64 array; TypeError/ValueError naming ``name`` otherwise."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer node ids, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _as_times(name: str, values: object) -> np.ndarray:
    """``values`` as a 1-D float64 array without NaN."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    array = array.astype(np.float64, copy=False)
    if np.isnan(array).any():
        raise ValueError(f"{name} holds NaN at index {int(np.flatnonzero(np.isnan(array))[0])}; "
                         f"every time must be a number")
    return array


def _check_events(src: object, dst: object, t: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated ``(src, dst, t)``: equal lengths, integer ids >= 0, times non-decreasing."""
    src, dst, t = _as_ids("src", src), _as_ids("dst", dst), _as_times("t", t)
    if not src.size == dst.size == t.size:
        raise ValueError(f"src, dst and t must have one entry per event, got lengths {src.size}, {dst.size}, {t.size}")
    for name, ids in (("src", src), ("dst", dst)):
        if ids.size and ids.min() < 0:
            raise ValueError(f"{name} holds negative node id {int(ids.min())}; node ids must be >= 0")
    backwards = np.flatnonzero(t[1:] < t[:-1])
    if backwards.size:
        i = int(backwards[0])
        raise ValueError(f"event times must be non-decreasing, but t[{i}]={t[i]} > t[{i + 1}]={t[i + 1]}; "
                         f"sort the events by time (e.g. order = np.argsort(t, kind='stable'))")
    return src, dst, t


class _TimeIndex:
    """Counts, for ``(owner, time)`` queries, the entries of the owner's segment with an earlier time.

    The entries are sorted by owner and, within an owner, by time.  Each gets the composite key
    ``owner * R + rank(time)`` (``R`` distinct times), which is globally sorted, so one
    ``searchsorted`` answers every query at once; the query time's rank is found with ``side='left'``
    among the distinct times, so entries at exactly the query time are not counted.
    """

    def __init__(self, owners: np.ndarray, times: np.ndarray, num_owners: int) -> None:
        self.distinct_times, rank = np.unique(times, return_inverse=True)
        self.num_ranks = int(self.distinct_times.size)
        if num_owners and (num_owners + 1) * (self.num_ranks + 1) >= np.iinfo(np.int64).max:
            raise ValueError(f"{num_owners} nodes x {self.num_ranks} distinct times overflow the int64 search key")
        self.keys = owners * self.num_ranks + rank.reshape(-1).astype(np.int64)

    def ends(self, owners: np.ndarray, times: np.ndarray) -> np.ndarray:
        """int64 [B]: one past the last entry of ``owners[i]``'s segment with time < ``times[i]``."""
        query_rank = np.searchsorted(self.distinct_times, times, side="left")
        return np.searchsorted(self.keys, owners * self.num_ranks + query_rank, side="left")


class TemporalGraph:
    """Every node's incident events, sorted by (time, event id), in CSR form.

    Args:
        src: int64 [E] source of each event.
        dst: int64 [E] destination of each event.
        t: float64 [E] time of each event, non-decreasing (event ``e`` is row ``e``).
        num_nodes: number of nodes; every id in ``src``/``dst`` must be below it.
        undirected: list each event ``(u, v, t)`` under ``u`` (neighbour ``v``) and under ``v``
            (neighbour ``u``), as TGN's ``NeighborFinder`` does; False lists it under ``u`` only.
            A self-loop ``(u, u)`` is then listed twice under ``u``.

    Attributes:
        indptr: int64 [N + 1] segment offsets.
        neighbors: int64 [M] the other endpoint of each listed event.
        times: float64 [M] its time.
        event_ids: int64 [M] its event id.
    """

    def __init__(self, src: object, dst: object, t: object, num_nodes: int, *, undirected: bool = True) -> None:
        src, dst, t = _check_events(src, dst, t)
        num_nodes = int(num_nodes)
        if num_nodes < 0:
            raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
        largest = int(max(src.max(initial=-1), dst.max(initial=-1)))
        if largest >= num_nodes:
            raise ValueError(f"node id {largest} is out of range for num_nodes={num_nodes}; "
                             f"pass num_nodes > the largest id")
        self.num_nodes = num_nodes
        self.num_events = int(t.size)
        self.undirected = undirected
        event = np.arange(self.num_events, dtype=np.int64)
        if undirected:
            # Interleaved (u's copy, v's copy) per event keeps the listing in event order, which is
            # time order, so a stable sort by owner alone leaves each segment sorted by (time, id).
            owners = np.stack([src, dst], axis=1).reshape(-1)
            others = np.stack([dst, src], axis=1).reshape(-1)
            event = np.repeat(event, 2)
        else:
            owners, others = src, dst
        order = np.argsort(owners, kind="stable")
        owners = owners[order]
        self.neighbors = others[order]
        self.event_ids = event[order]
        self.times = t[self.event_ids]
        self.indptr = np.zeros(num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(owners, minlength=num_nodes), out=self.indptr[1:])
        self._index = _TimeIndex(owners, self.times, num_nodes)

    @property
    def num_entries(self) -> int:
        """M: listed (node, event) pairs, 2E when undirected."""
        return int(self.neighbors.size)

    def num_events_before(self, nodes: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start, count)`` int64 [B]: node ``nodes[i]``'s events with time < ``times[i]`` are entries
        ``start[i] : start[i] + count[i]`` of the CSR arrays (inputs already validated)."""
        start = self.indptr[nodes]
        return start, self._index.ends(nodes, times) - start


@dataclass(kw_only=True)
class TemporalNeighbors:
    """Sampled past events of ``B`` query nodes, ``k`` slots per query, right-aligned.

    Real entries of a row are sorted by (time, event id), oldest first, and occupy its last
    columns, so the most recent sampled event is always in column ``k - 1`` (TGN's layout).
    Padding fills the first columns: neighbour ``PAD_NEIGHBOR`` (0), time ``PAD_TIME`` (0.0),
    event id ``PAD_EVENT`` (-1), mask False.
    """

    neighbors: np.ndarray
    """int64 [B, k] the other endpoint of each sampled event."""
    times: np.ndarray
    """float64 [B, k] the sampled event's time (< the query's time)."""
    event_ids: np.ndarray
    """int64 [B, k] the sampled event's id (its row in the stream)."""
    mask: np.ndarray
    """bool [B, k] True for a real entry, False for padding."""


class TemporalNeighborSampler:
    """Samples, for each ``(node, time)`` query, ``num_neighbors`` of the node's events strictly before that time.

    Args:
        graph: the indexed event stream.
        num_neighbors: k, slots per query (>= 1).
        strategy: ``"recent"``: the k most recent eligible events (fewer when fewer exist, padded);
            ``"uniform"``: k draws uniformly *with replacement* from the eligible events (TGN's
            ``uniform=True``), so a row is either full or, with no eligible event, all padding.
    """

    def __init__(self, graph: TemporalGraph, num_neighbors: int, strategy: Strategy = "recent") -> None:
        if int(num_neighbors) < 1:
            raise ValueError(f"num_neighbors must be >= 1, got {num_neighbors}")
        if strategy not in get_args(Strategy):
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(get_args(Strategy))}")
        self.graph = graph
        self.num_neighbors = int(num_neighbors)
        self.strategy = strategy

    def sample(self, nodes: object, times: object, rng: np.random.Generator) -> TemporalNeighbors:
        """Sample the past events of ``nodes`` (int64 [B]) before ``times`` (float64 [B]), drawing from
        ``rng`` (only ``"uniform"`` draws; ``"recent"`` leaves it untouched).  Nodes without events, or
        queried at or before their first event, get all-padding rows."""
        nodes, times = _as_ids("nodes", nodes), _as_times("times", times)
        if nodes.size != times.size:
            raise ValueError(f"nodes and times must have one entry per query, "
                             f"got lengths {nodes.size} and {times.size}")
        if nodes.size and (nodes.min() < 0 or nodes.max() >= self.graph.num_nodes):
            bad = nodes[(nodes < 0) | (nodes >= self.graph.num_nodes)][0]
            raise ValueError(f"query node {int(bad)} is out of range for a graph of {self.graph.num_nodes} nodes")
        k = self.num_neighbors
        start, count = self.graph.num_events_before(nodes, times)
        end = start + count
        if self.strategy == "recent":
            position = end[:, None] + np.arange(-k, 0, dtype=np.int64)
            mask = position >= start[:, None]
        else:
            mask = np.zeros((nodes.size, k), dtype=bool)
            position = np.zeros((nodes.size, k), dtype=np.int64)
            rows = np.flatnonzero(count)
            mask[rows] = True
            draws = rng.random((rows.size, k)) * count[rows, None]
            # Each segment is sorted by (time, id), so sorting positions sorts the row by time.
            position[rows] = np.sort(start[rows, None] + draws.astype(np.int64), axis=1)
        return self._gather(position, mask)

    def _gather(self, position: np.ndarray, mask: np.ndarray) -> TemporalNeighbors:
        """The CSR entries at ``position`` [B, k], padding where ``mask`` is False."""
        graph = self.graph
        if graph.num_entries == 0:  # nothing to index: every slot is padding
            mask = np.zeros_like(mask)
            neighbors = np.full(position.shape, PAD_NEIGHBOR, dtype=np.int64)
            return TemporalNeighbors(neighbors=neighbors, times=np.full(position.shape, PAD_TIME),
                                     event_ids=np.full(position.shape, PAD_EVENT, dtype=np.int64), mask=mask)
        safe = np.where(mask, position, 0)
        return TemporalNeighbors(
            neighbors=np.where(mask, graph.neighbors[safe], PAD_NEIGHBOR),
            times=np.where(mask, graph.times[safe], PAD_TIME),
            event_ids=np.where(mask, graph.event_ids[safe], PAD_EVENT),
            mask=mask,
        )


class RandomDestinationSampler:
    """Negative destinations drawn uniformly from a fixed pool of node ids (TGN's ``RandEdgeSampler``).

    Args:
        destinations: int64 [D] candidate ids, e.g. every distinct destination in the data;
            repeats are collapsed, so the draw is uniform over distinct ids.
    """

    def __init__(self, destinations: object) -> None:
        pool = _as_ids("destinations", destinations)
        if pool.size == 0:
            raise ValueError("destinations is empty; give at least one candidate node id")
        self.pool = np.unique(pool)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """int64 [n] destinations, uniform over the pool (with replacement; may equal a positive's),
        drawing from ``rng``."""
        if int(n) < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return self.pool[rng.integers(0, self.pool.size, int(n))]


class SeenDestinationSampler:
    """Negative destinations drawn uniformly from the distinct destinations seen so far in a stream.

    Args:
        destinations: int64 [E] the destination of each event, in stream order.

    ``sample(n, rng, upto)`` draws among the destinations of events ``0 .. upto - 1``: the nodes a
    model has seen as destinations by then, so no negative is a node the stream has not reached
    (whose memory is still empty, an easy negative that teaches nothing).  The distinct
    destinations are kept in order of first appearance, so the pool of any prefix is a prefix of
    that order and a draw costs one search.
    """

    def __init__(self, destinations: object) -> None:
        stream = _as_ids("destinations", destinations)
        if stream.size == 0:
            raise ValueError("destinations is empty; give the destination of at least one event")
        nodes, first = np.unique(stream, return_index=True)
        order = np.argsort(first, kind="stable")
        self.pool, self.first_seen = nodes[order], first[order]

    def sample(self, n: int, rng: np.random.Generator, upto: int) -> np.ndarray:
        """int64 [n] destinations, uniform over the distinct destinations of events before position
        ``upto`` (at least 1), drawing from ``rng``."""
        if int(n) < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if int(upto) < 1:
            raise ValueError(f"upto must be >= 1 (at least one event seen), got {upto}")
        count = int(np.searchsorted(self.first_seen, int(upto)))
        return self.pool[rng.integers(0, count, int(n))]


class HistoricalNegativeSampler:
    """Historical negative destinations (Poursafaei et al. 2022): nodes that *were* destinations before the batch.

    For a batch whose first event is at time ``t0 = min(batch_time)``, the history is every event
    with time strictly before ``t0``.  Row ``i`` draws uniformly among the *distinct* historical
    destinations, leaving out ``batch_dst[i]`` (the positive's own destination) when it is given:

    * ``per_source=False`` (default): destinations of any historical event;
    * ``per_source=True``: destinations of historical events *from* ``batch_src[i]`` (TGB-style: a
      past partner of the source that it does not link to now).

    Fallback: a row with no candidate (no history yet, a source without history, or only its own
    destination) gets a uniform draw from ``fallback`` instead, which may equal ``batch_dst[i]``.

    Args:
        src, dst, t: the event stream (``t`` non-decreasing), usually the training events.
        fallback: int64 [D] pool for the fallback (default: every distinct ``dst``).
        per_source: restrict row ``i``'s candidates to ``batch_src[i]``'s own history.
    """

    def __init__(self, src: object, dst: object, t: object, *, fallback: object | None = None,
                 per_source: bool = False) -> None:
        src, dst, t = _check_events(src, dst, t)
        self.per_source = per_source
        if fallback is None and dst.size == 0:
            raise ValueError("the event stream is empty, so there is no default fallback pool; pass fallback=")
        self.fallback = RandomDestinationSampler(dst if fallback is None else fallback)
        owners = src if per_source else np.zeros_like(src)
        # Distinct (owner, destination) pairs; the first occurrence is the earliest, events being time-sorted.
        self._width = int(dst.max(initial=-1)) + 1
        pair_keys, first = np.unique(owners * self._width + dst, return_index=True)
        pair_owner, pair_time = owners[first], t[first]
        order = np.lexsort((first, pair_owner))  # by owner, then first appearance (hence time)
        self._candidates = dst[first[order]]
        self._pair_keys = pair_keys
        self._pair_position = np.empty(order.size, dtype=np.int64)  # CSR slot of each sorted pair key
        self._pair_position[order] = np.arange(order.size, dtype=np.int64)
        self._num_owners = int(owners.max(initial=-1)) + 1
        self._indptr = np.zeros(self._num_owners + 1, dtype=np.int64)
        np.cumsum(np.bincount(pair_owner, minlength=self._num_owners), out=self._indptr[1:])
        self._index = _TimeIndex(pair_owner[order], pair_time[order], self._num_owners)

    def sample(self, batch_src: object, batch_time: object, rng: np.random.Generator, *,
               batch_dst: object | None = None) -> np.ndarray:
        """int64 [B] one negative destination per positive ``(batch_src[i], batch_dst[i], batch_time[i])``,
        drawing from ``rng``."""
        batch_src, batch_time = _as_ids("batch_src", batch_src), _as_times("batch_time", batch_time)
        if batch_src.size != batch_time.size:
            raise ValueError(f"batch_src and batch_time must have one entry per positive, "
                             f"got lengths {batch_src.size} and {batch_time.size}")
        if batch_dst is not None:
            batch_dst = _as_ids("batch_dst", batch_dst)
            if batch_dst.size != batch_src.size:
                raise ValueError(f"batch_dst must have one entry per positive like batch_src, "
                                 f"got lengths {batch_dst.size} and {batch_src.size}")
        size = batch_src.size
        if size == 0:
            return np.empty(0, dtype=np.int64)
        owners = batch_src if self.per_source else np.zeros(size, dtype=np.int64)
        known = (owners >= 0) & (owners < self._num_owners)
        owner = np.where(known, owners, 0)
        start = self._indptr[owner]
        first_time = np.full(size, batch_time.min())
        count = np.where(known, self._index.ends(owner, first_time) - start, 0)
        # Leave out the positive's own destination: draw from count - 1 slots and step over its slot.
        skip = np.full(size, -1, dtype=np.int64)
        if batch_dst is not None and self._pair_keys.size:
            key = owner * self._width + batch_dst
            where = np.minimum(np.searchsorted(self._pair_keys, key), self._pair_keys.size - 1)
            slot = self._pair_position[where] - start
            found = (known & (batch_dst >= 0) & (batch_dst < self._width)
                     & (self._pair_keys[where] == key) & (slot < count))
            skip = np.where(found, slot, -1)
        choices = count - (skip >= 0)
        out = np.empty(size, dtype=np.int64)
        rows = np.flatnonzero(choices > 0)
        pick = (rng.random(rows.size) * choices[rows]).astype(np.int64)
        pick += (skip[rows] >= 0) & (pick >= skip[rows])
        out[rows] = self._candidates[start[rows] + pick]
        empty = np.flatnonzero(choices <= 0)
        out[empty] = self.fallback.sample(empty.size, rng)
        return out
