"""Temporal event streams for temporal link prediction (TGN-style), and the TGN chronological split.

A stream is a time-ordered list of events ``(src, dst, t)``, optionally with a feature vector and
a label per event (:class:`TemporalEvents`).  Three file formats are read:

* JODIE/TGN CSV (:func:`load_jodie_csv`): header ``u,i,ts,label[,f0,f1,...]``, one event per line;
* SNAP temporal (:func:`load_snap_temporal`): ``src dst unixtime`` per line, whitespace, no header,
  ``#`` comments; ids are relabelled 0..n-1, times shifted so that the first event is at t = 0;
* npz (:func:`load_temporal_npz`): arrays ``src``, ``dst``, ``t``; optional ``edge_features``,
  ``labels``, ``num_nodes`` (scalar), ``orig_ids``.

:func:`load_temporal` dispatches by name and also knows the bundled copies of Wikipedia and
CollegeMsg (``../shared/datasets/{wikipedia,collegemsg}``).  Every loader refuses bad input with
one :class:`~gnnscale.data.dataset.DatasetError` (a ``ValueError``) of the form
``path: field: problem; fix`` that names the line (text) or event (npz); a missing file raises
``FileNotFoundError`` in the same form.  Events must already be sorted by time: re-sorting
silently would hide a broken export and change which events land in the test period.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from gnnscale.data.dataset import fail

TEMPORAL_NAMES: tuple[str, ...] = ("wikipedia", "collegemsg", "csv", "snap", "npz")
"""Every name :func:`load_temporal` accepts."""

_JODIE_COLUMNS = ("u", "i", "ts", "label")
_JODIE_FIX = ("write the JODIE/TGN layout: a header u,i,ts,label[,f0,f1,...] and then one event per line "
              "(user id, item id offset past the user ids, time, label, edge features)")
_SNAP_FIX = "write one event 'src dst unixtime' per line, whitespace separated, no header ('#' starts a comment)"
_NPZ_KEYS = ("src", "dst", "t", "edge_features", "labels", "num_nodes", "orig_ids")
DENSE_ID_LIMIT = 1 << 16
"""Node ids are used as they are up to ``max(2 * events, DENSE_ID_LIMIT)`` nodes; beyond, the loaders
relabel them compactly (:func:`compact_ids`).  Below the limit the arrays sized by node count are small
(65,536 memory rows of 100 floats: 26 MB) whatever the stream."""
_FLOAT_EXACT = 1 << 53
"""float64 holds every integer up to 2**53; larger ids parsed as floats could merge with a neighbour."""


@dataclass(kw_only=True)
class TemporalEvents:
    """A time-ordered stream of ``num_events`` (E) events between ``num_nodes`` nodes."""

    src: np.ndarray
    """int64 [E]: source node of each event (the user, in bipartite JODIE data)."""
    dst: np.ndarray
    """int64 [E]: destination node of each event (the item)."""
    t: np.ndarray
    """float64 [E]: event times, non-decreasing."""
    edge_features: np.ndarray | None = None
    """float32 [E, F] per-event features, or None."""
    labels: np.ndarray | None = None
    """float32 [E] per-event labels (JODIE's user-state-change label), or None."""
    num_nodes: int
    """Number of nodes; every id in ``src``/``dst`` is in ``[0, num_nodes)``."""
    name: str
    """Short name for logs, e.g. ``"wikipedia"``."""
    orig_ids: np.ndarray | None = None
    """int64 [num_nodes]: the file's id of each node when the loader relabelled ids, else None."""

    def __post_init__(self) -> None:
        n = self.src.shape[0]
        checks = [
            (self.src.dtype == np.int64 and self.src.ndim == 1, f"src must be int64 [E], got {self.src.dtype} "
                                                                 f"{self.src.shape}"),
            (self.dst.dtype == np.int64 and self.dst.shape == (n,), f"dst must be int64 [{n}], got {self.dst.dtype} "
                                                                    f"{self.dst.shape}"),
            (self.t.dtype == np.float64 and self.t.shape == (n,), f"t must be float64 [{n}], got {self.t.dtype} "
                                                                  f"{self.t.shape}"),
            (not np.any(np.diff(self.t) < 0), "event times must be non-decreasing; sort the events by time"),
            (self.edge_features is None or (self.edge_features.dtype == np.float32 and self.edge_features.ndim == 2
                                            and self.edge_features.shape[0] == n), f"edge_features must be float32 [{n}, D]"),
            (self.labels is None or (self.labels.dtype == np.float32 and self.labels.shape == (n,)),
             f"labels must be float32 [{n}]"),
            (not n or min(self.src.min(), self.dst.min()) >= 0, "node ids must be >= 0"),
            (not n or max(self.src.max(), self.dst.max()) < self.num_nodes, f"node ids must be < num_nodes "
                                                                              f"({self.num_nodes})"),
            (self.orig_ids is None or (self.orig_ids.dtype == np.int64 and self.orig_ids.shape == (self.num_nodes,)),
             f"orig_ids must be int64 [{self.num_nodes}]"),
        ]
        for ok, problem in checks:
            if not ok:
                raise ValueError(f"events {self.name!r}: {problem}")

    @property
    def num_events(self) -> int:
        return int(self.src.shape[0])

    @property
    def num_edge_features(self) -> int:
        """F, or 0 without edge features."""
        return 0 if self.edge_features is None else int(self.edge_features.shape[1])

    def subset(self, mask_or_index: np.ndarray) -> TemporalEvents:
        """The events selected by a bool [E] mask or an increasing int index, in the same node id space.

        Raises:
            ValueError: the mask has the wrong length, or the index would put events out of time order.
        """
        selector = np.asarray(mask_or_index)
        if selector.dtype == np.bool_ and selector.shape != (self.num_events,):
            raise ValueError(f"subset of {self.name}: mask has shape {list(selector.shape)}, expected "
                             f"[{self.num_events}]; pass one bool per event")
        if selector.dtype != np.bool_ and not np.issubdtype(selector.dtype, np.integer):
            raise ValueError(f"subset of {self.name}: expected a bool mask or integer indices, got dtype "
                             f"{selector.dtype}; pass np.flatnonzero(mask) or the mask itself")
        t = self.t[selector]
        if np.any(np.diff(t) < 0):
            raise ValueError(f"subset of {self.name}: the index puts events out of time order; "
                             f"pass a bool mask or sorted indices (np.sort(index))")

        def pick(array: np.ndarray | None) -> np.ndarray | None:
            return None if array is None else array[selector]

        return replace(self, src=self.src[selector], dst=self.dst[selector], t=t,
                       edge_features=pick(self.edge_features), labels=pick(self.labels))


# ---------------------------------------------------------------------- loaders
def load_temporal(name: str, path: str | Path) -> TemporalEvents:
    """Load temporal dataset ``name``, one of :data:`TEMPORAL_NAMES` (case-insensitive), from ``path``.

    ``"wikipedia"`` and ``"collegemsg"`` take the dataset folder (holding ``wikipedia.csv`` /
    ``CollegeMsg.txt``; the file itself is accepted too); ``"csv"``, ``"snap"`` and ``"npz"`` take the file.

    Raises:
        ValueError: unknown ``name``, or malformed data (a DatasetError).
        FileNotFoundError: the file or folder does not exist.
    """
    key = name.lower()
    path = Path(path)
    if key == "wikipedia":
        return load_jodie_csv(_file_in_folder(path, "wikipedia.csv", "the JODIE Wikipedia CSV (header u,i,ts,label)"),
                              name="wikipedia")
    if key == "collegemsg":
        return load_snap_temporal(_file_in_folder(path, "CollegeMsg.txt", "SNAP's CollegeMsg.txt (unzipped)"),
                                  name="collegemsg")
    if key == "csv":
        return load_jodie_csv(path)
    if key == "snap":
        return load_snap_temporal(path)
    if key == "npz":
        return load_temporal_npz(path)
    raise ValueError(f"unknown temporal dataset {name!r}; valid names: {', '.join(TEMPORAL_NAMES)}")


def load_jodie_csv(path: str | Path, *, name: str | None = None) -> TemporalEvents:
    """Read a JODIE/TGN CSV: header ``u,i,ts,label[,f0,...]``, then ``u,i,ts,label[,f0,...]`` per event.

    Ids are used as they are (items already offset past users); ``num_nodes`` = max id + 1.
    Columns after ``label`` become ``edge_features`` (the header need not name them, but if it
    names more than four columns every row must have that many fields).  ``name`` defaults to the
    file name without suffix.
    """
    path = _require_file(Path(path), "put a JODIE/TGN CSV there (header u,i,ts,label)")
    source = str(path)
    with open(path, encoding="utf-8-sig") as handle:
        header = handle.readline().rstrip("\r\n")
    if not header.strip():
        raise fail(source, "header", "the file is empty (or its first line is blank)", _JODIE_FIX)
    names = [column.strip().lower() for column in header.split(",")]
    if tuple(names[:4]) != _JODIE_COLUMNS:
        raise fail(source, "header", f"expected a header row starting with u,i,ts,label, got {header[:80]!r}",
                   _JODIE_FIX)
    expected = len(names) if len(names) > 4 else None
    data = _read_table(path, source, delimiter=",", comment=None, header=True, num_fields=expected, min_fields=4,
                       fix=_JODIE_FIX)
    features = data[:, 4:] if data.shape[1] > 4 else None
    rows = _Rows(path, header=True, comment=None)
    src, dst = _exact_ids(data, path, source, rows, delimiter=",", comment=None, header=True, columns=("u", "i"),
                          fix=_JODIE_FIX)
    return _build_events(src, dst, data[:, 2], labels=data[:, 3], edge_features=features, num_nodes=None,
                         source=source, rows=rows, columns=("u", "i", "ts"), name=name or path.stem)


def load_snap_temporal(path: str | Path, *, name: str | None = None) -> TemporalEvents:
    """Read a SNAP temporal network: ``src dst unixtime`` per line, whitespace separated, no header.

    Node ids are relabelled densely to ``0..n-1`` in increasing order of the file's ids (``orig_ids[k]``
    is the file's id of node ``k``), and times are shifted so that the first event is at ``t = 0`` (the
    file must be time-ordered).  ``name`` defaults to the file name without suffix.
    """
    path = _require_file(Path(path), "put a SNAP temporal edge list there ('src dst unixtime' per line)")
    source = str(path)
    data = _read_table(path, source, delimiter=None, comment="#", header=False, num_fields=3, min_fields=3,
                       fix=_SNAP_FIX)
    rows = _Rows(path, header=False, comment="#")
    src, dst = _exact_ids(data, path, source, rows, delimiter=None, comment="#", header=False,
                          columns=("src", "dst"), fix=_SNAP_FIX)
    events = _build_events(src, dst, data[:, 2], labels=None, edge_features=None, num_nodes=None, source=source,
                           rows=rows, columns=("src", "dst", "t"), name=name or path.stem, relabel=True)
    return replace(events, t=events.t - events.t[0])


def load_temporal_npz(path: str | Path, *, name: str | None = None) -> TemporalEvents:
    """Read an ``.npz`` with ``src``, ``dst`` (integer [E]) and ``t`` (float [E], sorted).

    Optional arrays: ``edge_features`` [E, F], ``labels`` [E], ``num_nodes`` (an integer scalar;
    default max id + 1) and ``orig_ids`` (int [num_nodes]).  Read with ``allow_pickle=False``;
    ``name`` defaults to the file name without suffix.
    """
    path = _require_file(Path(path), "save the events there with np.savez(path, src=..., dst=..., t=...)")
    source = str(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError) as err:  # not a zip, or object arrays under allow_pickle=False
        raise fail(source, "file", f"is not a readable .npz of numeric arrays ({err})",
                   "save plain numeric arrays with np.savez (no object dtype)") from None
    missing = [key for key in ("src", "dst", "t") if key not in arrays]
    if missing:
        raise fail(source, missing[0], f"array missing (found {sorted(arrays) or 'none'})",
                   "save the events with np.savez(path, src=..., dst=..., t=...)")
    ignored = sorted(set(arrays) - set(_NPZ_KEYS))
    if ignored:
        warnings.warn(f"{source}: ignoring array(s) {ignored}; a temporal .npz reads only {list(_NPZ_KEYS)}",
                      stacklevel=2)
    if arrays["src"].ndim != 1 or arrays["src"].shape[0] == 0:
        raise fail(source, "src", f"expected a non-empty 1-d array, got shape {list(arrays['src'].shape)}",
                   "store one source node id per event (a file without events cannot be trained on)")
    num_events = arrays["src"].shape[0]
    for key in ("src", "dst", "t", "labels"):
        if key in arrays and arrays[key].shape != (num_events,):
            raise fail(source, key, f"expected shape [{num_events}] (one value per event, like src), "
                       f"got {list(arrays[key].shape)}", "store 1-d arrays of equal length")
    features = arrays.get("edge_features")
    if features is not None and (features.ndim != 2 or features.shape[0] != num_events):
        raise fail(source, "edge_features", f"expected shape [{num_events}, num_edge_features], got "
                   f"{list(features.shape)}", "store one feature row per event")
    num_nodes = None
    if "num_nodes" in arrays:
        value = arrays["num_nodes"]
        if value.size != 1 or not np.issubdtype(value.dtype, np.integer):
            raise fail(source, "num_nodes", f"expected an integer scalar, got {value.dtype} {list(value.shape)}",
                       "save num_nodes=np.int64(n), or leave it out to use max id + 1")
        num_nodes = int(value.reshape(()))
    for key in ("src", "dst", "t", "labels", "edge_features"):
        if key in arrays and not (np.issubdtype(arrays[key].dtype, np.number) or arrays[key].dtype == np.bool_):
            raise fail(source, key, f"expected numbers, got dtype {arrays[key].dtype}", "store numeric arrays")
    return _build_events(arrays["src"], arrays["dst"], arrays["t"], labels=arrays.get("labels"),
                         edge_features=features, num_nodes=num_nodes, source=source, rows=_Rows(None),
                         columns=("src", "dst", "t"), name=name or path.stem, orig_ids=arrays.get("orig_ids"))


# ---------------------------------------------------------------------- TGN split
@dataclass(kw_only=True)
class TemporalSplit:
    """TGN's chronological split of a stream of E events; every mask is bool [E].

    ``train``, ``val`` and ``test`` are disjoint but need not cover every event: events at or
    before ``val_time`` that touch a node of ``new_nodes`` are in none of them (TGN drops them so
    that those nodes stay unseen).  ``val_new_node``/``test_new_node`` are the inductive subsets.
    """

    train: np.ndarray
    """bool [E]: ``t <= val_time`` and neither endpoint in ``new_nodes``."""
    val: np.ndarray
    """bool [E]: ``val_time < t <= test_time`` (all of them, transductive evaluation)."""
    test: np.ndarray
    """bool [E]: ``t > test_time``."""
    val_new_node: np.ndarray
    """bool [E]: ``val`` events with at least one endpoint that no ``train`` event touches."""
    test_new_node: np.ndarray
    """bool [E]: ``test`` events with at least one endpoint that no ``train`` event touches."""
    new_nodes: np.ndarray
    """int64 [K], sorted: the nodes held out of training (drawn among nodes active after ``val_time``)."""
    val_time: float
    """Last time of the training period (a quantile of ``t``)."""
    test_time: float
    """Last time of the validation period."""

    @property
    def sizes(self) -> dict[str, int]:
        """Number of events in each mask, and ``new_nodes`` (the count of held-out nodes)."""
        counts = {key: int(getattr(self, key).sum())
                  for key in ("train", "val", "test", "val_new_node", "test_new_node")}
        return {**counts, "new_nodes": int(self.new_nodes.shape[0])}


def chronological_split(events: TemporalEvents, val_fraction: float = 0.15, test_fraction: float = 0.15,
                        new_node_fraction: float = 0.1, seed: int = 0) -> TemporalSplit:
    """Split a stream by time as TGN does (Rossi et al. 2020, ``utils/data_processing.py:get_data``).

    1. ``val_time``, ``test_time`` = quantiles of ``t`` at ``1 - val_fraction - test_fraction``
       and ``1 - test_fraction`` (0.70 and 0.85 by default; ``np.quantile``, linear).
    2. ``new_nodes``: ``int(new_node_fraction * number of distinct nodes in the stream)`` nodes
       drawn without replacement (``np.random.default_rng(seed)``) among the nodes of events
       after ``val_time``.  As in TGN the count is a fraction of *all* nodes, not of the nodes
       drawn from; it is capped at the number available.
    3. ``train``: events with ``t <= val_time`` touching no new node.
    4. ``val``/``test``: every event in ``(val_time, test_time]`` / after ``test_time``;
       ``val_new_node``/``test_new_node``: those with an endpoint absent from ``train`` events
       (the drawn nodes, and nodes that only appear after ``val_time``).

    Deterministic for a given ``seed``.

    Raises:
        ValueError: a fraction is out of range, or the stream is too short for a non-empty part each.
    """
    if not (0 <= val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):
        raise ValueError(f"val_fraction={val_fraction} and test_fraction={test_fraction}: expected both >= 0 "
                         f"with a sum below 1; pass e.g. 0.15 and 0.15 (TGN's 70/15/15)")
    if not 0 <= new_node_fraction <= 1:
        raise ValueError(f"new_node_fraction={new_node_fraction}: expected a value in [0, 1]; pass e.g. 0.1 "
                         f"(TGN), or 0 for no inductive hold-out")
    if events.num_events == 0:
        raise ValueError(f"cannot split {events.name}: it has no events; load a non-empty stream")
    src, dst, t = events.src, events.dst, events.t
    val_time, test_time = (float(q) for q in np.quantile(t, [1.0 - (val_fraction + test_fraction),
                                                                1.0 - test_fraction]))
    later = t > val_time
    # Per-node flags over the distinct nodes of the stream (O(E)), not over ids up to num_nodes.
    all_nodes, position = np.unique(np.concatenate([src, dst]), return_inverse=True)
    position = position.reshape(-1)
    src_at, dst_at = position[:src.shape[0]], position[src.shape[0]:]
    candidates = np.unique(np.concatenate([src[later], dst[later]]))
    num_new = min(int(new_node_fraction * all_nodes.shape[0]), int(candidates.shape[0]))
    new_nodes = np.sort(np.random.default_rng(seed).choice(candidates, size=num_new, replace=False)).astype(np.int64)

    is_new = np.zeros(all_nodes.shape[0], dtype=bool)
    is_new[np.searchsorted(all_nodes, new_nodes)] = True
    train = ~later & ~is_new[src_at] & ~is_new[dst_at]
    in_train = np.zeros(all_nodes.shape[0], dtype=bool)
    in_train[src_at[train]] = True
    in_train[dst_at[train]] = True
    assert not (in_train & is_new).any(), "a held-out node touches a training event"
    unseen = ~in_train[src_at] | ~in_train[dst_at]
    val = later & (t <= test_time)
    test = t > test_time
    empty = [name for name, mask in (("training", train), ("validation", val), ("test", test)) if not mask.any()]
    if empty:
        raise ValueError(f"{events.name} has {events.num_events} event(s) at {np.unique(t).shape[0]} distinct "
                         f"time(s): too few for a chronological {1 - val_fraction - test_fraction:.0%}/"
                         f"{val_fraction:.0%}/{test_fraction:.0%} split, the {empty[0]} part is empty; give a longer "
                         f"stream")
    return TemporalSplit(train=train, val=val, test=test, val_new_node=val & unseen, test_new_node=test & unseen,
                         new_nodes=new_nodes, val_time=val_time, test_time=test_time)


# ---------------------------------------------------------------------- helpers
class _Rows:
    """Names event ``k`` in messages: ``line N (event k)`` of a text file (found by rescanning the
    file, only on an error), or ``event k``."""

    def __init__(self, path: Path | None, *, header: bool = False, comment: str | None = None) -> None:
        self.path, self.header, self.comment = path, header, comment
        self._lines: list[int] | None = None

    def __call__(self, event: int) -> str:
        if self.path is None:
            return f"event {event}"
        if self._lines is None:
            self._lines = [number for number, _ in _data_lines(self.path, self.header, self.comment)]
        return f"line {self._lines[event]} (event {event})"


def _data_lines(path: Path, header: bool, comment: str | None) -> Iterator[tuple[int, str]]:
    """Yield ``(1-based line number, content)`` of the lines np.loadtxt reads as rows."""
    with open(path, encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, start=1):
            if header and number == 1:
                continue
            content = line.rstrip("\r\n")
            if comment is not None:
                content = content.split(comment, 1)[0].strip()
            if content:
                yield number, content


def _read_table(path: Path, source: str, *, delimiter: str | None, comment: str | None, header: bool,
                num_fields: int | None, min_fields: int, fix: str) -> np.ndarray:
    """float64 [E, C] via np.loadtxt (C speed); on any problem, rescan to name the first bad line."""
    numpy_message = "unknown reason"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "input contained no data": reported below
        try:
            data = np.loadtxt(path, dtype=np.float64, delimiter=delimiter, comments=comment,
                              skiprows=1 if header else 0, ndmin=2, encoding="utf-8-sig")
        except ValueError as err:
            data, numpy_message = None, str(err)
    if data is not None and data.shape[0] == 0:
        raise fail(source, "events", "no events in the file" + (" (only a header)" if header else ""), fix)
    if data is not None and data.shape[1] >= min_fields and num_fields in (None, data.shape[1]):
        return data
    expected = num_fields
    for number, content in _data_lines(path, header, comment):
        fields = content.split(delimiter)
        if expected is None:
            expected = max(len(fields), min_fields)
        if len(fields) != expected:
            raise fail(source, "columns", f"line {number} has {len(fields)} field(s), expected {expected}", fix)
        for position, field in enumerate(fields):
            try:
                float(field)
            except ValueError:
                raise fail(source, "columns", f"line {number} field {position + 1} is not a number: {field.strip()!r}",
                           fix) from None
    raise fail(source, "columns", f"cannot be parsed ({numpy_message})", fix)  # numpy refused a line float() accepts


def _build_events(src: np.ndarray, dst: np.ndarray, t: np.ndarray, *, labels: np.ndarray | None,
                  edge_features: np.ndarray | None, num_nodes: int | None, source: str, rows: _Rows,
                  columns: tuple[str, str, str], name: str, orig_ids: np.ndarray | None = None,
                  relabel: bool = False) -> TemporalEvents:
    """Check ids, times, labels and features of raw columns; build the events (``num_nodes`` default max id + 1).

    The ids are relabelled compactly (:func:`compact_ids`, ``orig_ids`` keeping the file's) when ``relabel``
    is set, or when ``num_nodes`` exceeds both ``2 * E`` (the most ids E events can use) and
    :data:`DENSE_ID_LIMIT`: every array the trainer sizes by node count then stays O(E).
    """
    src = _check_ids(src, columns[0], source, rows)
    dst = _check_ids(dst, columns[1], source, rows)
    t = np.asarray(t, dtype=np.float64)
    time_name = columns[2]
    bad = np.flatnonzero(~np.isfinite(t))
    if bad.size:
        raise fail(source, time_name, f"{rows(int(bad[0]))} has time {_show(t[bad[0]])} (NaN or infinite)",
                   "give every event a finite timestamp")
    bad = np.flatnonzero(t < 0)
    if bad.size:
        raise fail(source, time_name, f"{rows(int(bad[0]))} has negative time {_show(t[bad[0]])}",
                   "times must be >= 0 (e.g. seconds since the first event or since the Unix epoch)")
    bad = np.flatnonzero(np.diff(t) < 0)
    if bad.size:
        k = int(bad[0]) + 1
        raise fail(source, time_name, f"{rows(k)} goes back in time ({_show(t[k])} after {_show(t[k - 1])}; "
                   f"{bad.size} such decrease(s))", "sort the events by time (a stable sort keeps ties in order)")
    max_id = int(max(src.max(), dst.max())) if src.size else -1
    if num_nodes is None:
        num_nodes = max_id + 1
    elif max_id >= num_nodes:
        k = int(np.flatnonzero((src >= num_nodes) | (dst >= num_nodes))[0])
        raise fail(source, "num_nodes", f"{rows(k)} ({src[k]} -> {dst[k]}) has a node id outside [0, {num_nodes})",
                   f"store num_nodes >= max id + 1 = {max_id + 1}, or leave num_nodes out")
    if orig_ids is not None and (orig_ids.shape != (num_nodes,) or not np.issubdtype(orig_ids.dtype, np.integer)):
        raise fail(source, "orig_ids", f"expected integers of shape [{num_nodes}], got {orig_ids.dtype} "
                   f"{list(orig_ids.shape)}", "store one original id per node, or leave it out")
    if labels is not None:
        labels = _check_finite(labels, "labels", source, rows).astype(np.float32)
    if edge_features is not None:
        edge_features = _check_finite(edge_features, "edge_features", source, rows).astype(np.float32)
    if relabel or num_nodes > max(2 * src.shape[0], DENSE_ID_LIMIT):
        src, dst, orig_ids, num_nodes = compact_ids(src, dst, orig_ids)
    return TemporalEvents(src=src, dst=dst, t=t, edge_features=edge_features, labels=labels, num_nodes=num_nodes,
                          name=name, orig_ids=None if orig_ids is None else orig_ids.astype(np.int64))


def compact_ids(src: np.ndarray, dst: np.ndarray,
                orig_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Relabel the node ids of ``src``/``dst`` (int64 [E]) to ``0..n-1`` in increasing order of id, in
    O(E log E) time and O(E) memory whatever the ids' values.

    Args:
        orig_ids: int [N], the original id of each current id, to compose with (None: the ids are original).

    Returns:
        ``(src, dst, orig_ids, n)``: the new ids (int64 [E] each), int64 [n] the original id of each new
        one, and n, the number of distinct ids.
    """
    num_events = src.shape[0]
    distinct, dense = np.unique(np.concatenate([src, dst]), return_inverse=True)
    dense = dense.reshape(-1).astype(np.int64)
    original = distinct if orig_ids is None else np.asarray(orig_ids)[distinct]
    return dense[:num_events], dense[num_events:], original.astype(np.int64), int(distinct.shape[0])


def _exact_ids(data: np.ndarray, path: Path, source: str, rows: Callable[[int], str], *, delimiter: str | None,
               comment: str | None, header: bool, columns: tuple[str, str], fix: str) -> tuple[np.ndarray, np.ndarray]:
    """The id columns of a text file: ``data``'s first two (float64 [E], as np.loadtxt parsed them), or, where
    an id reaches 2**53 and float64 may have merged it with a neighbour, both columns re-read as int64.

    Raises:
        DatasetError: an id of 2**53 or more that is not a plain integer below 2**63 (the most int64 holds).
    """
    ids = data[:, :2]
    large = np.abs(ids) >= _FLOAT_EXACT  # NaN compares False: reported later as a non-integer id
    if not large.any():
        return data[:, 0], data[:, 1]
    try:
        # Python's int() per field: numpy's own integer parser falls back to float (and wraps) past int64.
        exact = np.loadtxt(path, dtype=np.int64, delimiter=delimiter, comments=comment, usecols=(0, 1),
                           converters=int, skiprows=1 if header else 0, ndmin=2, encoding="utf-8-sig")
    except (ValueError, OverflowError):
        event, column = (int(i) for i in np.argwhere(large)[np.argmax(np.abs(ids[large]))])
        line = next(content for k, (_, content) in enumerate(_data_lines(path, header, comment)) if k == event)
        written = line.split(delimiter)[column].strip()
        raise fail(source, columns[column], f"{rows(event)} has node id {written}, at or beyond "
                   f"2**53: a file with such ids must write every id as plain integer digits below 2**63 (int64), "
                   f"which are read exactly", "write the ids as integers below 9223372036854775808, or relabel "
                   "them") from None
    return exact[:, 0], exact[:, 1]


def _check_ids(ids: np.ndarray, column: str, source: str, rows: Callable[[int], str]) -> np.ndarray:
    """int64 [E] node ids; whole-number floats ("3.0") below 2**53 are accepted, anything else names the first
    bad event."""
    if np.issubdtype(ids.dtype, np.floating):
        bad = np.flatnonzero(~(np.isfinite(ids) & (ids == np.round(ids))))
        if bad.size:
            raise fail(source, column, f"{rows(int(bad[0]))} has a non-integer node id {_show(ids[bad[0]])}",
                       "node ids must be whole numbers >= 0")
        bad = np.flatnonzero(np.abs(ids) >= _FLOAT_EXACT)
        if bad.size:
            raise fail(source, column, f"{rows(int(bad[0]))} has node id {_show(ids[bad[0]])} stored as a float at "
                       f"or beyond 2**53, where floats skip integers", "store node ids as int64")
    elif not np.issubdtype(ids.dtype, np.integer):
        raise fail(source, column, f"expected integer node ids, got dtype {ids.dtype}", "store node ids as integers")
    elif ids.dtype == np.uint64 and ids.size and ids.max() > np.iinfo(np.int64).max:
        event = int(np.argmax(ids > np.iinfo(np.int64).max))
        raise fail(source, column, f"{rows(event)} has node id {int(ids[event])}, beyond 2**63 - 1 (int64)",
                   "relabel the ids below 2**63")
    bad = np.flatnonzero(ids < 0)
    if bad.size:
        raise fail(source, column, f"{rows(int(bad[0]))} has a negative node id {_show(ids[bad[0]])}",
                   "node ids must be >= 0")
    return ids.astype(np.int64)


def _check_finite(values: np.ndarray, field_name: str, source: str, rows: Callable[[int], str]) -> np.ndarray:
    finite = np.isfinite(values.astype(np.float64, copy=False))
    if not finite.all():
        event = int(np.flatnonzero(~finite.reshape(finite.shape[0], -1).all(axis=1))[0])
        raise fail(source, field_name, f"{rows(event)} has a NaN or infinite value", "clean the data before loading")
    return values


def _show(value: float | int) -> str:
    """A number as the file wrote it: ``1082040961`` rather than ``1.08204e+09``, ``2.5``, ``nan``."""
    value = float(value)
    return str(int(value)) if np.isfinite(value) and value == round(value) else repr(value)


def _require_file(path: Path, fix: str) -> Path:
    if path.is_dir():
        raise FileNotFoundError(f"{path}: file: is a folder, expected a file; {fix}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file: not found; {fix}")
    return path


def _file_in_folder(path: Path, file_name: str, what: str) -> Path:
    """``path/file_name`` of a dataset folder (or ``path`` itself when it is a file)."""
    if path.is_file():
        return path
    bundled = f"../shared/datasets/{Path(file_name).stem.lower()}"
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: folder: not found; pass the folder that holds {file_name} "
                                f"(the bundled copy: {bundled})")
    file = path / file_name
    if not file.is_file():
        raise FileNotFoundError(f"{file}: file: not found; put {what} there (the bundled copy: {bundled})")
    return file
