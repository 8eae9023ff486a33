"""The training command's --task link: static link prediction on 1 and 2 ranks through the CLI, embeddings
written with --save-predictions, and its options' errors in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from distributed_helpers import partition_dataset, run_ranks

ARGS = ["--task", "link", "--model", "gcn", "--num-layers", "2", "--hidden", "32", "--fanouts", "5,5",
        "--batch-size", "256", "--epochs", "4", "--dropout", "0", "--weight-decay", "0", "--quiet"]


def synthetic() -> Any:
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

    return generate_synthetic(SyntheticConfig(num_nodes=1000, avg_degree=6, num_classes=5, feat_dim=16, seed=2))


def train(rank: int, parts: str, out: str) -> tuple[int, bool]:
    """The command's exit status, and whether torch's compiler was loaded (World.wrap and gnnscale's Adam
    leave it out: about 150 MiB a process, docs/memory.md)."""
    from gnnscale.train.cli import main

    status = main(["--partitions", parts, "--out", out, "--save-predictions", *ARGS])
    return status, "torch._dynamo" in sys.modules


@pytest.mark.parametrize("ranks", [1, 2])
def test_link_task_trains_and_writes_embeddings(tmp_path: Path, ranks: int) -> None:
    import gnnscale as gs

    parts = partition_dataset(synthetic(), tmp_path / "parts", ranks)
    assert run_ranks(train, ranks, str(parts), str(tmp_path / "run"), timeout=300.0) == [(0, False)] * ranks
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["task"] == "link" and metrics["metric"] == "roc_auc"
    # Planted communities: linked nodes share one, so held-out edges are far above chance (0.5).
    assert metrics["test"] > 0.75, metrics["test"]
    assert set(metrics["test_link"]) == {"roc_auc", "mrr", "hits@20", "hits@50"}
    assert all(0 <= metrics["test_link"][k] <= 1 for k in metrics["test_link"])
    embeddings = gs.read_outputs(tmp_path / "run" / "predictions")
    assert embeddings.shape == (1000, 32) and np.isfinite(embeddings).all()


@pytest.mark.parametrize("extra,message", [
    (["--num-negatives", "0"], "error: --num-negatives must be >= 1, got 0"),
    (["--val-fraction", "0.6", "--test-fraction", "0.5"], "error: --val-fraction and --test-fraction must be > 0 "
                                                          "with a sum below 1, got 0.6 and 0.5"),
])
def test_bad_link_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str],
                                       message: str) -> None:
    from gnnscale.train.cli import main

    assert main(["--dataset", "synthetic", "--num-nodes", "2000", "--out", str(tmp_path / "run"), *ARGS, *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(message), lines
    assert not (tmp_path / "run" / "metrics.json").exists()


def resumable(rank: int, parts: str, out: str, epochs: str, resume: bool) -> int:
    from gnnscale.train.cli import main

    return main(["--partitions", parts, "--out", out, *ARGS, "--epochs", epochs, *(["--resume"] if resume else [])])


@pytest.mark.parametrize("ranks", [1, 2])
def test_link_task_resumes_as_the_uninterrupted_run(tmp_path: Path, ranks: int) -> None:
    parts = str(partition_dataset(synthetic(), tmp_path / "parts", ranks))
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    assert run_ranks(resumable, ranks, parts, whole, "4", False, timeout=300.0) == [0] * ranks
    assert run_ranks(resumable, ranks, parts, split, "2", False, timeout=300.0) == [0] * ranks
    first = json.loads((Path(split) / "metrics.json").read_text())
    assert run_ranks(resumable, ranks, parts, split, "4", True, timeout=300.0) == [0] * ranks
    expected, resumed = (json.loads((Path(run) / "metrics.json").read_text()) for run in (whole, split))
    assert resumed["epochs_run"] == 4
    # Epochs 1-2 came from the checkpoint (their wall times are the first run's), 3-4 were trained again.
    assert [r["epoch_seconds"] for r in resumed["history"][:2]] == [r["epoch_seconds"] for r in first["history"]]
    for key in ("loss", "val"):  # the resumed epochs 3 and 4 are the uninterrupted run's, to the bit
        assert [r[key] for r in resumed["history"]] == [r[key] for r in expected["history"]], key
    assert resumed["test_link"] == expected["test_link"]


def test_link_resume_refuses_other_settings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from gnnscale.train.cli import main

    run = str(tmp_path / "run")
    base = ["--dataset", "synthetic", "--num-nodes", "2000", "--out", run, *ARGS, "--epochs", "1"]
    assert main(base) == 0
    assert main([*base, "--epochs", "2", "--resume", "--decoder", "mlp"]) == 2
    assert "was written by a different run (link = " in capsys.readouterr().err.strip().splitlines()[-1]
