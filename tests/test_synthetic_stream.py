"""The streamed synthetic generator: determinism, the folder it writes, bounded memory, structure, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gnnscale.data import synthetic_stream as ss
from gnnscale.data.edgelist import load_edgelist
from gnnscale.data.synthetic import _plant, generate_synthetic

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(num_nodes=20_000, num_edges=400_000, feat_dim=8, num_classes=4, seed=3)


def write(folder: Path, chunk_edges: int = 1 << 23, **overrides: int) -> Path:
    sizes = {**SMALL, **overrides}
    config = ss.stream_config(chunk_edges=chunk_edges, **sizes)
    return ss.write_stream(folder, config, sizes["num_edges"])


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix == ".npy"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("stream") / "g")


def test_deterministic_and_independent_of_chunking(folder: Path, tmp_path: Path) -> None:
    again = files(write(tmp_path / "again", chunk_edges=2 * ss.PAIR_BLOCK))  # several chunks, vs one
    assert again == files(folder)
    other = np.load(write(tmp_path / "other", seed=4) / "edges.npy")
    assert not np.array_equal(other, np.load(folder / "edges.npy"))


def test_node_data_equals_in_memory_generator(folder: Path) -> None:
    config = ss.stream_config(**SMALL)
    ds = generate_synthetic(config)
    np.testing.assert_array_equal(np.load(folder / "labels.npy"), ds.labels)
    np.testing.assert_array_equal(np.load(folder / "features.npy"), ds.features)
    for name, mask in zip(("train_mask", "val_mask", "test_mask"), (ds.train_masks, ds.val_masks, ds.test_masks)):
        np.testing.assert_array_equal(np.load(folder / f"{name}.npy"), mask)


def test_folder_loads_with_both_directions(folder: Path) -> None:
    edges = np.load(folder / "edges.npy")
    assert edges.shape == (SMALL["num_edges"], 2) and edges.dtype == np.int32
    assert (edges[:, 0] != edges[:, 1]).all()  # self-loops are redrawn
    np.testing.assert_array_equal(edges[0::2], edges[1::2, ::-1])
    ds = load_edgelist(folder)
    assert ds.num_nodes == SMALL["num_nodes"] and ds.features.shape == (SMALL["num_nodes"], SMALL["feat_dim"])
    duplicates = 1 - ds.indices.size / edges.shape[0]
    assert 0 <= duplicates < 0.1  # repeats are dropped by the reader; a few percent with these sizes


def test_community_structure(folder: Path) -> None:
    config = ss.stream_config(**SMALL)
    layout = _plant(config, np.random.default_rng(np.random.SeedSequence(config.seed).spawn(4)[0]))
    edges = np.load(folder / "edges.npy")
    community = layout.community
    intra = float((community[edges[:, 0]] == community[edges[:, 1]]).mean())
    # Intra-community draws, plus the rare background or same-label draw that lands in the own community.
    assert abs(intra - config.intra_fraction) < 0.02, intra
    same_label = float((layout.labels[edges[:, 0]] == layout.labels[edges[:, 1]]).mean())
    expected = config.intra_fraction + (1 - config.intra_fraction) * (
        config.same_label_fraction + (1 - config.same_label_fraction) / config.num_classes)
    assert abs(same_label - expected) < 0.02, (same_label, expected)


def test_partition_command_partitions_it(folder: Path, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "partition", "--dataset", "edgelist", "--data-dir", str(folder),
                          "--num-parts", "2", "--out", str(tmp_path / "parts"), "--quiet"],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "parts").is_dir() and any((tmp_path / "parts").iterdir())


_PEAK = """
import resource, sys
from gnnscale.data import synthetic_stream as ss
e = int(sys.argv[2])
ss.write_stream(sys.argv[1], ss.stream_config(200_000, e, 4, 4, 0, chunk_edges=1 << 20), e)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _peak(folder: Path, num_edges: int) -> int:
    run = subprocess.run([sys.executable, "-c", _PEAK, str(folder), str(num_edges)], cwd=ROOT, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    return int(run.stdout.split()[-1])


def test_peak_memory_does_not_grow_with_edges(tmp_path: Path) -> None:
    small, large = _peak(tmp_path / "a", 2_000_000), _peak(tmp_path / "b", 8_000_000)
    extra_edge_bytes = 6_000_000 * 2 * 4
    # Holding the edges would add at least their bytes (in-memory generation: about 5x that).
    assert large - small < 0.25 * extra_edge_bytes, (small, large)


@pytest.mark.parametrize("args, message", [
    (["--num-nodes", "1"], "num_nodes=1 is invalid"),
    (["--num-edges", "-4"], "num_edges=-4 is invalid"),
    (["--num-edges", "1001"], "num_edges=1001 is odd"),
    (["--feat-dim", "0"], "feat_dim=0 is invalid"),
    (["--num-classes", "1"], "num_classes=1 is invalid"),
    (["--num-nodes", "100", "--num-edges", "9000"], "num_edges / num_nodes=90.0 is invalid"),
])
def test_bad_sizes_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                  message: str) -> None:
    base = {"--out": str(tmp_path / "g"), "--num-nodes": "20000", "--num-edges": "1000", "--feat-dim": "4",
            "--num-classes": "4", "--seed": "0"}
    base.update(dict(zip(args[0::2], args[1::2])))
    assert ss.main([x for kv in base.items() for x in kv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_refuses_non_empty_out_and_small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(ss.StreamError, match="already exists and is not an empty folder"):
        write(tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "keep"
    monkeypatch.setattr(ss.shutil, "disk_usage", lambda _: ss.shutil._ntuple_diskusage(10, 10, 5))
    need = ss.bytes_needed(ss.stream_config(**SMALL), SMALL["num_edges"])
    with pytest.raises(ss.StreamError, match=f"needs {need:,} bytes .* only 5 bytes"):
        write(tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_failure_mid_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise OSError("disk went away")
    monkeypatch.setattr(ss, "_write_edges", broken)
    with pytest.raises(OSError, match="disk went away"):
        write(tmp_path / "g")
    assert list(tmp_path.iterdir()) == []


def test_empty_out_is_filled_and_help_runs(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    assert (write(tmp_path / "g") / "edges.npy").is_file()
    run = subprocess.run([sys.executable, "-m", "gnnscale.data.synthetic_stream", "--help"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "--chunk-edges" in run.stdout
