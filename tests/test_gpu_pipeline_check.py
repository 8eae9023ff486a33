"""scripts/gpu_pipeline_check.py: `save` on a tiny graph, then `check` end to end on the CPU (and on CUDA
where there is one), including in a process where DGL and the samplers cannot be imported.

Each run is a subprocess, as on the GPU machine; the whole file takes about 20 s.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_pipeline_check.py"
TINY = ["--num-nodes", "3000", "--num-batches", "4", "--batch-size", "64", "--fanouts", "5,3", "--feat-dim", "8"]
NUM_BATCHES, FEAT_DIM = 4, 8
CONFIG_NAMES = ("host_features", "device_features")


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", str(SCRIPT), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny folder written by `save` (which samples with `samplers`, pure numpy: it runs on any torch)."""
    folder = tmp_path_factory.mktemp("gpu_check") / "data"
    proc = run_script("save", "--out", str(folder), *TINY)
    assert proc.returncode == 0, proc.stderr
    return folder


def blocked_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import dgl` and `import samplers` raise ImportError."""
    shadow = tmp_path / "blocked"
    for name in ("dgl", "samplers"):
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked in this test')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shadow)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def check_report(report: dict, device: str) -> None:
    """Fields and values every check report must have."""
    assert report["settings"]["device"].startswith(device)
    assert report["settings"]["epochs"] == 1
    assert report["data"]["num_batches"] == NUM_BATCHES and report["data"]["feat_dim"] == FEAT_DIM
    assert report["environment"]["torch"] == torch.__version__
    assert report["environment"]["device_name"]
    assert report["environment"]["dgl_imported"] is False
    assert report["environment"]["samplers_imported"] is False
    for name in CONFIG_NAMES:
        (epoch,) = report["results"][name]["epochs"]
        summary = report["results"][name]["summary"]
        assert epoch["steps"] == NUM_BATCHES == summary["steps_per_epoch"]
        assert epoch["epoch_s"] > 0
        assert 0 <= epoch["wait_s"] <= epoch["epoch_s"]
        assert 0 < epoch["device_busy_s"] <= epoch["epoch_s"]
        assert 0.0 <= epoch["device_idle_share"] <= 1.0
        assert 0.0 <= epoch["device_idle_share_after_first_batch"] <= 1.0
        assert math.isfinite(epoch["loss"]) and epoch["loss"] > 0
        assert epoch["h2d_other_bytes"] > 0
        assert summary["epoch_s"] == epoch["epoch_s"]
    # Only the host-features run moves feature rows: exactly the saved batches' input rows.
    input_nodes = sum(json.loads((Path(report["data"]["folder"]) / "manifest.json").read_text())["input_nodes"])
    assert report["results"]["host_features"]["epochs"][0]["h2d_feature_bytes"] == input_nodes * FEAT_DIM * 4
    assert report["results"]["device_features"]["epochs"][0]["h2d_feature_bytes"] == 0
    # Same initial weights, batches and order: both runs train on the same numbers.
    losses = [report["results"][name]["summary"]["final_loss"] for name in CONFIG_NAMES]
    assert math.isclose(*losses, rel_tol=1e-3)


def test_save_writes_batches_features_and_manifest(saved: Path) -> None:
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["num_batches"] == NUM_BATCHES and manifest["fanouts"] == [5, 3]
    assert manifest["files"] == [f"batch_{i:04d}.pt" for i in range(NUM_BATCHES)]
    assert all((saved / name).is_file() for name in manifest["files"])
    features = np.load(saved / "features.npy", allow_pickle=False)
    labels = np.load(saved / "labels.npy", allow_pickle=False)
    assert features.shape == (3000, FEAT_DIM) and features.dtype == np.float32
    assert labels.shape == (3000,) and 0 <= labels.min() and labels.max() < manifest["num_classes"]
    assert len(manifest["input_nodes"]) == len(manifest["sample_seconds"]) == NUM_BATCHES


def test_check_runs_end_to_end_on_cpu(saved: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = run_script("check", str(saved), "--device", "cpu", "--epochs", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "host features" in proc.stdout and "features on device" in proc.stdout
    report = json.loads(out.read_text())
    check_report(report, "cpu")
    assert report["reference"]["pinned_gbps"] is None and report["reference"]["pageable_gbps"] is None
    assert report["h2d_ratio_to_pinned"] is None
    for name in CONFIG_NAMES:
        assert report["results"][name]["summary"]["h2d_gbps"] is None


def test_check_runs_where_dgl_and_samplers_cannot_be_imported(saved: Path, tmp_path: Path) -> None:
    env = blocked_env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import dgl"], env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "dgl is blocked" in probe.stderr  # the blocker works
    out = tmp_path / "results.json"
    proc = run_script("check", str(saved), "--device", "cpu", "--epochs", "1", "--warmup", "0", "--workers", "1",
                      "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    check_report(json.loads(out.read_text()), "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_check_runs_end_to_end_on_cuda(saved: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = run_script("check", str(saved), "--device", "cuda", "--epochs", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    check_report(report, "cuda")
    assert report["reference"]["pinned_gbps"] > 0 and report["reference"]["pageable_gbps"] > 0
    assert report["h2d_ratio_to_pinned"] > 0
    for name in CONFIG_NAMES:
        summary = report["results"][name]["summary"]
        assert summary["h2d_gbps"] > 0 and summary["h2d_s"] > 0 and summary["copy_efficiency"] > 0


def test_check_without_manifest_fails_with_one_line(tmp_path: Path) -> None:
    proc = run_script("check", str(tmp_path), "--device", "cpu")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "manifest.json not found" in lines[0] and "save --out" in lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the error for a machine without CUDA")
def test_check_on_cuda_without_cuda_fails_clearly(tmp_path: Path) -> None:
    proc = run_script("check", str(tmp_path), "--device", "cuda")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "sees no CUDA device" in lines[0] and "--device cpu" in lines[0]


def test_save_rejects_more_seeds_than_nodes(tmp_path: Path) -> None:
    proc = run_script("save", "--out", str(tmp_path / "data"), "--num-nodes", "100", "--num-batches", "2",
                      "--batch-size", "64")
    assert proc.returncode == 2
    assert "more than --num-nodes 100" in proc.stderr
    assert not (tmp_path / "data" / "manifest.json").exists()
