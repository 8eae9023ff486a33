"""A dense synthetic interaction stream: few nodes, long per-node histories, a state that drifts.

The streams the scale-out was first measured on are sparse (Wikipedia: about 17 events per node).
On a dense stream -- under a thousand nodes, about 200 events per node -- a node's memory sums up a
long history, and a copy of the memory that misses part of the stream (a memory group's, or a
stale replica) is wrong for many events.  This generator makes such a stream, with a signal that
lives in that history:

* users ``0..U-1`` interact with items ``U..N-1`` (bipartite); items have a heavy-tailed (Pareto)
  popularity;
* every user has a current *interest*, ``favourites`` items drawn by popularity, which it keeps for
  a geometric number of its own events (mean ``mean_interest_run``) and then draws anew; with
  ``p_interest`` an event's item is one of the user's current favourites (uniformly), else any item
  (by popularity);
* users are drawn per event by a mildly heavy-tailed activity, at exponential gaps in time.

So what a user will do next depends on which interest it is in, which its recent events show and
its memory can carry; the interest of a user changes in mid-stream, between the training, validation
and test parts, so a memory that has not seen the latest events predicts from an outdated interest.
Deterministic by seed; vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnscale.data.temporal import TemporalEvents
from gnnscale.data.temporal_synthetic import check_users


@dataclass(kw_only=True)
class DenseStreamConfig:
    """Size and shape of a dense synthetic stream (defaults: 800 nodes, 80,000 events: 200 per node)."""

    num_nodes: int = 800
    """Users plus items."""
    num_events: int = 80_000
    user_fraction: float = 0.5
    """Share of the nodes that are users."""
    favourites: int = 3
    """Items of one interest."""
    p_interest: float = 0.8
    """Share of the events whose item is one of the user's current favourites (the rest: any item)."""
    mean_interest_run: float = 40.0
    """Mean number of a user's own events before its interest changes (geometric)."""
    mean_gap: float = 10.0
    """Mean seconds between consecutive events of the stream (exponential)."""
    seed: int = 0

    def __post_init__(self) -> None:
        check_users(self.num_nodes, self.user_fraction)
        for name in ("num_events", "favourites"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.p_interest <= 1.0:
            raise ValueError(f"p_interest must be in [0, 1], got {self.p_interest}")
        if not self.mean_interest_run >= 1.0:
            raise ValueError(f"mean_interest_run must be >= 1 event, got {self.mean_interest_run}")
        if not self.mean_gap > 0:
            raise ValueError(f"mean_gap must be > 0, got {self.mean_gap}")

    @property
    def num_users(self) -> int:
        return int(self.num_nodes * self.user_fraction)


def _interests(src: np.ndarray, config: DenseStreamConfig, rng: np.random.Generator) -> np.ndarray:
    """The interest (a number) of each event's user at that event: per user, runs of geometric length
    (its own events, in stream order), each run a new interest."""
    order = np.argsort(src, kind="stable")  # each user's events, in stream order
    first_of_user = np.ones(src.size, dtype=bool)
    first_of_user[1:] = src[order][1:] != src[order][:-1]
    change = first_of_user | (rng.random(src.size) < 1.0 / config.mean_interest_run)
    run = np.cumsum(change) - 1
    interest = np.empty(src.size, dtype=np.int64)
    interest[order] = run
    return interest


def generate_dense_stream(config: DenseStreamConfig) -> TemporalEvents:
    """The stream of ``config``: ``num_events`` events in time order, ``name="dense-synthetic"``."""
    rng = np.random.default_rng(config.seed)
    users, events = config.num_users, config.num_events
    items = config.num_nodes - users
    popularity = np.concatenate([[0.0], np.cumsum(rng.pareto(2.0, items) + 1.0)])
    activity = np.concatenate([[0.0], np.cumsum(rng.pareto(3.0, users) + 1.0)])
    src = np.searchsorted(activity, rng.random(events) * activity[-1], side="right") - 1
    interest = _interests(src, config, rng)
    favourites = np.searchsorted(popularity, rng.random((int(interest.max()) + 1, config.favourites)) * popularity[-1],
                                 side="right") - 1
    item = np.searchsorted(popularity, rng.random(events) * popularity[-1], side="right") - 1
    chosen = rng.random(events) < config.p_interest
    item[chosen] = favourites[interest[chosen], rng.integers(0, config.favourites, int(chosen.sum()))]
    t = np.cumsum(rng.exponential(config.mean_gap, events))
    return TemporalEvents(src=src.astype(np.int64), dst=(users + item).astype(np.int64), t=t - t[0],
                          num_nodes=config.num_nodes, name="dense-synthetic")
