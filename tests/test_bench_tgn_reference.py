"""``scripts/bench_tgn_reference.py`` runs the reference TGN (twitter-research/tgn) and ours side by side.

Needs a checkout of the reference (``GNNSCALE_TGN_REFERENCE``, default ``../tgn-reference`` beside the
repository) and scikit-learn; skipped with the reason where either is missing (as in CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


REFERENCE_TGN = Path(os.environ.get("GNNSCALE_TGN_REFERENCE", ROOT.parent / "tgn-reference"))


@pytest.mark.skipif(not (REFERENCE_TGN / "train_self_supervised.py").is_file(),
                    reason="no checkout of twitter-research/tgn (set GNNSCALE_TGN_REFERENCE)")
def test_reference_tgn_bench_runs_both_sides(tmp_path):
    """``scripts/bench_tgn_reference.py`` on a tiny JODIE stream: the reference and ours, 2 runs of 2 epochs each."""
    pytest.importorskip("sklearn", reason="the reference imports scikit-learn: pip install -e .[tgn-reference]")
    rng = np.random.default_rng(0)
    users, items, n = 60, 40, 3000
    u = rng.integers(0, users, n)
    i = np.where(rng.random(n) < 0.7, rng.integers(0, items, users)[u], rng.integers(0, items, n)) + users
    (tmp_path / "wikipedia").mkdir()
    rows = "".join(f"{a},{b},{c:.1f},0\n" for a, b, c in zip(u, i, np.sort(rng.uniform(0, 1e5, n))))
    (tmp_path / "wikipedia" / "wikipedia.csv").write_text("u,i,ts,label\n" + rows)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_tgn_reference.py"), "--reference",
                           str(REFERENCE_TGN), "--datasets", "wikipedia", "--data-root", str(tmp_path), "--epochs", "2",
                           "--runs", "2", "--threads", "1", "--workdir", str(tmp_path / "work"),
                           "--out", str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    found = json.loads((tmp_path / "out.json").read_text())["datasets"]["wikipedia"]
    for side in ("ours", "reference"):
        runs = found[side]["runs"]
        assert len(runs) == 2 and all(len(r["val_ap_per_batch"]) == 2 for r in runs)
        assert len(found[side]["epoch_seconds"]) == 4  # both runs' epochs, pooled
        for epoch, mean in enumerate(found[side]["val_ap_per_batch"]):  # the comparison is between means over runs
            assert mean == pytest.approx(sum(r["val_ap_per_batch"][epoch] for r in runs) / 2)
        assert 0.0 < found[side]["test_ap_per_batch"] <= 1.0
    assert [r["seed"] for r in found["ours"]["runs"]] == [0, 1]
    assert found["ours"]["runs"][0]["val_ap_per_batch"] != found["ours"]["runs"][1]["val_ap_per_batch"]
    assert found["comparison"]["epoch_time_ratio"] > 0 and len(found["comparison"]["val_ap_gaps"]) == 2


def test_a_folder_without_the_reference_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_tgn_reference.py"), "--reference",
                           str(tmp_path), "--out", str(tmp_path / "out.json")], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {tmp_path} has no train_self_supervised.py; pass a checkout "
                                                "of twitter-research/tgn (commit d55bbe6) as --reference"]
    assert not (tmp_path / "out.json").exists()


def test_zero_runs_is_one_line(tmp_path):
    (tmp_path / "train_self_supervised.py").write_text("")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_tgn_reference.py"), "--reference",
                           str(tmp_path), "--runs", "0", "--out", str(tmp_path / "out.json")], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --datasets takes wikipedia and/or collegemsg; --epochs, "
                                                "--threads and --runs must be >= 1"]
    assert not (tmp_path / "out.json").exists()
