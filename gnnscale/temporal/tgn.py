"""TGN (Rossi et al. 2020): node memory + temporal graph attention over sampled past neighbours + link predictor.

The embedding of node ``i`` at time ``t`` attends from ``[s_i, phi(0)]`` over its ``k`` sampled
past events ``(j, t_j, e_j)`` with keys and values ``[s_j, e_j, phi(t - t_j)]`` (``s`` = memory
after pending messages, ``phi`` the memory's time encoder, shared), and merges the result with
``s_i`` through a two-layer MLP.  Link logits come from an MLP over ``[z_u, z_v]``.  With static
node memory (DistTGL) ``s`` is the dynamic memory plus a learnable per-node vector.

Plain torch; the neighbour arrays come from ``samplers.temporal`` (numpy) as tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.optim import Adam
from gnnscale.temporal.memory import MemoryConfig, MemoryView, TemporalMemory


@dataclass(kw_only=True)
class TGNConfig:
    """Architecture of a :class:`TGN` (beyond its memory)."""

    embedding_dim: int = 100
    """Width of node embeddings."""
    heads: int = 2
    """Attention heads."""
    dropout: float = 0.1
    """Dropout in attention and the merge MLP."""
    init: str = "xavier"
    """Initial weights: ``xavier`` as the reference TGN (Xavier-normal merge and predictor MLPs, as its
    ``MergeLayer``; Xavier-uniform attention projections with zero biases, as ``nn.MultiheadAttention``),
    or ``torch`` (``nn.Linear``'s default, half the scale: Wikipedia at batch 200 reached validation
    AP 0.9428 after one epoch with it, 0.9546 with ``xavier``)."""

    static_memory: bool = False
    """DistTGL's static node memory: a learnable vector per node, added to the dynamic memory wherever the
    embedding reads it (the node's own state and its neighbours'); it starts at zero, so the model
    starts as without it, and trains sparsely (only a batch's rows).  The memory's updates and the
    messages keep to the dynamic memory.  A table of ``num_nodes x memory_dim`` parameters."""

    def __post_init__(self) -> None:
        if self.embedding_dim < 1 or self.heads < 1:
            raise ValueError(f"embedding_dim and heads must be >= 1, got {self.embedding_dim} and {self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.init not in ("xavier", "torch"):
            raise ValueError(f"unknown init {self.init!r}; choose xavier or torch")


@dataclass
class Neighborhood:
    """Sampled past events of a set of query nodes, as tensors: each ``[B, k]``."""

    neighbors: Tensor
    times: Tensor
    event_ids: Tensor
    mask: Tensor
    """bool: False marks padding."""


@dataclass
class DropoutMasks:
    """Dropout of one batch's embeddings, drawn ahead (:meth:`TGN.dropout_masks`): keep masks already
    scaled by ``1 / (1 - p)``."""

    attention: Tensor
    """[B, heads, 1, k]: on the attention weights over each query's past events."""
    merge: Tensor
    """[B, embedding_dim]: on the merge MLP's hidden layer."""


class TemporalAttention(nn.Module):
    """One layer of TGN's graph attention embedding (the module docstring's attention), then a merge MLP.

    The key and value projections are split in two: the neighbour-memory part is applied once per
    *distinct* neighbour (a batch's neighbourhoods repeat the same nodes many times), the
    edge-and-time part per (query, neighbour) pair; their sum is the projection of the
    concatenation, as in ``nn.MultiheadAttention`` with ``kdim = vdim = d_mem + d_edge + d_time``.
    """

    def __init__(self, memory_dim: int, edge_dim: int, time_dim: int, config: TGNConfig) -> None:
        super().__init__()
        query_dim = memory_dim + time_dim
        if query_dim % config.heads:
            raise ValueError(f"memory_dim + time_dim = {query_dim} must be divisible by heads={config.heads}")
        self.heads, self.dropout = config.heads, config.dropout
        self.query = nn.Linear(query_dim, query_dim)
        self.key_value_memory = nn.Linear(memory_dim, 2 * query_dim)
        self.key_value_pair = nn.Linear(edge_dim + time_dim, 2 * query_dim, bias=False)
        self.out = nn.Linear(query_dim, query_dim)
        self.merge = nn.Sequential(nn.Linear(query_dim + memory_dim, config.embedding_dim), nn.ReLU(),
                                   nn.Dropout(config.dropout), nn.Linear(config.embedding_dim, config.embedding_dim))

    def forward(self, self_state: Tensor, query_time_code: Tensor, neighbor_memory: Tensor, neighbor_index: Tensor,
                pair_features: Tensor, mask: Tensor, dropout: DropoutMasks | None = None) -> Tensor:
        """``self_state`` [B, d_mem], ``query_time_code`` [B, d_time]; ``neighbor_memory`` [U, d_mem] rows of
        the distinct neighbours and ``neighbor_index`` [B, k] which row each slot is; ``pair_features``
        [B, k, d_edge + d_time]; ``mask`` [B, k] (False: padding).  ``dropout``: masks drawn ahead, applied
        instead of drawing here (training, as one process would draw them, on any share of a batch)."""
        batch, slots = mask.shape
        heads = self.heads
        query = self.query(torch.cat([self_state, query_time_code], dim=1))
        width = query.shape[1]
        # index_select, not [index]: its backward (index_add_) sums repeated rows in a fixed order.
        projected = self.key_value_memory(neighbor_memory)
        # Sizes spelled out: a rank's share of a global batch can be empty (sharded memory, small batches).
        key_value = projected.index_select(0, neighbor_index.reshape(-1)).view(batch, slots, 2 * width) + \
            self.key_value_pair(pair_features)
        key, value = key_value.split(width, dim=-1)
        query = query.view(batch, heads, 1, width // heads)
        key = key.view(batch, slots, heads, width // heads).transpose(1, 2)
        value = value.view(batch, slots, heads, width // heads).transpose(1, 2)
        # A row without any past event attends to nothing: give it one dummy valid slot and zero its output.
        empty = ~mask.any(dim=1)
        allowed = mask.clone()
        allowed[empty, 0] = True
        if dropout is None:
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed[:, None, None, :],
                                                 dropout_p=self.dropout if self.training else 0.0)
        else:  # SDPA's own dropout, with the given mask
            scores = (query @ key.transpose(-2, -1)) * (width // heads) ** -0.5
            scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
            out = (torch.softmax(scores, dim=-1) * dropout.attention) @ value
        out = self.out(out.reshape(batch, width)).masked_fill(empty.unsqueeze(1), 0.0)
        merged = torch.cat([out, self_state], dim=1)
        if dropout is None:
            return self.merge(merged)
        first, relu, _, last = self.merge
        return last(relu(first(merged)) * dropout.merge)


class LinkPredictor(nn.Module):
    """``logit(u, v) = MLP([z_u, z_v])``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU(), nn.Linear(dim, 1))

    def forward(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        return self.mlp(torch.cat([z_src, z_dst], dim=1)).squeeze(1)


class TGN(nn.Module):
    """Memory, one temporal attention layer and a link predictor; ``memory_config.edge_dim`` is the
    events' feature width."""

    def __init__(self, num_nodes: int, memory_config: MemoryConfig, config: TGNConfig) -> None:
        super().__init__()
        self.memory = TemporalMemory(num_nodes, memory_config)
        self.embedding = TemporalAttention(memory_config.memory_dim, memory_config.edge_dim,
                                           memory_config.time_dim, config)
        self.predictor = LinkPredictor(config.embedding_dim)
        self.edge_dim = memory_config.edge_dim
        self.static = None
        if config.static_memory:  # sparse gradients: a step touches a batch's rows, not the whole table
            self.static = nn.Embedding.from_pretrained(torch.zeros(num_nodes, memory_config.memory_dim), freeze=False,
                                                       sparse=True)  # no draw: the other weights stay as without it
        if config.init == "xavier":
            self._init_as_reference()

    @torch.no_grad()
    def _init_as_reference(self) -> None:
        """The reference TGN's initial weights (see :attr:`TGNConfig.init`); the memory's GRU and time
        encoder keep theirs."""
        attention = self.embedding
        for layer in (attention.merge[0], attention.merge[3], self.predictor.mlp[0], self.predictor.mlp[2]):
            nn.init.xavier_normal_(layer.weight)
        for layer in (attention.query, attention.key_value_memory, attention.key_value_pair, attention.out):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def dropout_masks(self, rows: int, slots: int, keep: Tensor) -> DropoutMasks | None:
        """Dropout masks of a *global* batch of ``rows`` queries over ``slots`` past events each, drawn from
        torch's generator in one fixed order, then the rows ``keep`` (int64) of the ones this rank embeds.

        Every rank of a sharded run draws the whole batch's masks from the same generator state, so each
        query gets the mask it gets in one process, whichever rank computes it (drawn per rank on its
        share, the masks, hence the run, depended on the number of ranks).  ``None`` outside training or
        without dropout; nothing is drawn then."""
        p = self.embedding.dropout
        if not self.training or p == 0.0:
            return None
        weight = self.predictor.mlp[0].weight
        attention = torch.rand(rows, self.embedding.heads, 1, slots, device=weight.device)
        merge = torch.rand(rows, self.embedding.merge[0].out_features, device=weight.device)
        scale = 1.0 / (1.0 - p)
        return DropoutMasks(*(((m.index_select(0, keep) >= p) * scale).to(weight.dtype) for m in (attention, merge)))

    def embed(self, memory: MemoryView, nodes: Tensor, times: Tensor, neighborhood: Neighborhood,
              edge_features: Tensor | None, dropout: DropoutMasks | None = None) -> Tensor:
        """Embeddings float [B, embedding_dim] of ``nodes`` at ``times`` (float64 [B]).  ``memory`` is the
        updated memory of the nodes and their neighbours (``self.memory.updated()``); ``edge_features``
        float [E, edge_dim] is indexed by the neighbourhood's event ids; ``dropout``: this batch's masks
        (:meth:`dropout_masks`), else (training) dropout draws its own."""
        encoder = self.memory.time_encoder
        dtype = memory.memory.dtype
        dt = (times.unsqueeze(1) - neighborhood.times).to(dtype).clamp(min=0.0)
        pair = [encoder(dt)]
        if self.edge_dim:
            ids = neighborhood.event_ids.clamp(min=0)
            pair.insert(0, edge_features[ids].to(dtype) * neighborhood.mask.unsqueeze(-1))
        distinct, index = torch.unique(neighborhood.neighbors.clamp(min=0), return_inverse=True)
        query_code = encoder(torch.zeros_like(times, dtype=dtype))
        own, neighbors = memory.rows(nodes), memory.rows(distinct)
        if self.static is not None:
            own, neighbors = own + self.static(nodes).to(dtype), neighbors + self.static(distinct).to(dtype)
        return self.embedding(own, query_code, neighbors, index, torch.cat(pair, dim=-1), neighborhood.mask, dropout)

    def optimizers(self, lr: float) -> list[Adam | torch.optim.Optimizer]:
        """Adam over the dense parameters (:class:`gnnscale.optim.Adam`: torch's, without loading its
        compiler), and torch's SparseAdam over the static memory if there is one."""
        dense = [p for name, p in self.named_parameters() if not name.startswith("static.")]
        return [Adam(dense, lr=lr)] + ([] if self.static is None else
                                                   [torch.optim.SparseAdam([self.static.weight], lr=lr)])

    def link_loss(self, z_src: Tensor, z_dst: Tensor, z_neg: Tensor,
                  reduction: str = "mean") -> tuple[Tensor, Tensor, Tensor]:
        """``(loss, positive logits, negative logits)`` with one negative destination per positive;
        ``reduction="sum"`` sums the two cross-entropies over the events instead of averaging."""
        pos = self.predictor(z_src, z_dst)
        neg = self.predictor(z_src, z_neg)
        loss = F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos), reduction=reduction) + \
            F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg), reduction=reduction)
        return loss, pos, neg
