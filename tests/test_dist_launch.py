"""Launching the distributed trainer for real: torchrun on one and two "nodes", failures, resume.

Every run is a real ``torchrun`` (or hand-launched ranks) on real partitions in ``tmp_path``,
with a timeout on each child, so a hang fails the test instead of the suite.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import read_strict_json

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "scripts" / "train_node_classification.py")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
# Small enough to start fast, with enough steps per epoch to kill a rank mid-epoch.
# A cache smaller than the halo: rows still cross between ranks (a cache holding every reachable row would
# leave nothing to send on a graph this small).
TRAIN_ARGS = ["--model", "sage", "--num-layers", "2", "--hidden", "32", "--fanouts", "10,10", "--batch-size", "32",
              "--eval-every", "1", "--quiet", "--cache-mb", "0.1"]
LAUNCH_TIMEOUT = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    # One thread per rank everywhere, so one-node and two-node launches compute identically.
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def run(command: list[str], timeout: float = LAUNCH_TIMEOUT) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=ROOT)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{' '.join(command[:6])} ... did not finish within {timeout} s:\n{err.stderr}")


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-partition synthetic graph: 8,000 nodes, ~25 steps of 32 seeds per rank and epoch."""
    out = tmp_path_factory.mktemp("dist") / "parts"
    done = run([sys.executable, "-m", "partition", "--num-nodes", "8000", "--feat-dim", "16", "--num-parts", "2",
                "--out", str(out), "--quiet"])
    assert done.returncode == 0, done.stderr
    return out


def standalone(parts: Path, out: Path, *extra: str, nproc: int = 2, launcher: tuple[str, ...] = ()) -> list[str]:
    return [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", *launcher, TRAIN, "--partitions", str(parts),
            "--out", str(out), *TRAIN_ARGS, *extra]


def metrics(out: Path) -> dict:
    return read_strict_json(out / "metrics.json")


def same_run(a: dict, b: dict) -> None:
    """Two runs trained identically: the same losses and scores every epoch."""
    assert [r["epoch"] for r in a["history"]] == [r["epoch"] for r in b["history"]]
    for ra, rb in zip(a["history"], b["history"]):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-6), (ra, rb)
        assert ra["val"] == pytest.approx(rb["val"], abs=1e-9), (ra, rb)
    assert (a["val"], a["test"], a["best_epoch"]) == pytest.approx((b["val"], b["test"], b["best_epoch"]))


@pytest.fixture(scope="module")
def reference(parts: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An uninterrupted 3-epoch run on one node with 2 ranks."""
    out = tmp_path_factory.mktemp("reference")
    done = run(standalone(parts, out, "--epochs", "3"))
    assert done.returncode == 0, done.stderr[-3000:]
    return metrics(out)


def test_single_node_run_writes_metrics(reference: dict) -> None:
    assert reference["world_size"] == 2 and reference["epochs_run"] == 3
    assert reference["test"] > 0.5  # 10 classes: chance is 0.1
    for key in ("sample_s", "gather_s", "compute_s", "wait_s", "bytes_sent", "cache_hit_rate"):
        assert key in reference["history"][0], key
    assert reference["history"][0]["bytes_sent"] > 0


def test_two_nodes_on_one_machine_agree_with_one_node(parts: Path, reference: dict, tmp_path: Path) -> None:
    port = free_port()
    agents = [subprocess.Popen([TORCHRUN, "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
                                "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=two-nodes",
                                TRAIN, "--partitions", str(parts), "--out", str(tmp_path), *TRAIN_ARGS,
                                "--epochs", "3"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
              for node in (0, 1)]
    try:
        outputs = [agent.communicate(timeout=LAUNCH_TIMEOUT) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    for agent, (_, err) in zip(agents, outputs):
        assert agent.returncode == 0, err[-3000:]
    same_run(metrics(tmp_path), reference)


def test_resume_ends_like_the_uninterrupted_run(parts: Path, reference: dict, tmp_path: Path) -> None:
    first = run(standalone(parts, tmp_path, "--epochs", "1"))
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run(standalone(parts, tmp_path, "--epochs", "3", "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    same_run(metrics(tmp_path), reference)


def test_resume_refuses_a_checkpoint_of_other_settings(parts: Path, tmp_path: Path) -> None:
    assert run(standalone(parts, tmp_path, "--epochs", "1")).returncode == 0
    done = run(standalone(parts, tmp_path, "--epochs", "2", "--resume", "--lr", "0.5"))
    assert done.returncode != 0
    assert "was written by a different run (lr = 0.01, this run has 0.5)" in done.stderr


def test_world_size_must_equal_the_number_of_partitions(parts: Path, tmp_path: Path) -> None:
    done = run([sys.executable, TRAIN, "--partitions", str(parts), "--out", str(tmp_path), *TRAIN_ARGS])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {parts} holds 2 partition(s) but this job has "
                                                           f"1 rank(s)")


def test_torchrun_without_partitions_partitions_first_like_the_cli(parts: Path, reference: dict,
                                                                  tmp_path: Path) -> None:
    command = [TORCHRUN, "--standalone", "--nproc_per_node=2", TRAIN, "--dataset", "synthetic", "--num-nodes", "8000",
               "--feat-dim", "16", "--out", str(tmp_path), *TRAIN_ARGS, "--epochs", "3"]
    done = run(command)
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads((tmp_path / "partitions" / "manifest.json").read_text())
    by_hand = json.loads((parts / "manifest.json").read_text())
    assert {k: v["sha256"] for k, v in written["files"].items()} == {k: v["sha256"] for k, v in by_hand["files"].items()}
    same_run(metrics(tmp_path), reference)


def test_several_loader_workers_need_a_world_of_one(parts: Path, tmp_path: Path) -> None:
    done = run(standalone(parts, tmp_path, "--epochs", "1", "--num-workers", "2"))
    assert done.returncode != 0
    assert "--num-workers 2 needs a world of one" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "metrics.json").exists()


def test_partitioning_failure_on_rank0_stops_the_job_with_its_reason(tmp_path: Path) -> None:
    command = [TORCHRUN, "--standalone", "--nproc_per_node=2", TRAIN, "--dataset", "cora", "--data-dir",
               str(tmp_path / "absent"), "--out", str(tmp_path / "run"), *TRAIN_ARGS]
    done = run(command)
    assert done.returncode != 0
    # The first rank to exit with it ends the job: torchrun stops the other, so the line may appear once.
    assert f"error: partitioning on rank 0 failed: {tmp_path / 'absent'}" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "run" / "metrics.json").exists()


def wait_for(path: Path, procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            pytest.fail(f"{path} did not appear (exit codes {[p.poll() for p in procs]})")
        time.sleep(0.2)


def test_killed_rank_is_named_by_the_survivor(parts: Path, tmp_path: Path) -> None:
    """Ranks launched by hand (no torchrun agent to clean up): the survivor must stop by itself."""
    port = free_port()
    ranks = []
    for rank in (0, 1):
        env = child_env() | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                             "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        ranks.append(subprocess.Popen([sys.executable, TRAIN, "--partitions", str(parts), "--out", str(tmp_path),
                                       *TRAIN_ARGS, "--epochs", "50", "--failure-timeout", "10"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT))
    try:
        wait_for(tmp_path / "checkpoint.pt", ranks, LAUNCH_TIMEOUT)
        ranks[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = ranks[0].communicate(timeout=120)
        stopped_after = time.monotonic() - killed_at
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    assert ranks[0].returncode == 3, err[-3000:]
    assert "rank 1 of 2 has not answered" in err, err[-3000:]
    assert stopped_after < 10 + 30, stopped_after


def test_torchrun_restart_with_resume_completes_after_a_kill(parts: Path, reference: dict, tmp_path: Path) -> None:
    agent = subprocess.Popen(standalone(parts, tmp_path, "--epochs", "3", "--resume", launcher=("--max-restarts=1",)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    try:
        wait_for(tmp_path / "checkpoint.pt", [agent], LAUNCH_TIMEOUT)
        workers = [p for p in psutil.Process(agent.pid).children(recursive=True) if TRAIN in p.cmdline()]
        assert len(workers) == 2, workers
        workers[-1].send_signal(signal.SIGKILL)
        _, err = agent.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        for proc in psutil.Process(agent.pid).children(recursive=True) if agent.poll() is None else []:
            proc.kill()
        agent.kill()
    assert agent.returncode == 0, err[-3000:]
    assert "resumed from epoch" in err or metrics(tmp_path)["epochs_run"] == 3
    same_run(metrics(tmp_path), reference)


def test_presample_cache_policy_caches_rows_that_are_then_hit(parts: Path, tmp_path: Path) -> None:
    done = run(standalone(parts, tmp_path, "--epochs", "1", "--cache-policy", "presample", "--cache-mb", "0.1"))
    assert done.returncode == 0, done.stderr[-3000:]
    record = metrics(tmp_path)["history"][0]
    # 0.1 MiB holds 1,638 rows of 16 floats: a partial cache, so both hits and fetches happen.
    assert 0.0 < record["cache_hit_rate"] < 1.0, record
    assert record["bytes_sent"] > 0
