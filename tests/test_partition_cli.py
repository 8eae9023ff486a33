"""The command line as users run it: ``python -m partition``, ``verify``, the console script, the benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import import_dgl_or_skip, read_strict_json

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = ["--dataset", "synthetic", "--num-nodes", "2000", "--avg-degree", "6", "--feat-dim", "4"]


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "partition", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def test_partition_then_verify(tmp_path: Path) -> None:
    out = tmp_path / "parts"
    proc = run([*SYNTHETIC, "--num-parts", "3", "--halo-hops", "2", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    for stage in ("load", "metis", "relabel", "write", "checksum"):  # one progress line per stage
        assert sum(f" {stage} " in line for line in proc.stderr.splitlines()) == 1, (stage, proc.stderr)
    assert "edge cut:" in proc.stdout and "balance max/mean: nodes" in proc.stdout and "replication" in proc.stdout
    manifest = read_strict_json(out / "manifest.json")
    assert manifest["command"].endswith(f"--num-parts 3 --halo-hops 2 --out {out}")
    assert manifest["halo_hops"] == 2 and set(manifest["stages"]["stages"]) == {"load", "metis", "relabel", "write",
                                                                                 "checksum"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts"]  # no temporary folder left

    proc = run(["verify", str(out), *SYNTHETIC])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"OK {out}: 3 partitions, 2,000 nodes, {manifest['num_edges']:,} edges, equal to " \
                                  f"dataset synthetic"


def test_console_script_and_bad_input_exit_codes(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("gnnscale-partition")
    if not script.exists():
        pytest.skip(f"console script not installed at {script}: run pip install -e .")
    out = tmp_path / "edgelist_parts"
    folder = tmp_path / "graph"
    folder.mkdir()
    np.save(folder / "edges.npy", np.array([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2]]))
    np.save(folder / "features.npy", np.eye(4, dtype=np.float32))
    np.save(folder / "labels.npy", np.array([0, 1, 0, 1]))
    proc = subprocess.run([str(script), "--dataset", "edgelist", "--data-dir", str(folder), "--num-parts", "2",
                           "--method", "random", "--out", str(out), "--quiet"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    again = subprocess.run([str(script), "--dataset", "edgelist", "--data-dir", str(folder), "--num-parts", "2",
                            "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"error: {out}: already exists; pass --force to replace it (the old folder is kept until the new one is "
        f"complete), or choose another --out"]
    (out / "part1" / "labels.npy").write_bytes(b"garbage")
    proc = subprocess.run([str(script), "verify", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"verify failed: {out / 'part1' / 'labels.npy'}: 7 bytes, but manifest.json records")


def test_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    """Smoke run of scripts/bench_partition.py on a tiny graph (ours only): it asserts nothing about speed."""
    report_path = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_partition.py"), "--num-nodes", "3000",
                           "--feat-dim", "4", "--repeats", "1", "--skip-dgl", "--out", str(report_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    ours = report["runs"]["ours"][0]
    assert ours["verified"] and ours["peak_rss_gib"] > 0 and 0 < ours["edge_cut"] < 0.5
    assert ours["edge_cut"] == pytest.approx(ours["own_report"]["edge_cut_fraction"], abs=1e-4)
    assert "wall time, s" in proc.stdout


@pytest.mark.dgl
def test_benchmark_against_dgl_runs_end_to_end(tmp_path: Path) -> None:
    import_dgl_or_skip()
    report_path = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_partition.py"), "--num-nodes", "5000",
                           "--feat-dim", "4", "--repeats", "1", "--out", str(report_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(report_path.read_text())["summary"]
    assert set(summary["ratio_ours_over_dgl"]) == {"wall_seconds", "peak_rss_gib", "edge_cut"}
