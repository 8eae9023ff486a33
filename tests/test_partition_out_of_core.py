"""``python -m partition --out-of-core``: the external sort equals the in-memory CSC, the folder equals the
in-memory pipeline's file for file, the memory budget plans or refuses in one line, and no failure leaves
a scratch or output folder behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gnnscale.data.dataset import DatasetError, csc_from_edges
from partition import cli
from partition.external import BLOCK, OutOfCorePlan, bucket_bounds, external_csc, plan_memory

ROOT = Path(__file__).resolve().parents[1]


def chunked(src: np.ndarray, dst: np.ndarray, rows: int):
    def chunks():
        for lo in range(0, src.shape[0], rows):
            yield lo, src[lo:lo + rows], dst[lo:lo + rows]
    return chunks


@pytest.mark.parametrize("symmetrize", [False, True])
@pytest.mark.parametrize("bucket_edges,rows", [(1, 3), (700, 1000), (10**9, 10**9)])
def test_external_csc_equals_the_in_memory_csc(tmp_path: Path, symmetrize: bool, bucket_edges: int, rows: int) -> None:
    rng = np.random.default_rng(1)
    n = 3 * BLOCK + 17
    src, dst = rng.integers(0, n, 20_000), rng.integers(0, n, 20_000)
    dst[:3000] = 5  # a hub with more in-edges than a bucket holds: its block is a bucket by itself
    src[3000:3100] = dst[3000:3100]  # self loops, dropped
    src[3100:3200], dst[3100:3200] = src[3200:3300], dst[3200:3300]  # repeats, dropped
    indptr, indices = external_csc(chunked(src, dst, rows), n, tmp_path, symmetrize=symmetrize,
                                   bucket_edges=bucket_edges, source="test")
    expected = csc_from_edges(src, dst, n, symmetrize=symmetrize)
    np.testing.assert_array_equal(indptr, expected[0])
    np.testing.assert_array_equal(indices, expected[1])
    assert [p.name for p in tmp_path.iterdir()] == ["indices.bin"]  # the buckets are gone


def test_external_csc_refuses_a_bad_id_of_a_later_chunk_and_leaves_nothing(tmp_path: Path) -> None:
    src, dst = np.arange(100) % 10, np.arange(1, 101) % 10
    dst[57] = 10
    with pytest.raises(DatasetError, match=r"edge 57 \(7 -> 10\) has a node id outside \[0, 10\)"):
        external_csc(chunked(src, dst, 20), 10, tmp_path, symmetrize=True, bucket_edges=8, source="edges.npy")
    assert list(tmp_path.iterdir()) == []


def test_bucket_bounds_cover_the_nodes_within_the_allowance() -> None:
    counts = np.array([5, 5, 5, 100, 1, 1], dtype=np.int64)
    bounds = bucket_bounds(counts, 5 * BLOCK + 3, 10)
    assert bounds.tolist() == [0, 2 * BLOCK, 3 * BLOCK, 4 * BLOCK, 5 * BLOCK + 3]


def test_plan_memory_sizes_chunks_and_refuses_what_cannot_fit() -> None:
    assert plan_memory(None, 10, 10, method="kaminpar", context="default") == OutOfCorePlan()
    plan = plan_memory(4096, 1_000_000, 20_000_000, method="kaminpar", context="default")
    assert 1 << 16 <= plan.chunk_edges <= 1 << 23 and plan.bucket_edges >= 1 << 16
    with pytest.raises(ValueError, match=r"--memory-budget 2000 MiB is too small .* --kaminpar-context terapart"):
        plan_memory(2000, 10_000_000, 100_000_000, method="kaminpar", context="default")
    # terapart's smaller graph fits where the default context does not
    plan_memory(2400, 10_000_000, 100_000_000, method="kaminpar", context="terapart")
    with pytest.raises(ValueError, match=r"--method kaminpar"):
        plan_memory(2400, 10_000_000, 100_000_000, method="metis", context="default")
    # The 1B synthetic folder: its 10^9 file rows are over 16 GiB's estimate, the 940,811,224 entries left after
    # the sort are not (measured peak 14.65 GiB); before the sort only the node arrays may refuse.
    big = dict(method="kaminpar", context="terapart")
    with pytest.raises(ValueError, match=r"16,812 MiB"):
        plan_memory(16384, 100_000_000, 1_000_000_000, **big)
    assert plan_memory(16384, 100_000_000, 1_000_000_000, exact=False, **big).chunk_edges == 1 << 23
    plan_memory(16384, 100_000_000, 940_811_224, **big)
    with pytest.raises(ValueError, match=r"--memory-budget 6000 MiB is too small to partition 100,000,000 nodes"):
        plan_memory(6000, 100_000_000, 1, exact=False, **big)


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A streamed edge-list folder: int32 edges.npy written in both directions, with repeats."""
    folder = tmp_path_factory.mktemp("ooc") / "graph"
    subprocess.run([sys.executable, "-m", "gnnscale.data.synthetic_stream", "--out", str(folder), "--num-nodes",
                    "6000", "--num-edges", "60000", "--feat-dim", "4", "--num-classes", "3", "--seed", "2"],
                   check=True, capture_output=True, cwd=ROOT)
    return folder


def partition(data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "partition", "--dataset", "edgelist", "--data-dir", str(data),
                           "--num-parts", "3", "--out", str(out), *extra], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def files(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())["files"]


@pytest.mark.parametrize("method", ["metis", "kaminpar"])
def test_out_of_core_writes_the_in_memory_folder(graph: Path, tmp_path: Path, method: str) -> None:
    if method == "kaminpar":
        pytest.importorskip("kaminpar", reason="kaminpar is not installed: pip install -e '.[kaminpar]'")
    assert partition(graph, tmp_path / "in", "--method", method).returncode == 0
    done = partition(graph, tmp_path / "ooc", "--method", method, "--out-of-core", "--memory-budget", "2000")
    assert done.returncode == 0, done.stderr
    assert files(tmp_path / "ooc") == files(tmp_path / "in")
    summary = json.loads((tmp_path / "ooc" / "manifest.json").read_text())["stages"]
    stages = summary["stages"]
    assert {"count", "scatter", "sort", "load", method, "write"} <= set(stages)
    assert all(stages[name]["within"] == "load" for name in ("count", "scatter", "sort"))
    # The passes are parts of the load: the total counts them once.
    top = sum(record["seconds"] for name, record in stages.items() if name not in ("count", "scatter", "sort"))
    assert summary["total_seconds"] == pytest.approx(top, abs=0.01)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "ooc"]  # no scratch folder left


def test_out_of_core_reads_a_text_edge_list_in_chunks(graph: Path, tmp_path: Path, monkeypatch) -> None:
    text = tmp_path / "text"
    text.mkdir()
    for name in ("features.npy", "labels.npy", "train_mask.npy", "val_mask.npy", "test_mask.npy"):
        (text / name).symlink_to(graph / name)
    edges = np.load(graph / "edges.npy")
    np.savetxt(text / "edges.csv", edges, fmt="%d", delimiter=",", header="src,dst", comments="")
    monkeypatch.setattr(cli, "OutOfCorePlan", lambda: OutOfCorePlan(chunk_edges=7_000, bucket_edges=9_000))
    monkeypatch.chdir(ROOT)
    assert cli.main(["--dataset", "edgelist", "--data-dir", str(graph), "--num-parts", "3", "--method", "random",
                     "--out", str(tmp_path / "in"), "--quiet"]) == 0
    assert cli.main(["--dataset", "edgelist", "--data-dir", str(text), "--num-parts", "3", "--method", "random",
                     "--out", str(tmp_path / "ooc"), "--out-of-core", "--quiet"]) == 0
    assert files(tmp_path / "ooc") == files(tmp_path / "in")


def test_a_bad_edge_stops_in_one_line_and_leaves_nothing(graph: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("features.npy", "labels.npy", "train_mask.npy", "val_mask.npy", "test_mask.npy"):
        (bad / name).symlink_to(graph / name)
    edges = np.load(graph / "edges.npy").astype(np.int64)
    edges[50_001, 1] = 6000
    np.save(bad / "edges.npy", edges)
    done = partition(bad, tmp_path / "out", "--out-of-core", "--quiet")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {bad / 'edges.npy'}") and "edge 50001" in line
    assert "has a node id outside [0, 6000)" in line and "0-based" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


def test_budget_refusals_and_the_automatic_switch(graph: Path, tmp_path: Path) -> None:
    small = partition(graph, tmp_path / "out", "--memory-budget", "100", "--quiet")
    assert small.returncode == 2 and small.stderr.startswith("error: --memory-budget 100 MiB is too small")
    assert len(small.stderr.strip().splitlines()) == 1
    other = subprocess.run([sys.executable, "-m", "partition", "--dataset", "synthetic", "--num-nodes", "500",
                            "--num-parts", "2", "--out", str(tmp_path / "out"), "--out-of-core"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert other.returncode == 2 and "--out-of-core reads an edge-list folder, not --dataset synthetic" in other.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # 602 MiB lies between the two estimates for this graph: out of core about 601.3 MiB (the base, 6,000 nodes at
    # 60 bytes and 60,000 entries at 15), in memory about 603.1 MiB (the base and 60,000 rows at 55 bytes).
    switched = partition(graph, tmp_path / "out", "--method", "kaminpar", "--memory-budget", "602")
    if "kaminpar package" in switched.stderr:
        pytest.skip("kaminpar is not installed")
    assert switched.returncode == 0, switched.stderr
    assert "out of core" in switched.stderr and "count" in switched.stderr


def test_rank0_partitions_an_edge_list_within_the_training_budget(graph: Path, tmp_path: Path) -> None:
    from gnnscale.train.cli import build_parser, partition_command

    args = build_parser().parse_args(["--dataset", "edgelist", "--data-dir", str(graph), "--memory-budget", "100"])
    command = partition_command(args, 2, tmp_path / "parts")
    assert command[command.index("--memory-budget") + 1] == "100"
    # What rank 0's child does with it: the one line every rank then prints after "partitioning on rank 0 failed".
    done = subprocess.run([*command, "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2 and done.stderr.startswith("error: --memory-budget 100 MiB is too small")
    synthetic = build_parser().parse_args(["--dataset", "synthetic", "--memory-budget", "100"])
    assert "--memory-budget" not in partition_command(synthetic, 2, tmp_path / "parts")


def test_the_python_api_writes_the_same_folder(graph: Path, tmp_path: Path) -> None:
    from gnnscale.data.edgelist import load_edgelist
    from partition import OutOfCorePlan, PartitionConfig, load_out_of_core, partition_graph

    config = PartitionConfig(num_parts=2, method="metis")
    partition_graph(load_edgelist(graph), tmp_path / "in", config)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    dataset = load_out_of_core(str(graph), str(scratch), OutOfCorePlan(chunk_edges=5_000, bucket_edges=20_000))
    partition_graph(dataset, tmp_path / "ooc", config)
    assert files(tmp_path / "ooc") == files(tmp_path / "in")


def test_partitioning_an_edge_list_never_imports_torch(graph: Path, tmp_path: Path) -> None:
    """torch's import alone is about 600 MiB of RSS (2.15, CUDA build): 0.6 GiB of a 1M-node command's peak."""
    out = tmp_path / "out"
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print('torch' in sys.modules, file=sys.stderr))\n"
             "sys.argv = ['partition', *sys.argv[1:]]\n"
             "runpy.run_module('partition', run_name='__main__')\n")
    for argv in (["--dataset", "edgelist", "--data-dir", str(graph), "--num-parts", "2", "--out", str(out),
                  "--out-of-core", "--quiet"], ["verify", str(out), "--dataset", "edgelist", "--data-dir", str(graph)]):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=ROOT,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stderr.strip().splitlines()[-1] == "False", f"{argv[0]} imported torch"


@pytest.mark.parametrize("stage,target", [("count", "partition.external._count_blocks"),
                                          ("scatter", "partition.external._scatter"),
                                          ("sort", "partition.external._merge"),
                                          ("partitioner", "partition.partitioner.assign_parts"),
                                          ("write", "partition.partitioner.write_partitions")])
@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failure_in_any_stage_leaves_neither_output_nor_scratch(graph: Path, tmp_path: Path, monkeypatch,
                                                                  stage: str, target: str, failure: BaseException,
                                                                  capsys) -> None:
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(target, fail)
    monkeypatch.chdir(ROOT)
    status = cli.main(["--dataset", "edgelist", "--data-dir", str(graph), "--num-parts", "3", "--method", "random",
                       "--out", str(tmp_path / "out"), "--out-of-core", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    if isinstance(failure, OSError):
        assert status == 2 and err == ["error: [Errno 28] No space left on device"], stage
    else:
        assert status == 130 and err == [f"interrupted: nothing written to {tmp_path / 'out'}"], stage
    assert list(tmp_path.iterdir()) == []  # no output, no hidden output, no scratch beside it
