"""``scripts/fault_drills.py`` for real: a stopped rank ends the whole torchrun job within --failure-timeout
plus the detection's and torchrun's own few seconds, not after torchrun's 30 s SIGTERM-to-SIGKILL grace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_clean_exit import child_env

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 5.0
SLACK = 12.0
"""Seconds allowed past --failure-timeout: measured 2.6-8.2 s here; torchrun's grace alone would be 30."""


def test_a_stopped_rank_ends_the_job_within_the_failure_timeout(tmp_path: Path) -> None:
    out = tmp_path / "drills.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fault_drills.py"), "--failure-timeout",
                           str(TIMEOUT), "--only", "stop", "--limit", "120", "--out", str(out)],
                          capture_output=True, text=True, timeout=400, env=child_env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    (drill,) = json.loads(out.read_text())
    assert drill["status"] is not None and drill["status"] != 0, drill
    assert drill["seconds"] < TIMEOUT + SLACK, drill
    (line,) = drill["printed"]
    assert "rank 1 of 2 has not answered for 5 s" in line and "killed silent rank 1 (pid" in line, line
    assert "| stop |" in done.stdout
