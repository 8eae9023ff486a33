"""Every way partitioning, loading and verifying refuse bad input: one clear error, nothing written."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import partition.partitioner
from gnnscale.data.dataset import DatasetError, GraphDataset
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
from partition import PartitionConfig, PartitionError, load_partition, partition_graph, verify
from partition.cli import main


@pytest.fixture(scope="module")
def dataset() -> GraphDataset:
    return generate_synthetic(SyntheticConfig(num_nodes=800, avg_degree=4, feat_dim=4))


@pytest.fixture(scope="module")
def pristine(dataset: GraphDataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pristine") / "parts"
    partition_graph(dataset, out, PartitionConfig(num_parts=3))
    return out


@pytest.fixture
def parts(pristine: Path, tmp_path: Path) -> Path:
    """A fresh copy of a good partition folder, for a test to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "parts"))


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir())


def rewrite_manifest(root: Path, change) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith(("error:", "verify failed:", "interrupted:"))]
    return code, errors[-1] if errors else ""


SYNTHETIC = ["--dataset", "synthetic", "--num-nodes", "1000", "--feat-dim", "4", "--avg-degree", "4", "--quiet"]


# ---------------------------------------------------------------------- partitioning
def test_num_parts_below_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ValueError, match=r"num_parts must be >= 1, got 0; pass --num-parts 1 or more"):
        PartitionConfig(num_parts=0)
    code, line = run_cli([*SYNTHETIC, "--num-parts", "0", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and line == "error: --num-parts must be >= 1, got 0"
    assert siblings(tmp_path / "out") == []


def test_num_parts_above_num_nodes(dataset: GraphDataset, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ValueError, match=r"num_parts=801 exceeds the number of nodes of synthetic \(800\); "
                                         r"pass --num-parts 800 or fewer"):
        partition_graph(dataset, tmp_path / "out", PartitionConfig(num_parts=801))
    code, line = run_cli([*SYNTHETIC, "--num-parts", "1001", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "exceeds the number of nodes of synthetic (1,000)" in line
    assert siblings(tmp_path / "out") == []


def test_other_bad_options(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"balance constraints \['nodes', 'degree'\] are invalid"):
        PartitionConfig(num_parts=2, balance="nodes,degree")
    with pytest.raises(ValueError, match=r"halo_hops must be >= 0, got -1"):
        PartitionConfig(num_parts=2, halo_hops=-1)
    with pytest.raises(TypeError, match=r"PartitionConfig.num_parts must be an int, got 2.0"):
        PartitionConfig(num_parts=2.0)
    code, line = run_cli([*SYNTHETIC, "--num-parts", "2", "--split", "3", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and line.startswith("error: split 3 does not exist: synthetic has 1 split(s)")


def test_dataset_that_fails_to_load(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    code, line = run_cli(["--dataset", "cora", "--data-dir", str(tmp_path / "nowhere"), "--num-parts", "2",
                          "--out", str(out)], capsys)
    assert code == 2 and line.startswith(f"error: {tmp_path / 'nowhere'}: data_dir: folder not found")
    assert list(tmp_path.iterdir()) == []
    code, line = run_cli(["--dataset", "cora", "--num-parts", "2", "--out", str(out)], capsys)
    assert code == 2 and line == "error: --dataset cora needs --data-dir pointing at its files"
    from gnnscale.data.loaders import load_dataset

    with pytest.raises(DatasetError, match=r"ind\.cora\.x: x: file not found; download"):
        load_dataset("cora", tmp_path)


def test_existing_output_is_never_replaced_without_force(dataset: GraphDataset, parts: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    before = (parts / "manifest.json").read_text()
    with pytest.raises(FileExistsError, match=r"parts: already exists; pass --force to replace it"):
        partition_graph(dataset, parts, PartitionConfig(num_parts=2))
    code, line = run_cli([*SYNTHETIC, "--num-parts", "2", "--out", str(parts)], capsys)
    assert code == 2 and line.endswith("already exists; pass --force to replace it (the old folder is kept until "
                                       "the new one is complete), or choose another --out")
    assert (parts / "manifest.json").read_text() == before and siblings(parts) == ["parts"]


def test_force_replaces_only_a_complete_new_folder(dataset: GraphDataset, parts: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    before = (parts / "manifest.json").read_text()

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(partition.partitioner, "write_partitions", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        partition_graph(dataset, parts, PartitionConfig(num_parts=2), force=True)
    assert (parts / "manifest.json").read_text() == before and siblings(parts) == ["parts"]
    monkeypatch.undo()
    manifest = partition_graph(dataset, parts, PartitionConfig(num_parts=2), force=True)
    assert manifest["num_parts"] == 2 and siblings(parts) == ["parts"]
    verify(parts, dataset)


def test_failed_write_on_the_writer_thread_leaves_nothing(dataset: GraphDataset, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import partition.format

    def disk_full(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(partition.format._NpyStream, "_write", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        partition_graph(dataset, tmp_path / "out", PartitionConfig(num_parts=2))
    assert list(tmp_path.iterdir()) == []


def test_force_refuses_a_folder_that_is_not_a_partition(dataset: GraphDataset, tmp_path: Path) -> None:
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match=r"home: exists and is not a partition folder \(no manifest\.json\); "
                                              r"refusing to replace it even with --force"):
        partition_graph(dataset, precious, PartitionConfig(num_parts=2), force=True)
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_interrupted_run_leaves_nothing(dataset: GraphDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(partition.partitioner, "write_partitions", interrupted)
    out = tmp_path / "new" / "deeper" / "parts"
    with pytest.raises(KeyboardInterrupt):
        partition_graph(dataset, out, PartitionConfig(num_parts=2))
    assert not (tmp_path / "new").exists()  # the parents it created are gone too
    code, line = run_cli([*SYNTHETIC, "--num-parts", "2", "--out", str(out)], capsys)
    assert code == 130 and line == f"interrupted: nothing written to {out}"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- damaged folders
def test_corrupted_file(dataset: GraphDataset, parts: Path, capsys: pytest.CaptureFixture) -> None:
    path = parts / "part1" / "features.npy"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # same size, one flipped byte
    path.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match=r"part1/features\.npy: sha256 [0-9a-f]{16}\.\.\. differs from "
                                             r"manifest\.json's [0-9a-f]{16}\.\.\. \(the file was modified"):
        verify(parts)
    with pytest.raises(PartitionError, match=r"part1/features\.npy: sha256"):
        load_partition(parts, 1, verify_checksums=True)
    load_partition(parts, 0, verify_checksums=True)  # other partitions are not read
    code, line = run_cli(["verify", str(parts)], capsys)
    assert code == 1 and line.startswith("verify failed: ") and "part1/features.npy: sha256" in line


def test_truncated_file(parts: Path, capsys: pytest.CaptureFixture) -> None:
    path = parts / "part2" / "indices.npy"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(PartitionError, match=r"part2/indices\.npy: \d+ bytes, but manifest\.json records \d+ "
                                             r"\(truncated or replaced\)"):
        load_partition(parts, 2)  # caught without hashing
    code, line = run_cli(["verify", str(parts), "--no-checksums"], capsys)
    assert code == 1 and "part2/indices.npy" in line and "truncated" in line


def test_missing_file_and_folder(parts: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (parts / "part0" / "halo_ids.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"part0/halo_ids\.npy: partition file not found"):
        load_partition(parts, 0)
    with pytest.raises(FileNotFoundError, match=r"part0/halo_ids\.npy: partition file not found"):
        verify(parts)
    with pytest.raises(FileNotFoundError, match=r"nowhere: partition folder not found"):
        load_partition(tmp_path / "nowhere", 0)
    (parts / "manifest.json").unlink()
    code, line = run_cli(["verify", str(parts)], capsys)
    assert code == 1 and "manifest.json: manifest not found" in line


def test_newer_format_version(parts: Path, capsys: pytest.CaptureFixture) -> None:
    rewrite_manifest(parts, lambda m: m.update(format_version=2))
    with pytest.raises(PartitionError, match=r"manifest\.json: format version 2 is newer than this gnnscale reads "
                                             r"\(up to 1\); upgrade gnnscale"):
        load_partition(parts, 0)
    code, line = run_cli(["verify", str(parts)], capsys)
    assert code == 1 and "format version 2 is newer" in line


def test_tampered_checksum(parts: Path) -> None:
    rewrite_manifest(parts, lambda m: m["files"]["orig2new.npy"].update(sha256="0" * 64))
    with pytest.raises(PartitionError, match=r"orig2new\.npy: sha256 [0-9a-f]{16}\.\.\. differs from manifest\.json's "
                                             r"0000000000000000\.\.\."):
        verify(parts)


def test_not_ours_or_inconsistent_manifest(parts: Path) -> None:
    rewrite_manifest(parts, lambda m: m["files"]["part0/labels.npy"].update(dtype="int32"))
    with pytest.raises(PartitionError, match=r"manifest\.json: part0/labels\.npy is recorded as int32"):
        load_partition(parts, 0)
    rewrite_manifest(parts, lambda m: m["node_ranges"].reverse())
    with pytest.raises(PartitionError, match=r"node_ranges\[0\] = \[\d+, \d+\] does not continue the tiling"):
        verify(parts)
    (parts / "manifest.json").write_text("{not json")
    with pytest.raises(PartitionError, match=r"manifest\.json: not valid JSON"):
        load_partition(parts, 0)
    (parts / "manifest.json").write_text(json.dumps({"format": "dgl"}))
    with pytest.raises(PartitionError, match=r"format is 'dgl', expected 'gnnscale-partition'"):
        verify(parts)


def test_rank_out_of_range(parts: Path) -> None:
    with pytest.raises(ValueError, match=r"rank 3 has no partition: .* holds 3 partition\(s\), 0\.\.2"):
        load_partition(parts, 3)


def _replace_array(root: Path, rel: str, array: np.ndarray) -> None:
    """Rewrite one file and its checksum: damage that checksums cannot see."""
    np.save(root / rel, array)
    digest = hashlib.sha256((root / rel).read_bytes()).hexdigest()
    rewrite_manifest(root, lambda m: m["files"][rel].update(sha256=digest, bytes=(root / rel).stat().st_size))


def test_verify_catches_consistent_but_wrong_content(dataset: GraphDataset, parts: Path) -> None:
    features = np.load(parts / "part1" / "features.npy")
    features[5] += 1.0
    _replace_array(parts, "part1/features.npy", features)
    verify(parts)  # internally consistent ...
    with pytest.raises(PartitionError, match=r"part1/features\.npy: rows 0\.\.\d+ differ from the dataset's"):
        verify(parts, dataset)  # ... but not the dataset's features


def test_verify_catches_a_wrong_edge(dataset: GraphDataset, parts: Path) -> None:
    indices = np.load(parts / "part0" / "indices.npy")
    indptr = np.load(parts / "part0" / "indptr.npy")
    local = int(np.flatnonzero(np.diff(indptr))[0])
    indices[indptr[local]] = (indices[indptr[local]] + 1) % dataset.num_nodes
    _replace_array(parts, "part0/indices.npy", indices)
    with pytest.raises(PartitionError, match=r"part0/(halo_ids|indices)\.npy"):
        verify(parts, dataset)


def test_verify_catches_a_node_owned_twice(parts: Path) -> None:
    orig = np.load(parts / "part2" / "orig_ids.npy")
    orig[0] = np.load(parts / "part0" / "orig_ids.npy")[0]
    _replace_array(parts, "part2/orig_ids.npy", orig)
    with pytest.raises(PartitionError, match=r"part2/orig_ids\.npy: position 0 is original node \d+, which "
                                             r"orig2new\.npy maps to \d+ instead of \d+"):
        verify(parts)


def _corrupt(root: Path, rel: str, change) -> None:
    array = np.load(root / rel)
    change(array)
    _replace_array(root, rel, array)


def _set(position: int, value: int):
    return lambda array: array.__setitem__(position, value)


@pytest.mark.parametrize("rel, change, problem", [
    ("part1/indices.npy", _set(7, 10**6), r"position 7 holds 1000000, outside \[0, 800\)"),
    ("part1/indices.npy", _set(0, -1), r"position 0 holds -1, outside \[0, 800\)"),
    ("part1/halo_ids.npy", _set(2, 800), r"position 2 holds 800, outside \[0, 800\)"),
    ("part1/orig_ids.npy", _set(3, 800), r"position 3 holds 800, outside \[0, 800\)"),
    ("part1/labels.npy", _set(4, 99), r"position 4 holds 99, outside \[0, \d+\)"),
    ("part1/indptr.npy", _set(5, 0), r"position 5 holds 0: CSC offsets must rise from 0 to \d+"),
    ("part1/indptr.npy", lambda a: a.__setitem__(-1, a[-1] - 1), r"position \d+ holds \d+: CSC offsets must rise"),
    ("orig2new.npy", lambda a: a.__setitem__(slice(None), np.roll(a, 1)), r"position 0 is original node \d+, "
                                                                          r"which orig2new\.npy maps to \d+ instead"),
])
def test_load_partition_refuses_consistent_checksums_with_broken_invariants(parts: Path, rel: str, change,
                                                                           problem: str) -> None:
    """Damage that checksums cannot see: load_partition names the file, the position and the fix."""
    _corrupt(parts, rel, change)
    expected = rel if rel.startswith("part1") else "part1/orig_ids.npy"
    with pytest.raises(PartitionError, match=re.escape(str(parts / expected)) + ": " + problem + r".*re-create it "
                                             r"with python -m partition \.\.\. --force \(python -m partition "
                                             r"verify .* checks the whole folder\)"):
        load_partition(parts, 1)
    with pytest.raises(PartitionError, match=re.escape(str(parts)) + r"/part\d/\w+\.npy: position \d+"):
        verify(parts, checksums=False)  # verify runs the same checks, naming the folder and the fix too
    assert load_partition(parts, 1, check=False).num_nodes > 0  # the opt-out for trusted folders
