"""scripts/bench_gather.py end to end on a small graph, and its refusal of a folder of several partitions."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from distributed_helpers import partition_dataset

ROOT = Path(__file__).resolve().parents[1]


def bench_main():
    spec = importlib.util.spec_from_file_location("bench_gather", ROOT / "scripts" / "bench_gather.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

    dataset = generate_synthetic(SyntheticConfig(num_nodes=3000, avg_degree=6, num_classes=4, feat_dim=8, seed=1))
    root = tmp_path_factory.mktemp("gather")
    return {n: partition_dataset(dataset, root / f"parts-{n}", n) for n in (1, 2)}


def test_times_every_path_and_counts_half_batches(folders: dict[int, Path], tmp_path: Path) -> None:
    out = tmp_path / "gather.json"
    assert bench_main()(["--partitions", str(folders[1]), "--batch-size", "20", "--batches", "4", "--repeats", "1",
                         "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert all(result[k] > 0 for k in ("grouped_ms", "ordered_ms", "plain_ms", "input_rows_per_batch"))
    # Two half batches never read fewer rows or edges than one batch of their union.
    assert result["input_rows_ratio"] >= 1.0 and result["edges_ratio"] >= 1.0


def test_refuses_a_folder_of_several_partitions(folders: dict[int, Path], capsys: pytest.CaptureFixture) -> None:
    assert bench_main()(["--partitions", str(folders[2])]) == 2
    assert "holds 2 partitions; give a one-partition folder" in capsys.readouterr().err
