"""Link decoders: a score for each pair of node embeddings (logits; apply a sigmoid for probabilities)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class DotDecoder(nn.Module):
    """``score(u, v) = <h_u, h_v>`` (PyG's link-prediction example; GAE's inner-product decoder)."""

    def forward(self, h: Tensor, pairs: Tensor) -> Tensor:
        """``h`` float [n, D] embeddings, ``pairs`` int64 [2, P] rows of ``h`` -> float [P] logits."""
        return (h.index_select(0, pairs[0]) * h.index_select(0, pairs[1])).sum(-1)


class MLPDecoder(nn.Module):
    """``score(u, v) = MLP(h_u * h_v)``: ``num_layers`` linear layers with ReLU between them, the last to one
    logit.  The elementwise product keeps the score symmetric in ``u`` and ``v`` (OGB's link baselines)."""

    def __init__(self, dim: int, hidden: int = 256, num_layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if dim < 1 or hidden < 1:
            raise ValueError(f"dim and hidden must be >= 1, got {dim} and {hidden}")
        widths = [dim] + [hidden] * (num_layers - 1) + [1]
        layers: list[nn.Module] = []
        for i in range(num_layers):
            if i:
                layers += [nn.ReLU(), nn.Dropout(dropout)]
            layers.append(nn.Linear(widths[i], widths[i + 1]))
        self.mlp = nn.Sequential(*layers)

    def forward(self, h: Tensor, pairs: Tensor) -> Tensor:
        """``h`` float [n, D] embeddings, ``pairs`` int64 [2, P] rows of ``h`` -> float [P] logits."""
        return self.mlp(h.index_select(0, pairs[0]) * h.index_select(0, pairs[1])).squeeze(-1)


def make_decoder(name: str, dim: int, hidden: int = 256) -> nn.Module:
    """The decoder called ``name`` (``"dot"`` or ``"mlp"``) over ``dim``-wide embeddings."""
    if name == "dot":
        return DotDecoder()
    if name == "mlp":
        return MLPDecoder(dim, hidden)
    raise ValueError(f"decoder must be 'dot' or 'mlp', got {name!r}")


def link_loss(pos_scores: Tensor, neg_scores: Tensor) -> Tensor:
    """Binary cross-entropy of positive logits against 1 and negative logits against 0, over all pairs."""
    scores = torch.cat([pos_scores, neg_scores])
    labels = torch.cat([torch.ones_like(pos_scores), torch.zeros_like(neg_scores)])
    return nn.functional.binary_cross_entropy_with_logits(scores, labels)
