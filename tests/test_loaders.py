"""Loaders on the real shared datasets (skipped when absent) and on tiny files written here."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest

from gnnscale.data.dataset import GraphDataset
from gnnscale.data.loaders import DATASET_NAMES, load_dataset

# Undirected ring of six nodes: every node has in-degree 2.
RING_INDPTR = np.arange(0, 14, 2)


def assert_well_formed(ds: GraphDataset) -> None:
    """Invariants every loader promises beyond GraphDataset.validate: no self loops or duplicates, finite, disjoint."""
    src, dst = ds.edges()
    assert not np.any(src == dst), "self loops must be removed"
    assert np.unique(dst * ds.num_nodes + src).shape[0] == ds.num_edges, "duplicate edges must be removed"
    assert np.isfinite(ds.features).all()
    assert not (ds.train_masks & ds.val_masks).any()
    assert not (ds.train_masks & ds.test_masks).any()
    assert not (ds.val_masks & ds.test_masks).any()


def assert_symmetric(ds: GraphDataset) -> None:
    src, dst = ds.edges()
    forward = np.sort(dst * ds.num_nodes + src)
    backward = np.sort(src * ds.num_nodes + dst)
    np.testing.assert_array_equal(forward, backward)


# ---------------------------------------------------------------------- real data
@pytest.mark.parametrize(
    ("name", "num_nodes", "num_edges", "num_features", "num_classes", "sizes"),
    [("cora", 2708, 10556, 1433, 7, (140, 500, 1000)),
     ("citeseer", 3327, 9104, 3703, 6, (120, 500, 1000))],
)
def test_planetoid_counts(dataset_dir: Callable[[str], Path], name: str, num_nodes: int, num_edges: int,
                          num_features: int, num_classes: int, sizes: tuple[int, int, int]) -> None:
    ds = load_dataset(name, dataset_dir(name))
    assert (ds.num_nodes, ds.num_edges, ds.num_features, ds.num_classes) == (num_nodes, num_edges, num_features,
                                                                             num_classes)
    assert ds.num_splits == 1 and ds.metric == "accuracy"
    train, val, test = ds.split(0)
    assert (int(train.sum()), int(val.sum()), int(test.sum())) == sizes
    # Kipf split: the first len(y) nodes train, the next 500 validate.
    assert train[:sizes[0]].all() and val[sizes[0]:sizes[0] + 500].all()
    assert_well_formed(ds)
    assert_symmetric(ds)
    # Row-normalised: every non-empty feature row sums to one.
    row_sums = ds.features.sum(axis=1)
    np.testing.assert_allclose(row_sums[row_sums > 0], 1.0, rtol=1e-5)


def test_cora_class_counts_match_pyg(dataset_dir: Callable[[str], Path]) -> None:
    ds = load_dataset("cora", dataset_dir("cora"))
    np.testing.assert_array_equal(np.bincount(ds.labels), [351, 217, 418, 818, 426, 298, 180])


def test_citeseer_isolated_test_range_nodes(dataset_dir: Callable[[str], Path]) -> None:
    ds = load_dataset("citeseer", dataset_dir("citeseer"), row_normalize=False)
    # The 15 ids inside test.index's range but not listed in it: zero features, label 0, in no mask.
    unlisted = ~(ds.train_masks[0] | ds.val_masks[0] | ds.test_masks[0])
    unlisted[:2312] = False
    assert int(unlisted.sum()) == 15 == ds.extra["num_unlisted_test_range_nodes"]
    assert not ds.features[unlisted].any()
    assert (ds.labels[unlisted] == 0).all()
    assert (ds.features.sum(axis=1) == 0).sum() == 15
    # Without normalisation the bag-of-words features stay binary.
    assert ((ds.features == 0) | (ds.features == 1)).all()


def test_tolokers(dataset_dir: Callable[[str], Path]) -> None:
    ds = load_dataset("tolokers", dataset_dir("tolokers"))
    assert (ds.num_nodes, ds.num_edges, ds.num_features, ds.num_classes) == (11758, 1038000, 10, 2)
    assert ds.num_splits == 10 and ds.metric == "roc_auc"
    assert ds.train_masks.sum(axis=1).tolist() == [5879] * 10
    assert_well_formed(ds)
    assert_symmetric(ds)


# ---------------------------------------------------------------------- tiny files
def check_tiny(ds: GraphDataset, tiny: dict[str, np.ndarray], num_splits: int) -> None:
    assert ds.num_nodes == 6 and ds.num_edges == 12 and ds.num_classes == 3
    np.testing.assert_array_equal(ds.indptr, RING_INDPTR)
    np.testing.assert_array_equal(ds.features, tiny["features"])
    np.testing.assert_array_equal(ds.labels, tiny["labels"])
    np.testing.assert_array_equal(ds.train_masks, tiny["train"][:num_splits])
    np.testing.assert_array_equal(ds.val_masks, tiny["val"][:num_splits])
    np.testing.assert_array_equal(ds.test_masks, tiny["test"][:num_splits])
    assert_symmetric(ds)


def test_heterophilous_multiclass_npz_uses_accuracy(hetero_npz: Path, tiny: dict[str, np.ndarray]) -> None:
    ds = load_dataset("roman-empire", hetero_npz)  # the .npz path itself is accepted
    check_tiny(ds, tiny, num_splits=2)
    assert ds.metric == "accuracy"


def test_edgelist_with_masks(edgelist_dir: Path, tiny: dict[str, np.ndarray]) -> None:
    ds = load_dataset("edgelist", edgelist_dir)
    check_tiny(ds, tiny, num_splits=2)
    assert ds.name == "tiny_edgelist"


def test_edgelist_whitespace_directed_random_split(edgelist_dir: Path) -> None:
    (edgelist_dir / "edges.csv").unlink()
    (edgelist_dir / "edges.txt").write_text("0 1.0  # trailing comment\n1\t2\n2 2\n2 3\n2 3\n")
    for mask in ("train_mask", "val_mask", "test_mask"):
        (edgelist_dir / f"{mask}.npy").unlink()
    ds = load_dataset("edgelist", edgelist_dir, undirected=False, seed=3)
    # Directed, self loop and duplicate dropped: 0->1, 1->2, 2->3.
    src, dst = ds.edges()
    assert sorted(zip(src.tolist(), dst.tolist())) == [(0, 1), (1, 2), (2, 3)]
    assert ds.num_splits == 1
    sizes = [int(m.sum()) for m in ds.split(0)]
    assert sizes == [4, 1, 1]  # round(0.6 * 6), round(0.2 * 6), the rest
    assert_well_formed(ds)
    again = load_dataset("edgelist", edgelist_dir, undirected=False, seed=3)
    np.testing.assert_array_equal(again.train_masks, ds.train_masks)


def test_edgelist_binary_edges_npy(edgelist_dir: Path, tiny: dict[str, np.ndarray]) -> None:
    (edgelist_dir / "edges.csv").unlink()
    np.save(edgelist_dir / "edges.npy", tiny["edges"].astype(np.int32))
    ds = load_dataset("edgelist", edgelist_dir)
    check_tiny(ds, tiny, num_splits=2)


def test_ogb_layout(ogb_dir: Path, tiny: dict[str, np.ndarray]) -> None:
    ds = load_dataset("ogb", ogb_dir)
    check_tiny(ds, tiny, num_splits=1)
    assert ds.extra == {"num_unlabeled": 0, "split_name": "time"}


def test_ogb_nan_labels_are_unlabeled(tmp_path: Path, make_ogb_layout: Callable[..., Path],
                                      tiny: dict[str, np.ndarray]) -> None:
    labels = tiny["labels"].astype(float)
    labels[2] = np.nan
    root = make_ogb_layout(tmp_path / "nan", labels=labels)
    pd.DataFrame([3]).to_csv(root / "split" / "time" / "valid.csv.gz", header=False, index=False)
    ds = load_dataset("ogb", root, to_undirected=False)
    assert ds.extra["num_unlabeled"] == 1 and ds.labels[2] == 0
    assert not (ds.train_masks | ds.val_masks | ds.test_masks)[0, 2]
    assert ds.num_edges == 6  # directed: each edge stored once


@pytest.mark.dgl
def test_dgl_binary_folder_and_2d_masks(tmp_path: Path, make_dgl_bin: Callable[..., Path],
                                        tiny: dict[str, np.ndarray]) -> None:
    make_dgl_bin(tmp_path / "ring.bin")
    ds = load_dataset("dgl", tmp_path)
    check_tiny(ds, tiny, num_splits=2)
    assert ds.name == "ring"


def test_registry_names() -> None:
    assert {"cora", "citeseer", "tolokers", "dgl", "ogb", "edgelist", "synthetic"} <= set(DATASET_NAMES)


def test_synthetic_dispatch() -> None:
    pytest.importorskip("gnnscale.data.synthetic", reason="gnnscale/data/synthetic.py not written yet")
    ds = load_dataset("synthetic", None, num_nodes=2000, avg_degree=4, num_classes=3, feat_dim=8, seed=0,
                      community_size=100)
    assert ds.num_nodes == 2000 and ds.num_classes == 3 and ds.num_features == 8
