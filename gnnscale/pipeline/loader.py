"""A prefetching mini-batch loader: worker threads sample and gather ahead of the trainer.

::

    epoch order (seeded)  ->  tasks, in batch order  ->  worker threads (num_workers)
                                                            sample(seeds, rng_i)   ids + blocks
                                                            gather rows into a reused buffer slot
    trainer  <-  batches in order  <-  reorder by index  <-------------'

Design points:

* **Workers are threads.**  Sampling (numpy), the compaction and row gathering (a compiled kernel
  with software prefetch, :mod:`gnnscale.pipeline.native`) all run in C with the GIL released, so
  threads overlap with the trainer's torch ops without pickling anything: feature rows are written
  once, by the worker, into a buffer the trainer reads in place.
* **Reused buffers.**  ``prefetch + num_workers + 2`` buffer slots are allocated once (and grown
  when a batch needs more rows); a worker takes a slot before it takes a task, tasks are handed out
  in batch order, and a slot comes back when the trainer asks for the batch after next.  The lowest
  batch not yet delivered therefore always holds a slot, so the pipeline cannot deadlock, and at
  most that many batches exist at once (bounded memory).  With ``pin_memory`` the slots are
  page-locked, so a copy to the GPU is a true async DMA.
* **Determinism.**  Batch ``i`` of epoch ``e`` is sampled with ``default_rng((seed, e, i, rank))``, so
  batches are the same whatever the number of workers and whichever worker takes which batch.
* **Shutdown.**  Workers live for one pass over the data.  When the pass ends -- normally, by
  ``break``, by an exception in the trainer or a worker, or by Ctrl-C -- the pass's ``finally``
  stops and joins them (they check a stop flag between stages and never block forever), so no
  worker outlives the loop; a worker's exception is re-raised in the trainer at that batch.
* **Time accounting.**  :class:`PassStats` splits each pass into the trainer's waiting time (the
  device idle) and the workers' time per stage.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from gnnscale import interrupt
from gnnscale.batch import MiniBatch
from gnnscale.pipeline.native import gather_rows

SampleFn = Callable[..., MiniBatch]

_JOIN_TIMEOUT_S = 10.0


@dataclass(kw_only=True)
class LoaderConfig:
    """How a :class:`PrefetchLoader` schedules its work."""

    batch_size: int = 1024
    """Seed nodes per mini-batch (the last batch of a pass may be smaller unless ``drop_last``)."""
    num_workers: int = 1
    """Worker threads that sample and gather; 0 does both in the trainer's thread, on demand."""
    prefetch: int = 2
    """Batches kept ready beyond those the workers are preparing (the queue bound)."""
    shuffle: bool = True
    """Reshuffle the seeds every pass (pass ``e`` uses ``seed`` and ``e``)."""
    drop_last: bool = False
    """Skip the last, smaller batch of a pass."""
    seed: int = 0
    """Seeds the order of the seeds and every batch's sampling generator."""
    pin_memory: bool = False
    """Gather into page-locked buffers (set it when batches go to a CUDA device)."""
    gather_features: bool = True
    """Gather feature rows on the host; off when the table lives on the device and only ids travel."""
    num_batches: int | None = None
    """Split every pass into exactly this many near-equal batches instead of ``batch_size`` ones (the
    ranks of a job take the same number of steps, whatever their number of seeds)."""
    rank: int = 0
    """Which rank's batch generators to draw: each rank samples its own independent stream."""

    def __post_init__(self) -> None:
        lower_bounds = (("batch_size", 1, ""), ("num_workers", 0, " (0 samples in the trainer's thread)"),
                        ("prefetch", 0, ""), ("seed", 0, ""))
        for name, low, note in lower_bounds:
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}{note}, got {getattr(self, name)}")
        if self.num_batches is not None and self.num_batches < 1:
            raise ValueError(f"num_batches must be >= 1, got {self.num_batches}")


@dataclass
class PassStats:
    """Where one pass over the data spent its time (seconds) and what it moved."""

    batches: int = 0
    wait: float = 0.0
    """Trainer time blocked waiting for the next batch: the device idle."""
    sample: float = 0.0
    """Worker time sampling blocks (summed over workers)."""
    gather: float = 0.0
    """Worker time gathering feature rows and labels into buffers (summed over workers)."""
    sample_cpu: float = 0.0
    """CPU seconds of the sampling (the thread's own: where several threads share a core, less than
    ``sample``, which also holds the time others ran)."""
    gather_cpu: float = 0.0
    """CPU seconds of the gathering (the thread's own)."""
    gathered_bytes: int = 0
    """Bytes of feature rows gathered."""
    seconds: float = 0.0
    """Wall time of the pass, first request to last delivery."""

    def as_dict(self) -> dict[str, float]:
        return {"batches": self.batches, "wait_s": self.wait, "sample_s": self.sample, "gather_s": self.gather,
                "sample_cpu_s": self.sample_cpu, "gather_cpu_s": self.gather_cpu,
                "gathered_bytes": self.gathered_bytes, "pass_s": self.seconds}


@dataclass
class LoadedBatch:
    """A sampled mini-batch with its inputs.  ``x`` and ``y`` are views of a reused buffer slot:
    valid until the trainer asks for the batch after next (copy them to keep them longer)."""

    index: int
    batch: MiniBatch
    x: Tensor | None
    """float [num_input, F] feature rows of ``batch.input_ids`` (None when ``gather_features`` is off)."""
    y: Tensor | None
    """Labels of ``batch.seeds`` (None when the loader has no labels, e.g. link prediction)."""
    slot: int = -1
    release_after: list = field(default_factory=list)
    """Events (``torch.cuda.Event``) that must complete before the slot's memory is reused."""


def epoch_order(seeds: Tensor, *, shuffle: bool, seed: int, epoch: int) -> Tensor:
    """The seeds in pass ``epoch``'s order: a seeded permutation, or as given."""
    if not shuffle:
        return seeds
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return seeds[torch.randperm(seeds.numel(), generator=generator)]


def batch_rng(seed: int, epoch: int, index: int, rank: int = 0) -> np.random.Generator:
    """The sampling generator of batch ``index`` of pass ``epoch`` on ``rank``, whichever thread draws it."""
    return np.random.default_rng((seed, epoch, index, rank))


def split_batches(order: Tensor, batch_size: int, drop_last: bool, num_batches: int | None = None) -> list[Tensor]:
    """``order`` cut into batches of ``batch_size`` seeds, or into exactly ``num_batches`` near-equal ones."""
    if num_batches is not None:
        return list(torch.tensor_split(order, num_batches))
    batches = list(torch.split(order, batch_size)) if order.numel() else []
    if drop_last and batches and batches[-1].numel() < batch_size:
        batches.pop()
    return batches


class _Slot:
    """One reusable pair of host buffers (features, labels), grown on demand."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.features: Tensor | None = None
        self.labels: Tensor | None = None

    def _ensure(self, current: Tensor | None, rows: int, template: Tensor) -> Tensor:
        if current is None or current.shape[0] < rows or current.dtype != template.dtype:
            # 25% headroom: batch sizes vary a little, and regrowing a pinned buffer is slow.
            current = torch.empty((int(rows * 1.25) + 1,) + tuple(template.shape[1:]), dtype=template.dtype,
                                  pin_memory=self.pin)
        return current

    def take(self, which: str, rows: int, template: Tensor) -> Tensor:
        """A [rows, ...] view of this slot's ``which`` buffer, shaped and typed like ``template``'s rows."""
        buffer = self._ensure(getattr(self, which), rows, template)
        setattr(self, which, buffer)
        return buffer[:rows]


class FeatureStore(Protocol):
    """Where a batch's input rows come from when not from one local table (e.g. ``DistTable``)."""

    def gather_batch(self, batch: MiniBatch, out: Callable[[int, Tensor], Tensor]) -> tuple[MiniBatch, Tensor]:
        """The input rows of ``batch`` written into ``out(rows, template)``, and the batch renumbered to match."""


class PrefetchLoader:
    """Iterates over mini-batches of ``seeds``, prepared ahead of the trainer by worker threads.

    Args:
        sample: ``sample(seeds int64 [b], rng=generator) -> MiniBatch``, e.g. ``NeighborSampler.sample``, with
            ``rng`` a keyword argument; called from worker threads, so it must not share mutable state
            between calls (the samplers keep their scratch space per thread).
        seeds: int64 [num_seeds] nodes to cover exactly once per pass.
        features: float [num_nodes, F] feature table (host memory), indexed by ``batch.input_ids - first_id``,
            or a :class:`FeatureStore` (rows held elsewhere, e.g. by other ranks).
        labels: [num_nodes] labels, indexed by ``batch.seeds - first_id``; None for tasks without per-seed
            labels (link prediction: the batch carries its pairs).
        config: scheduling settings.
        first_id: the node id of row 0 of ``labels`` (and of a ``features`` table).
        plan: ``plan(epoch) -> batches``, the seeds of every batch of pass ``epoch``, instead of cutting
            ``seeds`` in a seeded order (e.g. :class:`gnnscale.train.shares.SeedShares`).

    Each ``iter(loader)`` is one pass; pass ``e`` (``loader.epoch`` before the pass) has its own order and
    generators, so setting ``epoch`` replays any pass.  ``loader.stats`` describes the last pass.
    """

    def __init__(self, sample: SampleFn, seeds: Tensor, features: Tensor | FeatureStore, labels: Tensor | None,
                 config: LoaderConfig, *, first_id: int = 0, plan: Callable[[int], list[Tensor]] | None = None) -> None:
        self.sample_fn = sample
        self.plan = plan
        self.seeds = torch.as_tensor(seeds, dtype=torch.int64)
        self.features, self.labels, self.first_id = features, labels, first_id
        self.config = config
        self.epoch = 0
        self.stats = PassStats()
        num_slots = config.prefetch + config.num_workers + 2 if config.num_workers else 2
        self._slots = [_Slot(config.pin_memory) for _ in range(num_slots)]
        self._running = False

    def __len__(self) -> int:
        n, b = self.seeds.numel(), self.config.batch_size
        if self.config.num_batches is not None:
            return self.config.num_batches
        return n // b if self.config.drop_last else (n + b - 1) // b

    # ------------------------------------------------------------------ one batch
    def _prepare(self, index: int, seeds: Tensor, slot: int, epoch: int, stats: PassStats,
                 lock: threading.Lock) -> LoadedBatch:
        start, cpu_start = time.perf_counter(), time.thread_time()
        batch = self.sample_fn(seeds, rng=batch_rng(self.config.seed, epoch, index, self.config.rank))
        sampled, cpu_sampled = time.perf_counter(), time.thread_time()
        buffers = self._slots[slot]
        x = None
        if self.config.gather_features:
            batch, x = self._gather_inputs(batch, buffers)
        y = None
        if self.labels is not None:
            seeds = batch.seeds if self.first_id == 0 else batch.seeds - self.first_id
            y = gather_rows(self.labels, seeds, buffers.take("labels", seeds.numel(), self.labels))
        done, cpu_done = time.perf_counter(), time.thread_time()
        with lock:
            stats.sample += sampled - start
            stats.gather += done - sampled
            stats.sample_cpu += cpu_sampled - cpu_start
            stats.gather_cpu += cpu_done - cpu_sampled
            stats.gathered_bytes += 0 if x is None else x.numel() * x.element_size()
        return LoadedBatch(index=index, batch=batch, x=x, y=y, slot=slot)

    def _gather_inputs(self, batch: MiniBatch, buffers: _Slot) -> tuple[MiniBatch, Tensor]:
        if not isinstance(self.features, Tensor):
            return self.features.gather_batch(batch, lambda rows, like: buffers.take("features", rows, like))
        ids = batch.input_ids if self.first_id == 0 else batch.input_ids - self.first_id
        return batch, gather_rows(self.features, ids, buffers.take("features", ids.numel(), self.features))

    # ------------------------------------------------------------------ a pass
    def __iter__(self) -> Iterator[LoadedBatch]:
        epoch = self.epoch
        self.epoch += 1
        if self.plan is not None:
            batches = self.plan(epoch)
        else:
            order = epoch_order(self.seeds, shuffle=self.config.shuffle, seed=self.config.seed, epoch=epoch)
            batches = split_batches(order, self.config.batch_size, self.config.drop_last, self.config.num_batches)
        passes = self._serial_pass(batches, epoch) if self.config.num_workers == 0 else \
            _ThreadedPass(self, batches, epoch).run()
        return self._exclusive(passes)

    def _exclusive(self, passes: Iterator[LoadedBatch]) -> Iterator[LoadedBatch]:
        # Two passes at once would write into the same buffer slots.
        if self._running:
            raise RuntimeError("this PrefetchLoader is already in a pass; it runs one pass at a time (finish or "
                               "close the first iterator, or make a second loader)")
        self._running = True
        self.stats = PassStats()
        try:
            for loaded in passes:
                interrupt.check()  # a Ctrl-C swallowed by a __del__ stops the pass here
                yield loaded
        finally:
            passes.close()
            self._running = False

    def _serial_pass(self, batches: list[Tensor], epoch: int) -> Iterator[LoadedBatch]:
        stats, lock, began = self.stats, threading.Lock(), time.perf_counter()
        for index, seeds in enumerate(batches):
            start = time.perf_counter()
            loaded = self._prepare(index, seeds, index % 2, epoch, stats, lock)
            stats.wait += time.perf_counter() - start
            stats.batches += 1
            stats.seconds = time.perf_counter() - began
            yield loaded
            _wait_events(loaded)


def _wait_events(loaded: LoadedBatch) -> None:
    for event in loaded.release_after:
        event.synchronize()
    loaded.release_after.clear()


class _ThreadedPass:
    """The state of one pass with worker threads (see the module docstring for the protocol)."""

    def __init__(self, loader: PrefetchLoader, batches: list[Tensor], epoch: int) -> None:
        self.loader, self.batches, self.epoch = loader, batches, epoch
        self.cond = threading.Condition()
        self.stats_lock = threading.Lock()
        self.free_slots = list(range(len(loader._slots)))
        self.next_task = 0
        self.ready: dict[int, LoadedBatch | BaseException] = {}
        self.stopping = False
        self.threads: list[threading.Thread] = []

    def _take_task(self) -> tuple[int, int] | None:
        """Block until a slot is free and a task is left; ``(index, slot)``, or None when the pass is over."""
        with self.cond:
            while not self.stopping and self.next_task < len(self.batches) and not self.free_slots:
                self.cond.wait()
            if self.stopping or self.next_task >= len(self.batches):
                return None
            index, slot = self.next_task, self.free_slots.pop(0)
            self.next_task += 1
            return index, slot

    def _work(self) -> None:
        while True:
            task = self._take_task()
            if task is None:
                return
            index, slot = task
            try:
                result: LoadedBatch | BaseException = self.loader._prepare(
                    index, self.batches[index], slot, self.epoch, self.stats, self.stats_lock)
            except BaseException as error:  # noqa: BLE001 -- handed to the trainer, re-raised there
                result = error
            with self.cond:
                self.ready[index] = result
                self.cond.notify_all()
            if isinstance(result, BaseException):
                return

    def _release(self, loaded: LoadedBatch) -> None:
        _wait_events(loaded)
        with self.cond:
            self.free_slots.append(loaded.slot)
            self.cond.notify_all()

    def _stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            # Daemon threads cannot keep the interpreter alive; say so rather than hang here.
            raise RuntimeError(f"loader workers {alive} did not stop within {_JOIN_TIMEOUT_S:.0f} s "
                               f"(a sample function blocked?)")

    def run(self) -> Iterator[LoadedBatch]:
        loader = self.loader
        stats = self.stats = loader.stats
        began = time.perf_counter()
        self.threads = [threading.Thread(target=self._work, name=f"gnnscale-loader-{i}", daemon=True)
                        for i in range(min(loader.config.num_workers, max(len(self.batches), 1)))]
        for thread in self.threads:
            thread.start()
        held: collections.deque[LoadedBatch] = collections.deque()
        try:
            for index in range(len(self.batches)):
                start = time.perf_counter()
                with self.cond:
                    while index not in self.ready:
                        self.cond.wait(timeout=1.0)
                    result = self.ready.pop(index)
                stats.wait += time.perf_counter() - start
                if isinstance(result, BaseException):
                    raise result
                # The trainer may still hold the previous batch; the one before it is recycled.
                if len(held) == 2:
                    self._release(held.popleft())
                stats.batches += 1
                stats.seconds = time.perf_counter() - began
                held.append(result)
                yield result
        finally:
            self._stop()
            for loaded in held:
                _wait_events(loaded)
