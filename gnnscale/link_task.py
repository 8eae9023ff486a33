"""Static link prediction on a :class:`gnnscale.Graph`: one training epoch and the split's evaluation.

The pieces a script (``examples/link_prediction.py``) or the CLI's ``--task link`` puts together::

    split = split_edges(graph, num_val=0.05, num_test=0.1, seed=0)
    task = LinkTask(graph, split, fanouts=[10, 10], batch_size=512, gcn_norm=True)
    for epoch in range(epochs):
        loss = task.train_epoch(model, decoder, optimizer, epoch)
        val = task.evaluate(model, decoder, "val")       # {"roc_auc", "mrr", "hits@20", "hits@50"}

Evaluation scores the split's fixed positives and negatives with full neighbourhoods (fanout -1) over
the stage's message graph (train edges for val, train + val edges for test: PyG's ``RandomLinkSplit``),
each rank its share, all ranks then holding every score.  Metrics: ROC-AUC of positives against
negatives; MRR and Hits@K with every positive ranked against the stage's whole negative set (OGB's
ogbl-collab convention for Hits@K: :func:`gnnscale.metrics.hits_at_k` with shared negatives).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from gnnscale.data.link_split import LinkSplit
from gnnscale.graph import Graph
from gnnscale.link_loader import LinkLoader, gather_scores, rank_share, score_pairs
from gnnscale.metrics import hits_at_k, mean_reciprocal_rank, roc_auc
from gnnscale.nn.link import link_loss
from gnnscale.sampling import CacheConfig

HITS_AT = (20, 50)


class LinkTask:
    """The training loader and the val/test scorers of one split.

    Args:
        graph: the graph handle (the whole graph: the split's val and test edges are held out of messages).
        split: :func:`gnnscale.link_loader.split_edges`'s split, global ids.
        fanouts: training fanouts, input side first; evaluation takes every neighbour.
        batch_size: training seed edges per batch and rank (evaluation scores ``4 * batch_size`` pairs a batch).
        loader_args: passed to the training :class:`LinkLoader` (``num_negatives``, ``negative_sampling``,
            ``exclude``, ``seed``, ``num_workers``, ``gcn_norm``, ``self_loops``, ``cache``, ``device``,
            ``edge_features`` ...); the scorers take the same ``gcn_norm``, ``self_loops``, ``device``, ``cache``
            and ``edge_features``.
    """

    def __init__(self, graph: Graph, split: LinkSplit, *, fanouts: Sequence[int], batch_size: int = 1024,
                 **loader_args) -> None:
        self.graph, self.split = graph, split
        self.train = LinkLoader(graph, rank_share(split.train_pos, graph), fanouts=fanouts, batch_size=batch_size,
                                held_out=torch.from_numpy(split.held_out("train")), **loader_args)
        norm = {k: loader_args[k] for k in ("gcn_norm", "self_loops", "device", "cache", "edge_features")
                if k in loader_args}
        self.scorers = {stage: self._scorer(stage, len(fanouts), 4 * batch_size, norm) for stage in ("val", "test")}

    def _scorer(self, stage: str, num_layers: int, batch_size: int, norm: dict) -> tuple[LinkLoader, int]:
        pos, neg = getattr(self.split, f"{stage}_pos"), getattr(self.split, f"{stage}_neg")
        mine_pos, mine_neg = rank_share(pos, self.graph), rank_share(neg, self.graph)
        pairs = torch.cat([mine_pos, mine_neg], dim=1)
        loader = LinkLoader(self.graph, pairs, fanouts=[-1] * num_layers, batch_size=batch_size, num_negatives=0,
                            exclude="none", shuffle=False, held_out=torch.from_numpy(self.split.held_out(stage)),
                            fill_cache=False, num_workers=1, **{**norm, "cache": norm.get("cache", CacheConfig())})
        return loader, mine_pos.shape[1]

    def train_epoch(self, model: nn.Module, decoder: nn.Module, optimizer: torch.optim.Optimizer,
                    epoch: int) -> float:
        """One pass over this rank's training edges (every rank the same number of steps); mean loss."""
        model.train()
        decoder.train()
        self.train.set_epoch(epoch)
        total, steps = 0.0, 0
        for batch in self.train:
            h = model(batch.blocks, batch.x)
            loss = link_loss(decoder(h, batch.pos), decoder(h, batch.neg))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
        return total / max(steps, 1)

    def scores(self, model: nn.Module, decoder: nn.Module, stage: str) -> tuple[Tensor, Tensor]:
        """``(positive, negative)`` logits float of every ``stage`` pair of the split, from all ranks.  A collective."""
        loader, num_pos = self.scorers[stage]
        model.eval()
        decoder.eval()
        scores = score_pairs(loader, model, decoder)
        positive, negative = gather_scores(self.graph, scores[:num_pos]), gather_scores(self.graph, scores[num_pos:])
        return positive, negative

    def evaluate(self, model: nn.Module, decoder: nn.Module, stage: str) -> dict[str, float]:
        """ROC-AUC, MRR and Hits@20/50 of ``stage`` (``"val"`` or ``"test"``), the same on every rank."""
        if stage not in self.scorers:
            raise ValueError(f"stage must be 'val' or 'test', got {stage!r}")
        positive, negative = self.scores(model, decoder, stage)
        labels = torch.cat([torch.ones_like(positive), torch.zeros_like(negative)])
        out = {"roc_auc": roc_auc(torch.cat([positive, negative]), labels),
               "mrr": mean_reciprocal_rank(positive, negative)}
        out.update({f"hits@{k}": hits_at_k(positive, negative, k) for k in HITS_AT})
        return out
