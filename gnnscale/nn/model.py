"""Stacked GNN models on sampled blocks: GraphSAGE, GCN and GAT."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.batch import Block
from gnnscale.nn.gat import GATConv
from gnnscale.nn.gcn import GCNConv
from gnnscale.nn.sage import SAGEConv

ModelName = Literal["sage", "gcn", "gat"]


@dataclass(kw_only=True)
class ModelConfig:
    """Architecture of a :class:`GNN`."""

    model: ModelName = "sage"
    """Layer type: ``"sage"`` (mean), ``"gcn"`` or ``"gat"``."""
    num_layers: int = 2
    """Number of message-passing layers; the sampler needs one fanout per layer."""
    hidden: int = 256
    """Hidden width. For GAT this is per head, so a hidden layer outputs ``hidden * heads``."""
    dropout: float = 0.5
    """Dropout on the input of every layer but the first."""
    input_dropout: float = 0.0
    """Dropout on the input features (GAT recipes use 0.6)."""
    heads: int = 8
    """GAT: attention heads in hidden layers (ignored by other models)."""
    out_heads: int = 1
    """GAT: attention heads in the output layer, averaged."""
    attn_dropout: float = 0.6
    """GAT: dropout on attention coefficients."""
    edge_features: bool = False
    """GAT: use the graph's edge features in the attention scores (``GATConv(edge_dim=...)``)."""
    residual: bool = False
    """Residual pre-LayerNorm blocks (Platonov et al. 2023): a linear input projection to
    ``hidden``, then per layer ``h_v <- h_v + Dropout(act(conv(LayerNorm(h))))_v``, then
    LayerNorm and a linear classifier. Helps deeper models and heterophilous graphs."""

    def __post_init__(self) -> None:
        if self.model not in ("sage", "gcn", "gat"):
            raise ValueError(f"unknown model {self.model!r}; choose one of sage, gcn, gat")
        for name in ("num_layers", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("dropout", "input_dropout", "attn_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.edge_features and self.model != "gat":
            raise ValueError(f"edge_features are used by the gat model only, got model {self.model!r}")
        if self.heads < 1 or self.out_heads < 1:
            raise ValueError(f"heads and out_heads must be >= 1, got {self.heads} and {self.out_heads}")


class GNN(nn.Module):
    """``num_layers`` convolutions with ReLU (ELU for GAT) and dropout between them.

    ``forward(blocks, x)`` runs a sampled mini-batch; :meth:`layer` runs one layer, for
    layer-wise full-neighbour inference.
    """

    def __init__(self, config: ModelConfig, in_dim: int, out_dim: int, edge_dim: int = 0) -> None:
        super().__init__()
        if config.edge_features and edge_dim < 1:
            raise ValueError("ModelConfig(edge_features=True) needs the edge feature width: pass edge_dim > 0")
        self.config = config
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        if config.residual:
            self.input_proj = nn.Linear(in_dim, self._hidden_width())
            self.output_norm = nn.LayerNorm(self._hidden_width())
            self.output_proj = nn.Linear(self._hidden_width(), out_dim)
        for i in range(config.num_layers):
            # Residual blocks keep one width throughout; the classifier is a separate linear head.
            last = i == config.num_layers - 1 and not config.residual
            width_in = in_dim if i == 0 and not config.residual else self._hidden_width()
            width_out = out_dim if last else config.hidden
            if config.residual:
                self.norms.append(nn.LayerNorm(width_in))
            if config.model == "sage":
                self.convs.append(SAGEConv(width_in, width_out))
            elif config.model == "gcn":
                self.convs.append(GCNConv(width_in, width_out))
            else:
                heads = config.out_heads if last else config.heads
                self.convs.append(GATConv(width_in, width_out, heads, attn_dropout=config.attn_dropout,
                                          edge_dim=edge_dim if config.edge_features else 0))
        self.dropout = nn.Dropout(config.dropout)
        self.input_dropout = nn.Dropout(config.input_dropout)

    def _hidden_width(self) -> int:
        return self.config.hidden * (self.config.heads if self.config.model == "gat" else 1)

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def layer(self, index: int, block: Block, h: Tensor) -> Tensor:
        """Apply layer ``index`` (with its input dropout and output activation) to one block."""
        if self.config.residual:
            return self._residual_layer(index, block, h)
        h = self.input_dropout(h) if index == 0 else self.dropout(h)
        h = self.convs[index](block, h)
        last = index == self.num_layers - 1
        if self.config.model == "gat":
            h = h.mean(1) if last else F.elu(h.flatten(1))
        elif not last:
            h = F.relu(h)
        return h

    def _residual_layer(self, index: int, block: Block, h: Tensor) -> Tensor:
        if index == 0:
            h = self.input_proj(self.input_dropout(h))
        update = self.convs[index](block, self.norms[index](h))
        update = F.elu(update.flatten(1)) if self.config.model == "gat" else F.relu(update)
        h = h[: block.num_dst] + self.dropout(update)
        if index == self.num_layers - 1:
            h = self.output_proj(self.output_norm(h))
        return h

    def forward(self, blocks: list[Block], x: Tensor) -> Tensor:
        """``x`` float [blocks[0].num_src, in_dim] -> logits float [blocks[-1].num_dst, out_dim]."""
        if len(blocks) != self.num_layers:
            raise ValueError(f"got {len(blocks)} blocks for a {self.num_layers}-layer model; "
                             f"give the sampler one fanout per layer")
        h = x
        for i, block in enumerate(blocks):
            h = self.layer(i, block, h)
        return h

    def output_width(self, index: int) -> int:
        """Width of layer ``index``'s output after :meth:`layer` (for preallocating inference buffers)."""
        if index == self.num_layers - 1:
            return self.output_proj.out_features if self.config.residual else self.convs[index].out_dim
        return self._hidden_width()
