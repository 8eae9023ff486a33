"""One entry point for every dataset: ``load_dataset(name, data_dir, **kwargs)``.

Each format lives in its own module and is imported only when asked for, so the
registry costs nothing to import (``dgl`` takes seconds, and cannot be imported at
all on the GPU image; pandas is only needed for OGB).  The small checks that every
format shares live here too: a missing file, out-of-range node ids and building the
CSC structure from an edge list.

================  ===========================================  ==========================
name              ``data_dir``                                 module
================  ===========================================  ==========================
cora, citeseer    folder holding ``ind.<name>.*``               :mod:`.planetoid`
tolokers, ...     folder holding ``<name>.npz`` (or the file)   :mod:`.heterophilous`
dgl               a ``dgl.save_graphs`` file, or its folder     :mod:`.dgl_binary`
ogb               an extracted OGB node-property dataset        :mod:`.ogb`
edgelist          folder with ``edges.csv``/``edges.txt`` ...   :mod:`.edgelist`
synthetic         ``None``                                      :mod:`.synthetic`
================  ===========================================  ==========================
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gnnscale.data.dataset import GraphDataset, csc_from_edges, fail

# name -> (module, function, fixed keyword arguments).  The heterophilous-graphs
# datasets share one format, so each name just fixes ``name=``.
_REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "cora": ("gnnscale.data.planetoid", "load_planetoid", {"name": "cora"}),
    "citeseer": ("gnnscale.data.planetoid", "load_planetoid", {"name": "citeseer"}),
    "pubmed": ("gnnscale.data.planetoid", "load_planetoid", {"name": "pubmed"}),
    "tolokers": ("gnnscale.data.heterophilous", "load_heterophilous", {"name": "tolokers"}),
    "roman-empire": ("gnnscale.data.heterophilous", "load_heterophilous", {"name": "roman-empire"}),
    "amazon-ratings": ("gnnscale.data.heterophilous", "load_heterophilous", {"name": "amazon-ratings"}),
    "minesweeper": ("gnnscale.data.heterophilous", "load_heterophilous", {"name": "minesweeper"}),
    "questions": ("gnnscale.data.heterophilous", "load_heterophilous", {"name": "questions"}),
    "dgl": ("gnnscale.data.dgl_binary", "load_dgl_binary", {}),
    "ogb": ("gnnscale.data.ogb", "load_ogb_node", {}),
    "edgelist": ("gnnscale.data.edgelist", "load_edgelist", {}),
}

DATASET_NAMES: tuple[str, ...] = (*_REGISTRY, "synthetic")
"""Every name :func:`load_dataset` accepts."""


def load_dataset(name: str, data_dir: str | Path | None, **kwargs: Any) -> GraphDataset:
    """Load dataset ``name`` from ``data_dir``.

    Args:
        name: one of :data:`DATASET_NAMES` (case-insensitive).
        data_dir: where the files are (see the module table); ``None`` only for
            ``"synthetic"``, which generates its graph instead.
        **kwargs: passed on to the format's loader, e.g. ``row_normalize=False`` for
            Planetoid, ``seed=`` for an edge list without masks, or ``num_nodes``,
            ``avg_degree``, ``num_classes``, ``feat_dim``, ``seed`` for ``"synthetic"``.

    Raises:
        ValueError: ``name`` is unknown.
        DatasetError: the data is missing or malformed.
    """
    key = name.lower()
    if key == "synthetic":
        return _load_synthetic(data_dir, **kwargs)
    if key not in _REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)}")
    if data_dir is None:
        raise fail(key, "data_dir", "no data directory given",
                   f"pass the folder that holds the {key} files (for the bundled copies: ../shared/datasets/{key})")
    module_name, func_name, fixed = _REGISTRY[key]
    loader: Callable[..., GraphDataset] = getattr(importlib.import_module(module_name), func_name)
    return loader(Path(data_dir), **fixed, **kwargs)


def _load_synthetic(data_dir: str | Path | None, **kwargs: Any) -> GraphDataset:
    if data_dir is not None:
        raise ValueError(f"the synthetic dataset is generated, not read: got data_dir={str(data_dir)!r}; pass None")
    # Imported lazily: synthetic.py is a separate component with its own config.
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

    valid = [f.name for f in dataclasses.fields(SyntheticConfig)]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f"synthetic dataset got unknown option(s) {unknown}; valid: {valid}")
    return generate_synthetic(SyntheticConfig(**kwargs))


# ---------------------------------------------------------------------- shared checks
def require_file(path: Path, field_name: str, fix: str) -> Path:
    """Return ``path`` if it is an existing file, else raise a DatasetError naming it and ``fix``."""
    if path.is_dir():
        raise fail(str(path), field_name, "is a folder, expected a file", fix)
    if not path.is_file():
        raise fail(str(path), field_name, "file not found", fix)
    return path


def require_dir(path: Path, field_name: str, fix: str) -> Path:
    """Return ``path`` if it is an existing folder, else raise a DatasetError naming it and ``fix``."""
    if not path.is_dir():
        problem = "is a file, expected a folder" if path.exists() else "folder not found"
        raise fail(str(path), field_name, problem, fix)
    return path


def check_node_ids(src: np.ndarray, dst: np.ndarray, num_nodes: int, source: str,
                   field_name: str = "edges") -> None:
    """Raise a DatasetError naming the first edge whose endpoint is outside ``[0, num_nodes)``.

    ``csc_from_edges`` trusts its input (an out-of-range id silently corrupts the
    dst-major sort key), so every loader calls this first.

    Args:
        src, dst: integer [num_edges] endpoints, 0-based.
    """
    bad = (src < 0) | (src >= num_nodes) | (dst < 0) | (dst >= num_nodes)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise fail(source, field_name,
                   f"edge {row} ({int(src[row])} -> {int(dst[row])}) has a node id outside [0, {num_nodes}) "
                   f"({int(bad.sum())} such edges)",
                   "node ids must be 0-based and smaller than the number of nodes (the length of the labels)")


def edges_to_csc(src: np.ndarray, dst: np.ndarray, num_nodes: int, source: str, *,
                 symmetrize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Check ids, then build CSC with self loops and duplicates removed.

    Args:
        src, dst: integer [num_edges] endpoints.
        symmetrize: add every reverse edge (data that stores each undirected edge once).

    Returns:
        ``(indptr, indices)``: int64 [num_nodes + 1] and int64 [num_stored_edges].
    """
    if not (np.issubdtype(src.dtype, np.integer) and np.issubdtype(dst.dtype, np.integer)):
        raise fail(source, "edges", f"node ids must be integers, got dtype {src.dtype}",
                   "store the edge list as integer node ids")
    check_node_ids(src, dst, num_nodes, source)
    return csc_from_edges(src, dst, num_nodes, symmetrize=symmetrize, remove_self_loops=True, dedup=True)


def check_features(features: np.ndarray, num_nodes: int, source: str) -> np.ndarray:
    """Return ``features`` as float32 [num_nodes, F], or raise naming the bad shape, dtype or first NaN row."""
    if features.ndim != 2 or features.shape[0] != num_nodes:
        raise fail(source, "features", f"expected shape [{num_nodes}, num_features], got {list(features.shape)}",
                   "give one feature row per node, in node-id order")
    if not (np.issubdtype(features.dtype, np.floating) or np.issubdtype(features.dtype, np.integer)
            or features.dtype == np.bool_):
        raise fail(source, "features", f"expected numbers, got dtype {features.dtype}", "store features as floats")
    features = features.astype(np.float32, copy=False)
    finite = np.isfinite(features)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise fail(source, "features", f"non-finite value (NaN or inf) in row {row}",
                   "clean or impute the features before loading")
    return features


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
                   "give exactly one integer class id per node (multi-label tasks are not supported)")
    if np.issubdtype(labels.dtype, np.floating):
        if not np.array_equal(labels, np.round(labels)):
            raise fail(source, "labels", "values are not whole numbers", "store labels as integer class ids")
    elif not np.issubdtype(labels.dtype, np.integer):
        raise fail(source, "labels", f"expected integer class ids, got dtype {labels.dtype}",
                   "store labels as integer class ids")
    labels = labels.astype(np.int64)
    low, high = int(labels.min()), int(labels.max())
    if low < 0:
        raise fail(source, "labels", f"label {low} is negative", "labels must be class ids 0..num_classes-1")
    if num_classes is None:
        num_classes = high + 1
    elif high >= num_classes:
        raise fail(source, "labels", f"label {high} is out of range [0, {num_classes})",
                   f"labels must be class ids 0..{num_classes - 1}, or pass a larger num_classes")
    return labels, num_classes


def random_split(num_nodes: int, seed: int, fractions: tuple[float, float] = (0.6, 0.2)) -> tuple[np.ndarray, ...]:
    """Deterministic random train/val/test split (the rest is test).

    Returns:
        ``(train, val, test)``: bool [num_nodes] each, disjoint, covering every node.
    """
    order = np.random.default_rng(seed).permutation(num_nodes)
    num_train = int(round(fractions[0] * num_nodes))
    num_val = int(round(fractions[1] * num_nodes))
    masks = []
    for part in (order[:num_train], order[num_train:num_train + num_val], order[num_train + num_val:]):
        mask = np.zeros(num_nodes, dtype=bool)
        mask[part] = True
        masks.append(mask)
    return tuple(masks)
