"""OGB node-property datasets read from their extracted raw layout, without the ``ogb`` package.

The layout of e.g. ``ogbn-arxiv.zip`` from http://snap.stanford.edu/ogb/data/nodeproppred/::

    DIR/raw/edge.csv.gz           "src,dst" per line, no header
    DIR/raw/node-feat.csv.gz      F comma-separated floats per line
    DIR/raw/node-label.csv.gz     one label per line (NaN for an unlabelled node)
    DIR/raw/num-node-list.csv.gz  one line: the number of nodes
    DIR/split/<split_name>/{train,valid,test}.csv.gz   node ids, one a line

Unlabelled nodes (NaN labels, as in ogbn-papers100M) get label 0 and are left out
of every mask; a split that lists one is an error, since the file pair then
disagrees.  Multi-label tasks (ogbn-proteins) are refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gnnscale.data.dataset import GraphDataset, check_features, check_labels, fail
from gnnscale.data.loaders import edges_to_csc, require_dir, require_file

_DOWNLOAD_FIX = ("download and extract the dataset from http://snap.stanford.edu/ogb/data/nodeproppred/ "
                 "(e.g. arxiv.zip) and pass the folder that holds raw/ and split/")


def load_ogb_node(data_dir: str | Path, *, split_name: str | None = None, to_undirected: bool = True,
                  name: str | None = None) -> GraphDataset:
    """Load an OGB node-property dataset from ``data_dir`` (the folder holding ``raw/`` and ``split/``).

    Args:
        data_dir: dataset root, e.g. ``.../arxiv``.
        split_name: folder under ``split/``; may be omitted when there is only one
            (``time`` for arxiv, ``sales_ranking`` for products).
        to_undirected: add every reverse edge (the usual preprocessing for arxiv,
            whose raw edges are directed citations).
        name: dataset name for logs; defaults to the folder name.

    Returns:
        A one-split :class:`GraphDataset` with metric ``"accuracy"``; self loops and
        duplicate edges are removed; ``extra["num_unlabeled"]`` counts NaN labels.
    """
    root = require_dir(Path(data_dir), "data_dir", _DOWNLOAD_FIX)
    raw = require_dir(root / "raw", "raw", _DOWNLOAD_FIX)
    num_nodes = _read_num_nodes(require_file(raw / "num-node-list.csv.gz", "num_nodes", _DOWNLOAD_FIX))
    indptr, indices = _read_edges(raw, num_nodes, to_undirected)

    feat_path = require_file(raw / "node-feat.csv.gz", "features", _DOWNLOAD_FIX + " (datasets without node "
                             "features, such as ogbn-proteins, are not supported)")
    features = check_features(_read_csv(feat_path, "features", np.float32), num_nodes, str(feat_path))
    labels, num_classes, labeled = _read_labels(raw, num_nodes)

    split_dir = _resolve_split(root, split_name)
    masks = {part: _read_mask(split_dir, part, num_nodes, labeled) for part in ("train", "valid", "test")}
    return GraphDataset(
        name=name or root.resolve().name, indptr=indptr, indices=indices, features=features, labels=labels,
        train_masks=masks["train"], val_masks=masks["valid"], test_masks=masks["test"],
        num_classes=num_classes, metric="accuracy", source=str(root),
        extra={"num_unlabeled": int((~labeled).sum()), "split_name": split_dir.name},
    )


def _read_edges(raw: Path, num_nodes: int, to_undirected: bool) -> tuple[np.ndarray, np.ndarray]:
    """CSC ``(indptr, indices)`` from ``raw/edge.csv.gz``."""
    edge_path = require_file(raw / "edge.csv.gz", "edges", _DOWNLOAD_FIX)
    edges = _read_csv(edge_path, "edges", np.int64)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise fail(str(edge_path), "edges", f"expected 2 columns (src,dst), got {edges.shape[1]}",
                   "store one 'src,dst' pair per line")
    return edges_to_csc(edges[:, 0], edges[:, 1], num_nodes, str(edge_path), symmetrize=to_undirected)


def _read_labels(raw: Path, num_nodes: int) -> tuple[np.ndarray, int, np.ndarray]:
    """Labels int64 [N] (0 where NaN), the number of classes, and bool [N]: which labels were not NaN."""
    label_path = require_file(raw / "node-label.csv.gz", "labels", _DOWNLOAD_FIX)
    raw_labels = _read_csv(label_path, "labels", np.float64)
    if raw_labels.shape[1] != 1:
        raise fail(str(label_path), "labels", f"has {raw_labels.shape[1]} columns: a multi-label task",
                   "only single-label node classification is supported")
    raw_labels = raw_labels[:, 0]
    labeled = ~np.isnan(raw_labels)
    if not labeled.any():
        raise fail(str(label_path), "labels", "every label is NaN", "re-download the dataset")
    labels, num_classes = check_labels(np.where(labeled, raw_labels, 0.0), num_nodes, str(label_path))
    return labels, num_classes, labeled


def _read_mask(split_dir: Path, part: str, num_nodes: int, labeled: np.ndarray) -> np.ndarray:
    """bool [N] from ``split_dir/<part>.csv.gz``; every listed node must be in range and labelled."""
    path = require_file(split_dir / f"{part}.csv.gz", part, _DOWNLOAD_FIX)
    ids = _read_csv(path, part, np.int64)[:, 0]
    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise fail(str(path), part, f"node id {bad} is outside [0, {num_nodes})", "re-download the dataset")
    if not labeled[ids].all():
        raise fail(str(path), part, f"lists {int((~labeled[ids]).sum())} node(s) whose label is NaN",
                   "the split and node-label files disagree; re-download the dataset")
    mask = np.zeros(num_nodes, dtype=bool)
    mask[ids] = True
    return mask


def _read_csv(path: Path, field_name: str, dtype: type) -> np.ndarray:
    """Header-less CSV (gzip inferred from the suffix) as a 2-d ``dtype`` array."""
    try:
        frame = pd.read_csv(path, header=None, dtype=dtype)
    except (ValueError, TypeError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise fail(str(path), field_name, f"cannot be parsed as {np.dtype(dtype).name} CSV ({err})",
                   "re-download the dataset") from None
    return frame.to_numpy()


def _read_num_nodes(path: Path) -> int:
    counts = _read_csv(path, "num_nodes", np.int64).ravel()
    if counts.size != 1 or counts[0] < 1:
        raise fail(str(path), "num_nodes", f"expected one positive count, got {counts.tolist()[:5]}",
                   "this loader reads single-graph datasets only (ogbn-*)")
    return int(counts[0])


def _resolve_split(root: Path, split_name: str | None) -> Path:
    split_root = require_dir(root / "split", "split", _DOWNLOAD_FIX)
    available = sorted(p.name for p in split_root.iterdir() if p.is_dir())
    if split_name is None:
        if len(available) != 1:
            raise fail(str(split_root), "split_name", f"choose one of {available}", "pass split_name=")
        split_name = available[0]
    if split_name not in available:
        raise fail(str(split_root), "split_name", f"{split_name!r} not found; available: {available}",
                   "pass one of the available split names")
    return split_root / split_name
