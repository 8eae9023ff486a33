"""The synthetic temporal stream: deterministic, well formed, bursty, and with a signal to learn."""

from __future__ import annotations

import numpy as np
import pytest

from gnnscale.data.temporal import chronological_split
from gnnscale.data.temporal_synthetic import TemporalStreamConfig, generate_temporal_stream


def test_the_stream_is_deterministic_sorted_bipartite_and_exactly_sized():
    config = TemporalStreamConfig(num_nodes=3000, num_events=40_000, seed=3)
    first, again = generate_temporal_stream(config), generate_temporal_stream(config)
    for name in ("src", "dst", "t"):
        np.testing.assert_array_equal(getattr(first, name), getattr(again, name))
    other = generate_temporal_stream(TemporalStreamConfig(num_nodes=3000, num_events=40_000, seed=4))
    assert not np.array_equal(first.dst, other.dst)
    assert first.num_events == 40_000 and first.num_nodes == 3000 and first.t[0] == 0.0
    assert np.all(np.diff(first.t) >= 0)
    assert first.src.max() < 1500 <= first.dst.min() and first.dst.max() < 3000  # users, then items
    chronological_split(first)  # the protocol of the real streams applies


def test_users_come_in_bursts_and_return_to_their_favourites():
    events = generate_temporal_stream(TemporalStreamConfig(num_nodes=4000, num_events=60_000))
    # Bursts: a user's next event follows far sooner than the mean spacing of their events.
    order = np.lexsort((events.t, events.src))
    same = events.src[order][1:] == events.src[order][:-1]
    gaps = np.diff(events.t[order])[same]
    assert np.median(gaps) < 0.01 * (events.t[-1] / (events.num_events / 2000))
    # The learnable signal: a user's most frequent item takes far more of their events than chance.
    pairs, counts = np.unique(events.src * 4000 + events.dst, return_counts=True)
    top = np.zeros(2000)
    np.maximum.at(top, pairs // 4000, counts)
    per_user = np.bincount(events.src, minlength=2000)
    active = per_user >= 20
    assert np.mean(top[active] / per_user[active]) > 0.1  # 2000 items: chance is far below 0.01


@pytest.mark.parametrize("kwargs, message", [
    ({"num_nodes": 1}, "leaves no users or no items"),
    ({"num_events": 0}, "num_events must be >= 1, got 0"),
    ({"p_favourite": 0.8, "p_community": 0.3}, "must be >= 0 and sum to at most 1"),
    ({"mean_session": 0.5}, "mean_session must be >= 1 event, got 0.5"),
])
def test_bad_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TemporalStreamConfig(**kwargs)


def test_the_command_line_trains_on_a_synthetic_stream(tmp_path):
    import json

    from gnnscale.temporal.cli import main

    out = tmp_path / "run"
    assert main(["--dataset", "synthetic", "--num-nodes", "600", "--num-events", "6000", "--epochs", "2",
                 "--batch-size", "100", "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dataset"] == "synthetic" and metrics["args"]["num_events"] == 6000
    assert metrics["test_ap"] > 0.7  # learnable at once (0.805 here; 0.5 is chance)
