"""The least a partition may get (partition/minimums.py): one node, and under ``--part-weights`` one training node.

The command-line refusals and ``verify``'s empty-partition check run as subprocesses in the bad-input corpus
(tests/test_bad_inputs.py); here: the issue's own Cora command and its suggested fix, the raise arithmetic,
and the checks after assignment.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import partition.partitioner
from gnnscale.data.dataset import GraphDataset
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
from partition import PartitionConfig, partition_graph
from partition.minimums import raised_weights

ROOT = Path(__file__).resolve().parents[1]


def run_partition(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "partition", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def dataset() -> GraphDataset:
    """400 nodes, 40 of them training nodes."""
    return generate_synthetic(SyntheticConfig(num_nodes=400, avg_degree=4, feat_dim=4, num_classes=3))


def test_cora_weights_that_starve_a_partition_are_refused_and_the_suggestion_works(
        dataset_dir: Callable[[str], Path], tmp_path: Path) -> None:
    """The issue's command: it wrote an empty partition 0 and exited 0."""
    cora = ["--dataset", "cora", "--data-dir", str(dataset_dir("cora")), "--num-parts", "2", "--quiet"]
    refused = run_partition([*cora, "--part-weights", "1,1000000000", "--out", str(tmp_path / "out")], tmp_path)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert lines[0] == ("error: --part-weights '1,1000000000' give partition(s) [0] less than one of the 140 "
                        "training nodes (split 0) of cora (target: 1.4e-07); every partition needs at least one, "
                        "or its rank has nothing to train on. The smallest weights that give it, the others as "
                        "given: --part-weights 7200000,1000000000")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    suggested = lines[0].rsplit("--part-weights ", 1)[1]
    done = run_partition([*cora, "--part-weights", suggested, "--out", str(tmp_path / "out")], tmp_path)
    assert done.returncode == 0, done.stderr
    train_column = [line.split()[4] for line in done.stdout.splitlines()[1:3]]
    assert train_column == ["1", "139"], done.stdout
    verified = run_partition(["verify", str(tmp_path / "out"), "--quiet"], tmp_path)
    assert verified.returncode == 0, verified.stderr


@pytest.mark.parametrize("values,units,expected", [
    ([1, 1e9], 140, [7.2e6, None]),           # 1e9 / 139 = 7194245, up to three digits
    ([1, 140], 140, [1.01, None]),            # 140 / 139 = 1.0072
    ([1, 1, 100, 1e5], 140, [730, 730, 730, None]),  # all three start short: 1e5 / 137 = 729.9
    ([0.01, 1.001, 8.989], 10, [1.13, 1.13, None]),  # 0 alone at 1.11 leaves 1 at 0.0902: both, 8.989 / 8
    ([3, 1, 1], 5, [None, None, None]),
])
def test_raised_weights_are_the_smallest_that_give_every_partition_one_unit(
        values: list[float], units: int, expected: list[float | None]) -> None:
    raised = raised_weights(values, units)
    assert raised == [None if e is None else pytest.approx(e) for e in expected]
    final = [v if r is None else r for v, r in zip(values, raised)]
    assert min(final) / sum(final) * units >= 1 - 1e-9


def test_raised_weights_hold_on_random_weights() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(2, 9))
        values = (10.0 ** rng.uniform(-6, 9, k)).tolist()
        units = int(rng.integers(k, 500))
        raised = raised_weights(values, units)
        final = np.array([v if r is None else r for v, r in zip(values, raised)])
        assert (final / final.sum() * units).min() >= 1 - 1e-9, (values, units, raised)
        level = next((r for r in raised if r is not None), None)
        if level is not None:  # a hundredth lower, and some raised partition falls short again
            lower = np.where([r is None for r in raised], values, level * 0.99)
            assert (lower / lower.sum() * units).min() < 1, (values, units, raised)


def test_a_random_deal_that_misses_a_training_node_is_refused_before_writing(dataset: GraphDataset,
                                                                            tmp_path: Path) -> None:
    """Targets of at least one training node can still miss under ``--method random`` (it deals node counts)."""
    config = PartitionConfig(num_parts=2, method="random", seed=4, part_weights="1.2,40")
    message = ("--part-weights '1.2,40': partition(s) [0] would get none of the 40 training nodes (split 0) of "
               "synthetic (their targets: 1.17): random could not reach their shares; raise their weights, or "
               "balance training nodes with --method metis --balance nodes,train")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        partition_graph(dataset, tmp_path / "out", config)
    assert not any(tmp_path.iterdir())
    config = PartitionConfig(num_parts=2, method="random", seed=0, part_weights="1.2,40")
    assert partition_graph(dataset, tmp_path / "out", config)["parts"][0]["num_train"] == 1


def test_an_assignment_that_leaves_a_partition_empty_is_refused_before_writing(
        dataset: GraphDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition.partitioner, "assign_parts",
                        lambda data, config: (np.arange(data.num_nodes) % 2 * 2, {"method": "metis"}))
    with pytest.raises(ValueError, match=r"^partition\(s\) \[1\] would own no nodes: metis could not split synthetic "
                                         r"\(400 nodes\) into 3 non-empty parts; use fewer --num-parts, or "
                                         r"--method random$"):
        partition_graph(dataset, tmp_path / "out", PartitionConfig(num_parts=3))
    assert not any(tmp_path.iterdir())

