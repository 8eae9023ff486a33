"""Typed mini-batches of plain tensors: the contract between samplers and layers.

A sampler returns ids and block structure only; features are gathered afterwards.
Nothing here imports DGL, so a GPU machine whose torch cannot load DGL can still
run the layers on batches saved to disk (:meth:`MiniBatch.save` / :meth:`MiniBatch.load`).

Block convention (same as DGL's message-flow graphs): the destination nodes of a
block are the first ``num_dst`` of its source nodes, so ``h[:num_dst]`` is the
destination part of a source-feature tensor ``h``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import Tensor


@dataclass(kw_only=True)
class Block:
    """One layer of message passing: edges from ``num_src`` source to ``num_dst`` destination nodes, as CSC."""

    indptr: Tensor
    """int64 [num_dst + 1]: offsets of each destination's in-edges in ``indices``."""
    indices: Tensor
    """int64 [num_edges]: local source id (into ``src_ids``) of every edge."""
    src_ids: Tensor
    """int64 [num_src]: global ids of the source nodes; the first ``num_dst`` are the destinations."""
    num_dst: int
    """Number of destination nodes."""
    edge_weight: Tensor | None = None
    """float32 [num_edges] or None: per-edge weight (GCN normalisation), used by layers that accept it."""
    edge_ids: Tensor | None = None
    """int64 [num_edges] or None: global id of every edge (-1 for a self-loop the sampler added)."""
    edge_attr: Tensor | None = None
    """float [num_edges, D] or None: edge features (zeros for added self-loops), used by edge-aware layers."""

    def __post_init__(self) -> None:
        # Blocks also come from files (MiniBatch.load): a malformed one is an input error, not a bug.
        if self.indptr.numel() != self.num_dst + 1:
            raise ValueError(f"block indptr has {self.indptr.numel()} entries for {self.num_dst} destinations; "
                             f"it needs num_dst + 1 (re-create the saved batch)")
        if self.num_dst > self.src_ids.numel():
            raise ValueError(f"block has {self.num_dst} destinations but only {self.src_ids.numel()} sources; the "
                             f"destinations must be a prefix of the sources (re-create the saved batch)")

    @property
    def num_src(self) -> int:
        return int(self.src_ids.numel())

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    @property
    def dst_ids(self) -> Tensor:
        """int64 [num_dst]: global ids of the destination nodes."""
        return self.src_ids[: self.num_dst]

    def in_degrees(self) -> Tensor:
        """int64 [num_dst]: sampled in-degree of each destination."""
        return self.indptr[1:] - self.indptr[:-1]

    def dst_index(self) -> Tensor:
        """int64 [num_edges]: local destination id of every edge (COO row index of the CSC)."""
        return torch.repeat_interleave(torch.arange(self.num_dst, device=self.indptr.device), self.in_degrees(),
                                       output_size=self.num_edges)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Block":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, Tensor):
                moved[name] = value.to(device, non_blocking=non_blocking)
        return Block(**moved)


@dataclass(kw_only=True)
class MiniBatch:
    """The sampled computation graph of a set of seed nodes, outermost layer first: ``blocks[0]``
    consumes the features of ``input_ids``; ``blocks[-1]`` produces one row per seed."""

    seeds: Tensor
    """int64 [batch_size]: global ids of the nodes whose outputs are wanted."""
    blocks: list[Block]
    """One block per layer, input side first."""

    @property
    def input_ids(self) -> Tensor:
        """int64 [num_input]: global ids whose features the first layer reads."""
        return self.blocks[0].src_ids

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "MiniBatch":
        return MiniBatch(seeds=self.seeds.to(device, non_blocking=non_blocking),
                         blocks=[b.to(device, non_blocking=non_blocking) for b in self.blocks])

    def state(self) -> dict[str, Tensor | int]:
        """A flat dict of tensors and ints (safe for ``torch.save`` + ``weights_only`` loading)."""
        out: dict[str, Tensor | int] = {"seeds": self.seeds, "num_blocks": len(self.blocks)}
        for i, block in enumerate(self.blocks):
            for f in fields(block):
                value = getattr(block, f.name)
                if value is not None:
                    out[f"blocks.{i}.{f.name}"] = value
        return out

    @classmethod
    def from_state(cls, state: dict[str, Tensor | int]) -> "MiniBatch":
        blocks = []
        for i in range(int(state["num_blocks"])):
            prefix = f"blocks.{i}."
            blocks.append(Block(**{k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}))
        return cls(seeds=state["seeds"], blocks=blocks)

    def save(self, path: str | Path) -> None:
        torch.save(self.state(), path)

    @classmethod
    def load(cls, path: str | Path) -> "MiniBatch":
        return cls.from_state(torch.load(path, weights_only=True))


@dataclass(kw_only=True)
class LinkMiniBatch(MiniBatch):
    """A link-prediction batch: the computation graph of the unique endpoints of its positive and
    negative pairs.  ``seeds`` are those endpoints (global ids, sorted); ``pos`` and ``neg`` index
    into them, so ``h[pos[0]]`` and ``h[pos[1]]`` are the two ends of every positive pair when ``h``
    holds one output row per seed."""

    pos: Tensor
    """int64 [2, num_pos]: (source, destination) positions in ``seeds`` of the positive pairs."""
    neg: Tensor
    """int64 [2, num_neg]: the same for the negative pairs (``num_negatives`` per positive, grouped
    by positive: rows ``i * k .. i * k + k - 1`` corrupt positive ``i``)."""

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "LinkMiniBatch":
        moved = MiniBatch.to(self, device, non_blocking)
        return LinkMiniBatch(seeds=moved.seeds, blocks=moved.blocks, pos=self.pos.to(device, non_blocking=non_blocking),
                             neg=self.neg.to(device, non_blocking=non_blocking))

    def state(self) -> dict[str, Tensor | int]:
        return {**MiniBatch.state(self), "pos": self.pos, "neg": self.neg}

    @classmethod
    def from_state(cls, state: dict[str, Tensor | int]) -> "LinkMiniBatch":
        base = MiniBatch.from_state(state)
        return cls(seeds=base.seeds, blocks=base.blocks, pos=state["pos"], neg=state["neg"])
