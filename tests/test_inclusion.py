"""Vertex inclusion probabilities against exact small cases and against the sampler's own frequencies."""

from __future__ import annotations

import numpy as np
import torch

from gnnscale.data.dataset import csc_from_edges
from samplers import NeighborSampler, SamplerConfig
from samplers.inclusion import inclusion_probabilities


def test_exact_on_a_path_and_a_star() -> None:
    # In-edges: 1 <- 0, 2 <- 1, 3 <- 2 (a directed path); seed 3 for sure, fanout -1: 3, 2, 1 are inputs.
    indptr = np.array([0, 0, 1, 2, 3])
    indices = np.array([0, 1, 2])
    p = inclusion_probabilities(indptr, indices, np.array([0, 0, 0, 1.0]), [-1, -1])
    np.testing.assert_allclose(p, [0, 1, 1, 1], atol=1e-9)
    # Node 0 with 4 in-neighbours, fanout 1, seed with probability 1/2: each neighbour 1/2 x 1/4.
    indptr = np.array([0, 4, 4, 4, 4, 4])
    p = inclusion_probabilities(indptr, np.array([1, 2, 3, 4]), np.array([0.5, 0, 0, 0, 0]), [1])
    np.testing.assert_allclose(p, [0.5, 0.125, 0.125, 0.125, 0.125], atol=1e-9)


def test_matches_the_samplers_frequencies() -> None:
    rng = np.random.default_rng(0)
    num_nodes, batch = 3000, 30
    indptr, indices = csc_from_edges(rng.integers(0, num_nodes, 30000), rng.integers(0, num_nodes, 30000),
                                     num_nodes, symmetrize=True)
    train = np.flatnonzero(rng.random(num_nodes) < 0.1)
    seed_probability = np.zeros(num_nodes)
    seed_probability[train] = batch / train.size
    fanouts = [5, 3]
    p = inclusion_probabilities(indptr, indices, seed_probability, fanouts)
    sampler = NeighborSampler(indptr, indices, SamplerConfig(fanouts=fanouts))
    draws = 1000
    counts = np.zeros(num_nodes)
    for _ in range(draws):
        seeds = torch.from_numpy(rng.choice(train, batch, replace=False))
        counts[sampler.sample(seeds, rng=rng).input_ids.numpy()] += 1
    frequency = counts / draws
    # Independence between draws is an approximation: close, not equal (measured: correlation 0.97).
    assert np.corrcoef(p, frequency)[0, 1] > 0.95
    assert abs(p.mean() - frequency.mean()) < 0.03
    assert (p[frequency == 0] < 0.05).all()  # never drawn in 1000 batches: a small probability
    assert (p[frequency > 0] > 0).all()  # everything the sampler reached has a probability


def halo_copy(indptr: np.ndarray, indices: np.ndarray, start: int, end: int):
    """The :class:`HaloGraph` rank ``[start, end)`` of a whole CSC would fetch (no collective needed here)."""
    from samplers.distributed import HaloGraph, LocalGraph

    owned = LocalGraph(indptr[start:end + 1] - indptr[start], indices[indptr[start]:indptr[end]], start=start)
    sources = owned.indices
    halo_ids = np.unique(sources[(sources < start) | (sources >= end)])
    degree = indptr[halo_ids + 1] - indptr[halo_ids]
    halo_indptr = np.concatenate([[0], np.cumsum(degree)])
    halo_indices = np.concatenate([indices[indptr[v]:indptr[v + 1]] for v in halo_ids])
    return HaloGraph(owned, torch.from_numpy(halo_ids), halo_indptr, halo_indices, None)


def test_halo_inclusion_equals_the_whole_graphs_for_two_layers() -> None:
    """From owned and halo in-edges alone, every non-owned node's probability as the whole structure gives it."""
    from samplers.inclusion import halo_inclusion

    rng = np.random.default_rng(1)
    num_nodes, start, end = 2000, 600, 1300
    indptr, indices = csc_from_edges(rng.integers(0, num_nodes, 12000), rng.integers(0, num_nodes, 12000),
                                     num_nodes, symmetrize=True)
    halo = halo_copy(indptr, indices, start, end)
    seed_probability = np.zeros(end - start)
    seed_probability[rng.random(end - start) < 0.2] = 0.05
    for fanouts in ([4, 3], [-1, 2], [5]):
        ids, p = halo_inclusion(halo, seed_probability, fanouts)
        whole_seeds = np.zeros(num_nodes)
        whole_seeds[start:end] = seed_probability
        want = inclusion_probabilities(indptr, indices, whole_seeds, fanouts)
        want[start:end] = 0
        np.testing.assert_array_equal(ids, np.flatnonzero(want > 0), err_msg=f"fanouts {fanouts}: reached nodes")
        np.testing.assert_allclose(p, want[ids], rtol=1e-12, err_msg=f"fanouts {fanouts}")
        assert ids.size > halo.halo_ids.numel() or len(fanouts) == 1  # two hops reach beyond the halo
