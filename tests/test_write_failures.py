"""A run folder that becomes unwritable while training runs: one error line, nothing kept is lost.

The real commands run in a world of one (torchrun adds its own report of a failed child); the folder is
made immutable (``chattr +i``, which root cannot write through either) the moment the run shows a sign
of progress, so the failure comes late, as in a long run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_clean_exit import child_env, tiny_stream

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "scripts" / "train_node_classification.py")
TEMPORAL = str(ROOT / "scripts" / "train_temporal.py")
NODE_ARGS = ["--dataset", "synthetic", "--num-nodes", "1500", "--feat-dim", "8", "--num-layers", "2", "--hidden",
             "16", "--fanouts", "5,5", "--batch-size", "256", "--num-workers", "0"]
TEMPORAL_ARGS = ["--memory-dim", "4", "--time-dim", "4", "--embedding-dim", "4", "--heads", "1",
                 "--batch-size", "40", "--num-neighbors", "2", "--eval-negatives", "2"]
TIMEOUT = 300


def tree_digest(folder: Path) -> str:
    """One hash of every path and file content under ``folder``, the writers' temporaries aside.

    A temporary (``.name.tmp-PID``) opened just before the freeze is still written through its open
    descriptor, and the immutable folder keeps the writer from removing it: the freeze's own artefact,
    not a kept file changed (a full disk or an I/O error lets the writer remove it)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if not re.fullmatch(r"\..+\.tmp-\d+", p.name)):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _freeze(folder: Path, on: bool) -> None:
    if shutil.which("chattr") is not None and os.geteuid() == 0:
        subprocess.run(["chattr", "+i" if on else "-i", str(folder)], check=True)
    else:
        folder.chmod(0o555 if on else 0o755)


@pytest.fixture
def frozen() -> Iterator[Callable[[Path], None]]:
    """``frozen(folder)`` makes ``folder`` unwritable until the test ends; skips where that cannot be done."""
    done: list[Path] = []

    def freeze(folder: Path) -> None:
        _freeze(folder, True)
        done.append(folder)
        try:
            (folder / ".probe").touch()
        except OSError:
            return
        (folder / ".probe").unlink()
        pytest.skip("no way to make a folder unwritable here (not root, and chmod does not bind this user)")

    yield freeze
    for folder in done:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _freeze(folder, False)


def run_and_freeze(command: list[str], out: Path, sign: Callable[[Path, str], bool],
                   freeze: Callable[[Path], None]) -> tuple[subprocess.CompletedProcess, str]:
    """Run ``command``; once ``sign(out, stderr so far)`` holds, freeze ``out``.  The result, and the folder's
    digest at the freeze."""
    out.mkdir(parents=True, exist_ok=True)  # a run that writes only at the end: its folder is there to freeze
    log = out.parent / f"{out.name}.stderr"
    with open(log, "w") as err, open(out.parent / f"{out.name}.stdout", "w") as stdout:
        proc = subprocess.Popen(command, stdout=stdout, stderr=err, text=True, env=child_env(), cwd=ROOT)
        deadline, digest = time.monotonic() + TIMEOUT, None
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if digest is None and out.is_dir() and sign(out, log.read_text()):
                    freeze(out)
                    digest = tree_digest(out)
                time.sleep(0.02)
            assert proc.poll() is not None, f"{command[1]} did not end within {TIMEOUT} s"
        finally:
            proc.kill()
    assert digest is not None, f"the run ended before the sign to freeze its folder:\n{log.read_text()[-2000:]}"
    return subprocess.CompletedProcess(command, proc.returncode, (out.parent / f"{out.name}.stdout").read_text(),
                                       log.read_text()), digest


def problem_lines(stderr: str) -> list[str]:
    """stderr without the INFO log lines."""
    return [line for line in stderr.splitlines() if line.strip() and " INFO " not in line]


def test_checkpoint_failure_stops_in_one_line_with_the_last_checkpoint_intact(tmp_path: Path, frozen) -> None:
    out = tmp_path / "run"
    done, digest = run_and_freeze([sys.executable, TRAIN, *NODE_ARGS, "--epochs", "500", "--quiet", "--out", str(out)],
                                  out, lambda folder, _: (folder / "checkpoint.pt").exists(), frozen)
    assert done.returncode == 1, done.stderr
    (line,) = problem_lines(done.stderr)
    assert line.startswith(f"error: cannot write a checkpoint in {out} (")
    assert "the last checkpoint there (checkpoint.pt) is intact" in line and "--on-checkpoint-error warn" in line
    assert tree_digest(out) == digest and not (out / "metrics.json").exists()


def test_checkpoint_failure_with_warn_trains_on_and_prints_the_result(tmp_path: Path, frozen) -> None:
    out = tmp_path / "run"
    done, digest = run_and_freeze([sys.executable, TRAIN, *NODE_ARGS, "--epochs", "40", "--quiet", "--out", str(out),
                                   "--on-checkpoint-error", "warn"],
                                  out, lambda folder, _: (folder / "checkpoint.pt").exists(), frozen)
    assert done.returncode == 1, done.stderr
    warning, error = problem_lines(done.stderr)  # one warning however many checkpoints failed
    assert "WARNING cannot write a checkpoint in" in warning and "training goes on" in warning
    assert error.startswith(f"error: cannot write metrics.json in {out} (")
    result, payload = done.stdout.split("\n", 1)
    assert result.startswith("synthetic sage on 1 rank(s): test accuracy") and "not written" in result
    assert json.loads(payload)["epochs_run"] == 40
    assert tree_digest(out) == digest


def test_metrics_failure_prints_the_result_first_node_classification(tmp_path: Path, frozen) -> None:
    out = tmp_path / "run"
    done, digest = run_and_freeze([sys.executable, TRAIN, *NODE_ARGS, "--epochs", "40", "--checkpoint-every", "0",
                                   "--out", str(out)], out, lambda _, stderr: " epoch " in stderr, frozen)
    assert done.returncode == 1, done.stderr
    (line,) = problem_lines(done.stderr)
    assert line.startswith(f"error: cannot write metrics.json in {out} (") and "on stdout above" in line
    result, payload = done.stdout.split("\n", 1)
    assert "test accuracy" in result and json.loads(payload)["epochs_run"] == 40
    assert tree_digest(out) == digest


def test_metrics_failure_prints_the_result_first_temporal(tmp_path: Path, frozen) -> None:
    out = tmp_path / "run"
    data = tiny_stream(tmp_path / "events.csv")
    # No checkpoints (the temporal command writes one every epoch by default): metrics.json is what fails.
    done, digest = run_and_freeze([sys.executable, TEMPORAL, "--dataset", "csv", "--data-dir", str(data),
                                   *TEMPORAL_ARGS, "--epochs", "30", "--checkpoint-every", "0", "--out", str(out)],
                                  out, lambda _, stderr: " epoch " in stderr, frozen)
    assert done.returncode == 1, done.stderr
    (line,) = problem_lines(done.stderr)
    assert line.startswith(f"error: cannot write metrics.json in {out} (")
    result, payload = done.stdout.split("\n", 1)
    assert "test AP" in result and json.loads(payload)["epochs_run"] == 30
    assert tree_digest(out) == digest


def test_checkpoint_writer_policies(tmp_path: Path, frozen, caplog: pytest.LogCaptureFixture) -> None:
    from gnnscale.options import OutputError
    from gnnscale.train.checkpoint import CheckpointWriter

    with pytest.raises(ValueError, match="--on-checkpoint-error must be one of stop, warn, got 'ignore'"):
        CheckpointWriter(tmp_path / "checkpoint.pt", "ignore")
    folder = tmp_path / "run"
    folder.mkdir()
    stop, warn = CheckpointWriter(folder / "checkpoint.pt"), CheckpointWriter(folder / "checkpoint.pt", "warn")
    assert stop.write({"epoch": 1})
    frozen(folder)
    with pytest.raises(OutputError, match=r"cannot write a checkpoint in .*run \(.+\); the last checkpoint there "
                                          r"\(checkpoint.pt\) is intact"):
        stop.write({"epoch": 2})
    assert not warn.write({"epoch": 2}) and not warn.write({"epoch": 3}) and warn.failing
    assert sum("cannot write a checkpoint" in r.getMessage() for r in caplog.records) == 1
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.pt"]
