"""A script that never closes its ``gs.init()`` world still leaves the job cleanly at exit.

Before, the job was left by the garbage collector during interpreter shutdown: a world of one printed
"Exception ignored in: <generator object joined_job ...> ImportError: sys.meta_path is None", and on N ranks
the leaving code ran half torn down.  Now ``atexit`` closes the world: after a clean end as ``close`` does
(every rank at the barrier), after an uncaught exception as an error (its peers stop at once, naming it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_clean_exit import ROOT, TORCHRUN, child_env

TIMEOUT = 120.0

SCRIPT = """
import sys
import torch
import gnnscale as gs

world = gs.init(failure_timeout=30.0)
holder = {"world": world}
holder["self"] = holder  # a reference cycle (a user's objects that refer to the world): collected at shutdown
total = torch.ones(1)
if world.size > 1:
    torch.distributed.all_reduce(total, group=world.runtime.group)
print(f"rank {world.rank}: sum {total.item():g}", flush=True)
if world.rank == int(sys.argv[1]):
    raise RuntimeError(f"rank {world.rank} failed after the work")
# no world.close(): the interpreter's exit leaves the job
"""


def run_script(tmp_path: Path, ranks: int, failing_rank: int) -> subprocess.CompletedProcess:
    script = tmp_path / "forgets_close.py"
    script.write_text(SCRIPT)
    launch = [sys.executable] if ranks == 1 else [TORCHRUN, "--standalone", f"--nproc_per_node={ranks}"]
    return subprocess.run([*launch, str(script), str(failing_rank)], capture_output=True, text=True, env=child_env(),
                          cwd=ROOT, timeout=TIMEOUT)


def test_a_world_of_one_left_open_exits_without_a_shutdown_traceback(tmp_path: Path) -> None:
    done = run_script(tmp_path, 1, failing_rank=-1)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 0: sum 1" in done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_two_ranks_left_open_both_leave_the_job_and_exit(tmp_path: Path) -> None:
    done = run_script(tmp_path, 2, failing_rank=-1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0: sum 2" in done.stdout and "rank 1: sum 2" in done.stdout
    assert "Exception ignored" not in done.stderr and "Timeout (" not in done.stderr, done.stderr[-3000:]


def test_a_rank_that_raises_without_closing_stops_its_peer_naming_it(tmp_path: Path) -> None:
    """Rank 1 raises after the collective; rank 0 ends its script and waits at the exit's barrier: it must not
    wait out a hang (the run's timeout).  Either rank 0 is told that rank 1 failed (its own line), or torchrun, which
    saw rank 1 exit first, ends it: which comes first is a race (a clean-clone CI run met the second)."""
    done = run_script(tmp_path, 2, failing_rank=1)
    assert done.returncode != 0
    assert "rank 1 failed after the work" in done.stderr
    told = "rank 1 of 2 stopped with an error" in done.stderr and "stopping rank 0" in done.stderr
    assert told or "Signal 15 (SIGTERM) received" in done.stderr, done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]
