"""Node classification on 1..N ranks: one trainer, one input pipeline, one fit loop, written with the
public API (:class:`gnnscale.Graph`, :class:`gnnscale.NodeLoader`, :func:`gnnscale.layerwise_inference`).

Rank ``r`` of a world of ``N`` trains on partition ``r`` (a plain ``python`` run is a world
of one over :func:`partition.load.whole_graph_partition`).  Every rank

* samples with :class:`samplers.distributed.DistNeighborSampler` -- in a world of one, exactly
  the single-machine kernel -- inside a :class:`gnnscale.pipeline.PrefetchLoader` whose workers also
  gather the input rows (a local table, or the :class:`DistTable` of features whose remote rows come from
  their owners); on CUDA through pinned slots and a side stream (:class:`DeviceFeeder`);
* takes the same number of steps per epoch as every other rank (the rank with the most training
  nodes sets it), each rank's loss scaled so that the sum of the ranks' gradients is the gradient of
  the mean loss over the whole step's seeds, as on one machine;
* evaluates layer by layer over all neighbours of its owned nodes, exchanging the halo's
  embeddings once per layer; every rank computes the same metric.

Batch ``i`` of epoch ``e`` on rank ``r`` is sampled with generator ``(seed, e, i, r)`` and dropout
draws from torch's generator seeded from ``(seed, e, r)`` inside a fork of it (the caller's global
RNG state is restored after every epoch), so the same seed gives the same run, and a run resumed from the checkpoint of epoch ``e`` continues exactly as the
uninterrupted one.  Distributed sampling and fetching are collectives, so with more than one
rank batches are prepared by at most one worker thread (in batch order).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale import memory
from gnnscale.distributed.comm import Exchanger
from gnnscale.distributed.env import Runtime
from gnnscale.distributed.feature_store import DistTable
from gnnscale.distributed.gradsum import GradientSum, broadcast_from_rank0
from gnnscale.graph import Graph
from gnnscale.inference import NodeOutputs, layerwise_inference
from gnnscale.nn import GNN, ModelConfig
from gnnscale.optim import Adam
from gnnscale.node_loader import NodeLoader
from gnnscale.options import GRAD_SYNCS
from gnnscale.progress import Progress
from gnnscale.sampling import CacheConfig
from gnnscale.train.checkpoint import CHECKPOINT_NAME, CheckpointWriter, checkpoint_due, restore_checkpoint
from gnnscale.train.fit import FitState, epoch_seed, fit, seeded
from gnnscale.world import World
from partition.load import Partition
from samplers.distributed import DistNeighborSampler
from samplers.neighbor import SamplerConfig

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
    sum (:class:`GradientSum`'s buckets, started during the backward): the single-machine step; ``late``, a step's sum runs while
    the next step computes and each update applies the previous step's sum (one step stale, the last
    one applied before the epoch ends): the network and the ranks' step-to-step jitter are hidden."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_workers", "prefetch", "patience", "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.grad_sync not in GRAD_SYNCS:
            raise ValueError(f"grad_sync must be one of {', '.join(GRAD_SYNCS)}, got {self.grad_sync!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")


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
    memory: dict | None = None
    """Every rank's memory account at the start and the end (:mod:`gnnscale.memory`), for metrics.json."""



LossFn = Callable[[Tensor, Tensor], Tensor]
"""``loss(outputs [batch, ...], targets [batch, ...]) -> scalar``, summed (not averaged) over the batch's seeds:
the trainer scales it so that the gradient is that of the mean over the whole step's seeds on every rank."""
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def cross_entropy_sum(logits: Tensor, labels: Tensor) -> Tensor:
    """The default loss of single-label tasks: cross entropy summed over the batch."""
    return F.cross_entropy(logits, labels, reduction="sum")


def binary_cross_entropy_sum(logits: Tensor, labels: Tensor) -> Tensor:
    """The default loss of multi-label tasks (labels 0/1 [batch, num_labels]): binary cross entropy of every
    label, averaged over the labels and summed over the batch."""
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="sum") / labels.shape[1]


def default_loss(metric: str) -> LossFn:
    """The loss of a dataset's task: binary cross entropy per label for multi-label, else cross entropy."""
    return binary_cross_entropy_sum if metric == "multilabel_roc_auc" else cross_entropy_sum


class Trainer:
    """Trains a model on this rank's share of ``graph`` (the whole graph in a world of one), through the public
    API: a :class:`~gnnscale.NodeLoader` over the training nodes, :func:`~gnnscale.layerwise_inference` to
    evaluate.

    Args:
        graph: the graph handle; its split's masks give the training, validation and test nodes.
        sampler_config: fanouts (one per model layer), self-loops and GCN weights.
        config: optimisation, schedule, pipeline and checkpoints.
        model_config: the built-in :class:`GNN` to train (ignored when ``model`` is given).
        model: any module with ``forward(blocks, x)`` and the layer-wise protocol of :mod:`gnnscale.inference`.
        loss: ``loss(outputs, labels)`` summed over the batch (default: cross entropy).
        optimizer: ``optimizer(parameters) -> torch.optim.Optimizer`` (default: :class:`gnnscale.optim.Adam`,
            torch's Adam without its compiler's memory, with ``config``'s lr and weight decay).
        cache_config: feature cache and topology (more than one rank).
        out: run folder for the checkpoint (rank 0 writes it), or None for none.
        show_progress: draw progress within each epoch (rank 0 only).
    """

    def __init__(self, graph: Graph, *, sampler_config: SamplerConfig, config: TrainConfig,
                 model_config: ModelConfig | None = None, model: nn.Module | None = None, loss: LossFn | None = None,
                 optimizer: OptimizerFactory | None = None, cache_config: CacheConfig | None = None,
                 out: Path | None = None, show_progress: bool = False) -> None:
        self.graph, self.world, self.config = graph, graph.world, config
        self.runtime, self.rank, self.world_size, self.device = (self.world.runtime, self.world.rank,
                                                                 self.world.size, self.world.device)
        self.out, self.metric, self.show_progress = out, graph.metric, show_progress and self.rank == 0
        self.checkpoints = None if out is None else CheckpointWriter(out / CHECKPOINT_NAME, config.on_checkpoint_error)
        self.exchanger = self.world.exchanger
        self.module = self._build_model(model, model_config)
        if model_config is not None and model is None and model_config.edge_features:
            sampler_config = dataclasses.replace(sampler_config, edge_ids=True)  # the caller's stays as it is
        self.sampler_config = sampler_config
        if len(sampler_config.fanouts) != self.module.num_layers:
            raise ValueError(f"got {len(sampler_config.fanouts)} fanouts for {self.module.num_layers} layers; give "
                             f"one fanout per layer, e.g. fanouts={','.join(['10'] * self.module.num_layers)}")
        self._check_split()
        self.loader = NodeLoader(graph, graph.train_ids, fanouts=sampler_config.fanouts,
                                 batch_size=config.batch_size, seed=config.seed, self_loops=sampler_config.self_loops,
                                 gcn_norm=sampler_config.gcn_norm, replace=sampler_config.replace,
                                 num_workers=config.num_workers, prefetch=config.prefetch, cache=cache_config,
                                 rank_capacity=config.rank_capacity, features_on_device=config.features_on_device,
                                 edge_features=sampler_config.edge_ids)
        self.steps, self.step_seeds, self.shares = self.loader.steps, self.loader.step_sizes, self.loader.shares
        self.loss = loss or default_loss(graph.metric)
        self._wrap_for_gradient_sums()
        self.optimizer = optimizer(self.model.parameters()) if optimizer is not None else Adam(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        if self.shares is not None:
            self.shares.calibrate(self._alone_step)
        self.fingerprint = self._fingerprint(model_config if model is None else None)
        self.memory = {"start": self._memory_report("start")}

    @classmethod
    def on_partition(cls, part: Partition, runtime: Runtime, *, split: int = 0,
                     cache_config: CacheConfig | None = None, **kwargs: Any) -> "Trainer":
        """A trainer on ``part`` (this rank's partition) in the job ``runtime`` belongs to, whose lifetime the
        caller manages: the graph handle is made here, with ``cache_config``'s wire dtype and memory budget."""
        cache_config = cache_config or CacheConfig()
        graph = Graph(part, World.from_runtime(runtime), split=split, wire_dtype=cache_config.wire_dtype,
                      memory_budget=cache_config.memory_budget)
        return cls(graph, cache_config=cache_config, **kwargs)

    # ------------------------------------------------------------------ set-up
    def _memory_report(self, moment: str) -> dict[str, Any]:
        """Every rank's memory account (a collective), logged by rank 0."""
        return memory.report(self.graph, moment, loaders=[self.loader], model=self.module, optimizer=self.optimizer)

    def _build_model(self, model: nn.Module | None, model_config: ModelConfig | None) -> nn.Module:
        if model is not None:
            return model.to(self.device)
        if model_config is None:
            raise ValueError("give the Trainer a model, or a model_config for the built-in GNN")
        edges = self.graph.edge_features
        if model_config.edge_features and edges is None:
            raise ValueError("edge_features=True needs a graph with edge features; this dataset has none")
        with torch.random.fork_rng(devices=[]):  # the same initial weights on every rank, the global RNG untouched
            torch.manual_seed(self.config.seed)
            return GNN(model_config, self.graph.feature_dim, self.graph.num_classes,
                       edges.row_shape[0] if model_config.edge_features else 0).to(self.device)

    def _check_split(self) -> None:
        graph = self.graph
        for name, ids in (("training", graph.train_ids), ("validation", graph.val_ids), ("test", graph.test_ids)):
            if sum(self.exchanger.all_gather_counts(ids.numel())) == 0:
                raise ValueError(f"split {graph.split} has no {name} nodes, so there is nothing to "
                                 f"{'train on' if name == 'training' else 'score'}; choose another split, or give "
                                 f"the dataset a non-empty {name} mask")

    def _wrap_for_gradient_sums(self) -> None:
        """Gradient sums over the ranks by :class:`GradientSum` (not DDP, whose construction loads torch's
        compiler, about 150 MiB a process): its buckets start during the backward (``--grad-sync step``) or
        after it (``late``).  Rank 0's parameters and buffers are every rank's at the start, as DDP's are,
        and its buffers after every update (a model given with running statistics)."""
        runtime = self.runtime
        self.model = self.module
        self.late = self.config.grad_sync == "late"
        comm = Exchanger(runtime.group, self.rank, self.world_size)
        self.gradients = GradientSum(list(self.module.parameters()), comm) if runtime.group is not None else None
        self.buffers = [b for b in self.module.buffers() if b.is_floating_point()]
        if self.gradients is not None:
            broadcast_from_rank0(comm, [*self.module.parameters(), *self.module.buffers()])
        self.loss_scale = 1.0  # the sums add: the step's global mean's gradient
        self.grad_wait = 0.0  # this epoch's exposed wait for gradient sums

    def _fingerprint(self, model_config: ModelConfig | None) -> dict[str, Any]:
        config = self.config
        model = repr(model_config) if model_config is not None else \
            f"{type(self.module).__name__}({sum(p.numel() for p in self.module.parameters())} parameters)"
        fingerprint = {"num_nodes": self.graph.num_nodes, "world_size": self.world_size, "split": self.graph.split,
                       "model": model, "sampler": repr(self.sampler_config), "batch_size": config.batch_size,
                       "lr": config.lr, "seed": config.seed, "weight_decay": config.weight_decay,
                       "wire_dtype": self.wire_dtype}
        if config.rank_capacity is not None:  # absent otherwise: earlier checkpoints keep resuming
            fingerprint["rank_capacity"] = config.rank_capacity
        if self.late and self.gradients is not None:  # absent for step: earlier checkpoints keep resuming
            fingerprint["grad_sync"] = config.grad_sync
        return fingerprint

    @property
    def wire_dtype(self) -> str:
        return self.graph.wire_dtype

    @property
    def replicated(self) -> bool:
        return self.loader.replicated

    @property
    def features(self) -> DistTable:
        return self.graph.features

    @property
    def degrees(self) -> DistTable | None:
        """The degree table of GCN weights, where sampling needs one (the partitioned topology)."""
        return self.loader.sampler.degrees

    @property
    def sampler(self) -> DistNeighborSampler:
        return self.loader.sampler

    def _alone_step(self, seeds: Tensor) -> None:
        """One step's work on ``seeds`` with no collective: sampled on the replicated structure, remote rows
        left zero (owned and cached ones read), forward and backward, no gradient sum or update.  What
        ``--rank-capacity auto`` times."""
        rng = np.random.default_rng((self.config.seed, 2**31, self.rank))  # 2**31: no epoch's stream
        batch = self.sampler.sample(seeds, rng=rng)
        ids, graph = batch.input_ids, self.graph
        x = torch.zeros((ids.numel(), *self.features.row_shape))
        local = (ids >= graph.start) & (ids < graph.end)
        x[local] = self.features.read_owned(ids[local] - graph.start)
        outputs = self.module(batch.blocks, x.to(self.device))
        self.loss(outputs, self.shares.labels[seeds].to(self.device)).backward()
        self.module.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------ training
    def train_epoch(self, epoch: int) -> tuple[float, dict[str, float]]:
        """One pass over every rank's training nodes: the global mean loss, and this rank's time split.
        Dropout draws from a generator seeded by ``(seed, epoch, rank)``; the caller's global RNG is restored."""
        with seeded(epoch_seed(self.config.seed, epoch, self.rank), self.device):
            return self._train_steps(epoch)

    def _train_steps(self, epoch: int) -> tuple[float, dict[str, float]]:
        self.model.train()
        self.loader.set_epoch(epoch)
        loss_sum, self.grad_wait, start = 0.0, 0.0, time.perf_counter()
        pending: Callable[[], None] | None = None  # --grad-sync late: the previous step's sum
        with Progress(self.steps, desc=f"epoch {epoch}", enabled=self.show_progress) as progress:
            for step, item in enumerate(self.loader):
                loss = self.loss(self.model(item.blocks, item.x), item.y)
                self.optimizer.zero_grad(set_to_none=True)
                if self.gradients is not None and not self.late:
                    self.gradients.arm()  # buckets start as the backward fills them
                (loss * (self.loss_scale / self.step_seeds[step])).backward()
                pending = self._update(pending)
                # .item() waits for the device: it keeps the wait/compute split honest on CUDA.
                loss_sum += loss.item()
                progress.update()
        if pending is not None:  # the last step's sum, before evaluation or a checkpoint reads the weights
            self._late_update(pending)
        seconds, stats, feeder = time.perf_counter() - start, self.loader.stats, self.loader.feeder
        times = {"wait_s": stats.wait, "compute_s": seconds - stats.wait, "sample_s": stats.sample,
                 "gather_s": stats.gather, "transfer_s": feeder.copy_seconds, "grad_wait_s": self.grad_wait,
                 "sample_cpu_s": stats.sample_cpu, "gather_cpu_s": stats.gather_cpu}
        feeder.copy_seconds = 0.0
        total = self.exchanger.all_reduce(torch.tensor([loss_sum], dtype=torch.float64))
        return float(total[0]) / float(self.step_seeds.sum()), times

    def _update(self, pending: Callable[[], None] | None) -> Callable[[], None] | None:
        """After a step's backward: the update (a world of one; ``--grad-sync step``, once this step's sums
        are in), or start this step's sum and apply the previous one's (``late``); returns the sum still
        running."""
        if self.gradients is None:
            self.optimizer.step()
            return None
        started = self.gradients.start_rest()  # copies this step's gradients: the update may replace them
        if not self.late:
            self._late_update(started)
            return None
        if pending is not None:
            self._late_update(pending)
        return started

    def _late_update(self, finish: Callable[[], None]) -> None:
        waited = time.perf_counter()
        finish()  # the summed gradients become the parameters' own
        self.grad_wait += time.perf_counter() - waited  # the sum's exposed part: what no computation hid
        self.optimizer.step()
        if self.buffers:
            broadcast_from_rank0(self.gradients.comm, self.buffers)

    # ------------------------------------------------------------------ evaluation
    def inference(self) -> Tensor:
        """Outputs [num_owned, ...] of the owned nodes, layer by layer over all neighbours."""
        return self.predict().rows

    def predict(self) -> NodeOutputs:
        """The model's outputs for every owned node (:func:`gnnscale.layerwise_inference`)."""
        config = self.sampler_config
        return layerwise_inference(self.graph, self.module, batch_size=self.config.eval_batch_size,
                                   self_loops=config.self_loops, gcn_norm=config.gcn_norm,
                                   edge_features=config.edge_ids, device=self.device)

    def evaluate(self) -> tuple[float, float]:
        """``(val, test)`` over the val/test nodes of every rank (each rank returns the same)."""
        outputs = self.predict()
        return outputs.score(self.graph.val_ids, metric=self.metric), outputs.score(self.graph.test_ids,
                                                                                     metric=self.metric)

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
        if self.rank != 0 or self.checkpoints is None:
            return
        if checkpoint_due(state.epoch, every=self.config.checkpoint_every, epochs=self.config.epochs,
                          stopped=state.stopped):
            self.checkpoints.write({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                                    "fit": state.as_dict(), "fingerprint": self.fingerprint})

    def _restore(self) -> FitState:
        """Rank 0 reads the checkpoint and broadcasts it (no shared file system is assumed)."""
        path = self.out / CHECKPOINT_NAME if self.out is not None else None
        payload = restore_checkpoint(path, self.fingerprint, self.rank, self.runtime.sample_group)
        if payload is None:
            return FitState()
        self.module.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        state = FitState(**payload["fit"])
        log.info("resumed from epoch %d (best val %.4f at epoch %d)", state.epoch, state.best.get("val", float("nan")),
                 state.best.get("epoch", 0))
        return state

    def fit(self) -> TrainResult:
        """Train with early stopping on the validation score; the model keeps the best epoch's weights."""
        state = self._restore() if self.config.resume else FitState()
        counts = self.exchanger.all_gather_counts(self.graph.train_ids.numel())
        if self.rank == 0:
            log.info("training %s on %d rank(s): %s train nodes per rank, %d steps per epoch",
                     getattr(getattr(self.module, "config", None), "model", type(self.module).__name__),
                     self.world_size, counts, self.steps)
        state = fit(state, epochs=self.config.epochs, patience=self.config.patience, score_key="val",
                    train_epoch=self._epoch_record, log_epoch=self._log_epoch, after_epoch=self._checkpoint,
                    snapshot=lambda: {k: v.detach().clone() for k, v in self.module.state_dict().items()})
        if state.best_state is not None:
            self.module.load_state_dict(state.best_state)
        best = state.best
        self.memory["end"] = self._memory_report("end")
        return TrainResult(metric=self.metric, val=best.get("val", -math.inf), test=best.get("test", math.nan),
                           best_epoch=best.get("epoch", 0), epochs_run=state.epoch,
                           train_seconds=sum(r["epoch_seconds"] for r in state.history), history=state.history,
                           memory=self.memory)
