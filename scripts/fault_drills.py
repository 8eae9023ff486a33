"""Fault drills: inject a fault into a real 2-rank torchrun job and time the job's exit.

    python scripts/fault_drills.py [--failure-timeout 10] [--only kill,stop,interrupt,unwritable]
                                   [--monitor-interval S] [--out DRILLS.json]

Each drill partitions a synthetic graph once, starts ``torchrun --standalone --nproc_per_node=2
scripts/train_node_classification.py`` on it (many epochs, a checkpoint after each), waits for the first
checkpoint, then injects its fault and measures the seconds from the fault to torchrun's exit:

* ``kill``: SIGKILL to rank 1;
* ``stop``: SIGSTOP to rank 1 (a hung machine: alive, silent);
* ``interrupt``: SIGINT to torchrun (Ctrl-C);
* ``unwritable``: ``chattr +i`` on ``--out`` (root) or ``chmod 555`` (others).

Prints a markdown table (drill, seconds to exit, torchrun's status, what gnnscale printed) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "scripts" / "train_node_classification.py")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
DRILLS = ("kill", "stop", "interrupt", "unwritable")
TRAIN_ARGS = ["--num-layers", "2", "--hidden", "32", "--fanouts", "10,10", "--batch-size", "32", "--epochs", "1000",
              "--quiet"]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def rank_pid(agent: psutil.Process, rank: int, timeout: float = 60.0) -> int:
    """The pid of ``rank`` among the agent's children (read from their environment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in agent.children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise RuntimeError(f"rank {rank} of torchrun pid {agent.pid} not found within {timeout:g} s")


def set_writable(folder: Path, writable: bool) -> None:
    if os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "-i" if writable else "+i", str(folder)], check=True)
    else:
        folder.chmod(0o755 if writable else 0o555)


def inject(drill: str, agent: subprocess.Popen, out: Path) -> None:
    """The drill's fault, now."""
    if drill == "interrupt":
        agent.send_signal(signal.SIGINT)
    elif drill == "unwritable":
        set_writable(out, False)
    else:
        os.kill(rank_pid(psutil.Process(agent.pid), 1), signal.SIGKILL if drill == "kill" else signal.SIGSTOP)


def run_drill(drill: str, parts: Path, work: Path, failure_timeout: float, limit: float,
              launcher: tuple[str, ...] = ()) -> dict:
    """One drill: start the job, wait for its first checkpoint, inject, time the exit (or give up at ``limit``)."""
    out = work / drill
    command = [TORCHRUN, "--standalone", "--nproc_per_node=2", *launcher, TRAIN, "--partitions", str(parts),
               "--out", str(out), "--failure-timeout", str(failure_timeout), *TRAIN_ARGS]
    log = work / f"{drill}.log"
    with open(log, "w") as sink:
        agent = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT)
        try:
            while not (out / "checkpoint.pt").exists():
                if agent.poll() is not None:
                    raise RuntimeError(f"{drill}: the job ended before its first checkpoint:\n{log.read_text()}")
                time.sleep(0.05)
            start = time.monotonic()
            inject(drill, agent, out)
            try:
                status = agent.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                status = None
            seconds = time.monotonic() - start
        finally:
            for child in psutil.Process(agent.pid).children(recursive=True) if agent.poll() is None else []:
                child.kill()
            agent.kill()
            if drill == "unwritable":
                set_writable(out, True)
    ours = [line for line in log.read_text().splitlines()
            if line.startswith(("error:", "gnnscale:", "interrupted")) or " WARNING " in line]
    return {"drill": drill, "seconds": round(seconds, 1), "status": status, "printed": ours,
            "failure_timeout": failure_timeout}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failure-timeout", type=float, default=10.0)
    parser.add_argument("--only", default=",".join(DRILLS), help=f"comma-separated drills of {', '.join(DRILLS)}")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds to wait for the exit before giving up")
    parser.add_argument("--monitor-interval", type=float, default=None, help="torchrun's --monitor-interval "
                        "(seconds between its checks of the ranks; default: torchrun's own, 5 in torch 2.2)")
    parser.add_argument("--out", type=Path, default=None, help="JSON of the results")
    args = parser.parse_args(argv)
    drills = [d for d in args.only.split(",") if d]
    unknown = sorted(set(drills) - set(DRILLS))
    if unknown:
        parser.error(f"unknown drill(s) {', '.join(unknown)}; choose from {', '.join(DRILLS)}")
    with tempfile.TemporaryDirectory(prefix="gnnscale-drills-") as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "partition", "--num-nodes", "8000", "--feat-dim", "16", "--num-parts",
                        "2", "--out", str(work / "parts"), "--quiet"], check=True, env=child_env(), cwd=ROOT)
        launcher = () if args.monitor_interval is None else (f"--monitor-interval={args.monitor_interval:g}",)
        results = [run_drill(d, work / "parts", work, args.failure_timeout, args.limit, launcher) for d in drills]
    print(f"| drill | seconds from fault to exit (--failure-timeout {args.failure_timeout:g}) | torchrun status | "
          f"gnnscale printed |\n|---|---|---|---|")
    for r in results:
        print(f"| {r['drill']} | {r['seconds']} | {r['status']} | {' / '.join(r['printed']) or '(nothing)'} |")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
