"""``--task link``: static link prediction on 1..N ranks, written with the public API.

The whole loop is :class:`gnnscale.LinkTask` (training loader, val/test scorers) around an encoder
(the built-in :class:`GNN`, its output ``hidden`` wide) and a decoder (dot product, or an MLP over
``h_u * h_v``): the random 85/5/10 split of PyG's link-prediction example, the seed edges and their
reverses excluded from the sampled neighbourhoods, the weights of the epoch with the best validation
ROC-AUC kept, and the test figures (ROC-AUC, MRR, Hits@20/50) reported at that epoch.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gnnscale import memory
from gnnscale.graph import Graph
from gnnscale.link_loader import split_edges
from gnnscale.link_task import LinkTask
from gnnscale.nn import GNN, ModelConfig
from gnnscale.nn.link import make_decoder
from gnnscale.optim import Adam
from gnnscale.sampling import CacheConfig
from gnnscale.train.checkpoint import CHECKPOINT_NAME, CheckpointWriter, checkpoint_due, restore_checkpoint
from gnnscale.train.fit import FitState, fit, seeded
from gnnscale.train.trainer import TrainConfig, TrainResult
from samplers.neighbor import SamplerConfig

log = logging.getLogger("gnnscale.train")

DECODERS = ("dot", "mlp")


@dataclass(kw_only=True)
class LinkConfig:
    """What link prediction adds to training: the decoder, the negatives, the exclusion and the split."""

    decoder: str = "dot"
    """``dot`` (inner product) or ``mlp`` (an MLP over the elementwise product)."""
    num_negatives: int = 1
    """Negative pairs per positive in training."""
    negative_sampling: str = "uniform"
    """``uniform`` (the positive's source, a uniform destination), ``degree`` (destination by degree^0.75) or
    ``global`` (both ends uniform, as PyG's example)."""
    exclude: str = "reverse"
    """Seed edges left out of their own batch's neighbourhoods: ``reverse`` (and their reverses), ``self``, ``none``."""
    val_fraction: float = 0.05
    test_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if self.num_negatives < 1:
            raise ValueError(f"num_negatives must be >= 1, got {self.num_negatives}")
        if not (0 < self.val_fraction and 0 < self.test_fraction and self.val_fraction + self.test_fraction < 1):
            raise ValueError(f"val_fraction and test_fraction must be > 0 with a sum below 1, got "
                             f"{self.val_fraction} and {self.test_fraction}")


class LinkTrainer:
    """Encoder, decoder and optimizer over a :class:`LinkTask`; :meth:`fit` keeps the best validation epoch.

    With ``out``, rank 0 writes ``out/checkpoint.pt`` as the node trainer does (``config.checkpoint_every``,
    ``config.on_checkpoint_error``), and ``config.resume`` continues from it.
    """

    def __init__(self, graph: Graph, *, model_config: ModelConfig, sampler_config: SamplerConfig,
                 config: TrainConfig, link: LinkConfig, cache_config: CacheConfig | None = None,
                 out: Path | None = None) -> None:
        self.graph, self.world, self.config, self.out = graph, graph.world, config, out
        self.checkpoints = None if out is None else CheckpointWriter(out / CHECKPOINT_NAME, config.on_checkpoint_error)
        split = split_edges(graph, num_val=link.val_fraction, num_test=link.test_fraction, seed=config.seed)
        self.task = LinkTask(graph, split, fanouts=sampler_config.fanouts, batch_size=config.batch_size,
                             num_negatives=link.num_negatives, negative_sampling=link.negative_sampling,
                             exclude=link.exclude, seed=config.seed, gcn_norm=sampler_config.gcn_norm,
                             self_loops=sampler_config.self_loops, num_workers=min(config.num_workers, 1),
                             cache=cache_config or CacheConfig(), edge_features=model_config.edge_features)
        with torch.random.fork_rng(devices=[]):  # the same initial weights on every rank, the global RNG untouched
            torch.manual_seed(config.seed)
            edges = graph.edge_features
            encoder = GNN(model_config, graph.feature_dim, model_config.hidden,
                          edges.row_shape[0] if model_config.edge_features and edges is not None else 0)
            decoder = make_decoder(link.decoder, model_config.hidden)
        self.encoder, self.decoder = self.world.wrap(encoder), self.world.wrap(decoder)
        parameters = [*self.encoder.parameters(), *self.decoder.parameters()]
        self.optimizer = Adam(parameters, lr=config.lr, weight_decay=config.weight_decay)
        self.fingerprint = self._fingerprint(model_config, sampler_config, link)
        self.memory = {"start": self._memory_report("start")}

    def _memory_report(self, moment: str) -> dict[str, Any]:
        """Every rank's memory account (a collective), logged by rank 0."""
        loaders = [self.task.train, *(loader for loader, _ in self.task.scorers.values())]
        return memory.report(self.graph, moment, loaders=loaders, model=nn.ModuleList([self.encoder, self.decoder]),
                             optimizer=self.optimizer)

    def fit(self) -> TrainResult:
        """Train ``config.epochs`` epochs (early stop after ``patience`` evaluations without a better validation
        ROC-AUC), then the test figures with the best epoch's weights.  With ``config.resume``, continue from the
        run folder's checkpoint as the uninterrupted run would have."""
        state = self._restore() if self.config.resume else FitState()
        state = fit(state, epochs=self.config.epochs, patience=self.config.patience, score_key="val",
                    train_epoch=self._epoch_record, snapshot=self._state, log_epoch=self._log_epoch,
                    after_epoch=self._checkpoint)
        self._load(state.best_state)
        self.test = self.task.evaluate(self.encoder, self.decoder, "test")
        self.memory["end"] = self._memory_report("end")
        best = state.best
        return TrainResult(metric="roc_auc", val=best.get("val", -math.inf), test=self.test["roc_auc"],
                           best_epoch=best.get("epoch", 0), epochs_run=state.epoch,
                           train_seconds=sum(r["epoch_seconds"] for r in state.history), history=state.history,
                           memory=self.memory)

    def _epoch_record(self, epoch: int) -> dict[str, Any]:
        start = time.perf_counter()
        with seeded(self.config.seed * 1_000_003 + epoch, self.world.device):
            loss = self.task.train_epoch(self.encoder, self.decoder, self.optimizer, epoch)
        record: dict[str, Any] = {"epoch": epoch, "loss": loss, "epoch_seconds": time.perf_counter() - start}
        val = self.task.evaluate(self.encoder, self.decoder, "val")
        return {**record, "val": val["roc_auc"], "val_link": val}

    def _log_epoch(self, record: dict[str, Any], state: FitState) -> None:
        if self.world.is_main:
            log.info("epoch %3d  loss %.4f  %.2fs  val ROC-AUC %.4f  MRR %.4f  (best %.4f @ %d)", record["epoch"],
                     record["loss"], record["epoch_seconds"], record["val"], record["val_link"]["mrr"],
                     state.best["val"], state.best["epoch"])

    def _checkpoint(self, state: FitState) -> None:
        if self.world.is_main and self.checkpoints is not None and checkpoint_due(
                state.epoch, every=self.config.checkpoint_every, epochs=self.config.epochs, stopped=state.stopped):
            self.checkpoints.write({"model": self._state(), "optimizer": self.optimizer.state_dict(),
                                    "fit": state.as_dict(), "fingerprint": self.fingerprint})

    def _restore(self) -> FitState:
        path = self.out / CHECKPOINT_NAME if self.out is not None else None
        payload = restore_checkpoint(path, self.fingerprint, self.world.rank, self.world.runtime.sample_group)
        if payload is None:
            return FitState()
        self._load(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        state = FitState(**payload["fit"])
        if self.world.is_main:
            log.info("resumed from epoch %d (best val ROC-AUC %.4f at epoch %d)", state.epoch,
                     state.best.get("val", float("nan")), state.best.get("epoch", 0))
        return state

    def _fingerprint(self, model_config: ModelConfig, sampler_config: SamplerConfig,
                     link: LinkConfig) -> dict[str, Any]:
        """The settings a resumed run must share with the run that wrote the checkpoint."""
        config = self.config
        return {"task": "link", "num_nodes": self.graph.num_nodes, "world_size": self.world.size,
                "split": self.graph.split, "model": repr(model_config), "link": repr(link),
                "sampler": repr(sampler_config), "batch_size": config.batch_size, "lr": config.lr,
                "seed": config.seed, "weight_decay": config.weight_decay, "wire_dtype": self.graph.wire_dtype}

    def _state(self) -> dict[str, Any]:
        return copy.deepcopy({"encoder": self.encoder.state_dict(), "decoder": self.decoder.state_dict()})

    def _load(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.encoder.load_state_dict(state["encoder"])
            self.decoder.load_state_dict(state["decoder"])
