"""Link-prediction sampling: negative pairs, and the computation graph of a batch of seed edges.

A batch of positive edges (global ids) gets ``num_negatives`` corrupted pairs per positive (same
source, a random destination: DGL's ``negative_sampler.Uniform``, PyG's ``neg_sampling="binary"``);
the unique endpoints of both become the seed nodes of one neighbour-sampling pass, in which the
positive edges and their reverses are excluded from every hop (DGL's
``as_edge_prediction_sampler(exclude="reverse_id")``), so a model never reads the edge it must
predict.  Every draw comes from the batch's generator and all ids are global, so a batch is the
same in one process and on any rank that holds the graph's structure or can ask its owners.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from gnnscale.batch import LinkMiniBatch, MiniBatch

NegativeMode = Literal["uniform", "degree", "global"]
ExcludeMode = Literal["reverse", "self", "none"]
NEGATIVE_MODES = ("uniform", "degree", "global")
EXCLUDE_MODES = ("reverse", "self", "none")


class NegativeSampler:
    """Draws ``num_negatives`` corrupted pairs ``(u, v')`` per positive source ``u``.

    Args:
        num_nodes: destinations are drawn from ``[0, num_nodes)`` (global ids).
        num_negatives: pairs per positive (>= 1).
        mode: ``"uniform"``: ``v'`` uniform over all nodes.  ``"degree"``: ``P(v') ∝ degree(v')^power``
            (word2vec's and PinSAGE's unigram^0.75 smoothing by default), harder negatives on
            skewed graphs.  ``"global"``: both ends uniform, ``(u', v')`` (DGL's ``GlobalUniform``, PyG's
            ``negative_sampling``, the negatives of PyG's link-prediction example).
        degrees: int or float [num_nodes] degree of every node (needed for ``"degree"``).
        power: exponent of the degree weighting (``1.0``: proportional to degree).

    Negatives are not checked against the graph's edges (neither DGL's ``Uniform`` nor PyG's
    loaders do during training): on a sparse graph a drawn pair is an edge with probability
    about ``degree / num_nodes``.
    """

    def __init__(self, num_nodes: int, num_negatives: int = 1, mode: NegativeMode = "uniform", *,
                 degrees: Tensor | np.ndarray | None = None, power: float = 0.75) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        if num_negatives < 1:
            raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
        if mode not in NEGATIVE_MODES:
            raise ValueError(f"negative_sampling must be one of {NEGATIVE_MODES}, got {mode!r}")
        self.num_nodes, self.num_negatives, self.mode = num_nodes, num_negatives, mode
        self.cumulative: np.ndarray | None = None
        if mode == "degree":
            if degrees is None:
                raise ValueError("degree-weighted negative sampling needs degrees= (one per node)")
            weights = np.asarray(degrees, dtype=np.float64) ** power
            if weights.shape != (num_nodes,) or not np.isfinite(weights).all() or weights.sum() <= 0:
                raise ValueError(f"degrees must be {num_nodes} finite non-negative values, not all zero")
            self.cumulative = np.cumsum(weights / weights.sum())

    def __call__(self, src: Tensor, rng: np.random.Generator) -> Tensor:
        """int64 [2, len(src) * num_negatives] pairs, the negatives of ``src[i]`` at ``i*k .. i*k+k-1`` (with
        ``"global"`` their sources are drawn too)."""
        src = torch.as_tensor(src, dtype=torch.int64)
        count = src.numel() * self.num_negatives
        if self.mode == "global":
            return torch.from_numpy(rng.integers(0, self.num_nodes, (2, count), dtype=np.int64))
        if self.cumulative is None:
            dst = rng.integers(0, self.num_nodes, count, dtype=np.int64)
        else:
            # Inverse-CDF draw; the clip guards the last bucket against float round-off of the cumsum.
            dst = np.minimum(np.searchsorted(self.cumulative, rng.random(count), side="right"), self.num_nodes - 1)
        return torch.stack([src.repeat_interleave(self.num_negatives), torch.from_numpy(dst.astype(np.int64))])


def excluded_edges(pos: Tensor, mode: ExcludeMode) -> Tensor | None:
    """The edges to drop from the sampled neighbourhoods of a batch with positive pairs ``pos`` int64 [2, P]:
    the seed edges and their reverses (``"reverse"``), the seed edges only (``"self"``), or none."""
    if mode == "none":
        return None
    if mode == "self":
        return pos
    return torch.cat([pos, pos.flip(0)], dim=1)


class LinkSampler:
    """``(edge positions, rng) -> LinkMiniBatch``: the sample function a :class:`PrefetchLoader` drives.

    Args:
        sample: a node sampler's ``sample(seeds, rng=, exclude=) -> MiniBatch`` (``NeighborSampler``
            or ``DistNeighborSampler``, whose call is then a collective).
        edges: int64 [2, E] the seed edges ``(src, dst)``, global ids; the loader hands out positions
            into it.
        negatives: draws the negative pairs (None: batches without negatives, e.g. to score given pairs).
        exclude: which edges of the batch the neighbourhoods leave out (see :func:`excluded_edges`).
    """

    def __init__(self, sample: Callable[..., MiniBatch], edges: Tensor, negatives: NegativeSampler | None,
                 exclude: ExcludeMode = "reverse") -> None:
        if exclude not in EXCLUDE_MODES:
            raise ValueError(f"exclude must be one of {EXCLUDE_MODES}, got {exclude!r}")
        edges = torch.as_tensor(edges, dtype=torch.int64)
        if edges.dim() != 2 or edges.shape[0] != 2:
            raise ValueError(f"edges must be int64 [2, E] (src, dst) pairs, got shape {tuple(edges.shape)}")
        self.sample_nodes, self.edges, self.negatives, self.exclude = sample, edges, negatives, exclude

    def __call__(self, positions: Tensor, *, rng: np.random.Generator) -> LinkMiniBatch:
        pos = self.edges[:, torch.as_tensor(positions, dtype=torch.int64)]
        neg = pos[:, :0] if self.negatives is None else self.negatives(pos[0], rng)
        return link_batch(self.sample_nodes, pos, neg, rng=rng, exclude=excluded_edges(pos, self.exclude))


def link_batch(sample: Callable[..., MiniBatch], pos: Tensor, neg: Tensor, *, rng: np.random.Generator | None,
               exclude: Tensor | None = None) -> LinkMiniBatch:
    """The :class:`LinkMiniBatch` of global pairs ``pos`` int64 [2, P] and ``neg`` int64 [2, Q]: one
    node-sampling pass over their unique endpoints (sorted), the pairs renumbered into those seeds."""
    ends = torch.cat([pos, neg], dim=1)
    seeds, inverse = torch.unique(ends.reshape(-1), return_inverse=True)
    local = inverse.view(2, -1)
    batch = sample(seeds, rng=rng, exclude=exclude)
    return LinkMiniBatch(seeds=batch.seeds, blocks=batch.blocks, pos=local[:, :pos.shape[1]],
                         neg=local[:, pos.shape[1]:])
