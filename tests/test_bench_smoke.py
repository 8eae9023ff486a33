"""End-to-end smoke run of scripts/bench_single_process.py on a tiny graph (about 15 s).

Checks that both sides run in their child processes and the JSON report is complete;
it asserts nothing about speed (timing claims live in the benchmark's own output).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import import_dgl_or_skip

pytestmark = pytest.mark.dgl
import_dgl_or_skip()  # not importable on the GPU image, nor in today's stack (scripts/dev.sh test)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_single_process.py"


def test_bench_single_process_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    command = [sys.executable, "-W", "ignore", str(SCRIPT), "--num-nodes", "10000", "--feat-dim", "16",
               "--epochs", "1", "--repeats", "1", "--threads", "1", "--workers", "1", "--sides", "ours", "dgl",
               "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "ours/dgl" in proc.stdout and "feature gather" in proc.stdout

    report = json.loads(out.read_text())
    assert report["graph"]["num_nodes"] == 10000
    assert report["settings"]["threads"] == 1 and report["settings"]["workers"] == 1
    assert set(report["runs"]) == {"ours", "dgl"}
    for side in ("ours", "dgl"):
        (run,) = report["runs"][side]
        assert len(run["epoch_seconds"]) == 1
        assert run["num_batches"] == math.ceil(report["graph"]["num_train"] / 1024)
        assert 0.0 <= run["val_accuracy"] <= 1.0
        assert run["peak_rss_gib"] >= run["rss_data_gib"] > 0
    for name, row in report["summary"].items():
        if "ours/dgl" in row:
            assert row["ours"] > 0 and row["dgl"] > 0 and row["ours/dgl"] > 0, name
    gather = report["summary"]["gather_bandwidth"]
    assert gather["gather_gb_per_s"] > 0 and gather["copy_gb_per_s"] > 0
    (ours,) = report["runs"]["ours"]
    (times,) = ours["epoch_times"]
    assert times["compute_s"] > 0 and times["sample_s"] > 0 and times["wait_s"] >= 0


def test_bench_single_process_rejects_bad_counts() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "--epochs must be >= 1, got 0" in proc.stderr
