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
from typing import Any

import torch
from torch import nn

from gnnscale import memory
from gnnscale.graph import Graph
from gnnscale.link_loader import split_edges
from gnnscale.link_task import LinkTask
from gnnscale.nn import GNN, ModelConfig
from gnnscale.nn.link import make_decoder
from gnnscale.sampling import CacheConfig
from gnnscale.train.fit import seeded
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
    """Encoder, decoder and optimizer over a :class:`LinkTask`; :meth:`fit` keeps the best validation epoch."""

    def __init__(self, graph: Graph, *, model_config: ModelConfig, sampler_config: SamplerConfig,
                 config: TrainConfig, link: LinkConfig, cache_config: CacheConfig | None = None) -> None:
        self.graph, self.world, self.config = graph, graph.world, config
        split = split_edges(graph, num_val=link.val_fraction, num_test=link.test_fraction, seed=config.seed)
        self.task = LinkTask(graph, split, fanouts=sampler_config.fanouts, batch_size=config.batch_size,
                             num_negatives=link.num_negatives, negative_sampling=link.negative_sampling,
                             exclude=link.exclude, seed=config.seed, gcn_norm=sampler_config.gcn_norm,
                             self_loops=sampler_config.self_loops, num_workers=min(config.num_workers, 1),
                             cache=cache_config or CacheConfig())
        with torch.random.fork_rng(devices=[]):  # the same initial weights on every rank, the global RNG untouched
            torch.manual_seed(config.seed)
            encoder = GNN(model_config, graph.feature_dim, model_config.hidden)
            decoder = make_decoder(link.decoder, model_config.hidden)
        self.encoder, self.decoder = self.world.wrap(encoder), self._wrap(decoder)
        parameters = [*self.encoder.parameters(), *self.decoder.parameters()]
        self.optimizer = torch.optim.Adam(parameters, lr=config.lr, weight_decay=config.weight_decay)
        self.memory = {"start": self._memory_report("start")}

    def _memory_report(self, moment: str) -> dict[str, Any]:
        """Every rank's memory account (a collective), logged by rank 0."""
        loaders = [self.task.train, *(loader for loader, _ in self.task.scorers.values())]
        return memory.report(self.graph, moment, loaders=loaders, model=nn.ModuleList([self.encoder, self.decoder]),
                             optimizer=self.optimizer)

    def _wrap(self, decoder: nn.Module) -> nn.Module:
        # A dot decoder has no parameters, and DDP refuses a module without any.
        return self.world.wrap(decoder) if any(True for _ in decoder.parameters()) else decoder.to(self.world.device)

    def fit(self) -> TrainResult:
        """Train ``config.epochs`` epochs (early stop after ``patience`` evaluations without a better validation
        ROC-AUC), then the test figures with the best epoch's weights."""
        best, since, history, best_state = {"val": -math.inf, "epoch": 0}, 0, [], None
        for epoch in range(1, self.config.epochs + 1):
            start = time.perf_counter()
            with seeded(self.config.seed * 1_000_003 + epoch, self.world.device):
                loss = self.task.train_epoch(self.encoder, self.decoder, self.optimizer, epoch)
            record: dict[str, Any] = {"epoch": epoch, "loss": loss, "epoch_seconds": time.perf_counter() - start}
            val = self.task.evaluate(self.encoder, self.decoder, "val")
            record.update(val=val["roc_auc"], val_link=val)
            history.append(record)
            since = 0 if val["roc_auc"] > best["val"] else since + 1
            if since == 0:
                best, best_state = {"val": val["roc_auc"], "epoch": epoch}, self._state()
            if self.world.is_main:
                log.info("epoch %3d  loss %.4f  %.2fs  val ROC-AUC %.4f  MRR %.4f  (best %.4f @ %d)", epoch, loss,
                         record["epoch_seconds"], val["roc_auc"], val["mrr"], best["val"], best["epoch"])
            if self.config.patience and since >= self.config.patience:
                break
        self._load(best_state)
        self.test = self.task.evaluate(self.encoder, self.decoder, "test")
        self.memory["end"] = self._memory_report("end")
        return TrainResult(metric="roc_auc", val=best["val"], test=self.test["roc_auc"], best_epoch=best["epoch"],
                           epochs_run=len(history), train_seconds=sum(r["epoch_seconds"] for r in history),
                           history=history, memory=self.memory)

    def _state(self) -> dict[str, Any]:
        return copy.deepcopy({"encoder": self.encoder.state_dict(), "decoder": self.decoder.state_dict()})

    def _load(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.encoder.load_state_dict(state["encoder"])
            self.decoder.load_state_dict(state["decoder"])
