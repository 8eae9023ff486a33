"""GraphSAGE convolution with mean aggregation (Hamilton et al. 2017), on blocks."""

from __future__ import annotations

from torch import Tensor, nn

from gnnscale.batch import Block
from gnnscale.nn.ops import project_first, spmm_mean


class SAGEConv(nn.Module):
    """``h_v' = W_self h_v + W_neigh mean_{u in N(v)} h_u + b``.  Parameter layout matches
    ``dgl.nn.SAGEConv(aggregator_type="mean")``: ``lin_self`` carries the bias, ``lin_neigh`` has none."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.lin_self = nn.Linear(in_dim, out_dim)
        self.lin_neigh = nn.Linear(in_dim, out_dim, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.lin_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.lin_neigh.weight, gain=gain)
        nn.init.zeros_(self.lin_self.bias)

    def forward(self, block: Block, x: Tensor) -> Tensor:
        """``x`` float [num_src, in_dim] -> float [num_dst, out_dim]."""
        if project_first(self.in_dim, self.out_dim, x):
            neigh = spmm_mean(block, self.lin_neigh(x))
        else:
            neigh = self.lin_neigh(spmm_mean(block, x))
        return self.lin_self(x[: block.num_dst]) + neigh

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, aggregator=mean"
