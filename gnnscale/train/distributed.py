"""Node classification over a partitioned graph: one partition per rank, DDP, prefetched batches.

Every rank

* loads only its own partition (memory-mapped on disk, its arrays copied into memory);
* trains on its owned training nodes, split into the same number of steps as every other
  rank (the rank with the most training nodes sets it), so no rank waits on a collective
  that another never makes; each rank's loss is scaled so that DDP's average of gradients
  is the gradient of the mean loss over all of the step's seeds, as on one machine;
* samples and fetches features for batch ``i + 1`` in a background thread, on its own
  gloo group, while batch ``i`` trains (a bounded queue of ``prefetch`` batches);
* evaluates layer by layer over all neighbours of its owned nodes, exchanging the halo's
  embeddings once per layer; the val/test logits are gathered so that every rank computes
  the same metric.

Randomness is reseeded at the start of every epoch from ``(seed, epoch, rank)``, so a run
resumed from the checkpoint of epoch ``e`` trains exactly as the uninterrupted run did.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from gnnscale.batch import Block, MiniBatch
from gnnscale.distributed.comm import Exchanger
from gnnscale.distributed.env import Runtime
from gnnscale.distributed.feature_store import DistTable, cache_rows_for, edge_source_counts
from gnnscale.metrics import evaluate
from gnnscale.nn import GNN, ModelConfig
from gnnscale.pipeline.allocator import keep_freed_memory
from gnnscale.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from gnnscale.train.node_classification import TrainConfig, TrainResult
from partition.load import Partition
from samplers.distributed import DistNeighborSampler, LocalGraph
from samplers.neighbor import SamplerConfig, seed_sampling

log = logging.getLogger("gnnscale.train")

STAGES = ("sample", "fetch", "compute", "wait")


@dataclass(kw_only=True)
class DistConfig:
    """Settings of the distributed runtime that a single process does not have."""

    cache_mb: float = 64.0
    """MiB of remote feature rows each rank caches (0 disables the cache)."""
    cache_policy: str = "degree"
    """Which remote rows to cache: ``degree`` (most frequent sources of owned nodes' in-edges) or
    ``presample`` (most requested while sampling ``presample_batches`` mini-batches)."""
    presample_batches: int = 8
    """Mini-batches sampled to count requests with the ``presample`` policy."""
    prefetch: int = 2
    """Batches sampled and fetched ahead of training (queue length); 0 samples in the training thread."""
    checkpoint_every: int = 1
    """Write a checkpoint every this many epochs (and after the last); 0 never."""
    resume: bool = False
    """Continue from the run folder's checkpoint when there is one."""

    def __post_init__(self) -> None:
        if self.cache_mb < 0:
            raise ValueError(f"cache_mb must be >= 0, got {self.cache_mb}")
        if self.cache_policy not in ("degree", "presample"):
            raise ValueError(f"cache_policy must be 'degree' or 'presample', got {self.cache_policy!r}")
        for name in ("presample_batches", "prefetch", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class EpochTimes:
    """Seconds of one epoch on this rank, per stage (sampling and fetching run in the prefetch thread)."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    def add(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.seconds[stage] += now - since
        return now


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of every RNG of ``rank`` in ``epoch``: independent streams, reproducible after a resume."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0] >> 1)  # DGL takes a C int


class BufferRing:
    """Reusable feature buffers, one per mini-batch that can be alive at once.

    A fresh 25 MB tensor per batch costs about as much in first-touch page faults as the
    gather that fills it; a batch's buffer is free again once its training step is done, and
    at most ``prefetch`` queued batches, one being prepared and one training exist together.
    """

    def __init__(self, size: int) -> None:
        self.buffers: list[Tensor | None] = [None] * size
        self.next = 0

    def take(self, rows: int, template: Tensor) -> Tensor:
        """A [rows, ...] tensor shaped and typed like ``template``'s rows, valid until ``size`` more takes."""
        index, self.next = self.next, (self.next + 1) % len(self.buffers)
        buffer = self.buffers[index]
        if buffer is None or buffer.shape[0] < rows:
            # Headroom, so that a slightly larger batch does not reallocate every time.
            buffer = self.buffers[index] = template.new_empty((int(rows * 1.25) + 1, *template.shape[1:]))
        return buffer[:rows]


def gather_inputs(table: DistTable, batch: MiniBatch, buffers: BufferRing | None = None) -> tuple[MiniBatch, Tensor]:
    """The input features of ``batch``, and the batch with its first block renumbered to match them.

    The table returns rows in its own order (:meth:`DistTable.gather_grouped`); rather than
    scattering them back into the block's source order, the first block is renumbered: its
    destinations are copied to the front (a layer reads them as ``x[:num_dst]``) and its edges
    point into the table's order.  A destination that is also a source thus appears twice, with
    equal rows; every layer computes the same result.
    """
    first = batch.blocks[0]
    num_dst, num_src = first.num_dst, first.num_src
    x = table.rows.new_empty((num_dst + num_src, *table.row_shape)) if buffers is None else \
        buffers.take(num_dst + num_src, table.rows)
    order = table.gather_grouped(first.src_ids, out=x[num_dst:])
    position = torch.empty_like(order)
    position[order] = torch.arange(num_src)
    torch.index_select(x[num_dst:], 0, position[:num_dst], out=x[:num_dst])
    renumbered = Block(indptr=first.indptr, indices=position.index_select(0, first.indices) + num_dst,
                       src_ids=torch.cat([first.dst_ids, first.src_ids.index_select(0, order)]), num_dst=num_dst,
                       edge_weight=first.edge_weight)
    return MiniBatch(seeds=batch.seeds, blocks=[renumbered, *batch.blocks[1:]]), x


class DistNodeClassificationTrainer:
    """Trains a :class:`GNN` on partition ``runtime.rank`` of a partitioned dataset.

    Args:
        part: this rank's partition (``load_partition(dir, rank)``).
        runtime: process groups and device.
        split: which split's masks to use.
        out: run folder (checkpoint); only rank 0 writes there.
    """

    def __init__(self, part: Partition, runtime: Runtime, *, split: int, model_config: ModelConfig,
                 sampler_config: SamplerConfig, config: TrainConfig, dist_config: DistConfig,
                 out: Path | None = None) -> None:
        if len(sampler_config.fanouts) != model_config.num_layers:
            raise ValueError(f"got {len(sampler_config.fanouts)} fanouts for {model_config.num_layers} layers; "
                             f"give one fanout per layer, e.g. --fanouts {','.join(['10'] * model_config.num_layers)}")
        num_splits = part.train_masks.shape[0]
        if not 0 <= split < num_splits:
            raise ValueError(f"split {split} out of range: the partitions hold {num_splits} split(s), 0..{num_splits - 1}")
        self.part, self.runtime, self.config, self.dist_config = part, runtime, config, dist_config
        self.rank, self.world_size = runtime.rank, runtime.world_size
        if config.keep_freed_memory:
            keep_freed_memory()
        if config.features_on_device or config.num_workers > 1:
            log.warning("features_on_device and num_workers > 1 apply to single-process training; distributed "
                        "training prepares batches in one background thread (--prefetch)")
        self.device = runtime.device
        self.out = out
        self.metric = part.metric
        self.start, self.end = part.node_range
        self.exchanger = Exchanger(runtime.sample_group, self.rank, self.world_size)
        offsets = torch.from_numpy(np.asarray(part.book.offsets, dtype=np.int64))

        def owned(mask: np.ndarray) -> Tensor:
            return torch.from_numpy(np.nonzero(np.asarray(mask[split]))[0].astype(np.int64)) + self.start

        self.train_ids, self.val_ids, self.test_ids = (owned(part.train_masks), owned(part.val_masks),
                                                       owned(part.test_masks))
        self.labels = torch.from_numpy(np.array(part.labels, dtype=np.int64))
        self.graph = LocalGraph(part.indptr, part.indices, start=self.start, num_nodes=part.book.num_nodes)
        self.features = DistTable(torch.from_numpy(np.array(part.features, dtype=np.float32)), offsets,
                                  self.exchanger)
        # The 1-hop halo: every non-owned source of an owned node's in-edge, with its edge count.
        self.halo_ids, halo_counts = edge_source_counts(part.indices, self.start, self.end)
        self.degrees = None
        if sampler_config.gcn_norm:
            self.degrees = DistTable(self.graph.degree.to(torch.float32), offsets, self.exchanger)
            self.degrees.fill_cache(self.halo_ids)
        self.sampler = DistNeighborSampler(self.graph, offsets, self.exchanger, sampler_config, self.degrees)

        # Every rank takes the same number of steps: that of the rank with the most training nodes.
        self.train_counts = self.exchanger.all_gather_counts(self.train_ids.numel())
        self.steps = max(math.ceil(n / config.batch_size) for n in self.train_counts)
        short = [r for r, n in enumerate(self.train_counts) if n < self.steps]
        if short:
            raise ValueError(f"partition {short[0]} has {self.train_counts[short[0]]} training node(s) but every rank "
                             f"takes {self.steps} steps per epoch; re-partition with --balance nodes,train or raise "
                             f"--batch-size")
        # Global seeds per step, for scaling each rank's loss to the global mean.
        sizes = np.stack([[len(c) for c in np.array_split(np.arange(n), self.steps)] for n in self.train_counts])
        self.step_seeds = torch.from_numpy(sizes.sum(0)).to(torch.float32)

        seed_sampling(config.seed)  # the presample cache policy samples: the same cache for the same seed
        self._fill_feature_cache(halo_counts)
        torch.manual_seed(config.seed)  # identical initial weights on every rank
        self.module = GNN(model_config, self.features.row_shape[0], part.num_classes).to(self.device)
        self.model = DistributedDataParallel(self.module, process_group=runtime.group) \
            if runtime.group is not None else self.module
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self._eval_blocks: list[tuple[Block, Tensor]] | None = None
        self._buffers = BufferRing(dist_config.prefetch + 2)
        self._orders: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self.fingerprint = {"num_nodes": part.book.num_nodes, "world_size": self.world_size, "split": split,
                            "model": repr(model_config), "sampler": repr(sampler_config),
                            "batch_size": config.batch_size, "lr": config.lr, "seed": config.seed,
                            "weight_decay": config.weight_decay}

    # ------------------------------------------------------------------ set-up
    def _fill_feature_cache(self, halo_counts: Tensor) -> None:
        cfg = self.dist_config
        rows = min(cache_rows_for(cfg.cache_mb, self.features.row_shape, self.features.rows.dtype),
                   self.halo_ids.numel())
        if cfg.cache_policy == "degree" or rows == 0:
            self.features.fill_cache_by_counts(self.halo_ids, halo_counts, rows)
        else:
            candidates, counts = self._presample_counts()
            self.features.fill_cache_by_counts(candidates, counts, min(rows, candidates.numel()))
        log.info("rank %d: %d owned nodes, %d in-edges, %d halo nodes, feature cache %d rows (%.1f MiB, %s)",
                 self.rank, self.end - self.start, self.graph.indices.numel(), self.halo_ids.numel(),
                 self.features.cache_ids.numel(), self.features.cache_bytes / 2**20, cfg.cache_policy)

    def _presample_counts(self) -> tuple[Tensor, Tensor]:
        """Non-owned input nodes of a few sampled batches, with how often each was needed."""
        generator = torch.Generator().manual_seed(self.config.seed)
        order = self.train_ids[torch.randperm(self.train_ids.numel(), generator=generator)]
        batches = np.array_split(order.numpy(), self.steps)
        needed = []
        for step in range(min(self.dist_config.presample_batches, self.steps)):
            ids = self.sampler.sample(torch.from_numpy(batches[step])).input_ids
            needed.append(ids[(ids < self.start) | (ids >= self.end)])
        if not needed:
            return self.halo_ids[:0], self.halo_ids[:0]
        return torch.unique(torch.cat(needed), return_counts=True)

    # ------------------------------------------------------------------ training
    def _epoch_batches(self, epoch: int) -> list[Tensor]:
        generator = torch.Generator().manual_seed(epoch_seed(self.config.seed, epoch, self.rank))
        order = self.train_ids[torch.randperm(self.train_ids.numel(), generator=generator)]
        return list(torch.tensor_split(order, self.steps))

    def _serve_epochs(self, orders: queue.Queue) -> None:
        """The prefetch thread: for each ``(epoch, out, stop, times)`` order, sample and fetch every batch of
        ``epoch`` into ``out``, then ``None`` (or the exception); ends at a ``None`` order.

        One thread serves the whole run because DGL seeds its per-thread random engine with the seed
        plus the thread's creation index: the same thread must sample every epoch, in a fresh run and
        in a resumed one alike, for a resume to reproduce the uninterrupted run.
        """
        while (order := orders.get()) is not None:
            epoch, out, stop, times = order

            def put(item: Any) -> None:
                while not stop.is_set():
                    try:
                        out.put(item, timeout=0.5)
                        return
                    except queue.Full:
                        continue

            try:
                seed_sampling(epoch_seed(self.config.seed, epoch, self.rank))
                for seeds in self._epoch_batches(epoch):
                    if stop.is_set():
                        break
                    put(self._prepare(seeds, times))
                else:
                    put(None)
            except BaseException as exc:  # handed to the training thread, which raises it
                put(exc)

    def _prepare(self, seeds: Tensor, times: EpochTimes) -> tuple[MiniBatch, Tensor, Tensor]:
        since = time.perf_counter()
        batch = self.sampler.sample(seeds)
        since = times.add("sample", since)
        batch, x = gather_inputs(self.features, batch, self._buffers)
        y = self.labels.index_select(0, seeds - self.start)
        times.add("fetch", since)
        return batch, x, y

    def train_epoch(self, epoch: int) -> tuple[float, EpochTimes]:
        """One pass over every rank's training nodes; returns the global mean loss and this rank's stage times."""
        self.model.train()
        torch.manual_seed(epoch_seed(self.config.seed, epoch, self.rank))
        times = EpochTimes()
        stop = threading.Event()
        prefetch = self.dist_config.prefetch
        batches: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        worker = self._prefetch_thread()
        if worker is not None:
            self._orders.put((epoch, batches, stop, times))
        else:
            seed_sampling(epoch_seed(self.config.seed, epoch, self.rank))
            pending = iter(self._epoch_batches(epoch))
        loss_sum = 0.0
        try:
            for step in range(self.steps):
                since = time.perf_counter()
                if worker is not None:
                    item = batches.get()
                    if isinstance(item, BaseException):
                        raise item
                    assert item is not None, "the prefetch thread ended early"
                    since = times.add("wait", since)
                else:
                    item = self._prepare(next(pending), times)
                    since = time.perf_counter()
                batch, x, y = item
                batch = batch.to(self.device, non_blocking=True)
                logits = self.model(batch.blocks, x.to(self.device, non_blocking=True))
                loss = F.cross_entropy(logits, y.to(self.device, non_blocking=True), reduction="sum")
                self.optimizer.zero_grad(set_to_none=True)
                # DDP averages over ranks; scaled so that the average is the gradient of the global mean.
                (loss * (self.world_size / self.step_seeds[step])).backward()
                self.optimizer.step()
                loss_sum += loss.item()
                times.add("compute", since)
            if worker is not None:
                assert batches.get() is None
        finally:
            stop.set()
        total = self.exchanger.all_reduce(torch.tensor([loss_sum], dtype=torch.float64))
        return float(total[0]) / float(self.step_seeds.sum()), times

    def _prefetch_thread(self) -> threading.Thread | None:
        """The run's prefetch thread, started on first use (None with ``prefetch=0``)."""
        if not self.dist_config.prefetch:
            return None
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve_epochs, args=(self._orders,),
                                            name="gnnscale-prefetch", daemon=True)
            self._worker.start()
        return self._worker

    def close(self) -> None:
        """Stop the prefetch thread (it finishes the batch it is preparing)."""
        if self._worker is not None:
            self._orders.put(None)
            self._worker.join(timeout=10.0)
            self._worker = None

    # ------------------------------------------------------------------ evaluation
    def _eval_blocks_of_owned(self) -> list[tuple[Block, Tensor]]:
        """Full-neighbour blocks over the owned nodes, with each block's rows in ``cat(owned, halo)``."""
        if self._eval_blocks is None:
            owned = torch.arange(self.start, self.end, dtype=torch.int64)
            lookup = self.degrees.lookup if self.degrees is not None else None
            num_owned = self.end - self.start
            self._eval_blocks = []
            for chunk in owned.split(self.config.eval_batch_size):
                src, counts = self.graph.sample(chunk, -1, False)
                block = self.sampler.make_block(chunk, src, counts, lookup_degrees=lookup)
                ids = block.src_ids
                is_owned = (ids >= self.start) & (ids < self.end)
                rows = torch.where(is_owned, ids - self.start,
                                   num_owned + torch.searchsorted(self.halo_ids, ids))
                self._eval_blocks.append((block, rows))
        return self._eval_blocks

    @torch.no_grad()
    def inference(self) -> Tensor:
        """Logits float [num_owned, num_classes] of the owned nodes, layer by layer over all neighbours."""
        self.module.eval()
        table = self.features
        for layer in range(self.module.num_layers):
            every = torch.cat([table.rows, table.gather(self.halo_ids)])
            out = torch.empty(self.end - self.start, self.module.output_width(layer))
            for block, rows in self._eval_blocks_of_owned():
                x = every.index_select(0, rows).to(self.device)
                out[block.dst_ids - self.start] = self.module.layer(layer, block.to(self.device), x).cpu()
            table = DistTable(out, self.features.offsets, self.exchanger)
        return table.rows

    def evaluate(self) -> tuple[float, float]:
        """``(val, test)`` over the val/test nodes of every rank (each rank returns the same)."""
        logits = self.inference()
        scores = []
        for ids in (self.val_ids, self.test_ids):
            local = ids - self.start
            every_logits = self.exchanger.all_gather_rows(logits.index_select(0, local))
            every_labels = self.exchanger.all_gather_rows(self.labels.index_select(0, local))
            scores.append(evaluate(self.metric, every_logits, every_labels))
        return scores[0], scores[1]

    # ------------------------------------------------------------------ the loop
    def _reduce_epoch_stats(self, times: EpochTimes) -> dict[str, float]:
        """Mean stage times over ranks; total bytes and cache counts of all ranks."""
        feats = self.features.stats
        values = torch.tensor([times.seconds[s] for s in STAGES] +
                              [self.exchanger.stats.bytes_sent, self.exchanger.stats.bytes_received,
                               feats.cache_hits, feats.remote_rows], dtype=torch.float64)
        self.exchanger.all_reduce(values)
        stats = {f"{s}_seconds": float(values[i]) / self.world_size for i, s in enumerate(STAGES)}
        hits, misses = float(values[6]), float(values[7])
        stats.update(bytes_sent=int(values[4]), bytes_received=int(values[5]),
                     cache_hit_rate=hits / (hits + misses) if hits + misses else 0.0)
        return stats

    def _checkpoint_path(self) -> Path | None:
        return self.out / CHECKPOINT_NAME if self.out is not None else None

    def _restore(self) -> dict[str, Any] | None:
        """Rank 0 reads the checkpoint and broadcasts it (no shared file system is assumed)."""
        path = self._checkpoint_path()
        payload: list[Any] = [None]
        if self.rank == 0 and path is not None and path.exists():
            try:
                payload[0] = load_checkpoint(path, self.fingerprint)
            except ValueError as err:  # every rank must learn it, or the others wait in the broadcast
                payload[0] = str(err)
        if self.runtime.sample_group is not None:
            dist.broadcast_object_list(payload, src=0, group=self.runtime.sample_group)
        state = payload[0]
        if isinstance(state, str):
            raise ValueError(state)
        if state is not None:
            self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        return state

    def fit(self) -> TrainResult:
        try:
            return self._fit()
        finally:
            self.close()

    def _fit(self) -> TrainResult:
        cfg, dcfg = self.config, self.dist_config
        best: dict[str, Any] = {"val": -float("inf"), "test": float("nan"), "epoch": 0, "state": None}
        history: list[dict] = []
        since_best, first = 0, 1
        if dcfg.resume:
            state = self._restore()
            if state is not None:
                best, history, since_best = state["best"], state["history"], state["since_best"]
                first = state["epoch"] + 1
                log.info("resumed from epoch %d (best val %.4f at epoch %d)", state["epoch"], best["val"],
                         best["epoch"])
        if self.rank == 0:
            log.info("training %s on %d ranks: %s train nodes per rank, %d steps per epoch", self.module.config.model,
                     self.world_size, self.train_counts, self.steps)
        epoch = first - 1
        stopped = cfg.patience and since_best >= cfg.patience
        for epoch in range(first, cfg.epochs + 1):
            if stopped:
                break
            self.exchanger.stats.reset()
            self.features.stats.reset()
            start = time.perf_counter()
            loss, times = self.train_epoch(epoch)
            epoch_seconds = time.perf_counter() - start
            record: dict[str, Any] = {"epoch": epoch, "loss": loss, "epoch_seconds": epoch_seconds,
                                      **self._reduce_epoch_stats(times)}
            line = (f"epoch {epoch:3d}  loss {loss:.4f}  {epoch_seconds:.2f}s (sample {record['sample_seconds']:.2f} "
                    f"fetch {record['fetch_seconds']:.2f} compute {record['compute_seconds']:.2f} wait "
                    f"{record['wait_seconds']:.2f})  sent {record['bytes_sent'] / 2**20:.1f} MiB  cache hit "
                    f"{record['cache_hit_rate']:.1%}")
            if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                val, test = self.evaluate()
                record.update(val=val, test=test)
                if val > best["val"]:
                    state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
                    best = {"val": val, "test": test, "epoch": epoch, "state": state}
                    since_best = 0
                else:
                    since_best += 1
                line += f"  val {self.metric} {val:.4f} (best {best['val']:.4f} @ {best['epoch']})"
                stopped = bool(cfg.patience and since_best >= cfg.patience)
            history.append(record)
            if self.rank == 0:
                log.info(line)
                if stopped:
                    log.info("early stop: no better validation score in %d evaluations", cfg.patience)
            if self.rank == 0 and self._checkpoint_path() is not None and dcfg.checkpoint_every and \
                    (epoch % dcfg.checkpoint_every == 0 or epoch == cfg.epochs or stopped):
                save_checkpoint(self._checkpoint_path(), {
                    "epoch": epoch, "model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "best": best, "history": history, "since_best": since_best, "fingerprint": self.fingerprint,
                    "torch_rng": torch.get_rng_state()})
        if best["state"] is not None:
            self.module.load_state_dict(best["state"])
        train_seconds = sum(r["epoch_seconds"] for r in history)
        return TrainResult(metric=self.metric, val=best["val"], test=best["test"], best_epoch=best["epoch"],
                           epochs_run=epoch, train_seconds=train_seconds, history=history)
