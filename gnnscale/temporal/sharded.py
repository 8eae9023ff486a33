"""Node memory shared by ranks that each compute a share of every global batch, never more than K steps behind.

Every rank holds a memory table: every node in the default dense table, or (``cache_rows``) only
the nodes it *owns* (a METIS partition of the interaction graph, :func:`partition_interactions`)
plus a bounded cache of other nodes, evicted least recently read first.  One global step (one
global batch, split across ranks) goes::

    shard.read(needed)              # every node the step reads; missing ones admitted (fetched from owners)
    view = tm.updated(needed)
    ... embeddings, loss, gradients all-reduced, optimizer step ...
    shard.write(batch, ranks, view) # this rank's writes applied here at once
    shard.end_step()                # every P steps: the write log of those steps goes to every rank

**Write log.**  What a step writes is known everywhere but for the memory values: which rank
computed which event of the batch is a deterministic rule, so every rank knows which nodes each
rank persisted (its events' endpoints) and which messages it sent (its events' ``[s_u, s_v, e]``,
whose memory rows are the persisted ones).  A rank therefore sends only its persisted rows
(memory and last-update time), in a canonical order, into a buffer whose size every rank knows:
one all-gather of fixed-size buffers per flush, without a round of sizes.  Every rank then replays
the flushed steps in order on the rows it holds (the same overwrites a single process makes: a
node's persisted row, then its aggregated mail, ordered by the global batch's keys) and re-applies
its own later writes.  With ``K = 0`` the flush follows every step and every read is exactly what
a single process reads.

**Overlap.**  With ``K >= 1`` a flush covers ``P = K`` steps and runs while the next step
computes: it is started at the end of step ``s`` and applied at the end of step ``s + 1``.  A read
at step ``r`` then has every write through step ``c`` applied, where ``r - c - 1 <= K``.

**Staleness** (docs/temporal.md, "Sharded memory").  A read at step ``r`` by a rank whose writes
through step ``c`` are complete (its *version*) may miss the writes of other ranks at steps
``c < m < r``; its staleness is ``r - m`` for the earliest such write (0 if none): never more than
K by the schedule above, and measured, not assumed: every rank scores its reads against the write
log once it has it (:class:`StalenessStats`).  A rank's own writes are applied at once, so they are
never missed; writes of others count as missed even where the row happened to hold them (a fetched
row), so the figure is an upper bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from gnnscale.distributed import wire
from gnnscale.distributed.comm import Exchanger, split_by_owner
from gnnscale.temporal.memory import MemoryView, TemporalMemory, last_occurrence

log = logging.getLogger("gnnscale.temporal")

STEP_STRIDE = 1 << 31  # node * STEP_STRIDE + step orders writes by node, then step


@dataclass
class StalenessStats:
    """Reads of one pass (or run) and how stale they were, in global steps."""

    reads: int = 0
    """Rows read (each step's distinct needed nodes)."""
    remote_reads: int = 0
    """Of those, rows of nodes owned by another rank."""
    stale_reads: int = 0
    """Reads that may have missed at least one write of another rank."""
    staleness_sum: int = 0
    staleness_max: int = 0
    fetched: int = 0
    """Rows fetched from their owners (a bounded cache's misses)."""

    def as_dict(self) -> dict[str, float]:
        reads = max(self.reads, 1)
        return {"staleness_max": self.staleness_max, "staleness_mean": self.staleness_sum / reads,
                "stale_read_fraction": self.stale_reads / reads,
                "remote_read_fraction": self.remote_reads / reads, "fetched_rows": self.fetched,
                "reads": self.reads, "remote_reads": self.remote_reads}

    def to_tensor(self) -> Tensor:
        return torch.tensor([self.reads, self.remote_reads, self.stale_reads, self.staleness_sum, self.fetched],
                            dtype=torch.int64)


@dataclass
class ReadWriteLog:
    """Every read ``(node, step, version)`` and own write ``(node, step)`` of this rank, for tests."""

    reads: list[Tensor] = field(default_factory=list)
    writes: list[Tensor] = field(default_factory=list)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        reads = torch.cat(self.reads).numpy() if self.reads else np.empty((0, 3), np.int64)
        writes = torch.cat(self.writes).numpy() if self.writes else np.empty((0, 2), np.int64)
        return reads, writes


@dataclass
class StepWrites:
    """One global step's batch as every rank sees it (CPU tensors): events ``src -> dst`` at ``t``,
    their features ``e`` (any device, or ``None``), and ``ranks``, the rank computing each event."""

    step: int
    src: Tensor
    dst: Tensor
    t: Tensor
    e: Tensor | None
    ranks: Tensor
    rows: tuple[Tensor, Tensor] | None = None
    """This rank's persisted rows once written, exact, on the CPU: ``(memory, last_update)``."""
    _ends: dict[int, Tensor] = field(default_factory=dict)

    def events(self, rank: int) -> Tensor:
        return torch.nonzero(self.ranks == rank).squeeze(1)

    def ends(self, rank: int) -> Tensor:
        """The distinct endpoints of rank ``rank``'s events: the nodes it persisted, sorted."""
        if rank not in self._ends:
            mine = self.events(rank)
            self._ends[rank] = torch.unique(torch.cat([self.src[mine], self.dst[mine]]))
        return self._ends[rank]


class ShardedMemory:
    """The write log, the flushes, the bounded cache and the staleness figures around one rank's
    :class:`TemporalMemory`.

    In a world of one (``exchanger.group is None``) every node is held, nothing is sent and every
    read is exact: the single-process path is this class with nothing to do.

    Args:
        memory: this rank's memory module.
        owner: int64 [N], the rank owning each node (always held; serves fetches of it).
        staleness: K >= 0, the most global steps a read may be behind the writes of other ranks.
        exchanger: collectives over the training group (every rank calls in the same order).
        cache_rows: rows for nodes owned elsewhere (``None``: a dense table of every node).
        record: keep every read and own write in :attr:`log` (tests check the bound against it).
        wire_dtype: how memory and mail rows cross ranks (:mod:`gnnscale.distributed.wire`); times travel
            exactly.  A lossy code's rows are decoded alike on every rank, the sender's own included, so
            after a flush every rank holds the same row; until then a rank reads its own writes exactly.
    """

    def __init__(self, memory: TemporalMemory, owner: Tensor, *, staleness: int, exchanger: Exchanger,
                 cache_rows: int | None = None, record: bool = False, wire_dtype: str = "float32") -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0 global steps, got {staleness}")
        n = memory.state.num_nodes
        if owner.shape != (n,):
            raise ValueError(f"owner has shape {tuple(owner.shape)}, expected ({n},): one rank per node")
        if n and (int(owner.min()) < 0 or int(owner.max()) >= exchanger.world_size):
            raise ValueError(f"owner ranks must be in [0, {exchanger.world_size}), got "
                             f"[{int(owner.min())}, {int(owner.max())}]")
        if cache_rows is not None and cache_rows < 0:
            raise ValueError(f"cache_rows must be >= 0, got {cache_rows}")
        if wire.check_wire_dtype(wire_dtype) != "float32" and memory.state.dtype != torch.float32:
            raise TypeError(f"wire dtype {wire_dtype} encodes float32 memory only, and this one is "
                            f"{memory.state.dtype}: give wire_dtype='float32'")
        self.wire_dtype = wire_dtype
        self.memory, self.staleness, self.exchanger = memory, staleness, exchanger
        self.rank, self.world_size = exchanger.rank, exchanger.world_size
        self.owner = owner.to(torch.int64).cpu()
        self.owned = self.owner == self.rank
        self.period = max(staleness, 1)
        self.bounded = cache_rows is not None and exchanger.world_size > 1
        if self.bounded:
            owned = torch.nonzero(self.owned).squeeze(1)
            state = memory.state
            memory.state = type(state)(n, state.config, state.device, capacity=owned.numel() + cache_rows)
            memory.state.to(state.device, state.dtype)
            memory.state.admit(owned.to(state.device))
        self.cache_rows = cache_rows
        self.touched = torch.zeros(n, dtype=torch.bool)  # written by some rank, as far as this rank knows
        self.last_read = torch.zeros(n, dtype=torch.int64)
        self.stats = StalenessStats()
        self.log = ReadWriteLog() if record else None
        self.step = 0
        self.complete = -1  # every write through this step is applied here
        self._pending: list[StepWrites] = []  # steps written since `complete`, in order
        self._in_flight: tuple[int, Tensor, Callable[[], list[Tensor]]] | None = None
        self._reads: list[Tensor] = []  # (node, step, version) of reads not yet scored
        self._others: Tensor = torch.empty((0, 2), dtype=torch.int64)  # others' writes (node, step), not yet used

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Forget every node's memory (the start of each epoch over the stream); counters are kept."""
        self.refresh()
        self.memory.state.reset()
        # The reset is the same write on every rank at once: every row is current as of now.
        self.begin_pass()
        self.touched.zero_()

    def begin_pass(self) -> None:
        """Start a pass over a stream (after a :meth:`refresh`): the step count moves on to the next
        multiple of the flush period, so every pass flushes at the same points of its own steps, and a
        pass repeated from the same state reads exactly the same rows."""
        self.step = -(-self.step // self.period) * self.period
        self.complete = self.step - 1

    def state_dict(self, copy: bool = True) -> dict[str, Tensor]:
        """The memory state and what this rank knows of it (call after :meth:`refresh`); ``copy=False``:
        the live tensors (:meth:`MemoryState.state_dict`)."""
        known = {"touched": self.touched, "last_read": self.last_read}
        return {**self.memory.state.state_dict(copy), **{k: v.clone() if copy else v for k, v in known.items()}}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        state = dict(state)
        self.touched, self.last_read = state.pop("touched").clone(), state.pop("last_read").clone()
        self.memory.state.load_state_dict(state)

    def take_stats(self) -> StalenessStats:
        """This rank's counters since the last call, and start new ones."""
        stats, self.stats = self.stats, StalenessStats()
        return stats

    @property
    def rows(self) -> int:
        """Rows of this rank's memory table."""
        return self.memory.state.capacity

    # ------------------------------------------------------------------ one step
    def read(self, nodes: Tensor) -> None:
        """The distinct ``nodes`` a step is about to read: logged, and held from now on (a bounded
        cache admits the missing ones, fetching from their owners those written before)."""
        nodes = torch.unique(nodes.cpu())
        self.stats.reads += nodes.numel()
        self.stats.remote_reads += int((~self.owned[nodes]).sum())
        self.last_read[nodes] = self.step
        if self.world_size > 1:
            read = torch.stack([nodes, torch.full_like(nodes, self.step), torch.full_like(nodes, self.complete)], 1)
            self._reads.append(read)
            if self.log is not None:
                self.log.reads.append(read)
        if self.bounded:
            self._hold(nodes)

    @torch.no_grad()
    def write(self, batch: StepWrites, view: MemoryView) -> None:
        """Apply this rank's writes of ``batch`` here (its events' endpoints persisted from ``view``,
        its events' messages delivered) and log them for the next flush."""
        mine = batch.events(self.rank)
        ends = batch.ends(self.rank)
        device = self.memory.state.memory.device
        view = view.detach()
        at = view.index(ends.to(device))
        if self.world_size == 1 or self.staleness > 0:  # K = 0: the flush right after this step applies them
            self._apply_rank(batch, self.rank, ends, view.memory[at], view.last_update[at], only_held=False)
        if self.world_size == 1:
            return
        batch.rows = (view.memory[at].cpu(), view.last_update[at].cpu())
        self._pending.append(batch)
        self.touched[ends] = True
        if self.log is not None and mine.numel():
            self.log.writes.append(torch.stack([ends, torch.full_like(ends, batch.step)], 1))

    def end_step(self) -> None:
        """Close global step ``self.step``: apply a flush in flight, and start (``K >= 1``) or run
        (``K = 0``) the next one when ``P`` steps have passed since the last."""
        self.step += 1
        if self.world_size == 1:
            return
        self._finish_flush()
        if self.step % self.period == 0:
            self._start_flush()
            if self.staleness == 0:
                self._finish_flush()

    def refresh(self) -> None:
        """Apply every write so far on every rank (the end of a pass: every table complete)."""
        if self.world_size == 1:
            return
        self._finish_flush()
        if self._pending:
            self._start_flush()
            self._finish_flush()

    # ------------------------------------------------------------------ flushes
    def _to_wire(self, memory: Tensor, last_update: Tensor) -> Tensor:
        """uint8 rows: ``memory`` in the wire dtype, then the float64 times' 8 bytes."""
        return torch.cat([wire.to_bytes(memory, self.wire_dtype), last_update.reshape(-1, 1).view(torch.uint8)], 1)

    def _from_wire(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """``(memory, last_update)`` of :meth:`_to_wire`'s rows, in the memory's dtype."""
        d, dtype = self.memory.config.memory_dim, self.memory.state.dtype
        width = wire.byte_width(self.wire_dtype, d, dtype)
        memory = wire.from_bytes(rows[:, :width], self.wire_dtype, d, dtype)
        return memory, wire.bytes_as(rows[:, width:], torch.float64).reshape(-1)

    def _start_flush(self) -> None:
        """Send the pending steps' rows to every rank, each rank's buffer as long as the longest."""
        steps = self._pending
        counts = torch.tensor([[step.ends(r).numel() for r in range(self.world_size)] for step in steps]).reshape(
            len(steps), self.world_size)
        width = wire.byte_width(self.wire_dtype, self.memory.config.memory_dim, self.memory.state.dtype) + 8
        buffer = torch.zeros(int(counts.sum(0).max()), width, dtype=torch.uint8)
        if steps:
            memory, last_update = (torch.cat(parts) for parts in zip(*(step.rows for step in steps)))
            buffer[:memory.shape[0]] = self._to_wire(memory, last_update)
        self._in_flight = (len(steps), counts, self.exchanger.all_gather_start(buffer))

    def _finish_flush(self) -> None:
        """Apply the flush in flight: replay its steps on the rows held here, then this rank's later writes."""
        if self._in_flight is None:
            return
        length, counts, finish = self._in_flight
        self._in_flight = None
        gathered = finish()
        flushed, self._pending = self._pending[:length], self._pending[length:]
        offsets = torch.cat([torch.zeros(1, self.world_size, dtype=torch.int64), counts.cumsum(0)])
        others = []
        for i, step in enumerate(flushed):
            for rank in range(self.world_size):
                ends = step.ends(rank)
                if rank != self.rank:
                    self.touched[ends] = True
                    others.append(torch.stack([ends, torch.full_like(ends, step.step)], 1))
            self._replay(step, [gathered[r][offsets[i, r]:offsets[i + 1, r]] for r in range(self.world_size)])
        for step in self._pending:  # this rank's writes after the flushed steps win again
            ends = step.ends(self.rank)
            memory, last_update = step.rows
            device = self.memory.state.memory.device
            self._apply_rank(step, self.rank, ends, memory.to(device), last_update.to(device), only_held=False)
        if flushed:
            self.complete = flushed[-1].step
        self._others = torch.cat([self._others, *others])
        self._score_reads()

    def _replay(self, step: StepWrites, rows: list[Tensor]) -> None:
        """Step ``step``'s writes by every rank, in the order one process makes them: persisted rows
        (a node persisted by several ranks keeps the last rank's), then the aggregated messages."""
        device = self.memory.state.memory.device
        ends = [step.ends(r) for r in range(self.world_size)]
        unpacked = [self._from_wire(r) for r in rows]
        nodes = torch.cat(ends)
        memory = torch.cat([m for m, _ in unpacked]).to(device)
        last_update = torch.cat([t for _, t in unpacked]).to(device)
        unique, _, last = last_occurrence(nodes)
        keep = self._held(unique)
        self.memory.set_rows(unique[keep].to(device), memory[last[keep]], last_update[last[keep]])
        messages = [self._messages(step, r, MemoryView(ends[r].to(device), m.to(device), t.to(device)))
                    for r, (m, t) in enumerate(unpacked)]
        self._deliver(*(torch.cat(parts) for parts in zip(*messages)), only_held=True)

    def _apply_rank(self, step: StepWrites, rank: int, ends: Tensor, memory: Tensor, last_update: Tensor, *,
                    only_held: bool) -> None:
        """Rank ``rank``'s writes of ``step`` alone: its persisted rows, then its messages."""
        device = self.memory.state.memory.device
        self.memory.set_rows(ends.to(device), memory, last_update)
        self._deliver(*self._messages(step, rank, MemoryView(ends.to(device), memory, last_update)),
                      only_held=only_held)

    def _messages(self, step: StepWrites, rank: int, view: MemoryView) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Rank ``rank``'s messages of ``step`` from its persisted rows ``view``, keyed by position in the
        global batch (sources first): ``(nodes, times, keys, messages)``."""
        device = view.memory.device
        mine = step.events(rank)
        features = None if step.e is None else step.e[mine.to(step.e.device)].to(device)
        nodes, times, messages = self.memory.make_messages(
            step.src[mine].to(device), step.dst[mine].to(device), step.t[mine].to(device), view, features)
        keys = torch.cat([mine, step.src.numel() + mine]).to(device)
        return nodes, times, keys, messages

    def _deliver(self, nodes: Tensor, times: Tensor, keys: Tensor, messages: Tensor, *, only_held: bool) -> None:
        if only_held:
            keep = self._held(nodes.cpu()).to(nodes.device)
            nodes, times, keys, messages = nodes[keep], times[keep], keys[keep], messages[keep]
        if nodes.numel():
            self.memory.deliver(nodes, times, keys, messages)

    def _held(self, nodes: Tensor) -> Tensor:
        """Which of ``nodes`` (CPU) have a row here."""
        if not self.bounded:
            return torch.ones(nodes.shape, dtype=torch.bool)
        return self.memory.state.slot[nodes.to(self.memory.state.slot.device)].cpu() >= 0

    # ------------------------------------------------------------------ the bounded cache
    def _hold(self, nodes: Tensor) -> None:
        """Give every one of ``nodes`` a row: never-written ones start from zero, the others are
        fetched from their owners (two exchanges, made by every rank every step)."""
        state = self.memory.state
        missing = nodes[~self._held(nodes)]
        self._evict(missing.numel(), keep=nodes)
        if missing.numel():
            state.admit(missing.to(state.device))
        wanted = missing[self.touched[missing]]
        order, sizes = split_by_owner(self.owner[wanted], self.world_size)
        wanted = wanted[order]
        asked = self.exchanger.exchange(list(wanted.split(sizes)))
        got = torch.cat(self.exchanger.exchange([self._pack_state(a) for a in asked], recv_sizes=sizes))
        self.stats.fetched += wanted.numel()
        if wanted.numel():
            self._unpack_state(wanted, got)

    _TIMES = ("last_update", "mail_time")

    def _pack_state(self, nodes: Tensor) -> Tensor:
        """Whole rows of held ``nodes`` as uint8: memory and mail in the wire dtype, then the float64
        times and the mail flag bit-exact."""
        state = self.memory.state
        rows = state.rows(nodes.to(state.device))
        exact = torch.stack([state.last_update[rows], state.mail_time[rows], state.has_mail[rows].to(torch.float64)], 1)
        return torch.cat([wire.to_bytes(state.memory[rows].cpu(), self.wire_dtype),
                          wire.to_bytes(state.mail[rows].cpu(), self.wire_dtype), exact.cpu().view(torch.uint8)], 1)

    def _unpack_state(self, nodes: Tensor, packed: Tensor) -> None:
        state = self.memory.state
        rows = state.rows(nodes.to(state.device))
        d, m = state.memory.shape[1], state.mail.shape[1]
        wd, dtype = self.wire_dtype, state.dtype
        a = wire.byte_width(wd, d, dtype)
        b = a + wire.byte_width(wd, m, dtype)
        exact = wire.bytes_as(packed[:, b:], torch.float64).to(state.device)
        state.memory[rows] = wire.from_bytes(packed[:, :a], wd, d, dtype).to(state.device)
        state.mail[rows] = wire.from_bytes(packed[:, a:b], wd, m, dtype).to(state.device)
        state.last_update[rows], state.mail_time[rows] = exact[:, 0], exact[:, 1]
        state.has_mail[rows] = exact[:, 2] > 0.5

    def _evict(self, count: int, keep: Tensor) -> None:
        """Free at least ``count`` rows (a sixteenth of the cache at once, so that eviction is rare),
        least recently read first; owned nodes, ``keep`` and rows with writes not yet flushed stay."""
        state = self.memory.state
        if state.capacity - state.rows_held >= count:
            return
        held = state.node[state.node >= 0].cpu()
        candidate = ~self.owned[held]
        pinned = torch.zeros(self.owner.numel(), dtype=torch.bool)
        pinned[keep] = True
        for step in self._pending:
            pinned[step.ends(self.rank)] = True
        held = held[candidate & ~pinned[held]]
        goal = max(count - (state.capacity - state.rows_held), (self.cache_rows or 0) // 16)
        victims = held[torch.argsort(self.last_read[held], stable=True)[:goal]]
        if victims.numel():
            state.evict(victims.to(state.device))
        if state.capacity - state.rows_held < count:
            log.warning("the memory cache of %d rows cannot hold one step's %d missing nodes beside the pinned "
                        "ones: growing it to %d rows", self.cache_rows, count, state.rows_held + count)

    # ------------------------------------------------------------------ staleness
    def _score_reads(self) -> None:
        """Score the reads whose every earlier write is now known: for each, the earliest write of
        another rank after its version and before its step."""
        if not self._reads:
            return
        reads = torch.cat(self._reads)
        ready = reads[:, 1] <= self.complete + 1
        done, rest = reads[ready], reads[~ready]
        self._reads = [rest] if rest.numel() else []
        stats, writes = self.stats, self._others
        if writes.numel() and done.numel():
            keys = torch.sort(writes[:, 0] * STEP_STRIDE + writes[:, 1]).values
            at = torch.searchsorted(keys, done[:, 0] * STEP_STRIDE + done[:, 2] + 1).clamp(max=keys.numel() - 1)
            found = keys[at]
            hit = (found // STEP_STRIDE == done[:, 0]) & (found % STEP_STRIDE > done[:, 2]) & \
                (found % STEP_STRIDE < done[:, 1])
            if hit.any():
                ages = done[hit, 1] - found[hit] % STEP_STRIDE
                stats.stale_reads += int(hit.sum())
                stats.staleness_sum += int(ages.sum())
                stats.staleness_max = max(stats.staleness_max, int(ages.max()))
        # Writes at or before every remaining and future read's version can never be missed again.
        floor = min(self.complete, int(rest[:, 2].min())) if rest.numel() else self.complete
        self._others = writes[writes[:, 1] > floor]


def partition_interactions(src: np.ndarray, dst: np.ndarray, num_nodes: int, num_parts: int, *,
                           method: str = "metis", seed: int = 0) -> np.ndarray:
    """Owner rank of every node: ``partition``'s METIS (or random) assignment of the undirected graph
    of the given interactions, balanced on nodes and on interactions.

    Returns:
        int64 [num_nodes] with values in ``[0, num_parts)``.
    """
    from gnnscale.data.dataset import GraphDataset, csc_from_edges
    from partition.assign import assign_parts, random_parts
    from partition.config import PartitionConfig

    config = PartitionConfig(num_parts=num_parts, method=method, balance=("nodes", "edges"), seed=seed)
    if num_parts == 1:
        return np.zeros(num_nodes, dtype=np.int64)
    if method == "random":
        return random_parts(num_nodes, num_parts, seed)
    indptr, indices = csc_from_edges(src, dst, num_nodes, symmetrize=True)
    graph = GraphDataset(name="interactions", indptr=indptr, indices=indices,
                         features=np.zeros((num_nodes, 1), np.float32), labels=np.zeros(num_nodes, np.int64),
                         train_masks=np.ones((1, num_nodes), bool), val_masks=np.zeros((1, num_nodes), bool),
                         test_masks=np.zeros((1, num_nodes), bool), num_classes=1)
    return assign_parts(graph, config)[0]
