"""Temporal event streams: the real Wikipedia/CollegeMsg files, every refused input, and TGN's split."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from gnnscale.data.dataset import DatasetError
from gnnscale.data.temporal import (TemporalEvents, chronological_split, load_jodie_csv, load_snap_temporal,
                                    load_temporal, load_temporal_npz)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def random_stream(num_events: int = 300, num_nodes: int = 40, seed: int = 1) -> TemporalEvents:
    """Integer times with ties (so quantile cut points can land on an event time)."""
    rng = np.random.default_rng(seed)
    return TemporalEvents(src=rng.integers(0, num_nodes, num_events), dst=rng.integers(0, num_nodes, num_events),
                          t=np.sort(rng.integers(0, num_events // 3, num_events)).astype(np.float64),
                          num_nodes=num_nodes, name="random")


# ---------------------------------------------------------------------- real datasets
def test_wikipedia_real(dataset_dir: Callable[[str], Path]) -> None:
    events = load_temporal("wikipedia", dataset_dir("wikipedia"))
    assert (events.name, events.num_events, events.num_nodes) == ("wikipedia", 157_474, 9_227)
    assert (events.src.dtype, events.dst.dtype, events.t.dtype) == (np.int64, np.int64, np.float64)
    assert events.labels is not None and events.labels.dtype == np.float32
    assert set(np.unique(events.labels)) == {0.0, 1.0}
    assert events.edge_features is None and events.num_edge_features == 0 and events.orig_ids is None
    assert np.all(np.diff(events.t) >= 0) and events.t[0] == 0
    # Bipartite, items offset past users: users 0..8226, items 8227..9226, every id used.
    assert events.src.max() == 8226 and events.dst.min() == 8227 and events.dst.max() == 9226
    assert np.unique(np.concatenate([events.src, events.dst])).shape[0] == 9_227


def test_collegemsg_real(dataset_dir: Callable[[str], Path]) -> None:
    events = load_temporal("collegemsg", dataset_dir("collegemsg"))
    assert (events.name, events.num_events, events.num_nodes) == ("collegemsg", 59_835, 1_899)
    assert (events.src.dtype, events.dst.dtype, events.t.dtype) == (np.int64, np.int64, np.float64)
    assert events.labels is None and events.edge_features is None
    np.testing.assert_array_equal(events.orig_ids, np.arange(1, 1_900))  # file ids 1..1899 -> 0..1898
    assert events.t[0] == 0 and np.all(np.diff(events.t) >= 0)
    assert (events.src[0], events.dst[0], events.t[1]) == (0, 1, 1082155839 - 1082040961)  # lines 1-2 of the file


def test_wikipedia_split_is_70_15_15(dataset_dir: Callable[[str], Path]) -> None:
    events = load_temporal("wikipedia", dataset_dir("wikipedia"))
    split = chronological_split(events)
    sizes = split.sizes
    dropped = int(((events.t <= split.val_time) & ~split.train).sum())
    assert (sizes["train"] + dropped) / events.num_events == pytest.approx(0.70, abs=0.005)
    assert sizes["val"] / events.num_events == pytest.approx(0.15, abs=0.005)
    assert sizes["test"] / events.num_events == pytest.approx(0.15, abs=0.005)
    assert sizes["new_nodes"] == int(0.1 * 9_227)
    assert 0 < sizes["val_new_node"] < sizes["val"] and 0 < sizes["test_new_node"] < sizes["test"]
    assert not np.isin(events.src[split.train], split.new_nodes).any()
    assert not np.isin(events.dst[split.train], split.new_nodes).any()


# ---------------------------------------------------------------------- formats that load
def test_jodie_csv_with_features_and_crlf(tmp_path: Path) -> None:
    text = "u,i,ts,label,f0,f1\r\n0,3,0,0,0.5,1\r\n1,4,2.5,1,-1,2\r\n\r\n0,4,2.5,0,0,0\r\n"
    path = write(tmp_path / "stream.csv", text)
    events = load_jodie_csv(path)
    assert (events.name, events.num_events, events.num_nodes, events.num_edge_features) == ("stream", 3, 5, 2)
    np.testing.assert_array_equal(events.dst, [3, 4, 4])
    np.testing.assert_array_equal(events.t, [0, 2.5, 2.5])
    np.testing.assert_array_equal(events.labels, np.array([0, 1, 0], dtype=np.float32))
    assert events.edge_features.dtype == np.float32 and events.edge_features[1].tolist() == [-1, 2]
    # Unnamed feature columns are fine when the header names just the first four.
    assert load_jodie_csv(write(tmp_path / "b.csv", "u,i,ts,label\n0,1,0,0,7,8,9\n")).num_edge_features == 3


def test_snap_relabels_ids_and_shifts_times(tmp_path: Path) -> None:
    path = write(tmp_path / "msgs.txt", "# SNAP header\n10 30 1000\n30\t20 1005\n\n10 20 1005  # trailing\n")
    events = load_snap_temporal(path)
    np.testing.assert_array_equal(events.orig_ids, [10, 20, 30])
    np.testing.assert_array_equal(events.src, [0, 2, 0])
    np.testing.assert_array_equal(events.dst, [2, 1, 1])
    np.testing.assert_array_equal(events.t, [0, 5, 5])
    assert events.num_nodes == 3 and events.labels is None


def test_npz_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "events.npz"
    np.savez(path, src=np.array([0, 2]), dst=np.array([1, 1]), t=np.array([1.0, 4.0]), labels=np.array([0, 1]),
             edge_features=np.ones((2, 3)), num_nodes=np.int64(5), orig_ids=np.arange(5) + 100)
    events = load_temporal("npz", path)
    assert (events.num_events, events.num_nodes, events.num_edge_features) == (2, 5, 3)
    assert events.edge_features.dtype == np.float32 and events.labels.dtype == np.float32
    np.testing.assert_array_equal(events.orig_ids, np.arange(100, 105))
    np.savez(path, src=np.array([0]), dst=np.array([1]), t=np.array([0.0]), weight=np.array([2.0]))
    with pytest.warns(UserWarning, match=r"events\.npz: ignoring array\(s\) \['weight'\]"):
        assert load_temporal_npz(path).num_nodes == 2


def test_load_temporal_dispatch(tmp_path: Path) -> None:
    folder = tmp_path / "wiki"
    folder.mkdir()
    write(folder / "wikipedia.csv", "u,i,ts,label\n0,1,0,0\n")
    assert load_temporal("Wikipedia", folder).name == "wikipedia"
    assert load_temporal("csv", folder / "wikipedia.csv").name == "wikipedia"
    snap = write(tmp_path / "CollegeMsg.txt", "1 2 5\n")
    assert load_temporal("collegemsg", tmp_path).num_events == 1
    assert load_temporal("snap", snap).orig_ids.tolist() == [1, 2]


def test_subset(tmp_path: Path) -> None:
    events = load_jodie_csv(write(tmp_path / "s.csv", "u,i,ts,label,f\n0,3,0,0,1\n1,4,1,1,2\n2,5,2,0,3\n"))
    part = events.subset(events.t >= 1)
    assert part.num_events == 2 and part.num_nodes == 6
    np.testing.assert_array_equal(part.edge_features[:, 0], [2, 3])
    np.testing.assert_array_equal(events.subset(np.array([0, 2])).src, [0, 2])
    with pytest.raises(ValueError, match=r"subset of s: the index puts events out of time order; pass .*np\.sort"):
        events.subset(np.array([2, 0]))
    with pytest.raises(ValueError, match=r"subset of s: mask has shape \[2\], expected \[3\]"):
        events.subset(np.array([True, False]))


def test_events_assert_internal_invariants() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        TemporalEvents(src=np.zeros(2, np.int64), dst=np.ones(2, np.int64), t=np.array([1.0, 0.0]), num_nodes=2,
                       name="x")


# ---------------------------------------------------------------------- refused input
def test_unknown_name_lists_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown temporal dataset 'reddit'; valid names: wikipedia, collegemsg, "
                                         r"csv, snap, npz"):
        load_temporal("reddit", "/nowhere")


def test_missing_files_and_folders(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.csv: file: not found; put a JODIE/TGN CSV there"):
        load_temporal("csv", tmp_path / "nope.csv")
    with pytest.raises(FileNotFoundError, match=r"x\.txt: file: not found; put a SNAP temporal edge list there"):
        load_snap_temporal(tmp_path / "x.txt")
    with pytest.raises(FileNotFoundError, match=r"x\.npz: file: not found; save the events there with np\.savez"):
        load_temporal_npz(tmp_path / "x.npz")
    with pytest.raises(FileNotFoundError, match=r"file: is a folder, expected a file"):
        load_temporal("npz", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"missing: folder: not found; pass the folder that holds wikipedia"
                                                r"\.csv \(the bundled copy: \.\./shared/datasets/wikipedia\)"):
        load_temporal("wikipedia", tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"CollegeMsg\.txt: file: not found; put SNAP's CollegeMsg\.txt"):
        load_temporal("collegemsg", tmp_path)


@pytest.mark.parametrize(("text", "message"), [
    ("", r"header: the file is empty"),
    ("u,i,ts,label\n", r"events: no events in the file \(only a header\)"),
    ("0,1,0,0\n1,2,3,0\n", r"header: expected a header row starting with u,i,ts,label, got '0,1,0,0'; write the"),
    (",u,i,ts,label,idx\n", r"header: expected a header row starting with u,i,ts,label, got ',u,i,ts,label,idx'"),
    ("u,i,ts,label\n0,1,0,0\n1,2,3\n", r"columns: line 3 has 3 field\(s\), expected 4"),
    ("u,i,ts\n0,1,0\n", r"header: expected a header row starting with u,i,ts,label"),
    ("u,i,ts,label\n0,1,0\n", r"columns: line 2 has 3 field\(s\), expected 4"),
    ("u,i,ts,label,f0,f1\n0,1,0,0,1\n", r"columns: line 2 has 5 field\(s\), expected 6"),
    ("u,i,ts,label\n0,1,0,0\n0,x,1,0\n", r"columns: line 3 field 2 is not a number: 'x'"),
])
def test_csv_bad_layout(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DatasetError, match=rf"bad\.csv: {message}"):
        load_jodie_csv(write(tmp_path / "bad.csv", text))


@pytest.mark.parametrize(("rows", "message"), [
    ("0,1,0,0\n1,2,5,0\n\n2,3,4,0\n1,2,3,0\n",
     r"ts: line 5 \(event 2\) goes back in time \(4 after 5; 2 such decrease\(s\)\); sort the events by time"),
    ("0,1,0,0\n1,2,-3,0\n", r"ts: line 3 \(event 1\) has negative time -3; times must be >= 0"),
    ("0,1,0,0\n1,2,nan,0\n", r"ts: line 3 \(event 1\) has time nan \(NaN or infinite\); give every event a finite"),
    ("0,1,0,0\n-1,2,1,0\n", r"u: line 3 \(event 1\) has a negative node id -1; node ids must be >= 0"),
    ("0,1,0,0\n1,2.5,1,0\n", r"i: line 3 \(event 1\) has a non-integer node id 2\.5; node ids must be whole numbers"),
    ("0,1,0,nan\n", r"labels: line 2 \(event 0\) has a NaN or infinite value"),
])
def test_csv_bad_values(tmp_path: Path, rows: str, message: str) -> None:
    with pytest.raises(DatasetError, match=rf"bad\.csv: {message}"):
        load_jodie_csv(write(tmp_path / "bad.csv", "u,i,ts,label\n" + rows))


@pytest.mark.parametrize(("text", "message"), [
    ("# only a comment\n\n", r"events: no events in the file; write one event"),
    ("1 2 100\n2 3 100 7\n", r"columns: line 2 has 4 field\(s\), expected 3; write one event 'src dst unixtime'"),
    ("1 2 100 7\n", r"columns: line 1 has 4 field\(s\), expected 3"),
    ("1,2,100\n", r"columns: line 1 has 1 field\(s\), expected 3"),
    ("# c\n1 2 1082040961\n2 3 1082040900\n",
     r"t: line 3 \(event 1\) goes back in time \(1082040900 after 1082040961; 1 such decrease\(s\)\); sort"),
    ("1 2 100\n2 3.5 200\n", r"dst: line 2 \(event 1\) has a non-integer node id 3\.5"),
])
def test_snap_bad_input(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DatasetError, match=rf"bad\.txt: {message}"):
        load_snap_temporal(write(tmp_path / "bad.txt", text))


def test_npz_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    src, dst, t = np.array([0, 1, 2]), np.array([1, 2, 3]), np.array([0.0, 1.0, 2.0])

    def refused(message: str, **arrays: np.ndarray) -> None:
        np.savez(path, **arrays)
        with pytest.raises(DatasetError, match=rf"bad\.npz: {message}"):
            load_temporal_npz(path)

    refused(r"t: array missing \(found \['dst', 'src'\]\)", src=src, dst=dst)
    refused(r"src: expected a non-empty 1-d array, got shape \[0\]", src=src[:0], dst=dst[:0], t=t[:0])
    refused(r"dst: expected shape \[3\] \(one value per event, like src\), got \[2\]", src=src, dst=dst[:2], t=t)
    refused(r"edge_features: expected shape \[3, num_edge_features\], got \[3\]", src=src, dst=dst, t=t,
            edge_features=t)
    refused(r"num_nodes: event 2 \(2 -> 3\) has a node id outside \[0, 3\); store num_nodes >= max id \+ 1 = 4",
            src=src, dst=dst, t=t, num_nodes=np.int64(3))
    refused(r"num_nodes: expected an integer scalar, got int64 \[2\]", src=src, dst=dst, t=t,
            num_nodes=np.array([4, 4]))
    refused(r"t: event 2 goes back in time \(0\.5 after 1; 1 such decrease\(s\)\); sort the events by time",
            src=src, dst=dst, t=np.array([0.0, 1.0, 0.5]))
    refused(r"t: event 2 has time nan \(NaN or infinite\)", src=src, dst=dst, t=np.array([0.0, 1.0, np.nan]))
    refused(r"src: event 0 has a negative node id -1", src=src - 1, dst=dst, t=t)
    refused(r"src: expected integer node ids, got dtype bool", src=src > 0, dst=dst, t=t)
    np.savez(path, src=np.array([{"a": 1}] * 3, dtype=object), dst=dst, t=t)
    with pytest.raises(DatasetError, match=r"bad\.npz: file: is not a readable \.npz of numeric arrays"):
        load_temporal_npz(path)
    write(path, "not a zip")
    with pytest.raises(DatasetError, match=r"bad\.npz: file: is not a readable \.npz"):
        load_temporal_npz(path)


# ---------------------------------------------------------------------- TGN split
def test_split_cut_points_and_partition() -> None:
    events = random_stream()
    split = chronological_split(events, seed=3)
    assert (split.val_time, split.test_time) == tuple(np.quantile(events.t, [0.70, 0.85]))
    t = events.t
    touches_new = np.isin(events.src, split.new_nodes) | np.isin(events.dst, split.new_nodes)
    np.testing.assert_array_equal(split.train, (t <= split.val_time) & ~touches_new)
    np.testing.assert_array_equal(split.val, (t > split.val_time) & (t <= split.test_time))
    np.testing.assert_array_equal(split.test, t > split.test_time)
    # train, val, test and the dropped (pre-val_time, touching a new node) events partition the stream.
    dropped = (t <= split.val_time) & touches_new
    parts = np.stack([split.train, split.val, split.test, dropped]).astype(int)
    assert (parts.sum(axis=0) == 1).all() and dropped.any()
    assert split.new_nodes.dtype == np.int64 and np.all(np.diff(split.new_nodes) > 0)


def test_split_new_nodes_brute_force() -> None:
    events = random_stream(num_events=400, num_nodes=60, seed=7)
    split = chronological_split(events, new_node_fraction=0.2, seed=11)
    later = {int(n) for s, d, t in zip(events.src, events.dst, events.t) if t > split.val_time for n in (s, d)}
    all_nodes = set(events.src.tolist()) | set(events.dst.tolist())
    assert len(split.new_nodes) == int(0.2 * len(all_nodes)) and set(split.new_nodes.tolist()) <= later
    train_nodes = {int(n) for k in np.flatnonzero(split.train) for n in (events.src[k], events.dst[k])}
    assert not train_nodes & set(split.new_nodes.tolist())
    for k in range(events.num_events):
        unseen = events.src[k] not in train_nodes or events.dst[k] not in train_nodes
        assert split.val_new_node[k] == (split.val[k] and unseen)
        assert split.test_new_node[k] == (split.test[k] and unseen)
    assert split.val_new_node.any() and split.test_new_node.any()


def test_split_determinism_and_no_holdout() -> None:
    events = random_stream()
    first, again, other = (chronological_split(events, seed=seed) for seed in (5, 5, 6))
    for key in ("train", "val", "test", "val_new_node", "test_new_node", "new_nodes"):
        np.testing.assert_array_equal(getattr(first, key), getattr(again, key))
    assert not np.array_equal(first.new_nodes, other.new_nodes)
    plain = chronological_split(events, new_node_fraction=0.0)
    assert plain.new_nodes.size == 0
    np.testing.assert_array_equal(plain.train, events.t <= plain.val_time)


def test_split_caps_new_nodes_at_candidates() -> None:
    # Node 2 is the only node active after val_time (= 0.3); a fraction of 1 cannot hold out more than it.
    events = TemporalEvents(src=np.array([0] * 14 + [2] * 6), dst=np.array([1] * 14 + [2] * 6),
                            t=np.array([0.0] * 14 + [1.0] * 3 + [2.0] * 3), num_nodes=3, name="tiny")
    split = chronological_split(events, new_node_fraction=1.0)
    assert split.new_nodes.tolist() == [2] and split.test_new_node[-1]


def test_split_bad_arguments() -> None:
    events = random_stream()
    with pytest.raises(ValueError, match=r"val_fraction=0\.5 and test_fraction=0\.5: expected both >= 0 with a sum "
                                         r"below 1"):
        chronological_split(events, val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(ValueError, match=r"new_node_fraction=1\.5: expected a value in \[0, 1\]"):
        chronological_split(events, new_node_fraction=1.5)
    with pytest.raises(ValueError, match=r"cannot split random: it has no events"):
        chronological_split(events.subset(np.zeros(events.num_events, dtype=bool)))


def test_split_refuses_a_stream_too_short_for_three_parts() -> None:
    events = TemporalEvents(src=np.array([0] * 9 + [2]), dst=np.array([1] * 9 + [2]),
                            t=np.array([0.0] * 9 + [1.0]), num_nodes=3, name="tiny")
    with pytest.raises(ValueError, match=r"tiny has 10 event\(s\) at 2 distinct time\(s\): too few for a chronological "
                                         r"70%/15%/15% split, the validation part is empty; give a longer stream"):
        chronological_split(events)
