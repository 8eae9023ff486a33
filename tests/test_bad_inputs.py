"""Every entry point, run as a user runs it, against a corpus of bad inputs.

Each case is one subprocess (``scripts/train_node_classification.py``,
``scripts/train_temporal.py``, ``python -m partition`` or ``python -m partition verify``) in a
folder of its own that holds a good input with exactly one thing wrong.  For every case:

* the exit status is non-zero;
* stderr is exactly one line, the error (``error: ...`` or ``verify failed: ...``), naming the
  problem; no traceback;
* nothing in the case's folder changed: the input is untouched, the output path is absent or
  unchanged, and no temporary file is left behind (the folder is hashed before and after).

Positive controls run the same commands on the unbroken inputs and must succeed, so a case
fails only because of its one flaw.  Cases run two at a time: most cost one interpreter start
and a torch import.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from unittest import mock

import numpy as np
import pytest
import torch

from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
import partition.partitioner
from partition import PartitionConfig, partition_graph

ROOT = Path(__file__).resolve().parents[1]
ENTRY = {
    "train": [sys.executable, str(ROOT / "scripts" / "train_node_classification.py")],
    "temporal": [sys.executable, str(ROOT / "scripts" / "train_temporal.py")],
    "partition": [sys.executable, "-m", "partition"],
    "verify": [sys.executable, "-m", "partition", "verify"],
}
# A good run of each entry point, completed by the case's own flags ({d} is the case's folder).
GOOD = {
    "train": ["--dataset", "edgelist", "--data-dir", "{d}/graph", "--epochs", "1", "--batch-size", "16",
              "--hidden", "8", "--num-workers", "0", "--out", "{d}/out", "--quiet"],
    "temporal": ["--dataset", "csv", "--data-dir", "{d}/events.csv", "--epochs", "1", "--batch-size", "50",
                 "--memory-dim", "8", "--time-dim", "8", "--embedding-dim", "8", "--out", "{d}/out", "--quiet"],
    "partition": ["--dataset", "edgelist", "--data-dir", "{d}/graph", "--num-parts", "2", "--out", "{d}/out",
                  "--quiet"],
    "verify": ["--quiet"],
}
CASE_TIMEOUT_S = 120


# ---------------------------------------------------------------------- inputs
def write_graph(folder: Path, num_nodes: int = 60) -> None:
    """An edge-list folder: a random graph of 3 classes whose label shows in the features."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    labels = rng.integers(0, 3, num_nodes)
    features = (np.eye(3)[labels] + 0.3 * rng.standard_normal((num_nodes, 3))).astype(np.float32)
    src, dst = rng.integers(0, num_nodes, 4 * num_nodes), rng.integers(0, num_nodes, 4 * num_nodes)
    (folder / "edges.csv").write_text("src,dst\n" + "".join(f"{s},{d}\n" for s, d in zip(src, dst)))
    np.save(folder / "features.npy", features)
    np.save(folder / "labels.npy", labels)
    part = np.arange(num_nodes) % 5
    np.save(folder / "train_mask.npy", part < 3)
    np.save(folder / "val_mask.npy", part == 3)
    np.save(folder / "test_mask.npy", part == 4)


def write_events(path: Path, num_events: int = 400, num_nodes: int = 30) -> None:
    """A JODIE-layout CSV of random events at rising times."""
    rng = np.random.default_rng(1)
    src = rng.integers(0, num_nodes // 2, num_events)
    dst = rng.integers(num_nodes // 2, num_nodes, num_events)
    rows = "".join(f"{s},{d},{t},0\n" for s, d, t in zip(src, dst, np.arange(num_events) * 10))
    path.write_text("u,i,ts,label\n" + rows)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def replace_array(root: Path, rel: str, array: np.ndarray) -> None:
    """Rewrite one array of a partition folder and its manifest entry: damage that checksums cannot see."""
    np.save(root / rel, array)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"][rel].update(sha256=sha256(root / rel), bytes=(root / rel).stat().st_size)
    (root / "manifest.json").write_text(json.dumps(manifest))


def corrupt(rel: str, change: Callable[[np.ndarray], np.ndarray | None]) -> Callable[[Path], None]:
    """Damage one array of ``parts`` in place (or replace it by what ``change`` returns), checksums recomputed."""
    def setup(d: Path) -> None:
        array = np.load(d / "parts" / rel)
        changed = change(array)
        replace_array(d / "parts", rel, array if changed is None else changed)
    return setup


def edit_manifest(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        manifest = json.loads((d / "parts" / "manifest.json").read_text())
        change(manifest)
        (d / "parts" / "manifest.json").write_text(json.dumps(manifest))
    return setup


class SystemCall:
    """Unpickling this runs ``os.system(command)``: the classic malicious payload."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def planetoid_with_x(x_bytes: bytes) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        folder = d / "cora"
        folder.mkdir()
        for part in ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index"):
            (folder / f"ind.cora.{part}").write_bytes(b"")
        (folder / "ind.cora.x").write_bytes(x_bytes(d) if callable(x_bytes) else x_bytes)
    return setup


def save_in_graph(name: str, array: np.ndarray) -> Callable[[Path], None]:
    return lambda d: np.save(d / "graph" / f"{name}.npy", array)


def write_text(rel: str, text: str) -> Callable[[Path], None]:
    return lambda d: (d / rel).parent.mkdir(parents=True, exist_ok=True) or (d / rel).write_text(text)


def events_text(text: str) -> Callable[[Path], None]:
    return write_text("events.csv", "u,i,ts,label\n" + text)


def empty_partition_folder(d: Path) -> None:
    """``d/parts``: two partitions, the first empty, as ``partition`` wrote them before it refused that."""
    synthetic = generate_synthetic(SyntheticConfig(num_nodes=300, avg_degree=4, feat_dim=4, num_classes=3))
    all_in_one = lambda dataset, config: (np.ones(dataset.num_nodes, dtype=np.int64), {"method": "metis"})
    with mock.patch.object(partition.partitioner, "assign_parts", all_in_one), \
            mock.patch.object(partition.partitioner, "check_assignment", lambda *args: None):
        partition_graph(synthetic, d / "parts", PartitionConfig(num_parts=2))


def malicious_checkpoint(d: Path) -> None:
    torch.save({"format_version": 1, "payload": SystemCall(f"touch {d}/payload_ran")}, d / "out" / "checkpoint.pt")


def truncate(rel: str, keep: float = 0.5) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        data = (d / rel).read_bytes()
        (d / rel).write_bytes(data[:int(len(data) * keep)])
    return setup


# ---------------------------------------------------------------------- the corpus
@dataclass
class Case:
    id: str
    entry: str
    argv: list[str]
    message: str  # must appear in the one line on stderr ({d} is the case's folder)
    setup: Callable[[Path], None] | None = None
    inputs: tuple[str, ...] = ("graph",)  # good inputs copied into the folder before setup
    good: bool = True  # prefix argv with GOOD[entry]
    exit_code: int = 2

    def command(self, d: Path) -> list[str]:
        argv = (GOOD[self.entry] if self.good else []) + self.argv
        return ENTRY[self.entry] + [arg.replace("{d}", str(d)) for arg in argv]


def train(case_id: str, argv: list[str], message: str, setup=None, **kw) -> Case:
    return Case(case_id, "train", argv, message, setup, **kw)


def temporal(case_id: str, argv: list[str], message: str, setup=None, **kw) -> Case:
    return Case(case_id, "temporal", argv, message, setup, inputs=kw.pop("inputs", ("events.csv",)), **kw)


def on_parts(case_id: str, message: str, setup, folder: str = "parts") -> Case:
    """A plain (world of one) run on a damaged copy of a good one-part folder."""
    return Case(case_id, "train", ["--partitions", "{d}/parts", "--epochs", "1", "--batch-size", "16", "--hidden", "8",
                                   "--num-workers", "0", "--out", "{d}/out", "--quiet"],
                message, setup, inputs=((folder, "parts"),), good=False)


RANGE_CASES = [
    train("batch-size-0", ["--batch-size", "0"], "--batch-size must be >= 1, got 0 (default 1024)"),
    train("hidden-0", ["--hidden", "0"], "--hidden must be >= 1, got 0"),
    train("num-layers-0", ["--num-layers", "0"], "--num-layers must be >= 1, got 0"),
    train("dropout-1.5", ["--dropout", "1.5"], "--dropout must be >= 0 and < 1, got 1.5"),
    train("lr-nan", ["--lr", "nan"], "--lr must be > 0"),
    train("epochs-0", ["--epochs", "0"], "--epochs must be >= 1, got 0"),
    train("weight-decay-neg", ["--weight-decay", "-1"], "--weight-decay must be >= 0, got -1"),
    train("patience-neg", ["--patience", "-1"], "--patience must be >= 0, got -1"),
    train("num-workers-neg", ["--num-workers", "-1"], "--num-workers must be >= 0, got -1"),
    train("seed-neg", ["--seed", "-1"], "--seed must be >= 0, got -1"),
    train("cache-mb-neg", ["--cache-mb", "-1"], "--cache-mb must be >= 0, got -1"),
    train("wire-dtype-unknown", ["--wire-dtype", "foo"], "argument --wire-dtype: invalid choice: 'foo'"),
    train("rank-capacity-bad", ["--rank-capacity", "fast"], "--rank-capacity 'fast' is neither auto nor positive"),
    train("topology-budget-neg", ["--topology-budget-mb", "-1"], "--topology-budget-mb must be >= 0, got -1"),
    train("failure-timeout-0", ["--failure-timeout", "0"], "--failure-timeout must be > 0, got 0"),
    train("fanouts-not-numbers", ["--fanouts", "a,b"], "--fanouts 'a,b' is not a comma-separated list of integers"),
    train("fanouts-wrong-count", ["--num-layers", "3", "--fanouts", "5,5"], "got 2 fanouts for 3 layers"),
    train("split-out-of-range", ["--split", "7"], "--split 7 is out of range: the dataset has 1 split(s)"),
    train("batch-size-not-int", ["--batch-size", "ten"], "--batch-size: invalid int value: 'ten'"),
]
OUT_CASES = [
    train("out-is-a-file", [], "--out {d}/out is an existing file, not a folder", write_text("out", "a file where the run folder goes\n")),
    train("out-under-a-file", ["--out", "{d}/file/run"], "--out {d}/file/run cannot be created: {d}/file is a file", write_text("file", "not a folder\n")),
    train("out-not-creatable", ["--out", "/proc/1/gnnscale-run"],
          "--out /proc/1/gnnscale-run cannot be written: creating a file in /proc/1 failed"),
    Case("partition-out-under-a-file", "partition", ["--out", "{d}/file/parts"],
         "--out {d}/file/parts cannot be created: {d}/file is a file",
         write_text("file", "not a folder\n")),
    Case("partition-out-not-creatable", "partition", ["--out", "/proc/1/gnnscale-parts"],
         "--out /proc/1/gnnscale-parts cannot be written"),
    temporal("temporal-out-is-a-file", [], "--out {d}/out is an existing file, not a folder", write_text("out", "a file\n")),
]
RECIPE_CASES = [
    train("config-missing", ["--config", "{d}/nope.toml"], "--config {d}/nope.toml: cannot be read"),
    train("config-bad-toml", ["--config", "{d}/r.toml"], "{d}/r.toml is not valid TOML",
          write_text("r.toml", "epochs = = 3\n")),
    train("config-unknown-key", ["--config", "{d}/r.toml"], "unknown key 'epoch' in {d}/r.toml", write_text("r.toml", "epoch = 3\n")),
]
LOADER_CASES = [
    train("val-mask-empty", [], "no validation nodes", save_in_graph("val_mask", np.zeros(60, dtype=bool))),
    train("test-mask-empty", [], "no test nodes", save_in_graph("test_mask", np.zeros(60, dtype=bool))),
    train("train-mask-empty", [], "no training nodes", save_in_graph("train_mask", np.zeros(60, dtype=bool))),
    train("edgelist-missing-folder", ["--data-dir", "{d}/nope"], "{d}/nope: data_dir: folder not found"),
    train("edgelist-bad-column", [], "edges.csv: edges: edge 1 has a missing or non-integer node id 'x'", write_text("graph/edges.csv", "src,dst\n0,1\n1,x\n")),
    train("edgelist-nan-features", [], "features.npy: features: non-finite value (NaN or inf) in row 0",
          save_in_graph("features", np.full((60, 3), np.nan, dtype=np.float32))),
    train("edgelist-object-labels", [], "labels.npy: labels: is not a plain numeric .npy array", lambda d: np.save(d / "graph" / "labels.npy",
                                                                        np.array([object()] * 60), allow_pickle=True)),
    train("edgelist-short-mask", [], "train_mask.npy: train_mask: expected bool [num_splits, 60], got bool [1, 59]", save_in_graph("train_mask", np.ones(59, dtype=bool))),
    train("cora-missing", ["--dataset", "cora", "--data-dir", "{d}/nope"], "{d}/nope: data_dir: folder not found"),
    train("cora-truncated-pickle", ["--dataset", "cora", "--data-dir", "{d}/cora"], "ind.cora.x: pickle: cannot be read",
          planetoid_with_x(pickle.dumps(np.zeros(3), protocol=2)[:20])),
    train("cora-malicious-pickle", ["--dataset", "cora", "--data-dir", "{d}/cora"],
          "ind.cora.x: pickle: holds a non-array object",
          planetoid_with_x(lambda d: pickle.dumps(SystemCall(f"touch {d}/payload_ran"), protocol=2))),
    train("npz-short-labels", ["--dataset", "tolokers", "--data-dir", "{d}/npz"], "labels: expected shape [6], got [5]",
          lambda d: (d / "npz").mkdir() or np.savez(
              d / "npz" / "tolokers.npz", node_features=np.ones((6, 2), np.float32), node_labels=np.zeros(5, int),
              edges=np.array([[0, 1], [1, 2]]), train_masks=np.ones((1, 6), bool), val_masks=np.ones((1, 6), bool),
              test_masks=np.ones((1, 6), bool))),
]
PARTITION_FOLDER_CASES = [
    Case("partitions-missing", "train", ["--partitions", "{d}/nope", "--out", "{d}/out", "--quiet"],
         "{d}/nope: partition folder not found", inputs=(), good=False),
    on_parts("partitions-two-parts-one-rank", "holds 2 partition(s) but this job has 1 rank(s)", None, folder="parts2"),
    on_parts("partitions-wrong-part-count", "holds 3 partition(s) but this job has 1 rank(s)", edit_manifest(lambda m: m.update(num_parts=3))),
    on_parts("partitions-truncated-npy", "bytes, but manifest.json records", truncate("parts/part0/indices.npy")),
    on_parts("partitions-bad-json", "parts/manifest.json: not valid JSON", write_text("parts/manifest.json", "{\"format_version\": 1,")),
    on_parts("partitions-format-99", "format version 99 is newer than this gnnscale reads", edit_manifest(lambda m: m.update(format_version=99))),
    on_parts("partitions-wrong-dtype", "part0/indices.npy: holds float64",
             corrupt("part0/indices.npy", lambda a: a.astype(np.float64))),
    on_parts("partitions-source-id-too-large", "part0/indices.npy: position 3 holds 1000000, outside [0, 300)",
             corrupt("part0/indices.npy", lambda a: a.__setitem__(3, 10**6))),
    on_parts("partitions-negative-id", "part0/indices.npy: position 0 holds -1, outside [0, 300)",
             corrupt("part0/indices.npy", lambda a: a.__setitem__(0, -1))),
    on_parts("partitions-label-out-of-range", "part0/labels.npy: position 4 holds 99",
             corrupt("part0/labels.npy", lambda a: a.__setitem__(4, 99))),
    on_parts("partitions-indptr-decreasing", "part0/indptr.npy: position 5 holds 0: CSC offsets must rise",
             corrupt("part0/indptr.npy", lambda a: a.__setitem__(5, 0))),
    on_parts("partitions-orig2new-not-permutation", "the two id maps do not invert each other",
             corrupt("orig2new.npy", lambda a: a.__setitem__(slice(None), np.roll(a, 1)))),
    Case("verify-corrupt-two-parts", "verify", ["{d}/parts"], "{d}/parts/part1/labels.npy",
         corrupt("part1/labels.npy", lambda a: a.__setitem__(0, 99)), inputs=(("parts2", "parts"),), exit_code=1),
    Case("verify-part-folder-removed", "verify", ["{d}/parts"], "part1/indptr.npy: partition file not found", lambda d: shutil.rmtree(d / "parts" / "part1"),
         inputs=(("parts2", "parts"),), exit_code=1),
    Case("verify-truncated-file", "verify", ["{d}/parts"], "part0/features.npy: 1232 bytes, but manifest.json records 2464", truncate("parts/part0/features.npy"),
         inputs=(("parts2", "parts"),), exit_code=1),
    Case("verify-wrong-part-count", "verify", ["{d}/parts"], "manifest.json: does not list part2/indptr.npy",
         edit_manifest(lambda m: m.update(num_parts=3)), inputs=(("parts2", "parts"),), exit_code=1),
    Case("verify-missing-folder", "verify", ["{d}/nope"], "{d}/nope: partition folder not found", inputs=(), exit_code=1),
]
PARTITION_CLI_CASES = [
    Case("partition-num-parts-0", "partition", ["--num-parts", "0"], "--num-parts must be >= 1, got 0"),
    Case("partition-num-parts-above-nodes", "partition", ["--num-parts", "61"],
         "num_parts=61 exceeds the number of nodes of graph (60); pass --num-parts 60 or fewer"),
    Case("partition-existing-out", "partition", [], "{d}/out: already exists; pass --force", write_text("out/notes.txt", "someone's files\n")),
    Case("partition-balance-bogus", "partition", ["--balance", "nodes,bogus"], "balance constraints ['nodes', 'bogus'] are invalid"),
    Case("partition-halo-hops-neg", "partition", ["--halo-hops", "-1"], "--halo-hops must be >= 0, got -1"),
    Case("partition-missing-data", "partition", ["--data-dir", "{d}/nope"], "{d}/nope: data_dir: folder not found"),
    Case("partition-part-weights-count", "partition", ["--part-weights", "1,2,3"],
         "--part-weights '1,2,3' gives 3 weight(s) for --num-parts 2; give exactly one per partition, e.g. "
         "--part-weights 1,2"),
    Case("partition-part-weights-not-numbers", "partition", ["--part-weights", "1,fast"],
         "--part-weights '1,fast' is not a comma-separated list of numbers"),
    Case("partition-part-weights-zero", "partition", ["--part-weights", "1,0"],
         "--part-weights '1,0': the weight of partition 1 is 0.0, but every weight must be a positive finite number"),
    Case("partition-part-weights-negative", "partition", ["--part-weights=-1,2"],
         "--part-weights '-1,2': the weight of partition 0 is -1.0"),
    Case("partition-part-weights-nan", "partition", ["--part-weights", "1,nan"],
         "--part-weights '1,nan': the weight of partition 1 is nan"),
    Case("partition-part-weights-starve", "partition", ["--part-weights", "1,1000"],
         "--part-weights '1,1000' give partition(s) [0] less than one of the 36 training nodes (split 0) of graph "
         "(target: 0.036); every partition needs at least one, or its rank has nothing to train on. The smallest "
         "weights that give it, the others as given: --part-weights 28.6,1000"),
    Case("partition-part-weights-starve-force", "partition", ["--part-weights", "1,1e9", "--force"],
         "--part-weights '1,1e9' give partition(s) [0] less than one", inputs=("graph", ("parts2", "out"))),
    Case("partition-part-weights-more-parts-than-train", "partition", ["--num-parts", "40", "--part-weights",
                                                                        ",".join(["1"] * 40)],
         "--part-weights '1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1': graph has "
         "36 training nodes (split 0), fewer than the 40 partitions, and every partition needs at least one; use "
         "--num-parts 36 or fewer"),
    Case("verify-empty-partition", "verify", ["{d}/parts"], "own no nodes (node_ranges [[0, 0]]), so their ranks "
         "would have nothing to train on", empty_partition_folder, inputs=(), exit_code=1),
    Case("verify-part-weights-malformed", "verify", ["{d}/parts"],
         "partitioning.part_weights [0.5, 0.7] is not a list of 2 positive shares summing to 1",
         edit_manifest(lambda m: m["partitioning"].update(part_weights=[0.5, 0.7])), inputs=(("parts2", "parts"),),
         exit_code=1),
]
CHECKPOINT_CASES = [
    train("checkpoint-other-config", ["--resume", "--lr", "0.5"], "was written by a different run",
          inputs=("graph", "out")),
    train("checkpoint-truncated", ["--resume"], "is not a readable gnnscale checkpoint",
          truncate("out/checkpoint.pt"), inputs=("graph", "out")),
    train("checkpoint-pickled-payload", ["--resume"], "Weights only load failed", malicious_checkpoint,
          inputs=("graph", "out")),
]
TEMPORAL_CASES = [
    temporal("temporal-unsorted", [], "goes back in time", events_text("0,5,10,0\n1,6,5,0\n")),
    temporal("temporal-nan-time", [], "has time nan", events_text("0,5,0,0\n1,6,nan,0\n")),
    temporal("temporal-negative-id", [], "negative node id -1", events_text("0,5,0,0\n-1,6,1,0\n")),
    temporal("temporal-wrong-columns", [], "line 3 has 3 field(s), expected 4", events_text("0,5,0,0\n1,6,1\n")),
    temporal("temporal-empty-file", [], "the file is empty", write_text("events.csv", "")),
    temporal("temporal-header-only", [], "no events in the file", events_text("")),
    temporal("temporal-single-event", [], "too few for a chronological", events_text("0,5,0,0\n")),
    temporal("temporal-missing-file", ["--data-dir", "{d}/nope.csv"], "{d}/nope.csv", inputs=()),
    temporal("temporal-snap-bad-line", ["--dataset", "snap", "--data-dir", "{d}/e.txt"], "line 2 has 4 field(s)",
             write_text("e.txt", "1 2 100\n2 3 100 7\n")),
    temporal("temporal-npz-missing-array", ["--dataset", "npz", "--data-dir", "{d}/e.npz"], "t: array missing",
             lambda d: np.savez(d / "e.npz", src=np.arange(3), dst=np.arange(3))),
    temporal("temporal-wikipedia-missing", ["--dataset", "wikipedia", "--data-dir", "{d}/nope"],
             "{d}/nope: folder: not found; pass the folder that holds wikipedia.csv", inputs=()),
    temporal("temporal-batch-size-0", ["--batch-size", "0"], "--batch-size must be >= 1, got 0 (default 200)"),
    temporal("temporal-staleness-neg", ["--staleness", "-1"], "--staleness must be >= 0, got -1"),
    temporal("temporal-cache-rows-neg", ["--memory-cache-rows", "-5"], "--memory-cache-rows must be >= 0, got -5"),
    temporal("temporal-new-node-fraction", ["--new-node-fraction", "1.5"], "--new-node-fraction must be >= 0 and < 1"),
    temporal("temporal-heads-0", ["--heads", "0"], "--heads must be >= 1, got 0"),
]
CASES = (RANGE_CASES + OUT_CASES + RECIPE_CASES + LOADER_CASES + PARTITION_FOLDER_CASES + PARTITION_CLI_CASES
         + CHECKPOINT_CASES + TEMPORAL_CASES)


# ---------------------------------------------------------------------- running
@dataclass
class Outcome:
    folder: Path
    returncode: int
    stderr: str
    changed: list[str] = field(default_factory=list)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder``: file -> sha256, folder -> '<dir>'."""
    return {str(p.relative_to(folder)): "<dir>" if p.is_dir() else sha256(p) for p in sorted(folder.rglob("*"))}


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Good inputs, and the positive control of each entry point on them (its checkpoint is reused)."""
    root = tmp_path_factory.mktemp("good")
    write_graph(root / "graph")
    write_events(root / "events.csv")
    synthetic = generate_synthetic(SyntheticConfig(num_nodes=300, avg_degree=4, feat_dim=4, num_classes=3))
    partition_graph(synthetic, root / "parts", PartitionConfig(num_parts=1))
    partition_graph(synthetic, root / "parts2", PartitionConfig(num_parts=2))
    return root


@pytest.fixture(scope="module")
def outcomes(good: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    trained = run(Case("control", "train", [], "").command(good), good)
    assert trained.returncode == 0 and (good / "out" / "checkpoint.pt").is_file(), trained.stderr[-2000:]
    cases = tmp_path_factory.mktemp("cases")

    def one(case: Case) -> Outcome:
        d = cases / case.id
        d.mkdir()
        for item in case.inputs:
            source, name = item if isinstance(item, tuple) else (item, item)
            copy = shutil.copytree if (good / source).is_dir() else shutil.copyfile
            copy(good / source, d / name)
        if case.setup is not None:
            case.setup(d)
        before = snapshot(d)
        done = run(case.command(d), d)
        after = snapshot(d)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        return Outcome(d, done.returncode, done.stderr, changed)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip((c.id for c in CASES), pool.map(one, CASES)))


def test_the_corpus_is_large_and_its_names_unique() -> None:
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("entry", ["temporal", "partition"])
def test_each_entry_point_succeeds_on_the_unbroken_inputs(entry: str, good: Path, tmp_path: Path) -> None:
    """The control: without its one flaw, a case's command would have run (train's runs in ``outcomes``)."""
    shutil.copytree(good / "graph", tmp_path / "graph")
    shutil.copyfile(good / "events.csv", tmp_path / "events.csv")
    done = run(Case("control", entry, [], "").command(tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    if entry == "partition":
        verified = run(ENTRY["verify"] + [str(tmp_path / "out")], tmp_path)
        assert verified.returncode == 0, verified.stderr[-2000:]
    else:
        assert (tmp_path / "out" / "metrics.json").is_file()


def test_a_one_part_folder_trains_in_a_plain_run(good: Path, tmp_path: Path) -> None:
    shutil.copytree(good / "parts", tmp_path / "parts")
    done = run(on_parts("control", "", None).command(tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_is_refused_in_one_line_and_changes_nothing(case: Case, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[case.id]
    lines = outcome.stderr.strip().splitlines()
    assert "Traceback" not in outcome.stderr, outcome.stderr[-3000:]
    assert len(lines) == 1, outcome.stderr[-3000:]
    assert lines[0].startswith(("error: ", "verify failed: ")), lines[0]
    assert case.message.replace("{d}", str(outcome.folder)) in lines[0], lines[0]
    assert outcome.returncode == case.exit_code
    assert not outcome.changed, f"the command changed {outcome.changed}"
