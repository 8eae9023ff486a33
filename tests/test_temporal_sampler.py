"""Temporal neighbour sampling and negative samplers, against brute-force references over the event stream."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from samplers.temporal import (PAD_EVENT, HistoricalNegativeSampler, RandomDestinationSampler, SeenDestinationSampler,
                               TemporalGraph, TemporalNeighborSampler)


def random_stream(rng: np.random.Generator, num_events: int, num_nodes: int, num_times: int):
    """Events among the first ``num_nodes - 3`` nodes (the last three have none), integer-valued
    times with many repeats, self-loops possible."""
    src = rng.integers(0, num_nodes - 3, num_events)
    dst = rng.integers(0, num_nodes - 3, num_events)
    t = np.sort(rng.integers(0, num_times, num_events)).astype(np.float64)
    return src, dst, t


def random_queries(rng: np.random.Generator, t: np.ndarray, num_nodes: int, size: int):
    """Random nodes at a mix of exact event times, arbitrary times and times before any event."""
    nodes = rng.integers(0, num_nodes, size)
    kind = rng.integers(0, 3, size)
    times = np.where(kind == 0, t[rng.integers(0, t.size, size)], rng.uniform(t[0] - 1, t[-1] + 1, size))
    times = np.where(kind == 2, t[0] - 0.5 * rng.random(size) - 1e-9, times)
    times[:3] = t[0]  # exactly at the first event: nothing is eligible
    return nodes, times


def brute_force_events(src, dst, t, node: int, time: float, undirected: bool) -> list[tuple[float, int, int]]:
    """``(time, event id, neighbour)`` of ``node``'s events strictly before ``time``, in (time, id) order."""
    found = []
    for e in range(len(t)):
        if t[e] < time:
            if src[e] == node:
                found.append((float(t[e]), e, int(dst[e])))
            if undirected and dst[e] == node:
                found.append((float(t[e]), e, int(src[e])))
    return sorted(found)


@pytest.mark.parametrize("undirected", [True, False])
def test_csr_lists_every_incident_event_in_time_order(undirected):
    rng = np.random.default_rng(3)
    src, dst, t = random_stream(rng, 300, 40, 25)
    graph = TemporalGraph(src, dst, t, 40, undirected=undirected)
    assert graph.indptr.dtype == graph.neighbors.dtype == graph.event_ids.dtype == np.int64
    assert graph.times.dtype == np.float64
    assert graph.num_entries == (2 if undirected else 1) * 300
    for v in range(40):
        segment = slice(graph.indptr[v], graph.indptr[v + 1])
        listed = list(zip(graph.times[segment].tolist(), graph.event_ids[segment].tolist(),
                          graph.neighbors[segment].tolist()))
        assert listed == brute_force_events(src, dst, t, v, np.inf, undirected)


@pytest.mark.parametrize("undirected", [True, False])
@pytest.mark.parametrize("seed,k", [(0, 1), (1, 3), (2, 7)])
def test_recent_equals_brute_force(undirected, seed, k):
    rng = np.random.default_rng(seed)
    num_nodes = 30
    src, dst, t = random_stream(rng, 250, num_nodes, 20)
    nodes, times = random_queries(rng, t, num_nodes, 150)
    sampler = TemporalNeighborSampler(TemporalGraph(src, dst, t, num_nodes, undirected=undirected), k, "recent")
    out = sampler.sample(nodes, times, np.random.default_rng(0))
    expected_neighbors = np.zeros((150, k), dtype=np.int64)
    expected_times = np.zeros((150, k))
    expected_ids = np.full((150, k), PAD_EVENT, dtype=np.int64)
    expected_mask = np.zeros((150, k), dtype=bool)
    for i, (node, time) in enumerate(zip(nodes, times)):
        recent = brute_force_events(src, dst, t, node, time, undirected)[-k:]
        for j, (event_time, event, neighbor) in enumerate(recent, start=k - len(recent)):  # right-aligned
            expected_neighbors[i, j], expected_times[i, j], expected_ids[i, j] = neighbor, event_time, event
            expected_mask[i, j] = True
    np.testing.assert_array_equal(out.neighbors, expected_neighbors)
    np.testing.assert_array_equal(out.times, expected_times)
    np.testing.assert_array_equal(out.event_ids, expected_ids)
    np.testing.assert_array_equal(out.mask, expected_mask)
    assert out.mask.sum() > 0 and (~out.mask).sum() > 0  # the draw exercises both real entries and padding


def test_small_stream_by_hand():
    # Events 0..3: (0,1,t=1), (1,2,t=2), (0,2,t=2), (2,0,t=5); node 3 has none.
    src, dst, t = np.array([0, 1, 0, 2]), np.array([1, 2, 2, 0]), np.array([1.0, 2.0, 2.0, 5.0])
    nodes, times = np.array([0, 0, 2, 2, 1, 3]), np.array([2.0, 9.0, 2.0, 5.0, 1.0, 9.0])
    rng = np.random.default_rng(0)
    undirected = TemporalNeighborSampler(TemporalGraph(src, dst, t, 4), 2, "recent").sample(nodes, times, rng)
    assert undirected.event_ids.tolist() == [[-1, 0], [2, 3], [-1, -1], [1, 2], [-1, -1], [-1, -1]]
    assert undirected.neighbors.tolist() == [[0, 1], [2, 2], [0, 0], [1, 0], [0, 0], [0, 0]]
    directed = TemporalNeighborSampler(TemporalGraph(src, dst, t, 4, undirected=False), 2, "recent")
    assert directed.sample(nodes, times, rng).event_ids.tolist() == [[-1, 0], [0, 2], [-1, -1], [-1, -1],
                                                                     [-1, -1], [-1, -1]]
    # "recent" draws nothing, so the generator is where a fresh one with the same seed starts.
    assert rng.bit_generator.state == np.random.default_rng(0).bit_generator.state


@pytest.mark.parametrize("undirected", [True, False])
def test_uniform_draws_only_eligible_events(undirected):
    rng = np.random.default_rng(5)
    num_nodes = 30
    src, dst, t = random_stream(rng, 250, num_nodes, 20)
    nodes, times = random_queries(rng, t, num_nodes, 150)
    sampler = TemporalNeighborSampler(TemporalGraph(src, dst, t, num_nodes, undirected=undirected), 4, "uniform")
    out = sampler.sample(nodes, times, np.random.default_rng(0))
    for i, (node, time) in enumerate(zip(nodes, times)):
        eligible = set(brute_force_events(src, dst, t, node, time, undirected))
        row = list(zip(out.times[i].tolist(), out.event_ids[i].tolist(), out.neighbors[i].tolist()))
        if not eligible:
            assert not out.mask[i].any() and row == [(0.0, PAD_EVENT, 0)] * 4
            continue
        assert out.mask[i].all()  # with replacement: a row with any eligible event is full
        assert set(row) <= eligible
        assert row == sorted(row)


def test_uniform_frequencies_are_uniform():
    # Node 0 meets seven partners at times 1..7, then two more at time 8, the query time (excluded).
    src = np.zeros(9, dtype=np.int64)
    dst = np.arange(1, 10)
    t = np.array([1, 2, 3, 4, 5, 6, 7, 8, 8], dtype=np.float64)
    sampler = TemporalNeighborSampler(TemporalGraph(src, dst, t, 10), 5, "uniform")
    out = sampler.sample(np.zeros(4000, dtype=np.int64), np.full(4000, 8.0), np.random.default_rng(11))
    counts = np.bincount(out.event_ids.ravel(), minlength=9)
    assert counts[7:].sum() == 0
    assert chisquare(counts[:7]).pvalue > 1e-3


def test_uniform_same_generator_seed_same_sample():
    rng = np.random.default_rng(8)
    src, dst, t = random_stream(rng, 500, 50, 40)
    nodes, times = random_queries(rng, t, 50, 200)
    graph = TemporalGraph(src, dst, t, 50)
    first = TemporalNeighborSampler(graph, 6, "uniform").sample(nodes, times, np.random.default_rng(4))
    second = TemporalNeighborSampler(graph, 6, "uniform").sample(nodes, times, np.random.default_rng(4))
    other = TemporalNeighborSampler(graph, 6, "uniform").sample(nodes, times, np.random.default_rng(5))
    for name in ("neighbors", "times", "event_ids", "mask"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
    assert not np.array_equal(first.event_ids, other.event_ids)
    # The sampler keeps no random state of its own: a reused sampler repeats a draw given the same
    # generator seed, and only the generator advancing changes it.
    sampler = TemporalNeighborSampler(graph, 6, "uniform")
    shared = np.random.default_rng(4)
    again, later = sampler.sample(nodes, times, shared), sampler.sample(nodes, times, shared)
    np.testing.assert_array_equal(again.event_ids, first.event_ids)
    np.testing.assert_array_equal(sampler.sample(nodes, times, np.random.default_rng(4)).event_ids, first.event_ids)
    assert not np.array_equal(later.event_ids, first.event_ids)


@pytest.mark.parametrize("strategy", ["recent", "uniform"])
def test_no_event_at_or_after_the_query_time_on_a_large_stream(strategy):
    rng = np.random.default_rng(13)
    num_nodes = 3000
    src, dst, t = random_stream(rng, 60_000, num_nodes, 5_000)
    graph = TemporalGraph(src, dst, t, num_nodes)
    nodes = np.concatenate([src[:2000], dst[-2000:], rng.integers(0, num_nodes, 2000)])
    times = np.concatenate([t[:2000], t[-2000:], rng.uniform(-1, 5_001, 2000)])  # many exactly at event times
    out = TemporalNeighborSampler(graph, 10, strategy).sample(nodes, times, np.random.default_rng(1))
    assert out.mask.any()
    assert (out.times[out.mask] < np.broadcast_to(times[:, None], out.mask.shape)[out.mask]).all()
    np.testing.assert_array_equal(t[out.event_ids[out.mask]], out.times[out.mask])
    # Rows have exactly min(k, eligible) entries for recent, k or 0 for uniform.
    eligible = np.array([np.count_nonzero((t < time) & ((src == v) | (dst == v)))
                         + np.count_nonzero((t < time) & (src == v) & (dst == v))
                         for v, time in zip(nodes[::40], times[::40])])
    filled = out.mask[::40].sum(axis=1)
    expected = np.minimum(eligible, 10) if strategy == "recent" else np.where(eligible > 0, 10, 0)
    np.testing.assert_array_equal(filled, expected)


def test_empty_stream_gives_padding_only():
    graph = TemporalGraph(np.array([], dtype=np.int64), np.array([], dtype=np.int64), np.array([]), 3)
    for strategy in ("recent", "uniform"):
        out = TemporalNeighborSampler(graph, 2, strategy).sample(np.array([0, 2]), np.array([1.0, 5.0]),
                                                                 np.random.default_rng(0))
        assert not out.mask.any() and (out.event_ids == PAD_EVENT).all()


def test_random_destinations_are_uniform_over_the_pool():
    sampler = RandomDestinationSampler(np.array([4, 9, 9, 2, 7, 11]))
    drawn = sampler.sample(20_000, np.random.default_rng(3))
    assert drawn.dtype == np.int64 and drawn.shape == (20_000,)
    values, counts = np.unique(drawn, return_counts=True)
    assert values.tolist() == [2, 4, 7, 9, 11]  # repeats in the pool collapse
    assert chisquare(counts).pvalue > 1e-3
    assert sampler.sample(0, np.random.default_rng(3)).shape == (0,)


def test_random_destinations_same_generator_seed_same_draws():
    first = RandomDestinationSampler([4, 9, 2]).sample(50, np.random.default_rng(3))
    np.testing.assert_array_equal(first, RandomDestinationSampler([4, 9, 2]).sample(50, np.random.default_rng(3)))
    assert not np.array_equal(first, RandomDestinationSampler([4, 9, 2]).sample(50, np.random.default_rng(4)))


def test_historical_negatives_come_from_before_the_batch():
    rng = np.random.default_rng(21)
    src, dst, t = random_stream(rng, 2000, 300, 400)
    sampler = HistoricalNegativeSampler(src, dst, t, fallback=np.arange(1000, 1010))
    for start in (500, 1200, 1900):
        batch = slice(start, start + 100)
        negatives = sampler.sample(src[batch], t[batch], np.random.default_rng(start), batch_dst=dst[batch])
        history = set(dst[t < t[batch].min()].tolist())
        assert set(negatives.tolist()) <= history
        assert (negatives != dst[batch]).all()


def test_historical_negatives_are_uniform_over_distinct_past_destinations():
    # Destination 5 occurs three times in the past but is drawn like 6 and 7; 8 is at the batch time.
    src, dst, t = np.zeros(6, dtype=np.int64), np.array([5, 5, 6, 5, 7, 8]), np.array([0, 1, 1, 2, 3, 4.0])
    sampler = HistoricalNegativeSampler(src, dst, t)
    drawn = sampler.sample(np.zeros(6000, dtype=np.int64), np.full(6000, 4.0), np.random.default_rng(1),
                           batch_dst=np.full(6000, 6))
    values, counts = np.unique(drawn, return_counts=True)
    assert values.tolist() == [5, 7]  # 6 is each positive's own destination, 8 is not history
    assert chisquare(counts).pvalue > 1e-3


def test_historical_per_source_uses_the_sources_own_history():
    src, dst, t = np.array([0, 0, 1, 1, 0]), np.array([3, 4, 5, 6, 7]), np.array([1.0, 2, 3, 4, 5])
    sampler = HistoricalNegativeSampler(src, dst, t, per_source=True, fallback=[100])
    drawn = sampler.sample(np.array([0, 0, 1, 2] * 500), np.full(2000, 5.0), np.random.default_rng(0),
                           batch_dst=np.array([3, 9, 5, 3] * 500))
    assert set(drawn[0::4].tolist()) == {4}  # 3 is the positive's own; 7 is at the batch time
    assert set(drawn[1::4].tolist()) == {3, 4}
    assert set(drawn[2::4].tolist()) == {6}
    assert set(drawn[3::4].tolist()) == {100}  # source 2 has no history: fallback


def test_historical_falls_back_without_history():
    src, dst, t = np.array([0, 1, 2]), np.array([1, 2, 3]), np.array([1.0, 1.0, 2.0])
    sampler = HistoricalNegativeSampler(src, dst, t, fallback=[40, 41])
    rng = np.random.default_rng(0)
    # Before (and at) the first time there is no history.
    assert set(sampler.sample(np.zeros(200, dtype=np.int64), np.full(200, 1.0), rng).tolist()) == {40, 41}
    # At t=1.5 the history is destinations 1 and 2; leaving out each positive's own (1) leaves 2.
    assert set(sampler.sample([0] * 50, [1.5] * 50, rng, batch_dst=[1] * 50).tolist()) == {2}
    # The default fallback pool is every destination in the stream.
    default = HistoricalNegativeSampler(src, dst, t).sample(np.zeros(300, dtype=np.int64), np.zeros(300), rng)
    assert set(default.tolist()) == {1, 2, 3}


def test_errors():
    src, dst, t = np.array([0, 1]), np.array([1, 2]), np.array([1.0, 2.0])
    graph = TemporalGraph(src, dst, t, 3)
    with pytest.raises(ValueError, match="num_neighbors must be >= 1, got 0"):
        TemporalNeighborSampler(graph, 0, "recent")
    with pytest.raises(ValueError, match="unknown strategy 'latest'; choose one of recent, uniform"):
        TemporalNeighborSampler(graph, 3, "latest")
    sampler, rng = TemporalNeighborSampler(graph, 3, "recent"), np.random.default_rng(0)
    with pytest.raises(ValueError, match="nodes and times must have one entry per query, got lengths 2 and 3"):
        sampler.sample(np.array([0, 1]), np.array([1.0, 2.0, 3.0]), rng)
    with pytest.raises(ValueError, match="query node 3 is out of range for a graph of 3 nodes"):
        sampler.sample(np.array([0, 3]), np.array([1.0, 2.0]), rng)
    with pytest.raises(ValueError, match="times holds NaN at index 1"):
        sampler.sample(np.array([0, 1]), np.array([1.0, np.nan]), rng)
    with pytest.raises(TypeError, match="nodes must hold integer node ids, got dtype float64"):
        sampler.sample(np.array([0.5]), np.array([1.0]), rng)
    with pytest.raises(ValueError, match=r"t\[0\]=2.0 > t\[1\]=1.0; sort the events by time"):
        TemporalGraph(src, dst, np.array([2.0, 1.0]), 3)
    with pytest.raises(ValueError, match="src, dst and t must have one entry per event, got lengths 2, 1, 2"):
        TemporalGraph(src, dst[:1], t, 3)
    with pytest.raises(ValueError, match="node id 2 is out of range for num_nodes=2"):
        TemporalGraph(src, dst, t, 2)
    with pytest.raises(ValueError, match="src holds negative node id -1"):
        TemporalGraph(np.array([-1, 0]), dst, t, 3)
    with pytest.raises(ValueError, match="destinations is empty"):
        RandomDestinationSampler(np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        RandomDestinationSampler([1, 2]).sample(-1, rng)
    with pytest.raises(ValueError, match="sort the events by time"):
        HistoricalNegativeSampler(src, dst, np.array([2.0, 1.0]))
    with pytest.raises(ValueError, match="the event stream is empty, so there is no default fallback pool"):
        HistoricalNegativeSampler([], [], [])
    historical = HistoricalNegativeSampler(src, dst, t)
    with pytest.raises(ValueError, match="batch_src and batch_time must have one entry per positive"):
        historical.sample([0, 1], [1.0], rng)
    with pytest.raises(ValueError, match="batch_dst must have one entry per positive like batch_src"):
        historical.sample([0, 1], [1.0, 2.0], rng, batch_dst=[1])


def test_every_sampler_requires_a_generator():
    """No sampler falls back to a generator of its own: a draw is always the caller's ``rng``."""
    src, dst, t = np.array([0, 1]), np.array([1, 2]), np.array([1.0, 2.0])
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'rng'"):
        TemporalNeighborSampler(TemporalGraph(src, dst, t, 3), 2, "uniform").sample(np.array([1]), np.array([3.0]))
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'rng'"):
        RandomDestinationSampler([1, 2]).sample(4)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'rng'"):
        HistoricalNegativeSampler(src, dst, t).sample([0], [3.0], batch_dst=[2])
    with pytest.raises(TypeError, match="unexpected keyword argument 'seed'"):
        RandomDestinationSampler([1, 2], seed=0)


def test_seen_destinations_are_drawn_from_the_prefix_only():
    sampler = SeenDestinationSampler(np.array([7, 3, 7, 9, 3, 5]))
    rng = np.random.default_rng(0)
    assert set(sampler.sample(200, rng, 1).tolist()) == {7}
    assert set(sampler.sample(200, rng, 3).tolist()) == {7, 3}
    assert set(sampler.sample(400, rng, 6).tolist()) == {7, 3, 9, 5}
    assert set(sampler.sample(400, rng, 100).tolist()) == {7, 3, 9, 5}  # past the end: every destination
    with pytest.raises(ValueError, match="upto must be >= 1"):
        sampler.sample(1, rng, 0)
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        sampler.sample(-1, rng, 3)
    with pytest.raises(ValueError, match="destinations is empty"):
        SeenDestinationSampler([])
