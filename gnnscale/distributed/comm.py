"""Variable-sized all-to-all exchange on top of ``all_to_all_single``, with byte counters."""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


# The tensors of the last few collectives, for the whole process.  A gloo worker thread can drop its
# reference to a finished collective's tensors after the caller has moved on (a later barrier holds
# the work of a collective that had finished but not yet left gloo's in-progress list); were that
# the last reference, the thread would need the GIL to free them -- and if the process group is
# being destroyed right then, its destructor holds the GIL while joining that very thread: a
# deadlock (seen in torch 2.2.1 at the end of runs).  Holding the tensors here keeps the last
# reference ours, also after the Exchanger that sent them is gone (a trainer freed before the job
# is left); :func:`release_kept` lets go once the groups are destroyed -- really destroyed, not only dropped from
# torch's registry: :func:`gnnscale.distributed.shutdown.destroy_groups` checks that no group survived first.
_KEPT: collections.deque[Tensor] = collections.deque()
KEEP_COUNT = 16
"""The last tensors always held, whatever their size (those of the last few collectives)."""
KEEP_BYTES = 4 * 2**20
"""Beyond the last :data:`KEEP_COUNT`, older tensors are held while they add up to at most this many bytes:
holding a fixed number of them (64) held up to 64 feature fetches, about 80 MiB per rank on a 300k-node graph."""
_kept_bytes = [0]


def _nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def keep(*tensors: Tensor) -> None:
    """Hold ``tensors`` (of a collective) until :data:`KEEP_COUNT` later ones and :data:`KEEP_BYTES` of older
    ones have pushed them out, or :func:`release_kept`."""
    for tensor in tensors:
        _KEPT.append(tensor)
        _kept_bytes[0] += _nbytes(tensor)
    while len(_KEPT) > KEEP_COUNT and _kept_bytes[0] - sum(_nbytes(t) for t in list(_KEPT)[-KEEP_COUNT:]) > KEEP_BYTES:
        _kept_bytes[0] -= _nbytes(_KEPT.popleft())


def release_kept() -> None:
    """Let go of the kept tensors (after ``destroy_process_group``: no gloo thread is left to free them)."""
    _KEPT.clear()
    _kept_bytes[0] = 0


@dataclass
class CommStats:
    """What this rank sent and received, and the wall seconds it spent in exchanges (waiting on its
    peers included), reset at every epoch."""

    bytes_sent: int = 0
    bytes_received: int = 0
    exchanges: int = 0
    seconds: float = 0.0
    reduced_bytes: int = 0
    """The payload of the asynchronous all-reduces started here (gradients).  What crosses the wire
    depends on gloo's algorithm: a ring sends ``2 (R - 1) / R`` of it per rank."""

    def reset(self) -> None:
        self.bytes_sent = self.bytes_received = self.exchanges = self.reduced_bytes = 0
        self.seconds = 0.0


class Exchanger:
    """Sends ``chunks[r]`` to rank ``r`` and returns what every rank sent here.

    Every rank of ``group`` must call :meth:`exchange` the same number of times in the same
    order (a collective); a rank with nothing to send passes empty chunks.  In a world of
    one (``group`` is None) only the own chunk exists and is returned as is.
    """

    def __init__(self, group: dist.ProcessGroup | None, rank: int, world_size: int) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size
        self.stats = CommStats()

    @staticmethod
    def _keep(*tensors: Tensor) -> None:
        keep(*tensors)

    def exchange(self, chunks: list[Tensor], out: Tensor | None = None,
                 recv_sizes: list[int] | None = None) -> list[Tensor]:
        """``chunks``: one tensor per rank, same dtype and trailing shape; returns one per source rank.

        ``out``, when given, is a contiguous buffer of exactly the received rows: they land there
        (in rank order) without a further copy, and the returned tensors are views of it.
        ``recv_sizes``, when the caller knows how many rows each rank sends here (a reply to its
        own requests), saves the round that exchanges the sizes: one collective instead of two.
        """
        assert len(chunks) == self.world_size, (len(chunks), self.world_size)
        if self.group is None:
            if out is not None:
                torch.cat(chunks, out=out)
                return list(out.split([c.shape[0] for c in chunks]))
            return list(chunks)
        start = time.perf_counter()
        trailing = chunks[0].shape[1:]
        send_counts = torch.tensor([c.shape[0] for c in chunks], dtype=torch.int64)
        if recv_sizes is None:
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts, group=self.group)
            self._keep(send_counts, recv_counts)
        else:
            recv_counts = torch.tensor(recv_sizes, dtype=torch.int64)
        send = torch.cat(chunks) if len(chunks) > 1 else chunks[0]
        total = int(recv_counts.sum())
        if out is None:
            recv = send.new_empty((total, *trailing))
        else:
            assert out.is_contiguous() and out.shape[0] == total, (out.shape, total)
            recv = out
        recv_sizes = recv_counts.tolist()
        self.exchange_into(send.contiguous(), send_counts.tolist(), recv, recv_sizes, started=start)
        return list(recv.split(recv_sizes))

    def exchange_into(self, send: Tensor, send_sizes: list[int], recv: Tensor, recv_sizes: list[int], *,
                      started: float | None = None) -> None:
        """One all-to-all of rows: ``send``'s first ``send_sizes[r]`` rows (then the next ...) go to rank
        ``r``, and ``recv`` (contiguous, ``sum(recv_sizes)`` rows) receives ``recv_sizes[r]`` rows from rank
        ``r``, in rank order.  Every rank must know what it receives (a reply to its own requests).  The
        buffers may be views of larger ones reused across calls: what :func:`keep` then holds is theirs."""
        start = time.perf_counter() if started is None else started
        if self.group is None:
            recv.copy_(send)
            return
        dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes, input_split_sizes=send_sizes,
                               group=self.group)
        self._keep(send, recv)
        row_bytes = send.element_size() * math.prod(send.shape[1:])
        self.stats.bytes_sent += (sum(send_sizes) - send_sizes[self.rank]) * row_bytes
        self.stats.bytes_received += (sum(recv_sizes) - recv_sizes[self.rank]) * row_bytes
        self.stats.exchanges += 1
        self.stats.seconds += time.perf_counter() - start

    def all_reduce(self, values: Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> Tensor:
        """In-place all-reduce of a small CPU tensor (identity in a world of one)."""
        if self.group is not None:
            dist.all_reduce(values, op=op, group=self.group)
            self._keep(values)
        return values

    def broadcast(self, values: Tensor, src: int) -> Tensor:
        """In-place broadcast of a CPU tensor from rank ``src`` of the group (identity in a world of one)."""
        if self.group is not None:
            dist.broadcast(values, src=dist.get_global_rank(self.group, src), group=self.group)
            self._keep(values)
        return values

    def all_reduce_start(self, values: Tensor) -> Callable[[], Tensor]:
        """Start an in-place sum all-reduce of ``values``; returns what waits for it and gives the sum
        (at once in a world of one).  The caller works on meanwhile, without touching ``values``."""
        if self.group is None:
            return lambda: values
        self.stats.reduced_bytes += values.numel() * values.element_size()
        work = dist.all_reduce(values, group=self.group, async_op=True)
        self._keep(values)

        def finish() -> Tensor:
            work.wait()
            return values
        return finish

    def all_gather_start(self, rows: Tensor) -> Callable[[], list[Tensor]]:
        """Start gathering every rank's ``rows`` (a CPU tensor of the same shape on every rank: no round
        of sizes); returns what waits and gives them in rank order.  The caller works on meanwhile."""
        if self.group is None:
            return lambda: [rows]
        start = time.perf_counter()
        gathered = [torch.empty_like(rows) for _ in range(self.world_size)]
        work = dist.all_gather(gathered, rows, group=self.group, async_op=True)
        self._keep(rows, *gathered)
        size = rows.numel() * rows.element_size()
        self.stats.bytes_sent += size * (self.world_size - 1)
        self.stats.bytes_received += size * (self.world_size - 1)
        self.stats.exchanges += 1
        self.stats.seconds += time.perf_counter() - start

        def finish() -> list[Tensor]:
            waited = time.perf_counter()
            work.wait()
            self.stats.seconds += time.perf_counter() - waited
            return gathered
        return finish

    def all_gather_rows(self, rows: Tensor) -> Tensor:
        """Concatenate every rank's ``rows`` (any number per rank) in rank order."""
        if self.group is None:
            return rows
        counts = self.all_gather_counts(rows.shape[0])
        padded = rows.new_zeros((max(counts), *rows.shape[1:]))
        padded[:rows.shape[0]] = rows
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded, group=self.group)
        self._keep(padded, *gathered)
        return torch.cat([g[:n] for g, n in zip(gathered, counts)])

    def all_gather_counts(self, count: int) -> list[int]:
        """Every rank's ``count``, in rank order."""
        if self.group is None:
            return [count]
        counts = torch.zeros(self.world_size, dtype=torch.int64)
        counts[self.rank] = count
        dist.all_reduce(counts, group=self.group)
        self._keep(counts)
        return counts.tolist()


def split_by_owner(owner: Tensor, world_size: int) -> tuple[Tensor, list[int]]:
    """``(order, sizes)`` for ``owner`` int64 [n], the rank owning each position: ``order`` int64 [n]
    makes ``owner[order]`` non-decreasing, keeping the input order within each owner (a stable
    grouping), and ``sizes[r]`` positions belong to rank ``r``."""
    sizes = torch.bincount(owner, minlength=world_size).tolist()
    if world_size == 1:
        return torch.arange(owner.numel()), sizes
    return torch.sort(owner, stable=True).indices, sizes
