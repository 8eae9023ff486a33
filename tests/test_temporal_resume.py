"""Temporal checkpoints: a killed and resumed run repeats the uninterrupted run's history exactly, on one
process and on 2 ranks in every parallelism; the caller's RNG and configs are left alone; bad
checkpoints and changed settings are refused."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from distributed_helpers import run_ranks
from test_temporal_distributed import stream as returning_users
from gnnscale.data.temporal import TemporalEvents, chronological_split
from gnnscale.temporal import MemoryConfig, TGNConfig
from gnnscale.temporal.train import TemporalLinkTrainer, TemporalTrainConfig

ROOT = Path(__file__).resolve().parents[1]
TIMINGS = ("train_seconds", "train_events_per_second", "eval_seconds")
"""History fields that are wall-clock measurements, which no two runs share."""


def stream(num_events: int = 600, num_nodes: int = 80) -> TemporalEvents:
    """Users returning to favourite items, with repeated times: a stream the model learns something on."""
    return returning_users(num_events, num_nodes)


def trainer(out: Path | None, *, epochs: int = 3, resume: bool = False, runtime=None, owner=None,
            events: TemporalEvents | None = None, **settings) -> TemporalLinkTrainer:
    """A small TGN with dropout, uniform neighbours and static memory: every kind of state a resume must carry."""
    events = stream() if events is None else events
    tgn = dict(embedding_dim=8, heads=2, dropout=0.2, static_memory=settings.pop("static_memory", True))
    config = TemporalTrainConfig(**{"epochs": epochs, "batch_size": 60, "num_neighbors": 5, "seed": 3,
                                    "sampling": "uniform", "resume": resume, **settings})
    return TemporalLinkTrainer(events, chronological_split(events, seed=0), memory_config=MemoryConfig(
        memory_dim=8, time_dim=8), tgn_config=TGNConfig(**tgn), config=config, runtime=runtime, owner=owner, out=out)


def without_timings(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in TIMINGS} for record in history]


def outcome(metrics: dict) -> dict:
    """What must agree between a resumed and an uninterrupted run: every epoch's record, the final figures."""
    return {"history": without_timings(metrics["history"]), "best_epoch": metrics["best_epoch"],
            **{k: v for k, v in metrics.items() if k.startswith(("val_", "test_")) or k.endswith("_run")}}


@pytest.mark.parametrize("patience", [0, 1])
def test_a_resumed_run_repeats_the_uninterrupted_one(tmp_path, patience):
    """Epoch 1 in one trainer, epochs 2..3 in a fresh one from its checkpoint: the same records and final
    metrics as 3 epochs in one go, to the bit (patience 1: the patience count is carried over too)."""
    whole = trainer(tmp_path / "whole", epochs=3, patience=patience).fit()
    trainer(tmp_path / "cut", epochs=1, patience=patience).fit()
    resumed = trainer(tmp_path / "cut", epochs=3, patience=patience, resume=True).fit()
    assert outcome(resumed) == outcome(whole)
    assert len(whole["history"]) >= 2 and whole["history"][0]["loss"] != whole["history"][1]["loss"]


def test_resuming_a_finished_run_trains_nothing_and_reports_the_same(tmp_path):
    whole = trainer(tmp_path, epochs=2).fit()
    again = trainer(tmp_path, epochs=2, resume=True)
    steps = []
    again.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    assert outcome(again.fit()) == outcome(whole) and not steps


def test_no_checkpoint_yet_starts_from_the_first_epoch(tmp_path):
    assert outcome(trainer(tmp_path / "new", epochs=1, resume=True).fit()) == outcome(trainer(None, epochs=1).fit())


def test_checkpoint_every_writes_those_epochs_and_the_last(tmp_path):
    epochs = []
    run = trainer(tmp_path, epochs=3, checkpoint_every=2)
    save = run.checkpoint.save
    run.checkpoint.save = lambda state, *args: (epochs.append(state.epoch), save(state, *args))
    run.fit()
    assert epochs == [2, 3]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["epoch"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # one process: one file
    trainer(tmp_path / "never", epochs=1, checkpoint_every=0).fit()
    assert not (tmp_path / "never").exists()


def test_training_leaves_the_callers_rng_and_configs_alone_and_repeats_itself(tmp_path):
    """The global generator's state after ``fit`` is the one before it (no reseeding in library code),
    the configs passed in are unchanged, and two runs of one seed agree to the bit."""
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    events = stream()
    split = chronological_split(events, seed=0)
    configs = (MemoryConfig(memory_dim=8, time_dim=8), TGNConfig(embedding_dim=8, heads=2, dropout=0.3),
               TemporalTrainConfig(epochs=2, batch_size=60, num_neighbors=5, seed=3, sampling="uniform"))
    copies = copy.deepcopy(configs)
    runs = [TemporalLinkTrainer(events, split, memory_config=configs[0], tgn_config=configs[1], config=configs[2],
                                out=tmp_path / str(i)).fit() for i in range(2)]
    assert torch.equal(torch.get_rng_state(), before)
    assert configs == copies
    assert outcome(runs[0]) == outcome(runs[1])
    other = trainer(None, epochs=2, seed=4, static_memory=False, events=events)
    assert without_timings(other.fit()["history"]) != without_timings(runs[0]["history"])


def test_resume_refuses_other_settings_and_unreadable_files(tmp_path):
    trainer(tmp_path, epochs=1).fit()
    with pytest.raises(ValueError, match=r"different run \(lr = 0\.0005, this run has 0\.001\)"):
        trainer(tmp_path, epochs=2, lr=1e-3, resume=True).fit()
    with pytest.raises(ValueError, match=r"different run \(tgn = .*static_memory=True"):
        trainer(tmp_path, epochs=2, resume=True, static_memory=False).fit()
    with pytest.raises(ValueError, match=r"different run \(stream = 'toy: 80 nodes, 600 events'"):
        trainer(tmp_path, epochs=2, resume=True, events=stream(num_events=500)).fit()
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="is not a readable gnnscale checkpoint"):
        trainer(tmp_path, epochs=2, resume=True).fit()


def test_seeded_draws_from_its_seed_and_restores_the_callers_generator_even_on_an_error():
    from gnnscale.train.fit import seeded

    torch.manual_seed(99)
    before = torch.get_rng_state()
    with seeded(5, torch.device("cpu")):
        inside = torch.rand(4)
    with pytest.raises(RuntimeError, match="stop"), seeded(5, torch.device("cpu")):
        again = torch.rand(4)
        raise RuntimeError("stop")
    assert torch.equal(inside, again) and torch.equal(torch.get_rng_state(), before)
    assert torch.equal(inside, torch.rand(4, generator=torch.Generator().manual_seed(5)))


class RunsACommand:
    """Unpickling this runs ``touch``: what ``weights_only=True`` must refuse to do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def test_a_checkpoint_that_would_run_code_is_refused_unrun(tmp_path):
    trainer(tmp_path, epochs=1).fit()
    torch.save({"format_version": 1, "payload": RunsACommand(tmp_path / "payload_ran")}, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match="is not a readable gnnscale checkpoint .*Weights only load failed"):
        trainer(tmp_path, epochs=2, resume=True).fit()
    assert not (tmp_path / "payload_ran").exists()


def test_config_errors():
    with pytest.raises(ValueError, match="checkpoint_every must be >= 0 epochs, got -1"):
        TemporalTrainConfig(checkpoint_every=-1)
    with pytest.raises(ValueError, match="resume=True needs the out folder that holds the checkpoint"):
        trainer(None, resume=True)


def test_a_failed_checkpoint_write_is_one_output_error_naming_the_folder(tmp_path):
    from gnnscale.options import OutputError

    run = trainer(tmp_path / "run", epochs=1)
    (tmp_path / "run").write_text("a file where the run folder should be")
    with pytest.raises(OutputError, match=r"cannot write a checkpoint in .*run \(File exists\); no checkpoint "
                                         r"was kept"):
        run.fit()


# ---------------------------------------------------------------- the command line, killed for real
def cli(events_file: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "train_temporal.py"), "--dataset", "npz", "--data-dir",
            str(events_file), "--batch-size", "30", "--memory-dim", "16", "--time-dim", "16", "--embedding-dim", "16",
            "--num-neighbors", "5", "--sampling", "uniform", "--seed", "2", "--out", str(out), *extra]


def checkpoint_epoch(path: Path) -> int | None:
    try:
        return int(torch.load(path, weights_only=True)["epoch"])
    except Exception:  # not there yet, or being replaced
        return None


def kill_after_first_checkpoint(command: list[str], checkpoint: Path, timeout: float = 300.0) -> int:
    """Start ``command``; SIGKILL it once ``checkpoint`` exists; the epoch it holds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, f"the run ended before it was killed: {stderr[-2000:]}"
    epoch = checkpoint_epoch(checkpoint)
    assert epoch is not None, "no readable checkpoint after the kill"
    return epoch


def test_a_killed_command_line_run_resumes_to_the_uninterrupted_history(tmp_path):
    """``train_temporal.py`` SIGKILLed once its first checkpoint is on disk, then rerun with ``--resume``:
    metrics.json holds the history and test figures of an uninterrupted run."""
    events = stream(num_events=800, num_nodes=160)
    np.savez(tmp_path / "events.npz", src=events.src, dst=events.dst, t=events.t)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    epochs = ["--epochs", "3"]
    whole = subprocess.run(cli(tmp_path / "events.npz", tmp_path / "whole", *epochs), env=env, capture_output=True,
                           text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]
    killed_at = kill_after_first_checkpoint(cli(tmp_path / "events.npz", tmp_path / "cut", *epochs),
                                            tmp_path / "cut" / "checkpoint.pt")
    assert 1 <= killed_at < 3 and not (tmp_path / "cut" / "metrics.json").exists()
    resumed = subprocess.run(cli(tmp_path / "events.npz", tmp_path / "cut", *epochs, "--resume"), env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from epoch {killed_at}" in resumed.stderr
    a, b = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("whole", "cut"))
    assert without_timings(b["history"]) == without_timings(a["history"]) and len(a["history"]) == 3
    assert {k: v for k, v in b.items() if k.startswith(("val_", "test_"))} == \
        {k: v for k, v in a.items() if k.startswith(("val_", "test_"))}


def test_command_line_resume_with_other_settings_is_one_line(tmp_path):
    events = stream()
    np.savez(tmp_path / "events.npz", src=events.src, dst=events.dst, t=events.t)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run(cli(tmp_path / "events.npz", tmp_path / "run", "--epochs", "1"), env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    again = subprocess.run(cli(tmp_path / "events.npz", tmp_path / "run", "--epochs", "2", "--batch-size", "40",
                               "--resume", "--quiet"), env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'run' / 'checkpoint.pt'} was written by a different run (--batch-size = 30, this run "
        f"has 40); resume with the same settings, or use a fresh --out"]  # the library's name, as the flag


# ---------------------------------------------------------------- 2 ranks, every parallelism
MODES = {"sharded": dict(staleness=0),
         "sharded-bounded-k2": dict(staleness=2, memory_cache_rows=20, static_memory=False),
         "memory": dict(parallelism="memory"), "epoch": dict(parallelism="epoch")}
"""Per-rank state each resume must bring back: a dense shard, a bounded table (its held nodes, read times,
step count), a memory group's memory carried into its next segment, a lagging epoch-parallel rank."""


def resume_job(rank: int, root: str) -> dict:
    """On each rank, for every mode: 3 epochs in one go; 1 epoch, then a fresh trainer resumed to 3; then a
    resume with rank 1's share of the checkpoint deleted."""
    from gnnscale.distributed.env import init_runtime, read_env
    from gnnscale.temporal.sharded import partition_interactions

    torch.set_num_threads(1)
    runtime = init_runtime(read_env(), "cpu", timeout=180.0)  # two cores shared by many jobs
    events = stream()
    train = chronological_split(events, seed=0).train
    owner = partition_interactions(events.src[train], events.dst[train], events.num_nodes, 2, seed=0)
    results: dict = {}
    try:
        for mode, settings in MODES.items():
            out = Path(root) / mode
            owners = owner if settings.get("parallelism", "sharded") == "sharded" else None
            build = lambda folder, epochs, resume=False: trainer(  # noqa: E731
                folder, epochs=epochs, resume=resume, runtime=runtime, owner=owners, events=events, **settings)
            whole = build(out / "whole", 3).fit()
            build(out / "cut", 1).fit()
            files = sorted(p.name for p in (out / "cut").iterdir())
            resumed = build(out / "cut", 3, resume=True).fit()
            results[mode] = {"whole": outcome(whole), "resumed": outcome(resumed), "files": files}
        (Path(root) / "sharded" / "cut" / "checkpoint-rank1-epoch3.pt").unlink(missing_ok=True)
        try:
            trainer(Path(root) / "sharded" / "cut", epochs=4, resume=True, runtime=runtime, owner=owner,
                    events=events, **MODES["sharded"]).fit()
        except ValueError as err:
            results["missing"] = str(err)
        runtime.barrier()
    finally:
        runtime.close()
    return results


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(resume_job, 2, str(tmp_path_factory.mktemp("resume")), timeout=600)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_resumed_two_rank_run_repeats_the_uninterrupted_one(two_ranks, mode):
    """Each parallelism on 2 ranks: epoch 1, then epochs 2..3 from its checkpoint, equal every rank's
    uninterrupted run to the bit; the checkpoint is rank 0's file plus rank 1's share of the same epoch."""
    for rank in two_ranks:
        assert rank[mode]["resumed"] == rank[mode]["whole"]
    # Every rank reports the same losses and scores (in memory groups, read counts are each rank's own).
    scores = [[(r["loss"], r["val_ap"]) for r in rank[mode]["whole"]["history"]] for rank in two_ranks]
    assert scores[0] == scores[1] and len(scores[0]) == 3
    assert two_ranks[0][mode]["files"] == ["checkpoint-rank1-epoch1.pt", "checkpoint.pt"]


def test_a_missing_rank_share_is_refused_on_every_rank(two_ranks):
    assert two_ranks[0]["missing"] == two_ranks[1]["missing"]
    assert two_ranks[0]["missing"].startswith("rank 1: ")
    assert "checkpoint-rank1-epoch3.pt is missing: the checkpoint of epoch 3 needs every rank's share" in \
        two_ranks[0]["missing"]


@pytest.mark.slow
def test_torchrun_restarts_a_killed_rank_and_resumes_to_the_uninterrupted_history(tmp_path):
    """2 ranks under torchrun, node memory sharded in bounded tables with K = 2: rank 1 is SIGKILLed once the
    first checkpoint is on disk, torchrun (``--max-restarts=1``) restarts both with ``--resume``, and
    metrics.json equals an uninterrupted run's."""
    events = stream(num_events=1200, num_nodes=200)
    np.savez(tmp_path / "events.npz", src=events.src, dst=events.dst, t=events.t)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    torchrun = str(Path(sys.executable).with_name("torchrun"))

    def launch(out: str, *extra: str) -> list[str]:
        command = cli(tmp_path / "events.npz", tmp_path / out, "--epochs", "4", "--staleness", "2",
                      "--memory-cache-rows", "50", "--resume")
        return [torchrun, "--standalone", "--nproc_per_node=2", *extra, *command[1:]]

    whole = subprocess.run(launch("whole"), env=env, capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    agent = subprocess.Popen(launch("cut", "--max-restarts=1"), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not (tmp_path / "cut" / "checkpoint.pt").exists() and agent.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        workers = [p for p in psutil.Process(agent.pid).children(recursive=True) if "train_temporal.py" in " ".join(
            p.cmdline())]
        assert len(workers) == 2, workers
        workers[-1].send_signal(signal.SIGKILL)
        _, stderr = agent.communicate(timeout=600)
    finally:
        for proc in psutil.Process(agent.pid).children(recursive=True) if agent.poll() is None else []:
            proc.kill()
        agent.kill()
    assert agent.returncode == 0, stderr[-3000:]
    assert "resumed from epoch" in stderr, stderr[-3000:]
    a, b = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("whole", "cut"))
    assert without_timings(b["history"]) == without_timings(a["history"]) and len(a["history"]) == 4
    assert {k: v for k, v in b.items() if k.startswith(("val_", "test_"))} == \
        {k: v for k, v in a.items() if k.startswith(("val_", "test_"))}
