"""Every way a loader refuses bad input: one DatasetError naming the file, the field and the fix."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest

from conftest import import_dgl_or_skip
from gnnscale.data.dataset import DatasetError
from gnnscale.data.dgl_binary import DGLUnavailableError
from gnnscale.data.loaders import load_dataset
from gnnscale.data.planetoid import read_array_pickle

PLANETOID_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")


# ---------------------------------------------------------------------- registry
def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError,
                       match=r"unknown dataset 'corra'; valid names: cora, citeseer, .*edgelist.*synthetic"):
        load_dataset("corra", "/nowhere")


def test_missing_data_dir_argument() -> None:
    with pytest.raises(DatasetError, match=r"cora: data_dir: no data directory given; pass the folder"):
        load_dataset("cora", None)


def test_synthetic_rejects_data_dir_and_unknown_options() -> None:
    with pytest.raises(ValueError, match=r"generated, not read.*pass None"):
        load_dataset("synthetic", "/some/dir")
    pytest.importorskip("gnnscale.data.synthetic", reason="gnnscale/data/synthetic.py not written yet")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['num_nodez'\]; valid: .*num_nodes"):
        load_dataset("synthetic", None, num_nodez=10)


# ---------------------------------------------------------------------- planetoid
class _SystemCall:
    """Unpickling this runs ``os.system(command)``: the classic pickle payload."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def _planetoid_dir(folder: Path, x_bytes: bytes) -> Path:
    """A cora-named folder where ``ind.cora.x`` holds ``x_bytes`` and the other files are placeholders."""
    folder.mkdir()
    for part in PLANETOID_PARTS:
        (folder / f"ind.cora.{part}").write_bytes(b"")
    (folder / "ind.cora.x").write_bytes(x_bytes)
    return folder


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "payload_ran"
    payload = pickle.dumps(_SystemCall(f"touch {marker}"), protocol=protocol)
    folder = _planetoid_dir(tmp_path / "cora", payload)
    refused = r"ind\.cora\.x: pickle: holds a non-array object \(global (posix|os)\.system\); refusing"
    with pytest.raises(DatasetError, match=refused):
        load_dataset("cora", folder)
    assert not marker.exists(), "the pickle payload must not run"


def test_pickle_naming_eval_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pkl"
    path.write_bytes(b"\x80\x02cbuiltins\neval\nq\x00X\x06\x00\x00\x001 + 1q\x01\x85q\x02Rq\x03.")
    with pytest.raises(DatasetError, match=r"evil\.pkl: pickle: holds a non-array object \(global builtins\.eval\)"):
        read_array_pickle(path)


def test_pickle_of_non_array_is_refused(tmp_path: Path) -> None:
    folder = _planetoid_dir(tmp_path / "cora", pickle.dumps({"not": "an array"}, protocol=2))
    with pytest.raises(DatasetError, match=r"ind\.cora\.x: pickle: holds a dict, expected a feature matrix"):
        load_dataset("cora", folder)


def test_truncated_pickle(tmp_path: Path) -> None:
    folder = _planetoid_dir(tmp_path / "cora", pickle.dumps(np.zeros(3), protocol=2)[:20])
    with pytest.raises(DatasetError, match=r"ind\.cora\.x: pickle: cannot be read .*re-download the file"):
        load_dataset("cora", folder)


def test_planetoid_missing_folder_and_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError,
                       match=r"nope: data_dir: folder not found; download ind\.cora\..*kimiyoung/planetoid"):
        load_dataset("cora", tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match=r"ind\.citeseer\.x: x: file not found; download .* into .*empty"):
        load_dataset("citeseer", tmp_path / "empty")


# ---------------------------------------------------------------------- heterophilous npz
def test_npz_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"tolokers\.npz: npz: file not found; download tolokers\.npz from "
                                           r"https://github\.com/yandex-research/heterophilous-graphs"):
        load_dataset("tolokers", tmp_path)


def test_npz_missing_key(tmp_path: Path, tiny: dict[str, np.ndarray]) -> None:
    path = tmp_path / "tolokers.npz"
    np.savez(path, node_features=tiny["features"], node_labels=tiny["labels"],
             train_masks=tiny["train"], val_masks=tiny["val"], test_masks=tiny["test"])
    with pytest.raises(DatasetError, match=r"tolokers\.npz: edges: key missing .*re-download"):
        load_dataset("tolokers", tmp_path)


def test_npz_object_array_is_refused(tmp_path: Path, tiny: dict[str, np.ndarray]) -> None:
    path = tmp_path / "tolokers.npz"
    np.savez(path, node_features=np.array([object()] * 6, dtype=object), node_labels=tiny["labels"],
             edges=tiny["edges"], train_masks=tiny["train"], val_masks=tiny["val"], test_masks=tiny["test"])
    with pytest.raises(DatasetError, match=r"tolokers\.npz: npz: holds a non-array object"):
        load_dataset("tolokers", tmp_path)


def test_npz_bad_mask_shape(tmp_path: Path, tiny: dict[str, np.ndarray]) -> None:
    path = tmp_path / "tiny.npz"
    np.savez(path, node_features=tiny["features"], node_labels=tiny["labels"], edges=tiny["edges"],
             train_masks=tiny["train"][:, :5], val_masks=tiny["val"], test_masks=tiny["test"])
    with pytest.raises(DatasetError,
                       match=r"tiny\.npz: train_masks: expected bool \[num_splits, 6\], got bool \[2, 5\]"):
        load_dataset("tolokers", path)


def test_npz_edges_out_of_range(tmp_path: Path, tiny: dict[str, np.ndarray]) -> None:
    path = tmp_path / "tiny.npz"
    np.savez(path, node_features=tiny["features"], node_labels=tiny["labels"], edges=np.array([[0, 1], [2, 9]]),
             train_masks=tiny["train"], val_masks=tiny["val"], test_masks=tiny["test"])
    with pytest.raises(DatasetError, match=r"tiny\.npz: edges: edge 1 \(2 -> 9\) has a node id outside \[0, 6\)"):
        load_dataset("tolokers", path)


# ---------------------------------------------------------------------- edge-list folder
def test_edgelist_missing_folder_and_edges(tmp_path: Path, edgelist_dir: Path) -> None:
    with pytest.raises(DatasetError, match=r"missing: data_dir: folder not found"):
        load_dataset("edgelist", tmp_path / "missing")
    (edgelist_dir / "edges.csv").unlink()
    with pytest.raises(DatasetError, match=r"edges\.csv: edges: file not found \(nor edges\.txt\); put the edge list"):
        load_dataset("edgelist", edgelist_dir)


def test_edgelist_bad_or_ambiguous_edges_npy(edgelist_dir: Path) -> None:
    np.save(edgelist_dir / "edges.npy", np.array([[0, 1], [1, 2]]))
    with pytest.raises(DatasetError, match=r"edges: several edge files exist \(edges\.csv, edges\.npy\); keep only one"):
        load_dataset("edgelist", edgelist_dir)
    (edgelist_dir / "edges.csv").unlink()
    np.save(edgelist_dir / "edges.npy", np.array([0.0, 1.0, 2.0]))
    with pytest.raises(DatasetError, match=r"edges\.npy: edges: expected an integer array of shape \[num_edges, 2\], "
                                           r"got float64 \[3\]; save np\.stack"):
        load_dataset("edgelist", edgelist_dir)


def test_edgelist_feature_rows_mismatch(edgelist_dir: Path, tiny: dict[str, np.ndarray]) -> None:
    np.save(edgelist_dir / "features.npy", tiny["features"][:5])
    with pytest.raises(DatasetError, match=r"features\.npy: features: expected shape \[6, num_features\], "
                                           r"got \[5, 4\]; give one feature row per node"):
        load_dataset("edgelist", edgelist_dir)


def test_edgelist_nan_features(edgelist_dir: Path, tiny: dict[str, np.ndarray]) -> None:
    features = tiny["features"].copy()
    features[3, 1] = np.nan
    np.save(edgelist_dir / "features.npy", features)
    with pytest.raises(DatasetError, match=r"features\.npy: features: non-finite value \(NaN or inf\) in row 3; clean"):
        load_dataset("edgelist", edgelist_dir)


@pytest.mark.parametrize(("edge", "message"), [("2,6", r"edge 3 \(2 -> 6\) has a node id outside \[0, 6\)"),
                                               ("-1,2", r"edge 3 \(-1 -> 2\) has a node id outside \[0, 6\)")])
def test_edgelist_node_id_out_of_range(edgelist_dir: Path, edge: str, message: str) -> None:
    (edgelist_dir / "edges.csv").write_text(f"src,dst\n0,1\n1,2\n2,3\n{edge}\n")
    with pytest.raises(DatasetError, match=rf"edges\.csv: edges: {message} .*0-based"):
        load_dataset("edgelist", edgelist_dir)


def test_edgelist_bad_columns(edgelist_dir: Path) -> None:
    (edgelist_dir / "edges.csv").write_text("0,1,0.5\n1,2,0.5\n")
    with pytest.raises(DatasetError, match=r"edges\.csv: edges: expected 2 columns \(src, dst\), got 3"):
        load_dataset("edgelist", edgelist_dir)
    (edgelist_dir / "edges.csv").write_text("0,1\n1,x\n")
    with pytest.raises(DatasetError, match=r"edges\.csv: edges: edge 1 has a missing or non-integer node id 'x'"):
        load_dataset("edgelist", edgelist_dir)
    (edgelist_dir / "edges.csv").write_text("0 1\n1 2.5\n")
    with pytest.raises(DatasetError, match=r"edges\.csv: edges: edge 1 has a missing or non-integer node id 2\.5"):
        load_dataset("edgelist", edgelist_dir)


def test_edgelist_labels_out_of_range(edgelist_dir: Path, tiny: dict[str, np.ndarray]) -> None:
    with pytest.raises(DatasetError, match=r"labels\.npy: labels: label 2 is out of range \[0, 2\)"):
        load_dataset("edgelist", edgelist_dir, num_classes=2)
    np.save(edgelist_dir / "labels.npy", tiny["labels"] - 1)
    with pytest.raises(DatasetError, match=r"labels\.npy: labels: label -1 is negative; labels must be class ids"):
        load_dataset("edgelist", edgelist_dir)
    np.save(edgelist_dir / "labels.npy", tiny["labels"] + 0.5)
    with pytest.raises(DatasetError, match=r"labels\.npy: labels: values are not whole numbers"):
        load_dataset("edgelist", edgelist_dir)


def test_edgelist_object_npy_is_refused(edgelist_dir: Path) -> None:
    np.save(edgelist_dir / "labels.npy", np.array([{"a": 1}] * 6, dtype=object), allow_pickle=True)
    with pytest.raises(DatasetError, match=r"labels\.npy: labels: is not a plain numeric \.npy array"):
        load_dataset("edgelist", edgelist_dir)


def test_edgelist_mask_problems(edgelist_dir: Path, tiny: dict[str, np.ndarray]) -> None:
    np.save(edgelist_dir / "val_mask.npy", tiny["val"].astype(np.int8))
    with pytest.raises(DatasetError, match=r"val_mask\.npy: val_mask: expected dtype bool, got int8"):
        load_dataset("edgelist", edgelist_dir)
    np.save(edgelist_dir / "val_mask.npy", tiny["train"])
    with pytest.raises(DatasetError, match=r"val_mask\.npy: val_mask: node 0 of split 0 is also in train_mask; "
                                           r"make train, val and test masks disjoint"):
        load_dataset("edgelist", edgelist_dir)
    (edgelist_dir / "val_mask.npy").unlink()
    with pytest.raises(DatasetError, match=r"val_mask\.npy: val_mask: file not found, but other mask files exist"):
        load_dataset("edgelist", edgelist_dir)


# ---------------------------------------------------------------------- DGL binary
@pytest.mark.dgl
def test_dgl_missing_ndata_key(tmp_path: Path, make_dgl_bin: Callable[..., Path]) -> None:
    path = make_dgl_bin(tmp_path / "g.bin", drop="label")
    with pytest.raises(DatasetError, match=r"g\.bin: ndata\['label'\]: missing .*dgl\.save_graphs"):
        load_dataset("dgl", path)


@pytest.mark.dgl
def test_dgl_folder_without_single_bin(tmp_path: Path, make_dgl_bin: Callable[..., Path]) -> None:
    with pytest.raises(DatasetError, match=r"data_dir: expected exactly one \.bin file in the folder, found none"):
        load_dataset("dgl", tmp_path)
    make_dgl_bin(tmp_path / "a.bin")
    make_dgl_bin(tmp_path / "b.bin")
    with pytest.raises(DatasetError, match=r"found a\.bin, b\.bin; pass the path of the graph file itself"):
        load_dataset("dgl", tmp_path)


def test_dgl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"g\.bin: graph: file not found; write the graph with dgl\.save_graphs"):
        load_dataset("dgl", tmp_path / "g.bin")


def test_dgl_not_importable_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dgl", None)  # `import dgl` now raises ImportError
    (tmp_path / "g.bin").write_bytes(b"a graph")
    with pytest.raises(DGLUnavailableError, match=r"g\.bin: dgl: .*needs dgl, which cannot be imported "
                                                  r"\(ModuleNotFoundError: .*pip install 'gnnscale\[dgl\]'") as info:
        load_dataset("dgl", tmp_path / "g.bin")
    assert isinstance(info.value, ImportError) and "\n" not in str(info.value)


@pytest.mark.dgl
def test_dgl_unreadable_file(tmp_path: Path) -> None:
    import_dgl_or_skip()
    (tmp_path / "g.bin").write_bytes(b"not a graph")
    with pytest.raises(DatasetError, match=r"g\.bin: graph: cannot be read by dgl\.load_graphs"):
        load_dataset("dgl", tmp_path / "g.bin")


# ---------------------------------------------------------------------- OGB raw layout
def test_ogb_missing_raw(tmp_path: Path) -> None:
    (tmp_path / "arxiv").mkdir()
    with pytest.raises(DatasetError, match=r"arxiv/raw: raw: folder not found; download and extract .*snap\.stanford"):
        load_dataset("ogb", tmp_path / "arxiv")


def test_ogb_missing_file(ogb_dir: Path) -> None:
    (ogb_dir / "raw" / "node-feat.csv.gz").unlink()
    with pytest.raises(DatasetError, match=r"node-feat\.csv\.gz: features: file not found; .*without node features"):
        load_dataset("ogb", ogb_dir)


def test_ogb_split_choice(ogb_dir: Path) -> None:
    (ogb_dir / "split" / "random").mkdir()
    with pytest.raises(DatasetError, match=r"split: split_name: choose one of \['random', 'time'\]; pass split_name="):
        load_dataset("ogb", ogb_dir)
    with pytest.raises(DatasetError, match=r"split_name: 'species' not found; available: \['random', 'time'\]"):
        load_dataset("ogb", ogb_dir, split_name="species")


def test_ogb_split_lists_unlabeled_node(tmp_path: Path, make_ogb_layout: Callable[..., Path],
                                        tiny: dict[str, np.ndarray]) -> None:
    labels = tiny["labels"].astype(float)
    labels[2] = np.nan  # node 2 is in split 0's validation set
    root = make_ogb_layout(tmp_path / "nan", labels=labels)
    with pytest.raises(DatasetError, match=r"valid\.csv\.gz: valid: lists 1 node\(s\) whose label is NaN"):
        load_dataset("ogb", root)


def test_ogb_multilabel_and_bad_edges(ogb_dir: Path) -> None:
    pd.DataFrame(np.zeros((6, 3))).to_csv(ogb_dir / "raw" / "node-label.csv.gz", header=False, index=False)
    with pytest.raises(DatasetError, match=r"node-label\.csv\.gz: labels: has 3 columns: a multi-label task"):
        load_dataset("ogb", ogb_dir)
    pd.DataFrame([[0, 1], [1, 7]]).to_csv(ogb_dir / "raw" / "edge.csv.gz", header=False, index=False)
    with pytest.raises(DatasetError, match=r"edge\.csv\.gz: edges: edge 1 \(1 -> 7\) has a node id outside \[0, 6\)"):
        load_dataset("ogb", ogb_dir)
