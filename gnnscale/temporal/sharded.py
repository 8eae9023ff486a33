"""Node memory sharded by owner across ranks, with replicas that are never more than K steps behind.

Every node has one *owner* rank (a METIS partition of the interaction graph,
:func:`partition_interactions`).  The owner's rows of the :class:`~gnnscale.temporal.memory.MemoryState`
(memory, last update, mailbox) are the truth; every other rank reads that node from a local
*replica* row.  One global step (one global batch, split across ranks) goes::

    versions = shard.read(needed)       # every row the step reads; remote reads are logged
    memory, last_update = tm.updated(needed)
    ... embeddings, loss, gradients all-reduced, optimizer step ...
    shard.write(nodes, memory, last_update, message_nodes, times, keys, messages)
                                        # persisted rows and raw messages go to their owners,
                                        # which apply them at once (all-to-all)
    shard.end_step()                    # every K + 1 steps: owners send their changed rows
                                        # to every replica (all-gather)

so owners always hold their nodes' latest state, and a replica is refreshed at least every
``K + 1`` steps.  With ``K = 0`` every read sees exactly what a single process would (owners
aggregate a node's messages in the global batch's order, see :meth:`TemporalMemory.deliver`).

**Versions and staleness** (defined in docs/temporal.md, "Sharded memory").  Every row carries its
*version*, the global step of the owner's write it reflects (after a reset: the step before it).
A remote read at step ``s`` that missed owner writes has staleness ``s - m`` for the earliest
missed write ``m``; replicas are refreshed through step ``s - 1 - j`` with ``j <= K``, so it never
exceeds K.  Each refreshed row carries its owner's first write step since the previous refresh,
against which every rank scores its remote reads: measured, not assumed (:class:`StalenessStats`).

The replica is a dense table (negatives are drawn from all destinations, so any rank may read any
node): what is sharded is ownership, writes and traffic, which is only the rows that changed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from gnnscale.distributed.comm import Exchanger, split_by_owner
from gnnscale.temporal.memory import TemporalMemory, last_occurrence

log = logging.getLogger("gnnscale.temporal")

NEVER = torch.iinfo(torch.int64).max


@dataclass
class StalenessStats:
    """Reads of one pass (or run) and how stale the remote ones were, in global steps."""

    reads: int = 0
    """Rows read (each step's distinct needed nodes)."""
    remote_reads: int = 0
    """Of those, rows owned by another rank (read from the replica)."""
    stale_reads: int = 0
    """Remote reads that missed at least one write of the owner."""
    staleness_sum: int = 0
    staleness_max: int = 0

    def as_dict(self) -> dict[str, float]:
        remote = max(self.remote_reads, 1)
        return {"staleness_max": self.staleness_max, "staleness_mean": self.staleness_sum / remote,
                "stale_read_fraction": self.stale_reads / remote,
                "remote_read_fraction": self.remote_reads / max(self.reads, 1),
                "reads": self.reads, "remote_reads": self.remote_reads}

    def to_tensor(self) -> Tensor:
        return torch.tensor([self.reads, self.remote_reads, self.stale_reads, self.staleness_sum], dtype=torch.int64)


@dataclass
class ReadWriteLog:
    """Every remote read ``(node, step, version)`` and owned write ``(node, step)`` of this rank, for tests."""

    reads: list[Tensor] = field(default_factory=list)
    writes: list[Tensor] = field(default_factory=list)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        reads = torch.cat(self.reads).numpy() if self.reads else np.empty((0, 3), np.int64)
        writes = torch.cat(self.writes).numpy() if self.writes else np.empty((0, 2), np.int64)
        return reads, writes


class ShardedMemory:
    """Ownership, replicas and versions around one rank's :class:`TemporalMemory`.

    In a world of one (``exchanger.group is None``) every node is owned, nothing is sent and
    every read is exact: the single-process path is this class with nothing to do.

    Args:
        memory: this rank's memory module; its state holds owned rows and replica rows.
        owner: int64 [N], the rank owning each node.
        staleness: K >= 0, the most global steps a replica read may be behind its owner.
        exchanger: collectives over the training group (every rank calls in the same order).
        record: keep every remote read and owned write in :attr:`log` (tests check the bound
            against it independently of the counters).
    """

    def __init__(self, memory: TemporalMemory, owner: Tensor, *, staleness: int, exchanger: Exchanger,
                 record: bool = False) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0 global steps, got {staleness}")
        n = memory.state.num_nodes
        if owner.shape != (n,):
            raise ValueError(f"owner has shape {tuple(owner.shape)}, expected ({n},): one rank per node")
        if n and (int(owner.min()) < 0 or int(owner.max()) >= exchanger.world_size):
            raise ValueError(f"owner ranks must be in [0, {exchanger.world_size}), got "
                             f"[{int(owner.min())}, {int(owner.max())}]")
        self.memory, self.staleness, self.exchanger = memory, staleness, exchanger
        self.rank, self.world_size = exchanger.rank, exchanger.world_size
        self.owner = owner.to(torch.int64).cpu()
        self.owned = self.owner == self.rank
        self.version = torch.full((n,), -1, dtype=torch.int64)
        self.stats = StalenessStats()
        self.log = ReadWriteLog() if record else None
        self.step = 0
        self._dirty = torch.zeros(n, dtype=torch.bool)
        self._first_write = torch.full((n,), NEVER, dtype=torch.int64)
        self._reads: list[tuple[Tensor, int]] = []

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Forget every node's memory (the start of each epoch over the stream); counters are kept."""
        self.memory.state.reset()
        # The reset is the same write on every rank at once: every row is current as of now.
        self.begin_pass()
        self.version.fill_(self.step - 1)
        self._dirty.zero_()
        self._first_write.fill_(NEVER)
        self._reads.clear()

    def begin_pass(self) -> None:
        """Start a pass over a stream (after a :meth:`refresh`): the step count moves on to the next
        multiple of ``K + 1``, so every pass refreshes at the same points of its own steps, and a pass
        repeated from the same state reads exactly the same replica rows."""
        period = self.staleness + 1
        self.step = -(-self.step // period) * period

    def take_stats(self) -> StalenessStats:
        """This rank's counters since the last call, and start new ones."""
        stats, self.stats = self.stats, StalenessStats()
        return stats

    # ------------------------------------------------------------------ one step
    def read(self, nodes: Tensor) -> Tensor:
        """Version (int64) of each of the distinct ``nodes`` a step is about to read; logs the remote ones."""
        nodes = torch.unique(nodes.cpu())
        remote = nodes[~self.owned[nodes]]
        self.stats.reads += nodes.numel()
        self.stats.remote_reads += remote.numel()
        if remote.numel():
            self._reads.append((remote, self.step))
            if self.log is not None:
                self.log.reads.append(torch.stack([remote, torch.full_like(remote, self.step),
                                                   self.version[remote]], 1))
        return self.version[nodes]

    @torch.no_grad()
    def write(self, nodes: Tensor, memory: Tensor, last_update: Tensor, message_nodes: Tensor,
              message_times: Tensor, message_keys: Tensor, messages: Tensor) -> None:
        """Send this step's writes to their owners, which apply them before returning.

        Args:
            nodes: the distinct nodes whose updated rows are persisted (the local events' endpoints).
            memory: float [N, d] updated memory (from ``updated()``), read at ``nodes``.
            last_update: float64 [N] likewise.
            message_nodes, message_times, message_keys, messages: this rank's raw messages
                (:meth:`TemporalMemory.make_messages`), keyed by position in the global batch.
        """
        state = self.memory.state
        device = state.memory.device
        nodes = nodes.to(device)
        if self.world_size == 1:  # every node is owned here: apply in place, on the device
            self.memory.persist(nodes, memory, last_update)
            if message_nodes.numel():
                self.memory.deliver(message_nodes, message_times, message_keys, messages.to(state.mail.dtype))
            self._written(torch.unique(torch.cat([nodes, message_nodes])).cpu())
            return
        # One exchange carries both kinds of write, as float64 rows (ids and times stay exact):
        # [kind, node, time, key, payload...]; kind 0 persists memory (time: last update), kind 1
        # is a raw message (time: event time, key: order in the global batch).
        width = 4 + max(memory.shape[1], messages.shape[1])
        rows = torch.zeros(nodes.numel() + message_nodes.numel(), width, dtype=torch.float64)
        count = nodes.numel()
        rows[:count, 1] = nodes.cpu().to(torch.float64)
        rows[:count, 2] = last_update[nodes].cpu()
        rows[:count, 4:4 + memory.shape[1]] = memory[nodes].cpu().to(torch.float64)
        rows[count:, 0] = 1.0
        rows[count:, 1] = message_nodes.cpu().to(torch.float64)
        rows[count:, 2] = message_times.cpu().to(torch.float64)
        rows[count:, 3] = message_keys.cpu().to(torch.float64)
        rows[count:, 4:4 + messages.shape[1]] = messages.cpu().to(torch.float64)
        rows = torch.cat(self._to_owners(rows))
        kind = rows[:, 0] > 0.5
        persist, mail = rows[~kind], rows[kind]
        persisted = persist[:, 1].to(torch.int64)
        if persisted.numel():
            # Persisted by several ranks (same row when K = 0): keep the last rank's, so timing never decides.
            unique, _, last = last_occurrence(persisted)
            target = unique.to(device)
            d = state.memory.shape[1]
            state.memory[target] = persist[last, 4:4 + d].to(state.memory.dtype).to(device)
            state.last_update[target] = persist[last, 2].to(device)
            state.has_mail[target] = False
        mailed = mail[:, 1].to(torch.int64)
        if mailed.numel():
            self.memory.deliver(mailed.to(device), mail[:, 2].to(device), mail[:, 3].to(torch.int64).to(device),
                                mail[:, 4:4 + state.mail.shape[1]].to(state.mail.dtype).to(device))
        self._written(torch.unique(torch.cat([persisted, mailed])))

    def _written(self, nodes: Tensor) -> None:
        """Owned ``nodes`` (distinct, CPU) were written at this step: new versions, and for the next refresh."""
        if not nodes.numel():
            return
        self.version[nodes] = self.step
        if self.world_size > 1:
            self._dirty[nodes] = True
            first = self._first_write[nodes]
            self._first_write[nodes] = torch.where(first == NEVER, self.step, first)
        if self.log is not None:
            self.log.writes.append(torch.stack([nodes, torch.full_like(nodes, self.step)], 1))

    def end_step(self) -> None:
        """Close global step ``self.step``; refresh the replicas when K + 1 steps have passed since the last time."""
        self.step += 1
        if self.step % (self.staleness + 1) == 0:
            self.refresh()

    def refresh(self) -> None:
        """Owners send every row changed since the last refresh to every rank (one all-gather), with the
        step of its first write since then, and each rank scores the remote reads it made since the
        last refresh against those steps."""
        if self.world_size == 1:
            return
        state = self.memory.state
        rows = torch.nonzero(self._dirty).squeeze(1)
        device_rows = rows.to(state.memory.device)
        payload = torch.cat([rows.unsqueeze(1).to(torch.float64), self.version[rows].unsqueeze(1).to(torch.float64),
                             self._first_write[rows].unsqueeze(1).to(torch.float64),
                             state.last_update[device_rows].unsqueeze(1).cpu(),
                             state.mail_time[device_rows].unsqueeze(1).cpu(),
                             state.has_mail[device_rows].unsqueeze(1).to(torch.float64).cpu(),
                             state.memory[device_rows].to(torch.float64).cpu(),
                             state.mail[device_rows].to(torch.float64).cpu()], 1)
        self._dirty[rows] = False
        self._first_write[rows] = NEVER
        payload = self.exchanger.all_gather_rows(payload)
        nodes = payload[:, 0].to(torch.int64)
        first = torch.full((self.owner.numel(),), NEVER, dtype=torch.int64)
        first[nodes] = payload[:, 2].to(torch.int64)
        keep = ~self.owned[nodes]
        payload, nodes = payload[keep], nodes[keep]
        if nodes.numel():
            d = state.memory.shape[1]
            target = nodes.to(state.memory.device)
            self.version[nodes] = payload[:, 1].to(torch.int64)
            state.last_update[target] = payload[:, 3].to(state.memory.device)
            state.mail_time[target] = payload[:, 4].to(state.memory.device)
            state.has_mail[target] = payload[:, 5].to(state.memory.device) > 0.5
            state.memory[target] = payload[:, 6:6 + d].to(state.memory.dtype).to(state.memory.device)
            state.mail[target] = payload[:, 6 + d:].to(state.mail.dtype).to(state.memory.device)
        self._score_reads(first)

    def _score_reads(self, first: Tensor) -> None:
        """Staleness of the remote reads since the last refresh; ``first`` [N]: each node's first write
        since then (``NEVER`` if none)."""
        stats = self.stats
        for remote, step in self._reads:
            earliest = first[remote]
            missed = earliest < step
            if missed.any():
                ages = step - earliest[missed]
                stats.stale_reads += int(missed.sum())
                stats.staleness_sum += int(ages.sum())
                stats.staleness_max = max(stats.staleness_max, int(ages.max()))
        self._reads.clear()

    def _to_owners(self, rows: Tensor) -> list[Tensor]:
        """Route float64 rows whose second column is a node id to that node's owner; what arrives here."""
        order, sizes = split_by_owner(self.owner[rows[:, 1].to(torch.int64)], self.world_size)
        return self.exchanger.exchange(list(rows[order].split(sizes)))


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
