"""Under torchrun without ``--partitions`` (rank 0 partitions into ``<out>/partitions`` first), every option
that depends on the world size or the graph's size is refused before anything is written: one error line
for the whole job, and ``--out`` byte-identical."""

from __future__ import annotations

import re

import subprocess
import sys
from pathlib import Path

import pytest
from test_clean_exit import child_env
from test_write_failures import NODE_ARGS, tree_digest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "scripts" / "train_node_classification.py")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

REFUSED = {
    "capacity-of-3-ranks": (["--rank-capacity", "1,2,3"], "--rank-capacity '1,2,3' gives 3 weight(s) for 2 ranks"),
    "capacity-of-1-rank": (["--rank-capacity", "1"], "--rank-capacity '1' gives 1 weight(s) for 2 ranks"),
    "replicated-over-budget": (["--topology", "replicated", "--topology-budget-mb", "0.001"],
                               "--topology replicated needs 0.1 MiB per rank for the whole graph structure, over "
                               "--topology-budget-mb 0.001"),
    "vip-on-partitioned-without-halo-copy": (["--topology", "partitioned", "--cache-policy", "vip",
                                              "--topology-budget-mb", "0"],
                                             "--cache-policy vip needs every node a batch can reach"),
    "resume-of-1-rank": (["--resume"], "was written by a different run (world_size = 1, this run has 2)"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_before_the_first_write_in_one_line(tmp_path: Path, case: str) -> None:
    extra, message = REFUSED[case]
    out = tmp_path / "run"
    if case == "resume-of-1-rank":  # an existing run folder of a 1-rank run
        first = subprocess.run([sys.executable, TRAIN, *NODE_ARGS, "--epochs", "1", "--quiet", "--out", str(out)],
                               capture_output=True, text=True, timeout=300, env=child_env(), cwd=ROOT)
        assert first.returncode == 0, first.stderr
    else:
        out.mkdir()
        (out / "notes.txt").write_text("kept as it is\n")
    before = tree_digest(out)
    done = subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node=2", TRAIN, *NODE_ARGS, "--epochs", "1",
                           "--quiet", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300, env=child_env(), cwd=ROOT)
    assert done.returncode != 0
    ours = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and message in ours[0], done.stderr[-3000:]
    # What torchrun itself reports after its workers (its logger's module, or its own log line's path: torch
    # 2.15 prints "... torch/distributed/elastic/multiprocessing/api.py:...] failed" and a ChildFailedError
    # traceback) is not ours.
    ours_stderr = re.split(r"torch[./]distributed[./]elastic", done.stderr)[0]
    assert "Traceback" not in ours_stderr, done.stderr[-3000:]
    assert tree_digest(out) == before and not (out / "partitions").exists()
