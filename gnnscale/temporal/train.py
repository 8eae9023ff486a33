"""Single-process TGN training for temporal link prediction, in the event stream's order.

One epoch replays the training events in batches of ``batch_size`` consecutive events
(chronological order is the point: the memory must see the past before the present).  For each
batch: apply the pending messages (``memory.updated()``), embed sources, destinations and one
random negative destination per event from their sampled past neighbours (strictly earlier
events only), take a gradient step on the link loss, persist the batch's nodes' memory and store
the batch's events as messages (see :mod:`gnnscale.temporal.memory`).

Evaluation continues the stream from the memory reached at the end of training through the
validation events (and on through the test events), over all events so far for neighbours, and
reports for each split:

* ``ap``: average precision of positives against one random negative destination each;
* ``mrr``: mean reciprocal rank of each positive among ``eval_negatives`` random negative
  destinations (ties count half a place);
* the same two restricted to the *inductive* events (touching a node never seen in training),
  scored in the same pass.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gnnscale.metrics import average_precision, mean_reciprocal_rank
from gnnscale.temporal.memory import MemoryConfig
from gnnscale.temporal.tgn import TGN, Neighborhood, TGNConfig

log = logging.getLogger("gnnscale.temporal")


@dataclass(kw_only=True)
class TemporalTrainConfig:
    """Optimisation and evaluation of a temporal link-prediction run."""

    epochs: int = 10
    """Passes over the training events."""
    batch_size: int = 200
    """Consecutive events per step."""
    lr: float = 1e-4
    """Adam learning rate (TGN's)."""
    num_neighbors: int = 10
    """Past events each node attends over."""
    sampling: str = "recent"
    """Which past events: ``recent`` (most recent) or ``uniform``."""
    eval_negatives: int = 10
    """Negative destinations per positive for MRR."""
    patience: int = 5
    """Stop after this many epochs without a better validation AP; 0 never stops early."""
    seed: int = 0
    """Seeds the model, the negatives and the neighbour sampling."""
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "num_neighbors", "eval_negatives"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.sampling not in ("recent", "uniform"):
            raise ValueError(f"unknown sampling {self.sampling!r}; choose recent or uniform")
        if self.patience < 0:
            raise ValueError(f"patience must be >= 0, got {self.patience}")


class TemporalLinkTrainer:
    """Trains a :class:`TGN` on the training events of ``split`` and evaluates on the rest.

    Args:
        events: the whole stream (``gnnscale.data.temporal.TemporalEvents``).
        split: its ``chronological_split``.
    """

    def __init__(self, events, split, *, memory_config: MemoryConfig, tgn_config: TGNConfig,
                 config: TemporalTrainConfig) -> None:
        from samplers.temporal import RandomDestinationSampler, TemporalGraph, TemporalNeighborSampler

        self.events, self.split, self.config = events, split, config
        self.device = torch.device(config.device)
        torch.manual_seed(config.seed)
        self.model = TGN(events.num_nodes, memory_config, tgn_config).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr)
        train = np.flatnonzero(split.train)
        # Training sees only training events as neighbours; evaluation sees every event before each query.
        self.train_graph = TemporalGraph(events.src[train], events.dst[train], events.t[train], events.num_nodes)
        self.full_graph = TemporalGraph(events.src, events.dst, events.t, events.num_nodes)
        self.train_sampler = TemporalNeighborSampler(self.train_graph, config.num_neighbors, config.sampling)
        self.full_sampler = TemporalNeighborSampler(self.full_graph, config.num_neighbors, config.sampling)
        self.train_event_ids = train
        self.negatives = RandomDestinationSampler(np.unique(events.dst), seed=config.seed)
        self.edge_features = None if events.edge_features is None else \
            torch.from_numpy(events.edge_features).to(self.device)
        # Event ids of the neighbourhoods index the graph's own events: map them to stream positions.
        self.src = torch.from_numpy(events.src).to(self.device)
        self.dst = torch.from_numpy(events.dst).to(self.device)
        self.t = torch.from_numpy(events.t).to(self.device)

    # ------------------------------------------------------------------ one batch
    def _neighborhood(self, sampler, nodes: Tensor, times: Tensor, rng: np.random.Generator,
                      event_map: np.ndarray | None) -> Neighborhood:
        found = sampler.sample(nodes.cpu().numpy(), times.cpu().numpy(), rng)
        event_ids = found.event_ids if event_map is None else np.where(found.mask, event_map[found.event_ids.clip(0)], -1)
        return Neighborhood(neighbors=torch.from_numpy(found.neighbors).to(self.device),
                            times=torch.from_numpy(found.times).to(self.device),
                            event_ids=torch.from_numpy(event_ids).to(self.device),
                            mask=torch.from_numpy(found.mask).to(self.device))

    def embed_batch(self, batch: np.ndarray, sampler, event_map: np.ndarray | None, rng: np.random.Generator,
                    eval_negatives: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """Embeddings of a batch's sources, destinations and ``1 + eval_negatives`` negatives per event
        (``[src; dst; negatives]``), with the memory they were computed from: ``(z, memory, last_update)``.

        Leakage-free: the memory has only the messages of earlier batches applied, and neighbours are
        drawn from events before the batch's first event time, so no event of the batch (not even
        an earlier one inside it) reaches its own embeddings.  Time encodings use each query's own time.
        """
        src, dst, t = self.src[batch], self.dst[batch], self.t[batch]
        count = batch.size
        negatives = torch.from_numpy(self.negatives.sample(count * (1 + eval_negatives), rng)).to(self.device)
        nodes = torch.cat([src, dst, negatives])
        times = torch.cat([t, t, t.repeat(1 + eval_negatives)])
        cutoff = torch.full_like(times, float(t[0]))
        neighborhood = self._neighborhood(sampler, nodes, cutoff, rng, event_map)
        memory, last_update = self.model.memory.updated(torch.cat([nodes, neighborhood.neighbors[neighborhood.mask]]))
        return self.model.embed(memory, nodes, times, neighborhood, self.edge_features), memory, last_update

    def _step(self, batch: np.ndarray, sampler, event_map, rng: np.random.Generator, *, train: bool,
              eval_negatives: int = 0) -> dict[str, Tensor]:
        model, count = self.model, batch.size
        z, memory, last_update = self.embed_batch(batch, sampler, event_map, rng, eval_negatives)
        z_src, z_dst, z_neg = z[:count], z[count:2 * count], z[2 * count:]
        loss, pos, neg = model.link_loss(z_src, z_dst, z_neg[:count])
        if train:
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        out = {"loss": loss.detach(), "pos": pos.detach(), "neg": neg.detach()}
        if eval_negatives:
            others = model.predictor(z_src.repeat(eval_negatives, 1), z_neg[count:]).detach()
            out["mrr_neg"] = others.view(eval_negatives, count).t()
        src, dst, t = self.src[batch], self.dst[batch], self.t[batch]
        model.memory.persist(torch.cat([src, dst]), memory, last_update)
        model.memory.store_messages(src, dst, t, None if self.edge_features is None else self.edge_features[batch])
        return out

    def _batches(self, event_ids: np.ndarray) -> list[np.ndarray]:
        size = self.config.batch_size
        return [event_ids[i:i + size] for i in range(0, event_ids.size, size)]

    # ------------------------------------------------------------------ passes
    def train_epoch(self, epoch: int) -> float:
        self.model.train()
        self.model.memory.state.reset()
        rng = np.random.default_rng((self.config.seed, epoch))
        losses = []
        event_map = self.train_event_ids  # the train graph numbers its events 0..len(train)-1
        for batch in self._batches(self.train_event_ids):
            losses.append(self._step(batch, self.train_sampler, event_map, rng, train=True)["loss"])
        return float(torch.stack(losses).mean())

    @torch.no_grad()
    def evaluate(self, event_ids: np.ndarray, inductive: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
        """Stream ``event_ids`` (continuing the current memory); metrics overall and on ``inductive`` events."""
        self.model.eval()
        pos, neg, mrr_neg = [], [], []
        for batch in self._batches(event_ids):
            out = self._step(batch, self.full_sampler, None, rng, train=False,
                             eval_negatives=self.config.eval_negatives)
            pos.append(out["pos"]), neg.append(out["neg"]), mrr_neg.append(out["mrr_neg"])
        pos_all, neg_all, mrr_all = torch.cat(pos), torch.cat(neg), torch.cat(mrr_neg)
        new = torch.from_numpy(inductive[event_ids]).to(pos_all.device)
        result = {}
        for suffix, keep in (("", torch.ones_like(new)), ("_inductive", new)):
            p, n = pos_all[keep], neg_all[keep]
            scores = torch.cat([p, n])
            labels = torch.cat([torch.ones_like(p), torch.zeros_like(n)])
            result[f"ap{suffix}"] = average_precision(scores, labels)
            result[f"mrr{suffix}"] = mean_reciprocal_rank(p, mrr_all[keep])
            result[f"events{suffix}"] = int(keep.sum())
        return result

    def fit(self) -> dict:
        """Train with early stopping on validation AP; returns the metrics of the best epoch."""
        cfg, split = self.config, self.split
        val_ids, test_ids = np.flatnonzero(split.val), np.flatnonzero(split.test)
        inductive = split.val_new_node | split.test_new_node
        best: dict = {"val_ap": -1.0}
        history, since_best, started = [], 0, time.perf_counter()
        for epoch in range(1, cfg.epochs + 1):
            start = time.perf_counter()
            loss = self.train_epoch(epoch)
            train_seconds = time.perf_counter() - start
            after_training = self.model.memory.state.state_dict()
            rng = np.random.default_rng((cfg.seed, epoch, 1))
            val = self.evaluate(val_ids, inductive, rng)
            test = self.evaluate(test_ids, inductive, rng)
            record = {"epoch": epoch, "loss": loss, "train_seconds": train_seconds,
                      **{f"val_{k}": v for k, v in val.items()}, **{f"test_{k}": v for k, v in test.items()}}
            history.append(record)
            log.info("epoch %3d  loss %.4f  %.1fs  val AP %.4f (inductive %.4f)  test AP %.4f (inductive %.4f)",
                     epoch, loss, train_seconds, val["ap"], val["ap_inductive"], test["ap"], test["ap_inductive"])
            if val["ap"] > best["val_ap"]:
                best = dict(record, state=copy.deepcopy(self.model.state_dict()), memory=after_training)
                since_best = 0
            else:
                since_best += 1
                if cfg.patience and since_best >= cfg.patience:
                    log.info("early stop: no better validation AP in %d epochs", cfg.patience)
                    break
        self.model.load_state_dict(best.pop("state"))
        self.model.memory.state.load_state_dict(best.pop("memory"))
        best.update(best_epoch=best["epoch"], epochs_run=len(history), seconds=time.perf_counter() - started,
                    history=history)
        return best
