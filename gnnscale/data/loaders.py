"""One entry point for every dataset: ``load_dataset(name, data_dir, **kwargs)``.

Each format lives in its own module (named in :data:`_REGISTRY`; what ``data_dir`` holds for
each: docs/training.md, Data) and is imported only when asked for, so the registry costs
nothing to import (``dgl`` takes seconds, and cannot be imported at all on the GPU image;
pandas is only needed for OGB).  The small checks that the formats share live here too: a
missing file, out-of-range node ids, split masks and building the CSC structure.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gnnscale.data.dataset import GraphDataset, csc_from_edges, fail

# name -> (module, function, fixed keyword arguments).  The Planetoid and the heterophilous-graphs
# datasets share one format each, so each name just fixes ``name=``.
_REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    **{name: ("gnnscale.data.planetoid", "load_planetoid", {"name": name}) for name in ("cora", "citeseer", "pubmed")},
    **{name: ("gnnscale.data.heterophilous", "load_heterophilous", {"name": name})
       for name in ("tolokers", "roman-empire", "amazon-ratings", "minesweeper", "questions")},
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
        data_dir: where the files are (docs/training.md, Data); ``None`` only for
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


def edges_to_csc(src: np.ndarray, dst: np.ndarray, num_nodes: int, source: str, *,
                 symmetrize: bool) -> tuple[np.ndarray, np.ndarray]:
    """CSC ``(indptr, indices)`` of the edges ``src -> dst`` (integer [num_edges], 0-based), without self
    loops and duplicates, plus every reverse edge if ``symmetrize``.  The ids are checked first:
    ``csc_from_edges`` trusts its input, and an out-of-range id would corrupt its dst-major sort key.
    """
    check_edge_ids(src, dst, num_nodes, source)
    return csc_from_edges(src, dst, num_nodes, symmetrize=symmetrize)


def check_edge_ids(src: np.ndarray, dst: np.ndarray, num_nodes: int, source: str,
                   first_row: int | None = None) -> None:
    """Refuse non-integer ids and ids outside ``[0, num_nodes)``, naming the first bad edge: of the whole
    edge list of ``source``, or with ``first_row`` of the chunk of it that starts at that row."""
    if not (np.issubdtype(src.dtype, np.integer) and np.issubdtype(dst.dtype, np.integer)):
        raise fail(source, "edges", f"node ids must be integers, got dtype {src.dtype}",
                   "store the edge list as integer node ids")
    bad = (src < 0) | (src >= num_nodes) | (dst < 0) | (dst >= num_nodes)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise fail(source, "edges",
                   f"edge {(first_row or 0) + row} ({int(src[row])} -> {int(dst[row])}) has a node id outside "
                   f"[0, {num_nodes}) ({int(bad.sum())} such edges{'' if first_row is None else ' in its chunk'})",
                   "node ids must be 0-based and smaller than the number of nodes (the length of the labels)")


def check_split_masks(mask: np.ndarray, num_nodes: int, source: str, field_name: str) -> np.ndarray:
    """bool [S, N] from a bool [N] or [S, N] mask, or a DatasetError naming the bad shape or dtype."""
    mask = np.atleast_2d(mask)  # [N] is one split
    if mask.ndim != 2 or mask.shape[1] != num_nodes:
        raise fail(source, field_name, f"expected bool [num_splits, {num_nodes}], got {mask.dtype} "
                   f"{list(mask.shape)}", "store one boolean per node (and per split)")
    if mask.dtype != np.bool_:
        raise fail(source, field_name, f"expected dtype bool, got {mask.dtype}",
                   "store the mask as booleans, e.g. np.save(path, mask.astype(bool))")
    return mask


def random_split(num_nodes: int, seed: int, fractions: tuple[float, float] = (0.6, 0.2)) -> tuple[np.ndarray, ...]:
    """Deterministic random ``(train, val, test)`` masks, bool [num_nodes] each, disjoint, covering every node."""
    num_train = int(round(fractions[0] * num_nodes))
    ends = [num_train, num_train + int(round(fractions[1] * num_nodes))]
    # The node at position i of a seeded permutation goes to the part whose range of positions holds i.
    order = np.random.default_rng(seed).permutation(num_nodes)
    part = np.empty(num_nodes, dtype=np.int64)
    part[order] = np.searchsorted(ends, np.arange(num_nodes), side="right")
    return tuple(part == k for k in range(3))
