"""The heterophilous-graphs benchmark (Platonov et al. 2023): one ``<name>.npz`` per dataset.

Keys, identical for roman-empire, amazon-ratings, minesweeper, tolokers and questions::

    node_features  float [N, F]
    node_labels    int   [N]
    edges          int   [E, 2]   each undirected edge once (the reverse is added here)
    train_masks    bool  [10, N]  ten fixed random splits
    val_masks      bool  [10, N]
    test_masks     bool  [10, N]

The benchmark scores its binary datasets (minesweeper, tolokers, questions: all class-imbalanced) by
ROC-AUC and the others by accuracy, so the metric follows the number of classes.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from gnnscale.data.dataset import DatasetError, GraphDataset, check_features, check_labels, fail
from gnnscale.data.loaders import check_split_masks, edges_to_csc, require_file

_KEYS = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")
_DOWNLOAD_FIX = ("download {name}.npz from https://github.com/yandex-research/heterophilous-graphs/tree/main/data "
                 "into {folder}")


def load_heterophilous(data_dir: str | Path, *, name: str) -> GraphDataset:
    """Load ``<name>.npz`` with all of its splits.

    Args:
        data_dir: folder holding ``<name>.npz``, or the ``.npz`` file itself.
        name: dataset name, e.g. ``"tolokers"``.

    Returns:
        A :class:`GraphDataset` with a symmetric graph (self loops and duplicates removed),
        ``num_splits`` = 10, and metric ``"roc_auc"`` for binary labels, else ``"accuracy"``.
    """
    data_dir = Path(data_dir)
    path = data_dir if data_dir.suffix == ".npz" else data_dir / f"{name}.npz"
    require_file(path, "npz", _DOWNLOAD_FIX.format(name=name, folder=path.parent))
    source = str(path)
    arrays = _read_npz(path)

    labels, features = arrays["node_labels"], arrays["node_features"]
    # The feature table fixes the node count, so a short label array is blamed, not the features.
    num_nodes = int(features.shape[0]) if features.ndim == 2 else int(labels.shape[0]) if labels.ndim >= 1 else 0
    labels, num_classes = check_labels(labels, num_nodes, source)
    features = check_features(features, num_nodes, source)
    edges = arrays["edges"]
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise fail(source, "edges", f"expected shape [num_edges, 2], got {list(edges.shape)}",
                   "store one (src, dst) row per edge")
    indptr, indices = edges_to_csc(edges[:, 0], edges[:, 1], num_nodes, source, symmetrize=True)

    masks = {key: check_split_masks(arrays[key], num_nodes, source, key)
             for key in ("train_masks", "val_masks", "test_masks")}
    return GraphDataset(
        name=name, indptr=indptr, indices=indices, features=features, labels=labels,
        train_masks=masks["train_masks"], val_masks=masks["val_masks"], test_masks=masks["test_masks"],
        num_classes=num_classes, metric="roc_auc" if num_classes == 2 else "accuracy", source=source,
    )


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every key in :data:`_KEYS`, read eagerly; object arrays are refused (``allow_pickle=False``)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [key for key in _KEYS if key not in npz.files]
            if missing:
                raise fail(str(path), missing[0], f"key missing (file has {sorted(npz.files)})",
                           f"the file must hold {', '.join(_KEYS)}; re-download it")
            return {key: npz[key] for key in _KEYS}
    except DatasetError:
        raise
    except ValueError as err:
        # np.load raises ValueError for object arrays under allow_pickle=False.
        raise fail(str(path), "npz", f"holds a non-array object ({err})",
                   "store plain numeric arrays (np.savez without object dtype)") from None
    except (OSError, zipfile.BadZipFile) as err:
        raise fail(str(path), "npz", f"cannot be read ({err})", "re-download the file") from None
