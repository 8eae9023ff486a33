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
