"""Graph convolution (Kipf & Welling 2017), on blocks."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gnnscale.batch import Block
from gnnscale.nn.ops import project_first, spmm_sum


class GCNConv(nn.Module):
    """``h_v' = sum_{e=(u,v)} w_e W h_u + b``.

    With ``block.edge_weight`` set, ``w_e`` is that weight: the samplers put Kipf &
    Welling's ``1/sqrt(d~_u d~_v)`` there, computed from *full-graph* degrees with a
    self-loop edge in every block, so sampled training and full-neighbour evaluation
    see activations on the same scale. Without it, ``w_e = 1/sqrt(d_out(u) d_in(v))``
    from the degrees inside the block, exactly ``dgl.nn.GraphConv(norm="both")``.
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.zeros_(self.bias)

    def forward(self, block: Block, x: Tensor) -> Tensor:
        """``x`` float [num_src, in_dim] -> float [num_dst, out_dim]."""
        first = project_first(self.in_dim, self.out_dim, x)
        if first:
            x = self.lin(x)
        if block.edge_weight is not None:
            out = spmm_sum(block, x, block.edge_weight)
        else:
            out_deg = torch.bincount(block.indices, minlength=block.num_src).clamp(min=1).to(x.dtype)
            in_deg = block.in_degrees().clamp(min=1).to(x.dtype)
            out = spmm_sum(block, x * out_deg.rsqrt().unsqueeze(-1)) * in_deg.rsqrt().unsqueeze(-1)
        if not first:
            out = self.lin(out)
        return out + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}"
