"""Single-process mini-batch node classification with layer-wise full-neighbour evaluation."""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale.batch import MiniBatch
from gnnscale.data.dataset import GraphDataset
from gnnscale.metrics import evaluate
from gnnscale.nn import GNN, ModelConfig
from gnnscale.pipeline import LoaderConfig, PrefetchLoader, keep_freed_memory
from gnnscale.pipeline.device import DeviceFeeder

if TYPE_CHECKING:  # samplers import dgl, which the GPU image cannot load; the trainer module must not need it
    from samplers import SamplerConfig

log = logging.getLogger("gnnscale.train")


@dataclass(kw_only=True)
class TrainConfig:
    """Optimisation and evaluation schedule."""

    epochs: int = 20
    """Maximum number of passes over the training nodes."""
    batch_size: int = 1024
    """Seed nodes per mini-batch."""
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
    """Seeds torch, numpy, DGL's sampler and the batch order."""
    device: str = "cpu"
    """``"cpu"`` or ``"cuda"`` (or ``"cuda:N"``)."""
    num_workers: int = 1
    """Loader threads that sample and gather ahead of training; 0 samples in the training thread."""
    prefetch: int = 2
    """Batches kept ready beyond those the workers are preparing."""
    features_on_device: bool = False
    """Keep the whole feature table on the device and send only ids (CUDA; needs the memory)."""
    keep_freed_memory: bool = True
    """Keep freed heap memory in the process between steps (see :mod:`gnnscale.pipeline.allocator`)."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (0 samples in the training thread), got {self.num_workers}")
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {self.prefetch}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0 or self.patience < 0:
            raise ValueError(f"weight_decay and patience must be >= 0, got {self.weight_decay} and {self.patience}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} requested but torch sees no CUDA device; use --device cpu")


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


def seed_everything(seed: int) -> None:
    """Seed every RNG a run touches, so the same seed gives the same run."""
    # Sampling only; imported here so the trainer module imports without DGL installed.
    from samplers.neighbor import seed_sampling

    torch.manual_seed(seed)
    np.random.seed(seed)
    seed_sampling(seed)


class NodeClassificationTrainer:
    """Trains a :class:`GNN` on one split of a dataset with sampled mini-batches.

    Args:
        dataset: the graph, features, labels and splits.
        split: which split's masks to use.
        model_config, sampler_config, config: each component's own settings.
    """

    def __init__(self, dataset: GraphDataset, *, split: int, model_config: ModelConfig, sampler_config: SamplerConfig,
                 config: TrainConfig) -> None:
        from samplers import NeighborSampler

        if len(sampler_config.fanouts) != model_config.num_layers:
            raise ValueError(f"got {len(sampler_config.fanouts)} fanouts for {model_config.num_layers} layers; "
                             f"give one fanout per layer, e.g. --fanouts {','.join(['10'] * model_config.num_layers)}")
        self.dataset, self.config = dataset, config
        self.device = torch.device(config.device)
        if config.keep_freed_memory:
            keep_freed_memory()
        seed_everything(config.seed)
        train_mask, val_mask, test_mask = dataset.split(split)
        self.train_ids = torch.from_numpy(np.nonzero(train_mask)[0])
        self.val_ids = torch.from_numpy(np.nonzero(val_mask)[0])
        self.test_ids = torch.from_numpy(np.nonzero(test_mask)[0])
        self.features = torch.from_numpy(dataset.features)
        self.labels = torch.from_numpy(dataset.labels)
        self.sampler = NeighborSampler(dataset.indptr, dataset.indices, sampler_config)
        self.model = GNN(model_config, dataset.num_features, dataset.num_classes).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self._full_blocks: list | None = None
        self.device_features = self._features_on_device() if config.features_on_device else None
        self.feeder = DeviceFeeder(self.device, self.device_features)

    def _features_on_device(self) -> Tensor | None:
        """The feature table copied to the device, or None (with a warning) where that gains nothing."""
        if self.device.type != "cuda":
            log.warning("--features-on-device has no effect on %s: the table is already in host memory", self.device)
            return None
        needed = self.features.numel() * self.features.element_size()
        free, _ = torch.cuda.mem_get_info(self.device)
        # Leave room for activations, gradients and optimizer state: the table may take at most 80% of free memory.
        if needed > 0.8 * free:
            raise ValueError(f"the feature table ({needed / 2**30:.2f} GiB) does not fit in 80% of the "
                             f"{free / 2**30:.2f} GiB free on {self.device}; drop --features-on-device")
        return self.features.to(self.device)

    def make_loader(self) -> PrefetchLoader:
        """The training loader: the training nodes, shuffled every epoch, prepared by worker threads."""
        cfg = self.config
        return PrefetchLoader(self.sampler.sample, self.train_ids, self.features, self.labels, LoaderConfig(
            batch_size=cfg.batch_size, num_workers=cfg.num_workers, prefetch=cfg.prefetch, seed=cfg.seed,
            pin_memory=self.device.type == "cuda", gather_features=self.device_features is None))

    # ------------------------------------------------------------------ training
    def train_epoch(self, loader: PrefetchLoader) -> float:
        """One pass over the training nodes; returns the mean loss (``self.last_times`` has the time split)."""
        self.model.train()
        total, count = 0.0, 0
        start = time.perf_counter()
        for item in self.feeder(loader):
            loss = F.cross_entropy(self.model(item.batch.blocks, item.x), item.y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            # .item() waits for the device: the loss is needed for the log anyway, and it keeps
            # the wait/compute split honest on CUDA.
            total += loss.item() * item.y.numel()
            count += item.y.numel()
        seconds = time.perf_counter() - start
        stats = loader.stats
        self.last_times = {"wait_s": stats.wait, "compute_s": seconds - stats.wait, "sample_s": stats.sample,
                           "gather_s": stats.gather, "transfer_s": self.feeder.copy_seconds}
        self.feeder.copy_seconds = 0.0
        return total / max(count, 1)

    # ------------------------------------------------------------------ evaluation
    def _full_neighbour_blocks(self):
        # Full-neighbour blocks are deterministic, so they are built once and reused by every evaluation.
        if self._full_blocks is None:
            nodes = torch.arange(self.dataset.num_nodes)
            step = self.config.eval_batch_size
            self._full_blocks = [self.sampler.sample(nodes[i:i + step], [-1]).blocks[0]
                                 for i in range(0, nodes.numel(), step)]
        return self._full_blocks

    @torch.no_grad()
    def inference(self) -> Tensor:
        """Logits float [num_nodes, num_classes] of every node, layer by layer over all neighbours."""
        self.model.eval()
        h = self.features
        for layer in range(self.model.num_layers):
            out = torch.empty(self.dataset.num_nodes, self.model.output_width(layer))
            for block in self._full_neighbour_blocks():
                x = torch.index_select(h, 0, block.src_ids).to(self.device)
                out[block.dst_ids] = self.model.layer(layer, block.to(self.device), x).cpu()
            h = out
        return h

    def evaluate(self) -> tuple[float, float]:
        """``(val, test)`` scores in the dataset's metric."""
        logits = self.inference()
        metric = self.dataset.metric
        return (evaluate(metric, logits[self.val_ids], self.labels[self.val_ids]),
                evaluate(metric, logits[self.test_ids], self.labels[self.test_ids]))

    # ------------------------------------------------------------------ the loop
    def fit(self) -> TrainResult:
        cfg = self.config
        loader = self.make_loader()
        best = {"val": -float("inf"), "test": float("nan"), "epoch": 0, "state": None}
        history: list[dict] = []
        train_seconds, since_best, epoch = 0.0, 0, 0
        log.info("training %s on %s: %d train / %d val / %d test nodes, %d batches per epoch",
                 self.model.config.model, self.dataset.name, self.train_ids.numel(), self.val_ids.numel(),
                 self.test_ids.numel(), len(loader))
        for epoch in range(1, cfg.epochs + 1):
            start = time.perf_counter()
            loss = self.train_epoch(loader)
            epoch_seconds = time.perf_counter() - start
            train_seconds += epoch_seconds
            record = {"epoch": epoch, "loss": loss, "epoch_seconds": epoch_seconds,
                      **{k: round(v, 4) for k, v in self.last_times.items()}}
            times = "  (wait {wait_s:.2f}s compute {compute_s:.2f}s | workers: sample {sample_s:.2f}s " \
                    "gather {gather_s:.2f}s)".format(**self.last_times)
            if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                val, test = self.evaluate()
                record.update(val=val, test=test)
                if val > best["val"]:
                    best.update(val=val, test=test, epoch=epoch, state=copy.deepcopy(self.model.state_dict()))
                    since_best = 0
                else:
                    since_best += 1
                log.info("epoch %3d  loss %.4f  %.2fs  val %s %.4f  (best %.4f @ %d)%s", epoch, loss, epoch_seconds,
                         self.dataset.metric, val, best["val"], best["epoch"], times)
            else:
                log.info("epoch %3d  loss %.4f  %.2fs%s", epoch, loss, epoch_seconds, times)
            history.append(record)
            if cfg.patience and since_best >= cfg.patience:
                log.info("early stop: no better validation score in %d evaluations", cfg.patience)
                break
        if best["state"] is not None:
            self.model.load_state_dict(best["state"])
        return TrainResult(metric=self.dataset.metric, val=best["val"], test=best["test"], best_epoch=best["epoch"],
                           epochs_run=epoch, train_seconds=train_seconds, history=history)
