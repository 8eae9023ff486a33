"""The in-memory node-classification dataset every loader returns.

The graph is stored as CSC (compressed sparse column): for destination node ``v``, its in-neighbours are
``indices[indptr[v]:indptr[v + 1]]``.  Message passing pulls from in-neighbours, so CSC is the layout
samplers and layers want.  Undirected graphs store both directions.

Arrays are numpy so that partitions can later be memory-mapped; convert with
``torch.from_numpy`` (zero-copy) where tensors are needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from gnnscale.data.pages import release_rows, row_chunks

Metric = Literal["accuracy", "roc_auc"]


class DatasetError(ValueError):
    """Bad or unreadable input data.  The message names the file, the field and the fix."""


def fail(source: str, field_name: str, problem: str, fix: str) -> DatasetError:
    """Build a one-line :class:`DatasetError` of the form ``source: field: problem; fix``."""
    return DatasetError(f"{source}: {field_name}: {problem}; {fix}")


@dataclass(kw_only=True)
class GraphDataset:
    """A graph with node features, labels and one or more train/val/test splits."""

    name: str
    """Short name, e.g. ``"cora"``; used in logs and ``metrics.json``."""
    indptr: np.ndarray
    """int64 [num_nodes + 1]: CSC offsets over destination nodes."""
    indices: np.ndarray
    """int64 [num_edges]: source node of each in-edge, grouped by destination."""
    features: np.ndarray
    """float32 [num_nodes, num_features]."""
    labels: np.ndarray
    """int64 [num_nodes]: class ids in ``[0, num_classes)``."""
    train_masks: np.ndarray
    """bool [num_splits, num_nodes]."""
    val_masks: np.ndarray
    """bool [num_splits, num_nodes]."""
    test_masks: np.ndarray
    """bool [num_splits, num_nodes]."""
    num_classes: int
    """Number of label classes."""
    metric: Metric = "accuracy"
    """``"accuracy"``, or ``"roc_auc"`` for binary imbalanced tasks."""
    edge_features: np.ndarray | None = None
    """float32 [num_edges, D] or None: the features of edge ``i`` of ``indices`` (CSC order)."""
    source: str = "<memory>"
    """Where the data came from (a path); named in error messages."""
    extra: dict = field(default_factory=dict)
    """Loader-specific facts (e.g. original node ids), never needed for training."""

    def __post_init__(self) -> None:
        self.indptr = np.ascontiguousarray(self.indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(self.indices, dtype=np.int64)
        self.features = np.ascontiguousarray(self.features, dtype=np.float32)
        self.labels = np.ascontiguousarray(self.labels, dtype=np.int64)
        self.train_masks = _as_split_masks(self.train_masks)
        self.val_masks = _as_split_masks(self.val_masks)
        self.test_masks = _as_split_masks(self.test_masks)
        self.validate()

    # ------------------------------------------------------------------ shape facts
    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        """Number of directed (stored) edges."""
        return int(self.indices.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.features.shape[1])

    @property
    def num_splits(self) -> int:
        return int(self.train_masks.shape[0])

    def in_degrees(self) -> np.ndarray:
        """int64 [num_nodes]: number of stored in-edges of each node."""
        return np.diff(self.indptr)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """COO view ``(src, dst)``, both int64 [num_edges], grouped by ``dst``."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.in_degrees())
        return self.indices, dst

    def split(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ``(train, val, test)`` bool masks of split ``index``."""
        if not 0 <= index < self.num_splits:
            raise ValueError(f"split {index} does not exist: {self.name} has {self.num_splits} split(s); "
                             f"pass --split between 0 and {self.num_splits - 1}")
        return self.train_masks[index], self.val_masks[index], self.test_masks[index]

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check shapes, id ranges, NaNs and label ranges; raise :class:`DatasetError`."""
        src = self.source
        n = self.num_nodes
        if self.indptr.ndim != 1 or n < 1:
            raise fail(src, "indptr", f"expected a 1-d offsets array of length num_nodes + 1, got shape {self.indptr.shape}",
                       "rebuild the graph structure from an edge list")
        if self.indptr[0] != 0 or self.indptr[-1] != self.indices.shape[0] or np.any(np.diff(self.indptr) < 0):
            raise fail(src, "indptr", "offsets are not non-decreasing from 0 to num_edges",
                       "rebuild the graph structure from an edge list")
        low, high = _min_max(self.indices)
        if self.indices.size and (low < 0 or high >= n):
            bad = high if high >= n else low
            raise fail(src, "edges", f"node id {bad} is out of range [0, {n})",
                       "check the edge list against the number of nodes (ids must be 0-based)")
        check_features(self.features, n, src)
        if self.edge_features is not None:
            self.edge_features = check_features(np.asarray(self.edge_features), self.indices.shape[0], src,
                                                "edge_features")
        if self.num_classes < 1:
            raise fail(src, "labels", f"num_classes must be >= 1, got {self.num_classes}", "check the label file")
        if self.metric == "multilabel_roc_auc":
            check_multilabels(self.labels, n, src, self.num_classes)
        else:
            check_labels(self.labels, n, src, self.num_classes)
        for name, masks in (("train_mask", self.train_masks), ("val_mask", self.val_masks), ("test_mask", self.test_masks)):
            if masks.shape[1] != n:
                raise fail(src, name, f"expected {n} entries per split, got {masks.shape[1]}", "give one mask entry per node")
            if masks.shape[0] != self.train_masks.shape[0]:
                raise fail(src, name, f"has {masks.shape[0]} splits but train_mask has {self.train_masks.shape[0]}",
                           "give the same number of train, val and test splits")
        if not self.train_masks.any(axis=1).all():
            raise fail(src, "train_mask", "a split has no training nodes", "mark at least one node for training")
        if self.metric not in ("accuracy", "roc_auc", "multilabel_roc_auc"):
            raise fail(src, "metric", f"unknown metric {self.metric!r}", "use 'accuracy', 'roc_auc' or "
                       "'multilabel_roc_auc' (labels [num_nodes, num_classes] of 0/1)")
        if self.metric == "roc_auc" and self.num_classes != 2:
            raise fail(src, "metric", f"roc_auc needs a binary task, got {self.num_classes} classes", "use 'accuracy'")

    def __repr__(self) -> str:
        return (f"GraphDataset(name={self.name!r}, num_nodes={self.num_nodes:,}, num_edges={self.num_edges:,}, "
                f"num_features={self.num_features}, num_classes={self.num_classes}, num_splits={self.num_splits}, "
                f"metric={self.metric!r})")


def _min_max(values: np.ndarray) -> tuple[int, int]:
    """``(min, max)`` of a 1-d integer array (``(0, 0)`` when empty), read in chunks: a memory-mapped one's
    pages go back to the page cache as the pass leaves them (:mod:`gnnscale.data.pages`)."""
    low, high, starts = 0, 0, row_chunks(values)
    for i, lo in enumerate(starts):
        chunk = values[lo:lo + starts.step]
        low, high = (int(chunk.min()), int(chunk.max())) if i == 0 else \
            (min(low, int(chunk.min())), max(high, int(chunk.max())))
        release_rows(values, lo, lo + chunk.shape[0])
    return low, high


def check_features(features: np.ndarray, num_nodes: int, source: str, name: str = "features") -> np.ndarray:
    """Return ``features`` as float32 [num_nodes, F], or raise naming the bad shape, dtype or first NaN row
    (``name="edge_features"``: one row per edge)."""
    if features.ndim != 2 or features.shape[0] != num_nodes:
        what = "edge" if name == "edge_features" else "node"
        raise fail(source, name, f"expected shape [{num_nodes}, num_features], got {list(features.shape)}",
                   f"give one feature row per {what}, in {'CSC edge' if what == 'edge' else 'node-id'} order")
    if not (np.issubdtype(features.dtype, np.floating) or np.issubdtype(features.dtype, np.integer)
            or features.dtype == np.bool_):
        raise fail(source, name, f"expected numbers, got dtype {features.dtype}", "store features as floats")
    features = features.astype(np.float32, copy=False)
    chunks = row_chunks(features)  # a bounded temporary; a memory-mapped file's pages released as checked
    for lo in chunks:
        finite = np.isfinite(features[lo:lo + chunks.step]).all(axis=1)
        if not finite.all():
            row = lo + int(np.flatnonzero(~finite)[0])
            raise fail(source, name, f"non-finite value (NaN or inf) in row {row}",
                       "clean or impute the features before loading")
        release_rows(features, lo, lo + chunks.step)
    return features


def check_multilabels(labels: np.ndarray, num_nodes: int, source: str, num_classes: int) -> None:
    """Check multi-label targets: [num_nodes, num_classes] of 0 and 1 (one column per label)."""
    if labels.shape != (num_nodes, num_classes):
        raise fail(source, "labels", f"expected shape [{num_nodes}, {num_classes}] for a multi-label task, got "
                   f"{list(labels.shape)}", "give one 0/1 column per label and num_classes = the number of columns")
    if labels.size and (labels.min() < 0 or labels.max() > 1):
        raise fail(source, "labels", f"multi-label targets must be 0 or 1, found {int(labels.max())}",
                   "store each label as a 0/1 column")


def check_labels(labels: np.ndarray, num_nodes: int, source: str,
                 num_classes: int | None = None) -> tuple[np.ndarray, int]:
    """Return ``(labels as int64 [num_nodes], num_classes)``; ``num_classes`` defaults to max label + 1.

    Accepts integer labels of shape [N] or [N, 1] (the OGB/DGL habit); anything else
    (floats with fractions, several label columns, negatives) raises a DatasetError.
    """
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.shape != (num_nodes,):
        raise fail(source, "labels", f"expected shape [{num_nodes}], got {list(labels.shape)}",
                   "give exactly one integer class id per node (for several labels per node use "
                   "metric='multilabel_roc_auc' with [num_nodes, num_labels] 0/1 labels)")
    if np.issubdtype(labels.dtype, np.floating):
        if not np.array_equal(labels, np.round(labels)):
            raise fail(source, "labels", "values are not whole numbers", "store labels as integer class ids")
    elif not np.issubdtype(labels.dtype, np.integer):
        raise fail(source, "labels", f"expected integer class ids, got dtype {labels.dtype}",
                   "store labels as integer class ids")
    labels = labels.astype(np.int64, copy=False)
    low, high = int(labels.min()), int(labels.max())
    if low < 0:
        raise fail(source, "labels", f"label {low} is negative", "labels must be class ids 0..num_classes-1")
    if num_classes is None:
        num_classes = high + 1
    elif high >= num_classes:
        raise fail(source, "labels", f"label {high} is out of range [0, {num_classes})",
                   f"labels must be class ids 0..{num_classes - 1}, or pass a larger num_classes")
    return labels, num_classes


def _as_split_masks(mask: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.atleast_2d(mask).astype(bool, copy=False))  # [N] is one split


MAX_KEYED_NODES = 3_037_000_499
"""The most nodes whose edge keys ``dst * num_nodes + src`` fit int64 (``floor(sqrt(2**63 - 1))``)."""


_NODE_CHUNK = 1 << 16  # destinations whose keys are turned into sources at a time


def drop_repeats(key: np.ndarray) -> np.ndarray:
    """Sorted int64 ``key`` without repeated values: compacted in place, chunk by chunk (each chunk is written
    at or before where it was read), then shrunk; ``key`` itself when nothing repeats."""
    size = key.shape[0]
    if not np.any(key[1:] == key[:-1]):
        return key
    write, last = 0, None
    for lo in range(0, size, 1 << 20):
        block = key[lo:lo + (1 << 20)]
        keep = np.empty(block.shape[0], dtype=bool)
        keep[0] = last is None or block[0] != last
        np.not_equal(block[1:], block[:-1], out=keep[1:])
        last = block[-1].item()
        kept = block[keep]
        key[write:write + kept.shape[0]] = kept
        write += kept.shape[0]
    del block, kept  # no view of the old buffer outlives the realloc
    key.resize(write, refcheck=False)  # realloc: shrinks in place, the tail returned to the allocator
    return key


def csc_from_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int, *, symmetrize: bool = False,
                   remove_self_loops: bool = True, dedup: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Build CSC ``(indptr, indices)`` from COO edges, vectorised.

    Args:
        src, dst: int [num_edges] endpoints; ids must already be in ``[0, num_nodes)``.
        symmetrize: also add every reverse edge (for undirected data stored once).
        remove_self_loops: drop ``v -> v`` edges (layers add self terms explicitly).
        dedup: drop repeated edges.

    Raises:
        ValueError: ``num_nodes`` above :data:`MAX_KEYED_NODES`, where the sort key overflows int64.
    """
    if num_nodes > MAX_KEYED_NODES:
        raise ValueError(f"num_nodes={num_nodes:,} is too many for one int64 edge key (dst * num_nodes + src): at "
                         f"most {MAX_KEYED_NODES:,} nodes; relabel the ids compactly (0..n-1 over the nodes in use)")
    key = sorted_edge_keys(src, dst, num_nodes, symmetrize=symmetrize, remove_self_loops=remove_self_loops,
                           dedup=dedup)
    # Destination v's keys are [v * N, (v + 1) * N): offsets by binary search, then sources.
    indptr = np.searchsorted(key, np.arange(num_nodes + 1, dtype=np.int64) * num_nodes).astype(np.int64)
    return indptr, keys_to_sources(key, indptr, 0, num_nodes)


def sorted_edge_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int, *, symmetrize: bool = False,
                     remove_self_loops: bool = True, dedup: bool = True) -> np.ndarray:
    """Sorted int64 keys ``dst * num_nodes + src`` of the edges (and of their reverses with ``symmetrize``),
    without self loops and repeats unless asked to keep them: what a CSC is built from."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if remove_self_loops:
        keep = src != dst
        if not keep.all():
            src, dst = src[keep], dst[keep]
    # One int64 key per edge, dst-major: sorting groups in-edges by destination and makes
    # duplicates adjacent.  Built, sorted, reduced and turned into sources in place (no concatenated
    # copies of src/dst, no copy for the deduplicated keys, per-chunk temporaries only): the keys are
    # the one edge-sized array this builds.
    num = src.shape[0]
    key = np.empty(2 * num if symmetrize else num, dtype=np.int64)
    np.multiply(dst, num_nodes, out=key[:num])
    key[:num] += src
    if symmetrize:
        np.multiply(src, num_nodes, out=key[num:])
        key[num:] += dst
    # Integers need no stable sort: numpy's in-place quicksort (SIMD where the CPU has it) took 0.43 s
    # for 19M keys here, timsort 1.68 s and a buffer of half the keys.
    key.sort()
    return drop_repeats(key) if dedup and key.size else key


def keys_to_sources(key: np.ndarray, offsets: np.ndarray, first: int, num_nodes: int) -> np.ndarray:
    """The sorted keys of destinations ``first, first + 1, ...`` (``offsets``: int [D + 1], where each one's keys
    start) turned into their sources in place, by subtracting each key's destination times ``num_nodes`` (cheaper
    than an integer division per edge), a slice of destinations at a time; returns ``key``."""
    base = int(offsets[0])
    for lo in range(0, offsets.shape[0] - 1, _NODE_CHUNK):
        hi = min(offsets.shape[0] - 1, lo + _NODE_CHUNK)
        key[offsets[lo] - base:offsets[hi] - base] -= np.repeat(
            np.arange(first + lo, first + hi, dtype=np.int64) * num_nodes, np.diff(offsets[lo:hi + 1]))
    return key
