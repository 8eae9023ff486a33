"""Node classification on 1..N ranks: one trainer, one input pipeline, one fit loop.

Rank ``r`` of a world of ``N`` trains on partition ``r`` (a plain ``python`` run is a world
of one over :func:`partition.load.whole_graph_partition`).  Every rank

* samples with :class:`samplers.distributed.DistNeighborSampler` -- in a world of one, exactly
  the single-machine kernel -- inside a :class:`gnnscale.pipeline.PrefetchLoader` whose workers also
  gather the input rows (a local table, or the :class:`DistTable` of features whose remote rows come from
  their owners); on CUDA through pinned slots and a side stream (:class:`DeviceFeeder`);
* takes the same number of steps per epoch as every other rank (the rank with the most training
  nodes sets it), each rank's loss scaled so that DDP's average of gradients is the gradient of
  the mean loss over the whole step's seeds, as on one machine;
* evaluates layer by layer over all neighbours of its owned nodes, exchanging the halo's
  embeddings once per layer; every rank computes the same metric.

Batch ``i`` of epoch ``e`` on rank ``r`` is sampled with generator ``(seed, e, i, r)`` and the
torch generator is reseeded from ``(seed, e, r)`` every epoch, so the same seed gives the same
run, and a run resumed from the checkpoint of epoch ``e`` continues exactly as the
uninterrupted one.  Distributed sampling and fetching are collectives, so with more than one
rank batches are prepared by at most one worker thread (in batch order).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from gnnscale.batch import Block
from gnnscale.distributed import wire
from gnnscale.distributed.capacity import parse_capacity
from gnnscale.distributed.comm import Exchanger
from gnnscale.distributed.env import Runtime
from gnnscale.distributed.feature_store import DistTable, auto_cache_mb, cache_rows_for, edge_source_counts
from gnnscale.distributed.gradsum import GradientSum
from gnnscale.metrics import evaluate
from gnnscale.nn import GNN, ModelConfig
from gnnscale.options import GRAD_SYNCS
from gnnscale.pipeline import LoaderConfig, PrefetchLoader, split_batches
from gnnscale.pipeline.device import DeviceFeeder
from gnnscale.progress import Progress
from gnnscale.train.checkpoint import CHECKPOINT_NAME, CheckpointWriter, load_checkpoint
from gnnscale.train.fit import FitState, epoch_seed, fit
from gnnscale.train.gradclock import GradSumClock
from gnnscale.train.shares import SeedShares
from partition.load import Partition
from samplers.distributed import DistNeighborSampler, LocalGraph, replicate_structure, structure_bytes
from samplers.inclusion import inclusion_probabilities
from samplers.neighbor import SamplerConfig, make_block

log = logging.getLogger("gnnscale.train")


@dataclass(kw_only=True)
class TrainConfig:
    """Optimisation, evaluation schedule, input pipeline and checkpoints."""

    epochs: int = 20
    """Maximum number of passes over the training nodes."""
    batch_size: int = 1024
    """Seed nodes per mini-batch and rank."""
    lr: float = 0.01
    """Adam learning rate."""
    weight_decay: float = 5e-4
    """Adam L2 penalty (the Planetoid recipes use 5e-4)."""
    patience: int = 0
    """Stop after this many evaluations without a better validation score; 0 never stops early."""
    eval_every: int = 1
    """Evaluate on the validation set every this many epochs (and after the last)."""
    eval_batch_size: int = 8192
    """Destination nodes per block in layer-wise inference."""
    seed: int = 0
    """Seeds the weights, the batch order and every batch's sampling."""
    num_workers: int = 1
    """Loader threads that sample and gather ahead of training; 0 samples in the training thread.
    More than one needs a world of one (distributed sampling is a collective, made in batch order)."""
    prefetch: int = 2
    """Batches kept ready beyond those the workers are preparing."""
    features_on_device: bool = False
    """Keep the whole feature table on the device and send only ids (CUDA, world of one)."""
    checkpoint_every: int = 1
    """Write ``checkpoint.pt`` every this many epochs (and after the last); 0 never."""
    resume: bool = False
    """Continue from the run folder's checkpoint when there is one."""
    on_checkpoint_error: str = "stop"
    """A checkpoint that cannot be written: ``stop`` the run (the last one intact), or ``warn`` and train on."""
    rank_capacity: str | None = None
    """``auto`` or ``w0,w1,...``: deal every step's seeds among ranks by speed (:mod:`gnnscale.train.shares`);
    None: each rank trains its own training nodes."""
    grad_sync: str = "step"
    """How the ranks' gradients meet (more than one rank): ``step``, each update waits for its own step's
    sum (DDP, started during the backward): the single-machine step; ``late``, a step's sum runs while
    the next step computes and each update applies the previous step's sum (one step stale, the last
    one applied before the epoch ends): the network and the ranks' step-to-step jitter are hidden."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("num_workers", "prefetch", "patience", "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.grad_sync not in GRAD_SYNCS:
            raise ValueError(f"--grad-sync must be one of {', '.join(GRAD_SYNCS)}, got {self.grad_sync!r}")
        if self.weight_decay < 0:
            raise ValueError(f"--weight-decay must be >= 0, got {self.weight_decay}")


CACHE_POLICIES = ("auto", "degree", "presample", "vip")


@dataclass(kw_only=True)
class CacheConfig:
    """Which remote feature rows each rank keeps, and how remote rows travel (more than one rank only)."""

    cache_mb: float | str = "auto"
    """MiB of remote feature rows each rank caches (0 disables the cache), or ``auto``: every row the policy
    ranks (with vip: every remote row a batch can reach) while they fit a quarter of the memory available
    at start, shared among the machine's ranks (:func:`~gnnscale.distributed.feature_store.auto_cache_mb`)."""
    cache_policy: str = "auto"
    """``degree`` (most frequent sources of owned nodes' in-edges), ``presample`` (most requested
    while sampling ``presample_batches`` mini-batches), ``vip`` (highest probability of being a batch's
    input, SALIENT++'s; needs the replicated topology) or ``auto`` (vip where the topology is
    replicated, else degree)."""
    presample_batches: int = 8
    """Mini-batches sampled to count requests with the ``presample`` policy."""
    wire_dtype: str = "float32"
    """How feature rows (cache fill included) and evaluation's halo embeddings cross the wire: ``float32``
    exactly, or ``float16``/``bfloat16``/``int8`` within the bounds of :mod:`gnnscale.distributed.wire`.
    GCN degrees always travel exactly."""
    topology: str = "auto"
    """``replicated``: every rank holds the whole graph structure and samples without requests (only
    feature rows move); ``partitioned``: each rank holds its own in-edges and asks owners for the rest;
    ``auto``: replicated when the whole structure fits ``topology_budget_mb``."""
    topology_budget_mb: float = 1024.0
    """MiB each rank may spend on the whole graph structure (int64 offsets and sources)."""

    def __post_init__(self) -> None:
        wire.check_wire_dtype(self.wire_dtype)
        if self.topology not in ("auto", "partitioned", "replicated"):
            raise ValueError(f"--topology must be auto, partitioned or replicated, got {self.topology!r}")
        if self.topology_budget_mb < 0:
            raise ValueError(f"--topology-budget-mb must be >= 0, got {self.topology_budget_mb}")
        if isinstance(self.cache_mb, str) and self.cache_mb != "auto":
            raise ValueError(f"--cache-mb must be a number of MiB or auto, got {self.cache_mb!r}")
        if not isinstance(self.cache_mb, str) and not self.cache_mb >= 0:
            raise ValueError(f"--cache-mb must be >= 0, got {self.cache_mb}")
        if self.cache_policy not in CACHE_POLICIES:
            raise ValueError(f"--cache-policy must be one of {', '.join(CACHE_POLICIES)}, got {self.cache_policy!r}")
        if self.presample_batches < 0:
            raise ValueError(f"presample_batches must be >= 0, got {self.presample_batches}")


@dataclass(kw_only=True)
class TrainResult:
    """What a run achieved, at the epoch with the best validation score."""

    metric: str
    val: float
    test: float
    best_epoch: int
    epochs_run: int
    train_seconds: float
    history: list[dict]


def resident(array: np.ndarray, dtype: type) -> np.ndarray:
    """``array`` in memory and writable: a copy of a (read-only) memory map, else the array itself."""
    if isinstance(array, np.memmap) or not array.flags.writeable:
        return np.array(array, dtype=dtype)
    return np.ascontiguousarray(array, dtype=dtype)


class Trainer:
    """Trains a :class:`GNN` on partition ``runtime.rank`` (the whole graph in a world of one).

    Args:
        part: this rank's partition (``load_partition(dir, rank)`` or ``whole_graph_partition``).
        runtime: process groups and device (``init_runtime(DistEnv())`` for a world of one).
        split: which split's masks to use.
        out: run folder for the checkpoint (rank 0 writes it), or None for none.
        show_progress: draw progress within each epoch (rank 0 only).
    """

    def __init__(self, part: Partition, runtime: Runtime, *, split: int, model_config: ModelConfig,
                 sampler_config: SamplerConfig, config: TrainConfig, cache_config: CacheConfig | None = None,
                 out: Path | None = None, show_progress: bool = False) -> None:
        if len(sampler_config.fanouts) != model_config.num_layers:
            raise ValueError(f"got {len(sampler_config.fanouts)} fanouts for {model_config.num_layers} layers; "
                             f"give one fanout per layer, e.g. --fanouts {','.join(['10'] * model_config.num_layers)}")
        num_splits = part.train_masks.shape[0]
        if not 0 <= split < num_splits:
            raise ValueError(f"--split {split} is out of range: the dataset has {num_splits} split(s), "
                             f"0..{num_splits - 1}")
        self.part, self.runtime, self.config = part, runtime, config
        self.rank, self.world_size, self.device = runtime.rank, runtime.world_size, runtime.device
        self._check_pipeline_options()
        self.out, self.metric, self.show_progress = out, part.metric, show_progress and self.rank == 0
        self.checkpoints = None if out is None else CheckpointWriter(out / CHECKPOINT_NAME, config.on_checkpoint_error)
        self.start, self.end = part.node_range
        self.exchanger = Exchanger(runtime.sample_group, self.rank, self.world_size)
        self.split = split
        cache_config = cache_config or CacheConfig()
        # What actually crosses the wire: a world of one sends nothing, its rows stay exact.
        self.wire_dtype = cache_config.wire_dtype if self.world_size > 1 else "float32"
        self._load_shard(split)
        self._plan_steps()
        self._build_stores(sampler_config, cache_config)
        with torch.random.fork_rng(devices=[]):  # the same initial weights on every rank, the global RNG untouched
            torch.manual_seed(config.seed)
            self.module = GNN(model_config, self.features.row_shape[0], part.num_classes).to(self.device)
        late = config.grad_sync == "late" and runtime.group is not None
        self.model = DistributedDataParallel(self.module, process_group=runtime.group) \
            if runtime.group is not None and not late else self.module
        self.grad_clock = GradSumClock(self.model, runtime.group) if self.model is not self.module else None
        # --grad-sync late: gradients summed on the training thread's group (the loader's collectives use
        # the sample group), every update a step late.
        self.gradients = GradientSum(list(self.module.parameters()), Exchanger(
            runtime.group, self.rank, self.world_size)) if late else None
        # DDP averages over ranks, the late sum adds: either way the step's global mean's gradient.
        self.loss_scale = float(self.world_size) if self.grad_clock is not None else 1.0
        self.grad_wait = 0.0  # this epoch's exposed wait for gradient sums
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.shares = self._seed_shares()
        self.loader, self.feeder = self._make_pipeline()
        if self.shares is not None:
            self.shares.calibrate(self._alone_step)
        self._eval_blocks: list[tuple[Block, Tensor]] | None = None
        self.fingerprint = {"num_nodes": part.book.num_nodes, "world_size": self.world_size, "split": split,
                            "model": repr(model_config), "sampler": repr(sampler_config),
                            "batch_size": config.batch_size, "lr": config.lr, "seed": config.seed,
                            "weight_decay": config.weight_decay, "wire_dtype": self.wire_dtype}
        if config.rank_capacity is not None:  # absent otherwise: earlier checkpoints keep resuming
            self.fingerprint["rank_capacity"] = config.rank_capacity
        if late:
            self.fingerprint["grad_sync"] = config.grad_sync

    # ------------------------------------------------------------------ set-up
    def _check_pipeline_options(self) -> None:
        cfg = self.config
        if self.world_size > 1 and cfg.num_workers > 1:
            raise ValueError(f"--num-workers {cfg.num_workers} needs a world of one: with {self.world_size} ranks "
                             f"sampling and feature fetches are collectives made in batch order by one thread; "
                             f"use --num-workers 1")
        if cfg.features_on_device and (self.device.type != "cuda" or self.world_size > 1):
            log.warning("--features-on-device has no effect here (it needs --device cuda and a world of one); "
                        "batches are gathered on the host")
            cfg.features_on_device = False

    def _load_shard(self, split: int) -> None:
        part = self.part

        def owned(masks: np.ndarray) -> Tensor:
            return torch.from_numpy(np.flatnonzero(np.asarray(masks[split]))) + self.start

        self.train_ids, self.val_ids, self.test_ids = (owned(part.train_masks), owned(part.val_masks),
                                                       owned(part.test_masks))
        self.labels = torch.from_numpy(resident(part.labels, np.int64))
        self.graph = LocalGraph(resident(part.indptr, np.int64), resident(part.indices, np.int64), start=self.start)
        offsets = torch.from_numpy(np.asarray(part.book.offsets, dtype=np.int64))
        self.features = DistTable(torch.from_numpy(resident(part.features, np.float32)), offsets, self.exchanger,
                                  wire_dtype=self.wire_dtype)
        # The 1-hop halo: every non-owned source of an owned node's in-edge, with its edge count.
        self.halo_ids, self._halo_counts = edge_source_counts(self.graph.indices, self.start, self.end)

    def _sampling_graph(self, cache: CacheConfig) -> tuple[LocalGraph, bool]:
        """The graph the sampler draws from: the whole structure where ``cache.topology`` asks for it and it
        fits the budget (every rank decides alike: the sizes are global), else the own in-edges."""
        if self.world_size == 1 or cache.topology == "partitioned":
            return self.graph, False
        num_nodes = int(self.features.offsets[-1])
        size = structure_bytes(num_nodes, sum(self.exchanger.all_gather_counts(self.graph.indices.size)))
        budget = cache.topology_budget_mb * 2**20
        if size > budget:
            if cache.topology == "replicated":
                raise ValueError(f"--topology replicated needs {size / 2**20:.1f} MiB per rank for the whole graph "
                                 f"structure, over --topology-budget-mb {cache.topology_budget_mb:g}; raise the "
                                 f"budget or use --topology partitioned")
            log.info("rank %d: the whole graph structure (%.1f MiB) exceeds --topology-budget-mb %g: topology "
                     "partitioned, sampling asks owners for remote neighbours", self.rank, size / 2**20,
                     cache.topology_budget_mb)
            return self.graph, False
        log.info("rank %d: whole graph structure %.1f MiB of the %g MiB budget: topology replicated, sampling "
                 "sends no requests", self.rank, size / 2**20, cache.topology_budget_mb)
        return replicate_structure(self.graph, self.exchanger), True

    def _build_stores(self, sampler_config: SamplerConfig, cache: CacheConfig) -> None:
        sample_graph, self.replicated = self._sampling_graph(cache)
        self.degrees = None
        if sampler_config.gcn_norm and not self.replicated:
            self.degrees = DistTable(self.graph.degree.to(torch.float32), self.features.offsets, self.exchanger)
            self.degrees.fill_cache(self.halo_ids)
        self.sampler = DistNeighborSampler(sample_graph, self.features.offsets, self.exchanger, sampler_config,
                                           self.degrees, replicated=self.replicated)
        if self.world_size == 1:
            return
        self.features.use_id_map = self.replicated  # whole-graph arrays are held then anyway
        auto = cache.cache_mb == "auto"
        budget_mb = auto_cache_mb(self.runtime.env.local_world_size) if auto else cache.cache_mb
        rows = cache_rows_for(budget_mb, self.features.row_shape, self.features.rows.dtype)
        policy = cache.cache_policy if cache.cache_policy != "auto" else "vip" if self.replicated else "degree"
        candidates, counts = self.halo_ids, self._halo_counts
        if policy == "presample" and rows:
            candidates, counts = self._presample_counts(cache.presample_batches)
        elif policy == "vip" and rows:
            candidates, counts = self._inclusion_scores(sample_graph, sampler_config)
        self.features.fill_cache_by_counts(candidates, counts, min(rows, candidates.numel()))
        # vip's candidates are every node a batch of this rank can reach (with seed shares, from any rank's
        # seeds): cached whole on every rank, the batches need no exchange (and the ranks no lockstep but the
        # gradient sum).
        whole = policy == "vip" and rows >= candidates.numel()
        self.features.cache_complete = bool(self.exchanger.all_reduce(torch.tensor([int(whole)]),
                                                                      op=dist.ReduceOp.MIN)[0])
        log.info("rank %d: %d owned nodes, %d in-edges, %d halo nodes, feature cache %d rows (%.1f MiB of %s, %s)",
                 self.rank, self.end - self.start, self.graph.indices.size, self.halo_ids.numel(),
                 self.features.cache_ids.numel(), self.features.cache_bytes / 2**20,
                 f"{budget_mb:.0f} MiB" + (" auto" if auto else ""),
                 policy + (", every reachable remote row: batches make no exchange" if self.features.cache_complete
                           else ""))

    def _inclusion_scores(self, whole: LocalGraph, sampler_config: SamplerConfig) -> tuple[Tensor, Tensor]:
        """Non-owned nodes with their probability of being an input of one of this rank's mini-batches
        (SALIENT++'s vertex inclusion probability, :mod:`samplers.inclusion`); needs the whole structure.

        With seed shares (``--rank-capacity``) a rank may train any rank's seeds: those of the others count
        too, at 1/world_size of an own seed's weight (only part of them, and only on a faster rank), so that
        a budget holding every candidate leaves no batch anything to fetch."""
        if not self.replicated:
            raise ValueError("--cache-policy vip needs the whole graph structure on every rank: use --topology "
                             "replicated (or auto, within --topology-budget-mb), or another --cache-policy")
        seed_probability = np.zeros(whole.num_owned, dtype=np.float64)
        if self.config.rank_capacity is not None:
            seed_probability[self.exchanger.all_gather_rows(self.train_ids).numpy()] = \
                1.0 / (self.steps * self.world_size)
        seed_probability[self.train_ids.numpy()] = 1.0 / self.steps  # each own training node: one step per epoch
        p = inclusion_probabilities(whole.indptr, whole.indices, seed_probability, sampler_config.fanouts)
        p[self.start:self.end] = 0.0
        candidates = np.flatnonzero(p > 0)
        return torch.from_numpy(candidates), torch.from_numpy(p[candidates])

    def _presample_counts(self, num_batches: int) -> tuple[Tensor, Tensor]:
        """Non-owned input nodes of the first epoch's first few batches, with how often each was needed."""
        batches = split_batches(self.train_ids, self.config.batch_size, False, self._num_batches())
        needed = []
        for step in range(min(num_batches, len(batches))):
            rng = np.random.default_rng((self.config.seed, 0, step, self.rank))
            ids = self.sampler.sample(batches[step], rng=rng).input_ids
            needed.append(ids[(ids < self.start) | (ids >= self.end)])
        if not needed:
            return self.halo_ids[:0], self.halo_ids[:0]
        return torch.unique(torch.cat(needed), return_counts=True)

    def _num_batches(self) -> int | None:
        """Batches per epoch where ranks must agree on it (None in a world of one: cut by batch size)."""
        if self.world_size == 1:
            return None
        return max(math.ceil(n / self.config.batch_size) for n in self.train_counts)

    def _plan_steps(self) -> None:
        """Every rank takes the same number of steps; ``step_seeds[i]`` is step ``i``'s seeds over all ranks."""
        self.train_counts = self.exchanger.all_gather_counts(self.train_ids.numel())
        for name, ids in (("training", self.train_ids), ("validation", self.val_ids), ("test", self.test_ids)):
            if sum(self.train_counts if name == "training" else self.exchanger.all_gather_counts(ids.numel())) == 0:
                raise ValueError(f"split {self.split} has no {name} nodes, so there is nothing to "
                                 f"{'train on' if name == 'training' else 'score'}; choose another --split, or give "
                                 f"the dataset a non-empty {name} mask")
        steps = self._num_batches()
        short = [r for r, n in enumerate(self.train_counts) if steps is not None and n < steps]
        if short:
            raise ValueError(f"partition {short[0]} has {self.train_counts[short[0]]} training node(s) but every rank "
                             f"takes {steps} steps per epoch; re-partition with --balance nodes,train or raise "
                             f"--batch-size")
        sizes = [[len(b) for b in split_batches(torch.arange(n), self.config.batch_size, False, steps)]
                 for n in self.train_counts]
        self.steps = len(sizes[0])
        self.step_seeds = torch.tensor(np.sum(sizes, axis=0), dtype=torch.float32)

    def _seed_shares(self) -> SeedShares | None:
        capacity = parse_capacity(self.config.rank_capacity, self.world_size)
        if capacity is None or self.world_size == 1:
            return None
        if capacity == "auto" and not self.replicated:
            raise ValueError("--rank-capacity auto times each rank's steps alone, which needs the replicated "
                             "topology (sampling without requests): raise --topology-budget-mb, or give the "
                             "weights, e.g. --rank-capacity 2,1")
        return SeedShares(self.exchanger, self.train_ids, self.labels.index_select(0, self.train_ids - self.start),
                          self.train_counts, int(self.features.offsets[-1]), capacity,
                          batch_size=self.config.batch_size, steps=self.steps, seed=self.config.seed)

    def _alone_step(self, seeds: Tensor) -> None:
        """One step's work on ``seeds`` with no collective: sampled on the replicated structure, remote rows
        left zero (owned and cached ones read), forward and backward, no gradient sum or update.  What
        ``--rank-capacity auto`` times."""
        rng = np.random.default_rng((self.config.seed, 2**31, self.rank))  # 2**31: no epoch's stream
        batch = self.sampler.sample(seeds, rng=rng)
        ids = batch.input_ids
        x = torch.zeros((ids.numel(), *self.features.row_shape))
        local = (ids >= self.start) & (ids < self.end)
        x[local] = self.features.rows.index_select(0, ids[local] - self.start)
        logits = self.module(batch.blocks, x.to(self.device))
        F.cross_entropy(logits, self.shares.labels[seeds].to(self.device)).backward()
        self.module.zero_grad(set_to_none=True)

    def _make_pipeline(self) -> tuple[PrefetchLoader, DeviceFeeder]:
        cfg, on_device = self.config, self.config.features_on_device
        table = self.features.rows if self.world_size == 1 else self.features
        # With seed shares a rank trains seeds of other partitions: labels of every training node, by global id.
        labels, first_id = (self.labels, self.start) if self.shares is None else (self.shares.labels, 0)
        loader = PrefetchLoader(self.sampler.sample, self.train_ids, table, labels, LoaderConfig(
            batch_size=cfg.batch_size, num_workers=cfg.num_workers, prefetch=cfg.prefetch, seed=cfg.seed,
            pin_memory=self.device.type == "cuda", gather_features=not on_device,
            num_batches=self._num_batches(), rank=self.rank), first_id=first_id,
            plan=None if self.shares is None else self.shares.plan)
        return loader, DeviceFeeder(self.device, self.features.rows.to(self.device) if on_device else None)

    # ------------------------------------------------------------------ training
    def train_epoch(self, epoch: int) -> tuple[float, dict[str, float]]:
        """One pass over every rank's training nodes: the global mean loss, and this rank's time split."""
        self.model.train()
        torch.manual_seed(epoch_seed(self.config.seed, epoch, self.rank))
        self.loader.epoch = epoch
        loss_sum, self.grad_wait, start = 0.0, 0.0, time.perf_counter()
        pending: Callable[[], None] | None = None  # --grad-sync late: the previous step's sum
        with Progress(self.steps, desc=f"epoch {epoch}", enabled=self.show_progress) as progress:
            for step, item in enumerate(self.feeder(self.loader)):
                logits = self.model(item.batch.blocks, item.x)
                loss = F.cross_entropy(logits, item.y, reduction="sum")
                self.optimizer.zero_grad(set_to_none=True)
                backward_start = time.perf_counter()
                (loss * (self.loss_scale / self.step_seeds[step])).backward()
                pending = self._update(backward_start, pending)
                # .item() waits for the device: it keeps the wait/compute split honest on CUDA.
                loss_sum += loss.item()
                progress.update()
        if pending is not None:  # the last step's sum, before evaluation or a checkpoint reads the weights
            self._late_update(pending)
        seconds, stats = time.perf_counter() - start, self.loader.stats
        times = {"wait_s": stats.wait, "compute_s": seconds - stats.wait, "sample_s": stats.sample,
                 "gather_s": stats.gather, "transfer_s": self.feeder.copy_seconds, "grad_wait_s": self.grad_wait,
                 "sample_cpu_s": stats.sample_cpu, "gather_cpu_s": stats.gather_cpu}
        self.feeder.copy_seconds = 0.0
        total = self.exchanger.all_reduce(torch.tensor([loss_sum], dtype=torch.float64))
        return float(total[0]) / float(self.step_seeds.sum()), times

    def _update(self, backward_start: float, pending: Callable[[], None] | None) -> Callable[[], None] | None:
        """After a step's backward: the update (``--grad-sync step``, or a world of one), or start this
        step's sum and apply the previous one's (``late``); returns the sum still running."""
        if self.gradients is None:
            if self.grad_clock is not None:
                self.grad_wait += self.grad_clock.exposed(backward_start)
            self.optimizer.step()
            return None
        started = self.gradients.start_rest()  # copies this step's gradients: the update may replace them
        if pending is not None:
            self._late_update(pending)
        return started

    def _late_update(self, finish: Callable[[], None]) -> None:
        waited = time.perf_counter()
        finish()  # the summed gradients become the parameters' own
        self.grad_wait += time.perf_counter() - waited
        self.optimizer.step()

    # ------------------------------------------------------------------ evaluation
    def _eval_blocks_of_owned(self) -> list[tuple[Block, Tensor]]:
        """Full-neighbour blocks over the owned nodes, with each block's rows in ``cat(owned, halo)``."""
        if self._eval_blocks is None:
            owned = torch.arange(self.start, self.end, dtype=torch.int64)
            lookup = self.sampler.local_degrees if self.replicated else \
                self.degrees.lookup if self.degrees is not None else None
            self._eval_blocks = []
            for chunk in owned.split(self.config.eval_batch_size):
                src, counts = self.graph.sample(chunk, -1, False, None)
                block = make_block(chunk, src, counts, self.sampler.config, lookup)
                ids = block.src_ids
                is_owned = (ids >= self.start) & (ids < self.end)
                rows = torch.where(is_owned, ids - self.start,
                                   (self.end - self.start) + torch.searchsorted(self.halo_ids, ids))
                self._eval_blocks.append((block, rows))
        return self._eval_blocks

    @torch.no_grad()
    def inference(self) -> Tensor:
        """Logits float [num_owned, num_classes] of the owned nodes, layer by layer over all neighbours."""
        self.module.eval()
        table = self.features
        for layer in range(self.module.num_layers):
            every = table.rows if not self.halo_ids.numel() else torch.cat([table.rows, table.gather(self.halo_ids)])
            out = torch.empty(self.end - self.start, self.module.output_width(layer))
            for block, rows in self._eval_blocks_of_owned():
                x = every.index_select(0, rows).to(self.device)
                out[block.dst_ids - self.start] = self.module.layer(layer, block.to(self.device), x).cpu()
            table = DistTable(out, self.features.offsets, self.exchanger, wire_dtype=self.wire_dtype)
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
    def _epoch_record(self, epoch: int) -> dict[str, Any]:
        self.exchanger.stats.reset()
        self.features.stats.reset()
        start, cpu_start = time.perf_counter(), time.process_time()
        shares = self.shares.record() if self.shares is not None else {}
        loss, times = self.train_epoch(epoch)
        if self.shares is not None and epoch < self.config.epochs:  # the next epoch's shares, from this one's steps
            self.shares.rebalance(epoch, times["wait_s"] + times["compute_s"] - times["grad_wait_s"])
        # CPU seconds of every thread of this process (trainer, loader, gloo), summed over ranks below.
        times["cpu_s"] = time.process_time() - cpu_start
        times["exchange_s"] = self.exchanger.stats.seconds
        record: dict[str, Any] = {"epoch": epoch, "loss": loss, "epoch_seconds": time.perf_counter() - start,
                                  **self._reduce_epoch_stats(times), **shares}
        if epoch % self.config.eval_every == 0 or epoch == self.config.epochs:
            record["val"], record["test"] = self.evaluate()
        return record

    def _reduce_epoch_stats(self, times: dict[str, float]) -> dict[str, float]:
        """Stage times (and CPU and exchange seconds) averaged over ranks, CPU seconds also summed; bytes and
        cache counts summed (more than one rank)."""
        feats, comm = self.features.stats, self.exchanger.stats
        values = torch.tensor([*times.values(), comm.bytes_sent, comm.bytes_received, feats.cache_hits,
                               feats.remote_rows], dtype=torch.float64)
        self.exchanger.all_reduce(values)
        stats = {name: round(float(values[i]) / self.world_size, 4) for i, name in enumerate(times)}
        stats["cpu_s_all_ranks"] = round(float(values[list(times).index("cpu_s")]), 4)
        if self.world_size > 1:
            hits, misses = float(values[-2]), float(values[-1])
            stats.update(bytes_sent=int(values[-4]), bytes_received=int(values[-3]),
                         cache_hit_rate=hits / (hits + misses) if hits + misses else 0.0)
        return stats

    def _log_epoch(self, record: dict[str, Any], state: FitState) -> None:
        if self.rank != 0:
            return
        line = f"epoch {record['epoch']:3d}  loss {record['loss']:.4f}  {record['epoch_seconds']:.2f}s"
        if "val" in record:
            line += f"  val {self.metric} {record['val']:.4f}  (best {state.best['val']:.4f} @ {state.best['epoch']})"
        line += "  (wait {wait_s:.2f}s compute {compute_s:.2f}s | workers: sample {sample_s:.2f}s " \
                "gather {gather_s:.2f}s)".format(**record)
        if self.world_size > 1:
            line += f"  sent {record['bytes_sent'] / 2**20:.1f} MiB  cache hit {record['cache_hit_rate']:.1%}"
        log.info(line)

    def _checkpoint(self, state: FitState) -> None:
        every, path = self.config.checkpoint_every, self._checkpoint_path()
        if self.rank != 0 or path is None or not every:
            return
        if state.epoch % every == 0 or state.epoch == self.config.epochs or state.stopped:
            self.checkpoints.write({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                                    "fit": state.as_dict(), "fingerprint": self.fingerprint})

    def _checkpoint_path(self) -> Path | None:
        return self.out / CHECKPOINT_NAME if self.out is not None else None

    def _restore(self) -> FitState:
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
        if isinstance(payload[0], str):
            raise ValueError(payload[0])
        if payload[0] is None:
            return FitState()
        self.module.load_state_dict(payload[0]["model"])
        self.optimizer.load_state_dict(payload[0]["optimizer"])
        state = FitState(**payload[0]["fit"])
        log.info("resumed from epoch %d (best val %.4f at epoch %d)", state.epoch, state.best.get("val", float("nan")),
                 state.best.get("epoch", 0))
        return state

    def fit(self) -> TrainResult:
        """Train with early stopping on the validation score; the model keeps the best epoch's weights."""
        state = self._restore() if self.config.resume else FitState()
        if self.rank == 0:
            log.info("training %s on %d rank(s): %s train nodes per rank, %d steps per epoch",
                     self.module.config.model, self.world_size, self.train_counts, self.steps)
        state = fit(state, epochs=self.config.epochs, patience=self.config.patience, score_key="val",
                    train_epoch=self._epoch_record, log_epoch=self._log_epoch, after_epoch=self._checkpoint,
                    snapshot=lambda: {k: v.detach().clone() for k, v in self.module.state_dict().items()})
        if state.best_state is not None:
            self.module.load_state_dict(state.best_state)
        best = state.best
        return TrainResult(metric=self.metric, val=best.get("val", -math.inf), test=best.get("test", math.nan),
                           best_epoch=best.get("epoch", 0), epochs_run=state.epoch,
                           train_seconds=sum(r["epoch_seconds"] for r in state.history), history=state.history)
