"""Large and sparse node ids and timestamps: nothing is allocated by an id's or a time's value.

Temporal streams are relabelled compactly past ``max(2 * events, DENSE_ID_LIMIT)`` ids, keeping the file's
ids in ``orig_ids``; ids that int64 (or, written as floats, float64) cannot hold exactly are refused in one
line; static edge lists refuse ids beyond int64 in one line instead of overflowing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from gnnscale.data.dataset import MAX_KEYED_NODES, DatasetError, csc_from_edges
from gnnscale.data.edgelist import load_edgelist
from gnnscale.data.temporal import (DENSE_ID_LIMIT, TemporalEvents, chronological_split, compact_ids,
                                    load_jodie_csv, load_snap_temporal, load_temporal_npz)
from samplers.temporal import TemporalGraph, TemporalNeighborSampler

ROOT = Path(__file__).resolve().parents[1]
BIG = 10**12
# Far below what allocating by value would take (8 bytes x 10**12): what O(events) arrays need here.
PEAK_BYTES = 32 << 20


def events_csv(path: Path, num_events: int = 400, extra: str = "") -> Path:
    """A JODIE CSV of users 0..14 and items 15..29 at rising times, plus ``extra`` rows at the end."""
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 15, num_events), rng.integers(15, 30, num_events)
    rows = "".join(f"{s},{d},{t},0\n" for s, d, t in zip(src, dst, np.arange(num_events) * 10))
    path.write_text("u,i,ts,label\n" + rows + extra)
    return path


def peak_bytes(function, *args, **kwargs):
    """``(result, peak bytes numpy and Python allocated)`` of one call."""
    tracemalloc.start()
    try:
        result = function(*args, **kwargs)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_issues_event_with_source_id_ten_to_the_twelfth(tmp_path: Path) -> None:
    """``1000000000000,45,700,0`` crashed chronological_split with a 931 GiB allocation."""
    path = events_csv(tmp_path / "e.csv", extra=f"{BIG},45,4000,0\n")
    events, peak = peak_bytes(load_jodie_csv, path)
    assert peak < PEAK_BYTES and events.num_nodes == 32  # 30 ids in use, 45 and 10**12
    assert events.orig_ids[events.src[-1]] == BIG and events.orig_ids[events.dst[-1]] == 45
    # Order kept: the first 30 ids stay as they were, users still before items.
    np.testing.assert_array_equal(events.orig_ids, np.r_[np.arange(30), 45, BIG])
    split, peak = peak_bytes(chronological_split, events)
    assert peak < PEAK_BYTES and split.sizes["train"] > 0 and split.sizes["test"] > 0


def test_dense_ids_are_used_as_they_are(tmp_path: Path) -> None:
    """Below the limit nothing changes: ids with gaps keep their values and no orig_ids appear."""
    events = load_jodie_csv(events_csv(tmp_path / "e.csv", extra=f"3,{DENSE_ID_LIMIT - 1},4000,0\n"))
    assert events.num_nodes == DENSE_ID_LIMIT and events.orig_ids is None and events.dst[-1] == DENSE_ID_LIMIT - 1
    relabelled = load_jodie_csv(events_csv(tmp_path / "f.csv", extra=f"3,{DENSE_ID_LIMIT},4000,0\n"))
    assert relabelled.num_nodes == 31 and relabelled.orig_ids[relabelled.dst[-1]] == DENSE_ID_LIMIT


def test_sparse_ids_and_large_timestamps_through_split_graph_and_sampler(tmp_path: Path) -> None:
    """Ids spread over 10**15 apart and nanosecond timestamps near 10**18."""
    rng = np.random.default_rng(2)
    src, dst = rng.integers(0, 15, 300) * 10**15, rng.integers(15, 30, 300) * BIG + 7
    t = 10**18 + np.arange(300) * 10**9
    path = tmp_path / "sparse.csv"
    path.write_text("u,i,ts,label\n" + "".join(f"{s},{d},{x},0\n" for s, d, x in zip(src, dst, t)))
    events = load_jodie_csv(path)
    assert events.num_nodes == len(np.unique(np.r_[src, dst])) <= 30
    np.testing.assert_array_equal(events.orig_ids[events.src], src)
    np.testing.assert_array_equal(events.orig_ids[events.dst], dst)
    assert np.all(np.diff(events.t) > 0)  # a second apart: distinct in float64 at 10**18
    split = chronological_split(events)
    graph = TemporalGraph(events.src, events.dst, events.t, events.num_nodes)
    assert graph.indptr.shape == (events.num_nodes + 1,)
    sampled = TemporalNeighborSampler(graph, num_neighbors=5).sample(events.src[-5:], events.t[-5:],
                                                                     np.random.default_rng(0))
    assert (sampled.times[sampled.event_ids >= 0] < events.t[-1]).all() and split.sizes["val"] > 0


def test_split_of_events_built_with_a_huge_node_count_is_o_events() -> None:
    """chronological_split no longer sizes its flags by num_nodes: an API user's stream need not be compact."""
    events = TemporalEvents(src=np.arange(100) % 7, dst=np.full(100, BIG - 1), t=np.arange(100, dtype=np.float64),
                            num_nodes=BIG, name="api")
    split, peak = peak_bytes(chronological_split, events, new_node_fraction=0.5)
    assert peak < PEAK_BYTES and split.sizes["train"] > 0
    src, dst, orig_ids, n = compact_ids(events.src, events.dst)
    assert n == 8 and orig_ids[-1] == BIG - 1 and dst.max() == 7 and src.max() == 6


def test_ids_beyond_two_to_the_53_are_read_exactly(tmp_path: Path) -> None:
    """float64 would merge 2**53 and 2**53 + 1: they stay two nodes."""
    path = tmp_path / "e.csv"
    path.write_text(f"u,i,ts,label\n{2**53},1,0,0\n{2**53 + 1},1,1,0\n{2**63 - 1},2,2,0\n")
    events = load_jodie_csv(path)
    assert events.num_nodes == 5
    assert events.orig_ids.tolist() == [1, 2, 2**53, 2**53 + 1, 2**63 - 1]
    snap = tmp_path / "e.txt"
    snap.write_text(f"# big ids\n{2**53 + 1} {2**53} 5\n{2**53} 3 7  # comment\n")
    events = load_snap_temporal(snap)
    assert events.orig_ids.tolist() == [3, 2**53, 2**53 + 1] and events.t.tolist() == [0, 2]


@pytest.mark.parametrize(("rows", "message"), [
    ("0,1,0,0\n99999999999999999999,45,700,0\n", r"u: line 3 \(event 1\) has node id 99999999999999999999, at or "
                                                 r"beyond 2\*\*53: a file with such ids must write every id as plain "
                                                 r"integer digits below 2\*\*63 \(int64\)"),
    ("0,9223372036854775808,0,0\n", r"i: line 2 \(event 0\) has node id 9223372036854775808, at or beyond 2\*\*53"),
    ("0,1e17,0,0\n", r"i: line 2 \(event 0\) has node id 1e17, at or beyond 2\*\*53"),
])
def test_ids_that_int64_cannot_hold_are_refused(tmp_path: Path, rows: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("u,i,ts,label\n" + rows)
    with pytest.raises(DatasetError, match=rf"^{tmp_path / 'bad.csv'}: {message}"):
        load_jodie_csv(path)


def test_npz_ids_and_declared_node_counts(tmp_path: Path) -> None:
    path = tmp_path / "e.npz"
    np.savez(path, src=np.array([0, 5]), dst=np.array([99_999, 5]), t=np.array([0.0, 1.0]), num_nodes=np.int64(10**5),
             orig_ids=np.arange(10**5) + 7)
    events = load_temporal_npz(path)  # 10**5 declared nodes for 2 events: relabelled, orig_ids composed
    assert events.num_nodes == 3 and events.orig_ids.tolist() == [7, 12, 100_006]
    np.savez(path, src=np.array([0.0, float(2**60)]), dst=np.array([1, 1]), t=np.array([0.0, 1.0]))
    with pytest.raises(DatasetError, match=r"e\.npz: src: event 1 has node id 1152921504606846976 stored as a "
                                           r"float at or beyond 2\*\*53, where floats skip integers; store node ids "
                                           r"as int64"):
        load_temporal_npz(path)
    np.savez(path, src=np.array([0, 2**64 - 1], dtype=np.uint64), dst=np.array([1, 1]), t=np.array([0.0, 1.0]))
    with pytest.raises(DatasetError, match=r"e\.npz: src: event 1 has node id 18446744073709551615, beyond "
                                           r"2\*\*63 - 1"):
        load_temporal_npz(path)


@pytest.mark.parametrize(("edges", "message"), [
    ("0 1\n99999999999999999999 2\n", r"edge 1 has node id 99999999999999999999, beyond the largest id int64 holds"),
    ("src,dst\n0,9223372036854775808\n", r"edge 0 has node id 9223372036854775808, beyond the largest id int64"),
    ("0 1\n1000000000000 2\n", r"edge 1 \(1000000000000 -> 2\) has a node id outside \[0, 5\)"),
])
def test_static_edge_list_refuses_ids_past_its_nodes_without_allocating(tmp_path: Path, edges: str,
                                                                       message: str) -> None:
    """Static ids index the node arrays (N = len(labels)); an id beyond them is refused, not allocated for."""
    np.save(tmp_path / "labels.npy", np.zeros(5, np.int64))
    np.save(tmp_path / "features.npy", np.ones((5, 2), np.float32))
    (tmp_path / "edges.txt").write_text(edges)
    with pytest.raises(DatasetError, match=rf"edges\.txt: edges: {message}"):
        peak_bytes(load_edgelist, tmp_path)


def test_edge_keys_refuse_node_counts_that_overflow_int64() -> None:
    with pytest.raises(ValueError, match=r"num_nodes=3,037,000,500 is too many for one int64 edge key"):
        csc_from_edges(np.array([0]), np.array([1]), MAX_KEYED_NODES + 1)


def test_training_command_on_the_issues_stream(tmp_path: Path) -> None:
    """The real command: exit 0 and a result, where it ended in a 931 GiB allocation."""
    path = events_csv(tmp_path / "e.csv", extra=f"{BIG},45,4000,0\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "train_temporal.py"), "--dataset", "csv",
                           "--data-dir", str(path), "--epochs", "1", "--batch-size", "50", "--memory-dim", "8",
                           "--time-dim", "8", "--embedding-dim", "8", "--out", str(tmp_path / "out"), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["num_nodes"] == 32
