"""Shared fixtures: where the real datasets live, and skipping when they (or dgl) are absent."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np
import pandas as pd
import pytest

# ../shared/datasets relative to the repository root (tests/ is one level below it).
SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def read_strict_json(path: Path) -> dict:
    """Parse a JSON file we wrote as a strict parser would: NaN, Infinity and -Infinity are refused."""
    def refuse(constant: str) -> None:
        raise ValueError(f"{path} holds {constant}, which is not JSON")

    return json.loads(Path(path).read_text(), parse_constant=refuse)


def shared_dataset_dir(name: str) -> Path:
    """Path of ``../shared/datasets/<name>``; skips the calling test when the folder is absent."""
    path = SHARED_DATASETS / name
    if not path.is_dir():
        pytest.skip(f"real dataset {name!r} not available: {path} does not exist "
                    f"(the shared/datasets folder is not checked out on this machine)")
    return path


DGL_SKIP_REASON = ("needs dgl, the optional [dgl] extra: scripts/dev.sh test-dgl runs it in .venv-dgl "
                   "(Python 3.11, torch 2.2.1, dgl 2.1.0)")
NOT_MARKED = ("skips where dgl is absent but is not marked dgl, so scripts/dev.sh test-dgl (-m dgl, CI's DGL "
              "environment) never runs it: add @pytest.mark.dgl, or pytestmark = pytest.mark.dgl above the import")


def _marks_dgl(marks: object) -> bool:
    """Whether a ``pytestmark`` value (one mark or a list) holds the ``dgl`` mark."""
    marks = marks if isinstance(marks, (list, tuple)) else [marks]
    return any(getattr(mark, "name", None) == "dgl" for mark in marks)


def import_dgl_or_skip() -> ModuleType:
    """``import dgl``, or skip the calling test with the reason.

    Not ``pytest.importorskip``: with a torch newer than 2.2.1 ``import dgl`` raises
    OSError/FileNotFoundError (its C++ libraries are missing), not ImportError.  Called at
    module level, it skips the whole module, which must set ``pytestmark = pytest.mark.dgl``
    first (checked here, with or without dgl); a test that calls it must be marked ``dgl``
    (checked by :func:`pytest_runtest_makereport` where dgl is absent).
    """
    caller = sys._getframe(1)  # noqa: SLF001 - the module-level caller's globals hold its pytestmark
    if caller.f_code.co_name == "<module>" and not _marks_dgl(caller.f_globals.get("pytestmark")):
        raise RuntimeError(f"{caller.f_globals.get('__name__')}: {NOT_MARKED}")
    try:
        import dgl  # noqa: PLC0415 - optional
    except Exception as error:  # noqa: BLE001 - see the docstring
        pytest.skip(f"{DGL_SKIP_REASON}: {type(error).__name__}: {error}", allow_module_level=True)
    return dgl


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """Fail a test that skips for lack of dgl without the ``dgl`` mark: CI's DGL environment would miss it."""
    report = yield
    if report.skipped and DGL_SKIP_REASON in str(report.longrepr) and item.get_closest_marker("dgl") is None:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} {NOT_MARKED}"
    return report


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The ``../shared/datasets`` folder (it may be absent: use ``dataset_dir`` to skip)."""
    return SHARED_DATASETS


@pytest.fixture
def dataset_dir() -> Callable[[str], Path]:
    """``dataset_dir("cora")`` -> the folder, or skip the test with a reason when it is absent."""
    return shared_dataset_dir


# ---------------------------------------------------------------------- tiny on-disk datasets
# Six nodes on a ring (each undirected edge stored once), three classes, two splits
# where a format allows it.  Error tests write one of these and then break one thing.
TINY_EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0]], dtype=np.int64)
TINY_LABELS = np.array([0, 1, 2, 0, 1, 2], dtype=np.int64)
TINY_FEATURES = np.arange(24, dtype=np.float32).reshape(6, 4)
TINY_TRAIN = np.array([[1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]], dtype=bool)
TINY_VAL = np.array([[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1]], dtype=bool)
TINY_TEST = np.array([[0, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0]], dtype=bool)


@pytest.fixture
def edgelist_dir(tmp_path: Path) -> Path:
    """An edge-list folder: edges.csv with a header and a comment, .npy arrays, two-split masks."""
    folder = tmp_path / "tiny_edgelist"
    folder.mkdir()
    lines = ["# a ring", "src,dst"] + [f"{s},{d}" for s, d in TINY_EDGES]
    (folder / "edges.csv").write_text("\n".join(lines) + "\n")
    np.save(folder / "features.npy", TINY_FEATURES)
    np.save(folder / "labels.npy", TINY_LABELS)
    np.save(folder / "train_mask.npy", TINY_TRAIN)
    np.save(folder / "val_mask.npy", TINY_VAL)
    np.save(folder / "test_mask.npy", TINY_TEST)
    return folder


@pytest.fixture
def hetero_npz(tmp_path: Path) -> Path:
    """A heterophilous-graphs style ``tiny.npz`` (three classes, two splits)."""
    path = tmp_path / "tiny.npz"
    np.savez(path, node_features=TINY_FEATURES, node_labels=TINY_LABELS, edges=TINY_EDGES,
             train_masks=TINY_TRAIN, val_masks=TINY_VAL, test_masks=TINY_TEST)
    return path


def write_ogb_layout(root: Path, labels: np.ndarray | None = None) -> Path:
    """Write the OGB raw layout (gzip CSVs, split ``time``) for the tiny ring; labels may hold NaN."""
    labels = TINY_LABELS.astype(float) if labels is None else labels
    raw = root / "raw"
    split = root / "split" / "time"
    raw.mkdir(parents=True)
    split.mkdir(parents=True)
    pd.DataFrame(TINY_EDGES).to_csv(raw / "edge.csv.gz", header=False, index=False)
    pd.DataFrame(TINY_FEATURES).to_csv(raw / "node-feat.csv.gz", header=False, index=False)
    pd.DataFrame(labels).to_csv(raw / "node-label.csv.gz", header=False, index=False)
    pd.DataFrame([len(TINY_LABELS)]).to_csv(raw / "num-node-list.csv.gz", header=False, index=False)
    for part, mask in (("train", TINY_TRAIN[0]), ("valid", TINY_VAL[0]), ("test", TINY_TEST[0])):
        pd.DataFrame(np.flatnonzero(mask)).to_csv(split / f"{part}.csv.gz", header=False, index=False)
    return root


@pytest.fixture
def ogb_dir(tmp_path: Path) -> Path:
    """An extracted-OGB style folder ``tiny_ogb/{raw,split/time}``."""
    return write_ogb_layout(tmp_path / "tiny_ogb")


@pytest.fixture
def make_ogb_layout() -> Callable[..., Path]:
    """:func:`write_ogb_layout`, for tests that need other labels."""
    return write_ogb_layout


def write_dgl_bin(path: Path, drop: str | None = None) -> Path:
    """``dgl.save_graphs`` the tiny ring (both directions stored) with [N, 2] masks; ``drop`` omits one ndata key."""
    dgl = import_dgl_or_skip()
    import torch
    src = np.concatenate([TINY_EDGES[:, 0], TINY_EDGES[:, 1]])
    dst = np.concatenate([TINY_EDGES[:, 1], TINY_EDGES[:, 0]])
    graph = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=6)
    ndata = {"feat": torch.from_numpy(TINY_FEATURES), "label": torch.from_numpy(TINY_LABELS),
             "train_mask": torch.from_numpy(TINY_TRAIN.T.copy()), "val_mask": torch.from_numpy(TINY_VAL.T.copy()),
             "test_mask": torch.from_numpy(TINY_TEST.T.copy())}
    for key, value in ndata.items():
        if key != drop:
            graph.ndata[key] = value
    dgl.save_graphs(str(path), [graph])
    return path


@pytest.fixture
def make_dgl_bin() -> Callable[..., Path]:
    """:func:`write_dgl_bin`, for tests that need a broken graph."""
    return write_dgl_bin


@pytest.fixture
def tiny() -> dict[str, np.ndarray]:
    """The arrays the tiny datasets were written from: edges, labels, features, train, val, test."""
    return {"edges": TINY_EDGES, "labels": TINY_LABELS, "features": TINY_FEATURES,
            "train": TINY_TRAIN, "val": TINY_VAL, "test": TINY_TEST}
