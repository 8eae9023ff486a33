"""Multi-head graph attention (Velickovic et al. 2018), on blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.batch import Block
from gnnscale.nn.ops import gather_sum, segment_softmax


class GATConv(nn.Module):
    """``h_v'^k = sum_{u in N(v)} softmax_u(LeakyReLU(a_l^k . W^k h_u + a_r^k . W^k h_v [+ a_e^k . W_e^k e_uv]))
    W^k h_u + b^k``; the edge term with ``edge_dim`` > 0 (``block.edge_attr`` float [num_edges, edge_dim]).

    Returns float [num_dst, num_heads, out_dim]; the model concatenates or averages heads.
    Parameter layout matches ``dgl.nn.GATConv``: ``fc`` (no bias), ``attn_l``, ``attn_r``
    [1, heads, out_dim], ``bias`` [heads * out_dim]. Destinations with no in-edges get
    only the bias (add self-loops in the sampler to avoid them).
    """

    def __init__(self, in_dim: int, out_dim: int, num_heads: int, *, attn_dropout: float = 0.0,
                 negative_slope: float = 0.2, edge_dim: int = 0) -> None:
        super().__init__()
        self.in_dim, self.out_dim, self.num_heads, self.edge_dim = in_dim, out_dim, num_heads, edge_dim
        self.fc = nn.Linear(in_dim, out_dim * num_heads, bias=False)
        # Edge features join the attention score (as in PyG's GATConv(edge_dim=...)): a_e^k . W_e^k e_uv.
        self.fc_edge = nn.Linear(edge_dim, out_dim * num_heads, bias=False) if edge_dim else None
        self.attn_e = nn.Parameter(torch.empty(1, num_heads, out_dim)) if edge_dim else None
        self.attn_l = nn.Parameter(torch.empty(1, num_heads, out_dim))
        self.attn_r = nn.Parameter(torch.empty(1, num_heads, out_dim))
        self.bias = nn.Parameter(torch.zeros(num_heads * out_dim))
        self.attn_dropout = nn.Dropout(attn_dropout)
        self.negative_slope = negative_slope
        self.reset_parameters()

    def reset_parameters(self) -> None:
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_normal_(self.fc.weight, gain=gain)
        nn.init.xavier_normal_(self.attn_l, gain=gain)
        nn.init.xavier_normal_(self.attn_r, gain=gain)
        if self.fc_edge is not None:
            nn.init.xavier_normal_(self.fc_edge.weight, gain=gain)
            nn.init.xavier_normal_(self.attn_e, gain=gain)
        nn.init.zeros_(self.bias)

    def forward(self, block: Block, x: Tensor) -> Tensor:
        """``x`` float [num_src, in_dim] -> float [num_dst, num_heads, out_dim]."""
        h = self.fc(x).view(-1, self.num_heads, self.out_dim)
        score_src = (h * self.attn_l).sum(-1)  # [num_src, heads]
        score_dst = (h[: block.num_dst] * self.attn_r).sum(-1)  # [num_dst, heads]
        dst = block.dst_index()
        scores = score_src.index_select(0, block.indices) + score_dst.index_select(0, dst)
        if self.fc_edge is not None:
            if block.edge_attr is None:
                raise ValueError("this GATConv has edge_dim set but the block carries no edge features: load "
                                 "batches with edge_features=True")
            edge = self.fc_edge(block.edge_attr).view(-1, self.num_heads, self.out_dim)
            scores = scores + (edge * self.attn_e).sum(-1)
        scores = F.leaky_relu(scores, self.negative_slope)
        alpha = self.attn_dropout(segment_softmax(block, scores, dst))
        return gather_sum(block, h, alpha, dst) + self.bias.view(1, self.num_heads, self.out_dim)

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, heads={self.num_heads}"
