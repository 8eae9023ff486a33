"""A plain folder of an edge list plus ``.npy`` arrays: the format for bringing your own graph.

::

    DIR/edges.csv or DIR/edges.txt   two integer columns "src dst", comma or whitespace
                                     separated; '#' starts a comment; an optional
                                     header line (e.g. "src,dst") is skipped
    or DIR/edges.npy                 int [E, 2] rows "src dst": no parsing, for large graphs
    DIR/features.npy                 float [N, F]
    DIR/labels.npy                   int   [N]          N = len(labels) = number of nodes
    DIR/train_mask.npy               bool  [N] or [S, N]   optional, all three or none
    DIR/val_mask.npy
    DIR/test_mask.npy

Without masks a deterministic random 60/20/20 split is drawn from ``seed``.
Arrays are read with ``allow_pickle=False``: an ``.npy`` holding Python objects is refused.  With
``mmap_features`` (the partition command's choice) a float32 ``features.npy`` stays memory-mapped
(read-only): its pages are read when a pass reaches them and handed back to the page cache after it
(:mod:`gnnscale.data.pages`), so a large one is never resident as a whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from gnnscale.data.dataset import DatasetError, GraphDataset, check_features, check_labels, fail
from gnnscale.data.pages import release_rows
from gnnscale.data.loaders import check_split_masks, edges_to_csc, random_split, require_dir, require_file

BuildCSC = Callable[[Path, int, bool], tuple[np.ndarray, np.ndarray]]
"""``build_csc(edge file, num_nodes, symmetrize) -> (indptr, indices)``: see :func:`load_edgelist`."""
_FORMAT_FIX = "see gnnscale/data/edgelist.py for the folder layout"
_MASK_NAMES = ("train_mask", "val_mask", "test_mask")


def load_edgelist(data_dir: str | Path, *, undirected: bool = True, seed: int = 0,
                  num_classes: int | None = None, name: str | None = None,
                  mmap_features: bool = False, build_csc: BuildCSC | None = None) -> GraphDataset:
    """Load a graph from an edge-list folder.

    Args:
        data_dir: the folder (layout in the module docstring).
        undirected: add every reverse edge.
        seed: seed of the random 60/20/20 split, used only when no mask files exist.
        num_classes: number of classes; defaults to max label + 1.
        name: dataset name for logs; defaults to the folder name.
        mmap_features: keep a float32 ``features.npy`` memory-mapped read-only, its pages released after each
            pass (what ``python -m partition`` does: the features are then never resident as a whole); off,
            they are read into memory, writable, as training wants them.
        build_csc: ``build_csc(edge file, num_nodes, symmetrize)`` returns the CSC ``(indptr, indices)`` that
            :func:`~gnnscale.data.loaders.edges_to_csc` would (ids checked, self loops and repeats dropped);
            the out-of-core partition pipeline (:mod:`partition.external`) passes one that never holds the
            edges.  None: read the whole edge list and sort it in memory.

    Returns:
        A :class:`GraphDataset` with self loops and duplicate edges removed.
    """
    folder = require_dir(Path(data_dir), "data_dir", _FORMAT_FIX)
    labels_path = require_file(folder / "labels.npy", "labels", f"save the labels with np.save; {_FORMAT_FIX}")
    raw_labels = _load_npy(labels_path, "labels")
    if raw_labels.ndim != 1:
        raise fail(str(labels_path), "labels", f"expected shape [num_nodes], got {list(raw_labels.shape)}",
                   "give exactly one integer class id per node")
    num_nodes = int(raw_labels.shape[0])
    if num_nodes == 0:
        raise fail(str(labels_path), "labels", "is empty", "give one label per node")
    labels, num_classes = check_labels(raw_labels, num_nodes, str(labels_path), num_classes)

    features_path = require_file(folder / "features.npy", "features", f"save the features with np.save; {_FORMAT_FIX}")
    # The edges first, and dropped once in CSC form: the raw list and the features are never held together.
    edge_path = find_edge_file(folder)
    if build_csc is None:
        src, dst = _read_edges(edge_path)
        indptr, indices = edges_to_csc(src, dst, num_nodes, str(edge_path), symmetrize=undirected)
        del src, dst
    else:
        indptr, indices = build_csc(edge_path, num_nodes, undirected)
    # Memory-mapped read-only where asked: pages are read as passes reach them and released after them.
    features = check_features(_load_npy(features_path, "features", mmap=mmap_features), num_nodes,
                              str(features_path))

    masks, given = _masks(folder, num_nodes, seed)
    return GraphDataset(
        name=name or folder.resolve().name, indptr=indptr, indices=indices, features=features, labels=labels,
        train_masks=masks[0], val_masks=masks[1], test_masks=masks[2], num_classes=num_classes,
        metric="accuracy", source=str(folder), extra={"random_split_seed": None if given else seed},
    )


def _masks(folder: Path, num_nodes: int, seed: int) -> tuple[list, bool]:
    """The folder's train/val/test masks (all three, checked and disjoint), or a random split seeded with ``seed``
    when none is given; and whether they were given."""
    mask_paths = [folder / f"{mask}.npy" for mask in _MASK_NAMES]
    present = [path.is_file() for path in mask_paths]
    if all(present):
        masks = [check_split_masks(_load_npy(path, mask), num_nodes, str(path), mask)
                 for path, mask in zip(mask_paths, _MASK_NAMES)]
        _check_disjoint(masks, folder)
        return masks, True
    if any(present):
        missing = present.index(False)
        raise fail(str(mask_paths[missing]), _MASK_NAMES[missing], "file not found, but other mask files exist",
                   "give all of train_mask.npy, val_mask.npy, test_mask.npy, or none for a random split")
    return list(random_split(num_nodes, seed)), False


def _load_npy(path: Path, field_name: str, *, mmap: bool = False) -> np.ndarray:
    if mmap:
        try:
            return np.load(path, allow_pickle=False, mmap_mode="r")
        except ValueError:  # an empty array or objects cannot be mapped: read it, which names the problem
            pass
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as err:  # object arrays under allow_pickle=False, or a non-.npy file
        raise fail(str(path), field_name, f"is not a plain numeric .npy array ({err})",
                   "save a numeric array with np.save (no object dtype)") from None


def find_edge_file(folder: Path) -> Path:
    candidates = [folder / "edges.csv", folder / "edges.txt", folder / "edges.npy"]
    found = [path for path in candidates if path.is_file()]
    if not found:
        raise fail(str(candidates[0]), "edges", "file not found (nor edges.txt)",
                   f"put the edge list, one 'src dst' pair per line, in edges.csv or edges.txt (or an int [E, 2] "
                   f"array in edges.npy); {_FORMAT_FIX}")
    if len(found) > 1:
        raise fail(str(folder), "edges", f"several edge files exist ({', '.join(p.name for p in found)})",
                   "keep only one of them")
    return found[0]


def _read_edges(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """int64 ``(src, dst)`` [num_edges] from an int [E, 2] ``.npy`` or a two-column text file (pandas' C reader)."""
    if path.suffix == ".npy":
        edges = _edge_array(path)
        return edges[:, 0], edges[:, 1]
    chunks = list(edge_chunks(path, None))
    if not chunks:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return chunks[0][1], chunks[0][2]


def edge_chunks(path: Path, rows: int | None, *, mmap: bool = False) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """``(first row, src, dst)`` over an edge file, ``rows`` edges at a time (None: all at once): an ``.npy``
    memory-mapped (``mmap``) and sliced, a text file read by pandas in chunks.  Every chunk is checked as the
    whole file would be (integer ids that int64 holds); the ids' range is the caller's to check."""
    if path.suffix == ".npy":
        edges = _edge_array(path, mmap=mmap)
        step = max(1, rows or edges.shape[0])
        for lo in range(0, edges.shape[0], step):
            chunk = np.asarray(edges[lo:lo + step], dtype=np.int64)
            release_rows(edges, lo, lo + step)  # a mapped file's pages go back to the page cache once read
            yield lo, chunk[:, 0], chunk[:, 1]
        return
    first = _first_data_line(path)
    if first is None:
        return
    comma = "," in first
    tokens = [t for t in (first.split(",") if comma else first.split()) if t.strip()]
    # A first line of numbers is data ("3.0" too, so that it is reported as a bad id rather than skipped).
    has_header = not all(_is_number(t) for t in tokens)
    row = 0
    try:
        reader = pd.read_csv(path, sep="," if comma else r"\s+", header=0 if has_header else None,
                             comment="#", skipinitialspace=True, chunksize=rows)
        for frame in [reader] if rows is None else reader:
            edges = _frame_edges(frame, path, row)
            yield row, edges[:, 0], edges[:, 1]
            row += edges.shape[0]
    except (ValueError, pd.errors.ParserError) as err:
        if isinstance(err, DatasetError):
            raise
        raise fail(str(path), "edges", f"cannot be parsed as two columns ({err})",
                   "write one 'src dst' pair of integer node ids per line") from None


def _edge_array(path: Path, *, mmap: bool = False) -> np.ndarray:
    """The int [E, 2] array of an ``edges.npy`` (memory-mapped read-only with ``mmap``), its shape checked."""
    edges = _load_npy(path, "edges", mmap=mmap)
    if edges.ndim != 2 or edges.shape[1] != 2 or not np.issubdtype(edges.dtype, np.integer):
        raise fail(str(path), "edges", f"expected an integer array of shape [num_edges, 2], got "
                   f"{edges.dtype} {list(edges.shape)}", "save np.stack([src, dst], axis=1) with np.save")
    return edges


def _frame_edges(frame: pd.DataFrame, path: Path, row0: int) -> np.ndarray:
    """int64 [rows, 2] of a parsed chunk whose first row is edge ``row0`` of the file, or the error naming the
    first bad edge (a missing or non-integer id, or one beyond int64)."""
    if frame.shape[1] != 2:
        raise fail(str(path), "edges", f"expected 2 columns (src, dst), got {frame.shape[1]}",
                   "write one 'src dst' pair per line")
    for column in frame.columns:
        if not pd.api.types.is_integer_dtype(frame[column]):
            values = pd.to_numeric(frame[column], errors="coerce")
            bad = ~(values.notna() & (values == values.round()))
            if not bad.any():  # whole numbers written as floats ("3.0") are fine
                continue
            row = int(np.flatnonzero(bad.to_numpy())[0])
            value = frame[column].iloc[row]
            value = value.item() if isinstance(value, np.generic) else value  # numpy 2 reprs np.float64(2.5)
            raise fail(str(path), "edges", f"edge {row0 + row} has a missing or non-integer node id {value!r}",
                       "write one 'src dst' pair of integer node ids per line")
    _check_int64(frame, path, row0)
    return frame.to_numpy(dtype=np.int64)


def _check_int64(frame: pd.DataFrame, path: Path, row0: int = 0) -> None:
    """Refuse an id of 2**63 or more, which int64 cannot hold (it would raise OverflowError, or wrap around
    to a negative id, on the conversion); columns pandas read as int64 are in range by construction."""
    for column in frame.columns:
        if frame[column].dtype == np.int64:
            continue
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
        beyond = np.flatnonzero(values >= 2.0 ** 63)
        if beyond.size:
            row = int(beyond[0])
            raise fail(str(path), "edges", f"edge {row0 + row} has node id {frame[column].iloc[row]}, beyond the "
                       f"largest id int64 holds ({beyond.size} such edges)",
                       "node ids must be 0-based and smaller than "
                       "the number of nodes (the length of the labels)")


def _first_data_line(path: Path) -> str | None:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.split("#", 1)[0].strip()
            if line:
                return line
    return None


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _check_disjoint(masks: list[np.ndarray], folder: Path) -> None:
    """Overlapping train/val/test masks leak labels into evaluation: refuse them."""
    if len({mask.shape[0] for mask in masks}) != 1:
        raise fail(str(folder), "masks", f"split counts differ: {[mask.shape[0] for mask in masks]}",
                   "give every mask file the same number of rows (splits)")
    for i in range(3):
        for j in range(i + 1, 3):
            both = masks[i] & masks[j]
            if both.any():
                split, node = (int(v[0]) for v in np.nonzero(both))
                raise fail(str(folder / f"{_MASK_NAMES[j]}.npy"), _MASK_NAMES[j],
                           f"node {node} of split {split} is also in {_MASK_NAMES[i]}",
                           "make train, val and test masks disjoint")
