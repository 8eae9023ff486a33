"""``--method kaminpar``: the folder verifies, balance holds, a seed fixes the result, the manifest says so, errors."""

from __future__ import annotations

import builtins
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gnnscale.data.dataset import GraphDataset
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
from partition import PartitionConfig, partition_graph, verify
from partition.assign import metis_adjacency, partition_csr, vertex_weights
from partition.kaminpar_parts import write_parhip

kaminpar = pytest.importorskip("kaminpar", reason="kaminpar is not installed: pip install -e '.[kaminpar]' (it is in "
                               "the test extra on Linux x86_64)")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dataset() -> GraphDataset:
    return generate_synthetic(SyntheticConfig(num_nodes=3000, avg_degree=8, feat_dim=4, seed=0))


@pytest.fixture(scope="module")
def folder(dataset: GraphDataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kaminpar") / "parts"
    partition_graph(dataset, out, PartitionConfig(num_parts=4, method="kaminpar"))
    return out


def assignment(root: Path) -> np.ndarray:
    """int64 [N]: each original node's partition, from the folder's ranges and orig2new."""
    manifest = json.loads((root / "manifest.json").read_text())
    ends = np.asarray([end for _, end in manifest["node_ranges"]], dtype=np.int64)
    return np.searchsorted(ends, np.load(root / "orig2new.npy"), side="right")


def test_folder_verifies_against_the_dataset(folder: Path, dataset: GraphDataset) -> None:
    summary = verify(folder, dataset)
    assert summary["num_parts"] == 4 and summary["num_nodes"] == dataset.num_nodes


def test_every_constraint_within_tolerance_and_cut_better_than_random(folder: Path, dataset: GraphDataset) -> None:
    quality = json.loads((folder / "manifest.json").read_text())["quality"]
    assert all(value <= 1.0305 for value in quality["balance"].values()), quality["balance"]
    parts = assignment(folder)
    src = dataset.indices
    dst = np.repeat(np.arange(dataset.num_nodes), np.diff(dataset.indptr))
    cut = float(np.mean(parts[src] != parts[dst]))
    assert cut == pytest.approx(quality["edge_cut_fraction"], abs=1e-6)
    assert cut < 0.5 * (1 - 1 / 4)  # a random assignment cuts about 3/4 of the edges


def test_manifest_records_method_context_and_kaminpars_own_cut(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    info = manifest["partitioning"]
    assert info["method"] == "kaminpar" and info["kaminpar_options"]["context"] == "default"
    assert info["kaminpar_options"]["threads"] == 1 and info["kaminpar_options"]["node_weights"] == "combined"
    assert set(info["kaminpar_balance"]) == {"nodes", "train", "edges"} and info["rebalanced_nodes"] >= 0
    assert "kaminpar" in manifest["stages"]["stages"] and "metis" not in manifest["stages"]["stages"]
    # KaMinPar's own cut counts undirected edges before the rebalance pass, which only adds cut.
    assert 0 < info["kaminpar_cut_undirected_edges"] <= manifest["quality"]["num_cut_edges"] // 2


def test_same_seed_same_partition_other_seed_other_one(dataset: GraphDataset, tmp_path: Path) -> None:
    xadj, adjncy = metis_adjacency(dataset.indptr, dataset.indices)
    weights, used = vertex_weights(dataset, ("nodes", "train", "edges"), 0)
    runs = [partition_csr(xadj, adjncy, weights, used, PartitionConfig(num_parts=3, method="kaminpar", seed=seed),
                          scratch_dir=tmp_path)[0] for seed in (5, 5, 6)]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])
    assert list(tmp_path.iterdir()) == []  # the graph file is removed


@pytest.mark.parametrize("context", ["fast", "terapart"])
def test_other_contexts_and_part_weights_meet_their_shares(dataset: GraphDataset, context: str) -> None:
    xadj, adjncy = metis_adjacency(dataset.indptr, dataset.indices)
    weights, used = vertex_weights(dataset, ("nodes", "edges"), 0)
    config = PartitionConfig(num_parts=2, method="kaminpar", kaminpar_context=context, part_weights="1,3")
    parts, info = partition_csr(xadj, adjncy, weights, used, config)
    assert info["kaminpar_options"]["compressed"] == (context == "terapart")
    totals = np.stack([np.bincount(parts, weights=weights[:, c], minlength=2) for c in range(2)])
    shares = totals / totals.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(shares[:, 1], 0.75, atol=0.75 * 0.03 + 1e-9)


def test_parhip_file_round_trips_through_kaminpar(tmp_path: Path) -> None:
    # A path 0-1-2-3 plus the chord 0-2, symmetric; node weights 1..4.
    xadj = np.array([0, 2, 4, 7, 8])
    adjncy = np.array([1, 2, 0, 2, 0, 1, 3, 2])
    write_parhip(tmp_path / "g.parhip", xadj, adjncy, np.arange(1, 5))
    graph = kaminpar.load_graph(str(tmp_path / "g.parhip"), kaminpar.GraphFileFormat.PARHIP)
    assert (graph.n(), graph.m()) == (4, 8) and graph.is_node_weighted()
    assert [graph.node_weight(u) for u in range(4)] == [1, 2, 3, 4]
    assert [sorted(v for v, _ in graph.neighbors(u)) for u in range(4)] == [[1, 2], [0, 2], [0, 1, 3], [2]]
    write_parhip(tmp_path / "u.parhip", xadj, adjncy, None)
    assert not kaminpar.load_graph(str(tmp_path / "u.parhip"), kaminpar.GraphFileFormat.PARHIP).is_node_weighted()


def test_bad_context_and_threads_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--kaminpar-context 'bogus' is not a KaMinPar context; use one of .*fast"):
        PartitionConfig(num_parts=2, method="kaminpar", kaminpar_context="bogus")
    with pytest.raises(ValueError, match="--kaminpar-threads must be >= 1, got 0"):
        PartitionConfig(num_parts=2, method="kaminpar", kaminpar_threads=0)
    out = tmp_path / "never"
    proc = subprocess.run([sys.executable, "-m", "partition", "--dataset", "synthetic", "--num-nodes", "200",
                           "--num-parts", "2", "--method", "kaminpar", "--kaminpar-context", "bogus",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: --kaminpar-context 'bogus' is not a KaMinPar context") and not out.exists()


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_kaminpar(name: str, *args: object, **kwargs: object) -> object:
        if name == "kaminpar":
            raise ImportError("No module named 'kaminpar'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_kaminpar)
    with pytest.raises(ValueError, match=r"needs the kaminpar package.*install gnnscale\[kaminpar\]") as err:
        PartitionConfig(num_parts=2, method="kaminpar")
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_benchmark_prints_the_side_by_side_table(tmp_path: Path) -> None:
    """Smoke run of scripts/bench_partition_methods.py on a tiny graph: it asserts nothing about speed."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_partition_methods.py"), "--num-nodes", "2000",
                           "--avg-degree", "6", "--feat-dim", "4", "--contexts", "fast", "--datasets", "",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "kaminpar:fast / metis: peak_rss_gib" in proc.stdout and "rebalance pass" in proc.stdout
    report = json.loads(out.read_text())
    assert set(report["summary"]) == {"metis", "kaminpar:fast"} and report["runs"]["metis"][0]["verified"]
