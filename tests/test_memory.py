"""The memory account, the memory budget's decisions, and features read from their memory map."""

from __future__ import annotations

import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gnnscale as gs
from distributed_helpers import partition_dataset, run_ranks
from gnnscale import memory
import gnnscale.budget as budget_module
from gnnscale.budget import plan_graph, slot_rows
from gnnscale.distributed import comm
from gnnscale.distributed.comm import Exchanger
from gnnscale.distributed.feature_store import DistTable
from gnnscale.distributed.mapped import MappedTable, hot_order
from gnnscale.train.cli import main
from partition.load import load_partition


def _dataset(num_nodes: int = 3000, feat_dim: int = 32):
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

    return generate_synthetic(SyntheticConfig(num_nodes=num_nodes, avg_degree=6, feat_dim=feat_dim, num_classes=4))


@pytest.fixture(scope="module")
def world():
    with gs.init() as job:  # a world of one, left when the module's tests are done
        yield job


@pytest.fixture(scope="module")
def one_part(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return partition_dataset(_dataset(), tmp_path_factory.mktemp("parts") / "p1", 1)


def _trainer(world: gs.World, folder: Path, budget: float | None, epochs: int = 2) -> gs.Trainer:
    from gnnscale.train.trainer import TrainConfig
    from samplers import SamplerConfig

    graph = gs.open_graph(folder, world, memory_budget=budget)
    return gs.Trainer(graph, model_config=gs.ModelConfig(model="sage", num_layers=2, hidden=16),
                      sampler_config=SamplerConfig(fanouts=[5, 5]), config=TrainConfig(epochs=epochs, batch_size=128),
                      cache_config=gs.CacheConfig(memory_budget=budget))


def test_account_counts_each_structure_once(world: gs.World, one_part: Path) -> None:
    trainer = _trainer(world, one_part, 100_000.0, epochs=1)  # a roomy budget: evaluation keeps its blocks
    trainer.fit()
    graph = trainer.graph
    mine = memory.account(graph, loaders=[trainer.loader], model=trainer.module, optimizer=trainer.optimizer)
    assert mine.resident["features"] == graph.features.rows.numel() * 4
    assert mine.resident["partition"] >= graph.structure.indices.nbytes + graph.structure.indptr.nbytes
    for structure in ("pipeline", "evaluation", "optimizer"):
        assert mine.resident[structure] > 0, structure
    assert mine.mapped["partition"] > 0  # the folder's maps, beside their resident copies
    assert 0 < mine.rss <= mine.peak_rss and mine.total_resident < mine.rss
    if sys.platform.startswith("linux"):  # glibc's mallinfo2: what malloc handed out holds the resident arrays
        assert mine.heap_in_use >= mine.total_resident and mine.heap_free > 0
    assert memory.MemoryAccount.from_tensor(mine.to_tensor()) == mine
    record = trainer.memory["end"]
    assert set(record["ranks"][0]) >= {"resident_mib", "mapped_mib", "accounted_mib", "rss_mib", "peak_rss_mib",
                                       "heap_in_use_mib", "heap_free_mib"}
    assert record["peak_rss_mib_sum"] == record["ranks"][0]["peak_rss_mib"]


def test_released_pages_leave_the_rss(tmp_path: Path) -> None:
    path = tmp_path / "rows.npy"
    np.save(path, np.ones((8192, 1024), dtype=np.float32))  # 32 MiB
    mapped = np.load(path, mmap_mode="r")
    before = memory.rss_bytes()
    assert float(mapped.sum()) == 8192 * 1024
    read = memory.rss_bytes()
    memory.release_pages(mapped[10:20])  # a view: its map's pages go
    assert read - before > 24 * 2**20 and memory.rss_bytes() < read - 24 * 2**20
    memory.release_pages(np.ones(3))  # not mapped: nothing happens


def test_held_collectives_are_bounded_by_bytes() -> None:
    comm.release_kept()
    for _ in range(64):
        comm.keep(torch.empty(2**20 // 4))  # 1 MiB each
    held = sum(t.numel() * t.element_size() for t in comm._KEPT)
    assert held <= comm.KEEP_BYTES + comm.KEEP_COUNT * 2**20 and len(comm._KEPT) >= comm.KEEP_COUNT
    comm.release_kept()
    assert not comm._KEPT


def test_budget_decides_features_and_names_the_minimum(one_part: Path) -> None:
    part = load_partition(one_part, 0)
    features_mb = part.features.nbytes / 2**20
    roomy = plan_graph(part, 1000.0)
    assert not roomy.features_mapped and roomy.hot_rows == 0
    tight = plan_graph(part, roomy.minimum_mb + features_mb)  # the features need over half of what is left
    assert tight.features_mapped and 0 < tight.hot_rows < part.features.shape[0]
    assert any("memory-mapped" in line for line in tight.decisions)
    with pytest.raises(ValueError, match=r"below the \d+\.\d MiB rank 0's partition needs .* give at least \d+ MiB") \
            as error:
        plan_graph(part, roomy.minimum_mb / 2)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="memory_budget must be a positive number of MiB per rank, got -1"):
        gs.CacheConfig(memory_budget=-1)


def test_slot_estimate_is_bounded_by_the_graph() -> None:
    assert slot_rows(1000, 5000, 100, [10, 10]) <= 1100
    assert slot_rows(10**6, 10**7, 100, [5]) <= 100 * 6 + 100


def test_budget_lowers_prefetch_to_fit(world: gs.World, one_part: Path, caplog: pytest.LogCaptureFixture) -> None:
    graph = gs.open_graph(one_part, world)
    budget = plan_graph(graph.part, 1000.0).minimum_mb + 2.0  # the features fit, four slots of 512 seeds do not
    with caplog.at_level("INFO", logger="gnnscale.budget"):
        loader = gs.NodeLoader(graph, fanouts=[5, 5], batch_size=512, prefetch=4,
                               cache=gs.CacheConfig(memory_budget=budget))
    assert loader._loader.config.prefetch < 4
    assert "lowered from 4" in caplog.text


def test_mapped_reads_equal_resident(one_part: Path) -> None:
    part = load_partition(one_part, 0)
    exchanger, offsets = Exchanger(None, 0, 1), torch.tensor([0, part.features.shape[0]])
    resident = DistTable(torch.from_numpy(np.array(part.features)), offsets, exchanger)
    degree = torch.from_numpy(np.diff(np.asarray(part.indptr)))
    mapped = MappedTable(part.features, offsets, exchanger, hot=hot_order(degree), hot_rows=100, release_mb=0.01)
    assert mapped.mapped and mapped.hot_bytes == 100 * part.features.shape[1] * 4
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, part.features.shape[0], 2000))
    assert torch.equal(mapped.gather(ids), resident.gather(ids))
    assert torch.equal(mapped.read_owned(ids[:7]), resident.read_owned(ids[:7]))
    assert mapped.hot_reads > 0 and mapped.mapped_reads > 0
    assert mapped._where_map() is None  # never joined into one resident table


def test_mapped_features_train_to_identical_accuracy(world: gs.World, one_part: Path) -> None:
    resident = _trainer(world, one_part, None)
    part = resident.graph.part
    budget = plan_graph(part, 1000.0).minimum_mb + part.features.nbytes / 2**20  # over half of it is too little
    mapped = _trainer(world, one_part, budget)
    assert mapped.graph.features.mapped and not resident.graph.features.mapped
    first, second = resident.fit(), mapped.fit()
    assert (first.val, first.test) == (second.val, second.test)
    assert [r["loss"] for r in first.history] == [r["loss"] for r in second.history]
    assert mapped.memory["end"]["ranks"][0]["mapped_mib"]["features"] > 0


def test_inference_keeps_its_blocks_only_where_a_budget_has_room_and_gives_the_same_outputs(
        world: gs.World, one_part: Path, caplog: pytest.LogCaptureFixture) -> None:
    unbudgeted = gs.open_graph(one_part, world)
    model = gs.GNN(gs.ModelConfig(model="sage", num_layers=2, hidden=16), unbudgeted.feature_dim,
                   unbudgeted.num_classes)
    built = gs.layerwise_inference(unbudgeted, model, batch_size=500).rows
    assert not any(isinstance(k, tuple) and k[0] == "inference-blocks" for k in unbudgeted._memo)
    assert memory.account(unbudgeted).resident.get("evaluation", 0) == 0
    roomy = gs.open_graph(one_part, world, memory_budget=100_000.0)
    kept = gs.layerwise_inference(roomy, model, batch_size=500).rows
    assert torch.equal(kept, built)
    blocks = [v for k, v in roomy._memo.items() if isinstance(k, tuple) and k[0] == "inference-blocks"]
    held = sum(a.numel() * a.element_size() for a in memory._arrays(blocks, depth=6))
    assert 0 < held <= 1.25 * budget_module.inference_blocks_mb(roomy) * 2**20  # kept as int32: about 12 B an edge
    assert memory.account(roomy).resident["evaluation"] == held  # every kept array, once
    budget = plan_graph(roomy.part, 1000.0).minimum_mb + 0.1  # nothing left for the blocks (about 0.2 MiB)
    tight = gs.open_graph(one_part, world, memory_budget=budget)
    assert budget_module.inference_blocks_mb(tight) > tight.budget.left_mb
    with caplog.at_level("INFO", logger="gnnscale.budget"):
        gs.NodeLoader(tight, fanouts=[5, 5], batch_size=128, cache=gs.CacheConfig(memory_budget=budget))
    assert "built a batch at a time at every evaluation, not kept" in caplog.text
    rebuilt = gs.layerwise_inference(tight, model, batch_size=500).rows
    assert torch.equal(kept, rebuilt)
    assert not any(isinstance(k, tuple) and k[0] == "inference-blocks" for k in tight._memo)


def test_too_small_budget_is_a_one_line_error(one_part: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--partitions", str(one_part), "--out", str(tmp_path / "run"), "--memory-budget", "0.01",
                 "--epochs", "1", "--quiet"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "give at least" in err[-1] and "--memory-budget" in err[-1]
    assert not (tmp_path / "run" / "metrics.json").exists()


def _two_ranks(rank: int, folder: str, budgets: list[float]) -> list[tuple]:
    """Under each budget, one partitioned epoch: its memory record, test accuracy, whether features are mapped,
    the halo copy's bytes (None: not made), the MiB the feature cache was filled within plus the halo copy's
    (None: no copy was taken out of it), and the MiB the budget's plan gave the cache."""
    from gnnscale.train.trainer import TrainConfig
    from samplers import SamplerConfig

    import logging
    import re

    outcomes, lines = [], []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("gnnscale.loader").addHandler(handler)
    logging.getLogger("gnnscale.loader").setLevel(logging.INFO)
    with gs.init() as world:
        for budget in budgets:
            lines.clear()
            graph = gs.open_graph(folder, world, memory_budget=budget)
            trainer = gs.Trainer(graph, model_config=gs.ModelConfig(model="sage", num_layers=2, hidden=16),
                                 sampler_config=SamplerConfig(fanouts=[5, 5]),
                                 config=TrainConfig(epochs=1, batch_size=128),
                                 cache_config=gs.CacheConfig(memory_budget=budget, topology="partitioned"))
            result = trainer.fit()
            halo = graph._memo.get("halo_structure")
            halo_bytes = None if halo is None else halo.nbytes
            config = TrainConfig(epochs=1, batch_size=128)
            plan = budget_module.plan_loader(graph, gs.CacheConfig(memory_budget=budget, topology="partitioned"),
                                             batch_size=128, fanouts=[5, 5], num_workers=config.num_workers,
                                             prefetch=config.prefetch)
            filled = [float(a) + float(b) for line in lines
                      for a, b in re.findall(r"of ([0-9.]+) MiB after the halo copy ([0-9.]+) MiB", line)]
            outcomes.append((result.memory, result.test, graph.features.mapped, halo_bytes,
                             filled[0] if filled else None, plan.cache.cache_mb))
            del trainer, graph
    return outcomes


def test_two_ranks_report_every_rank_under_a_budget(tmp_path: Path) -> None:
    folder = partition_dataset(_dataset(), tmp_path / "p2", 2)
    part = load_partition(folder, 0)
    tight = plan_graph(part, 1000.0).minimum_mb + part.features.nbytes / 2**20
    outcomes = run_ranks(_two_ranks, 2, str(folder), [tight, 1000.0], timeout=180)
    (record, test, mapped, halo_bytes, _, _), (other, other_test, *_) = outcomes[0][0], outcomes[1][0]
    assert record == other and test == other_test and mapped
    assert [r["rank"] for r in record["end"]["ranks"]] == [0, 1]
    assert record["end"]["peak_rss_mib_sum"] >= record["end"]["peak_rss_mib_max"] > 0
    assert halo_bytes is None  # the tight budget leaves no room for the halo copy: it is not made
    for rank, runs in enumerate(outcomes):  # a roomy budget: the copy is made, and taken from the cache's share
        _, _, _, halo_bytes, cache_mb, plan_cache_mb = runs[1]
        assert halo_bytes is not None, rank
        assert cache_mb == pytest.approx(plan_cache_mb, abs=0.51), (rank, cache_mb, plan_cache_mb)


@pytest.mark.slow
def test_bench_rank_memory_runs_end_to_end(tmp_path: Path) -> None:
    """scripts/bench_rank_memory.py on a tiny graph (seven training runs, about a minute): the report is
    complete; nothing about its figures is asserted but what must hold whatever the host."""
    import json

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_rank_memory.py"
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(script), "--num-nodes", "5000", "--feat-dim", "16", "--epochs", "1",
                           "--work", str(tmp_path / "work"), "--json", str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"empty", "empty4", "one", "four", "four-global", "mapped", "four-budget"}
    assert len(report["runs"]["four"]["peak_rss_mib"]) == 4 and report["summary"]["mapped_accuracy_identical"]
    assert "--batch-size 250 " in report["runs"]["four-global"]["command"]
    assert "--batch-size 1000 " in report["runs"]["four"]["command"]
    assert report["summary"]["sum_ratio_global"] > 0
    assert "target <= 1.3" in proc.stdout and "global batch (250 seeds per rank)" in proc.stdout


def test_under_a_budget_freed_memory_goes_back_to_the_system(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import gnnscale.pipeline
    from gnnscale.train.cli import apply_process_settings

    calls, limits = [], []
    monkeypatch.setattr(gnnscale.pipeline, "keep_freed_memory", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(gnnscale.pipeline, "limit_arenas", lambda **kwargs: limits.append(kwargs))
    for budget in (None, 1500.0):
        apply_process_settings(argparse.Namespace(keep_freed_memory=True, memory_budget=budget, seed=0))
    assert calls == [{}]  # kept without a budget only
    assert limits == [{}, {}]  # the heaps are limited either way


ARENA_PROBE = """
import ctypes, sys, threading
from gnnscale.pipeline import limit_arenas
if sys.argv[1] == "limit":
    assert limit_arenas(1)
held = []
threads = [threading.Thread(target=lambda: held.append([bytearray(4096) for _ in range(100)])) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" block per heap, on stderr
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas: Linux only")
def test_limit_arenas_makes_threads_share_the_heaps() -> None:
    def heaps(mode: str) -> int:
        proc = subprocess.run([sys.executable, "-c", ARENA_PROBE, mode], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return sum(line.startswith("Arena ") for line in proc.stderr.splitlines())

    assert heaps("limit") == 1
    assert heaps("default") > 1  # four allocating threads get heaps of their own


TRIM_PROBE = """
import numpy as np
from gnnscale.pipeline.allocator import heap_bytes, keep_freed_memory, trimmed_heap
def rss():
    return int([l for l in open('/proc/self/status') if l.startswith('RssAnon')][0].split()[1]) * 1024
def allocate_and_free(size=64 << 20):
    np.ones(size, dtype=np.uint8)
assert keep_freed_memory()
allocate_and_free()
kept, free_kept = rss(), heap_bytes()[1]
with trimmed_heap():
    entered, free_entered = rss(), heap_bytes()[1]
    allocate_and_free()
    inside = rss()
print(kept - entered, inside - entered, inside - rss(), free_kept - free_entered)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_trimmed_heap_returns_kept_memory_on_entry_and_exit_and_keeps_it_inside() -> None:
    """With freed memory kept, the 64 MiB a step freed leave the process when evaluation starts, the 64 MiB
    evaluation frees stay while it runs (no page faults in its loop) and leave when it ends."""
    proc = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    on_entry, kept_inside, on_exit, heap_freed = (int(v) for v in proc.stdout.split())
    assert on_entry > 60 * 2**20 and kept_inside > 60 * 2**20 and on_exit > 60 * 2**20, proc.stdout
    assert heap_freed > 60 * 2**20, proc.stdout  # heap_bytes saw the kept 64 MiB as free heap, and saw it go


def _fake_cgroups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int, limit: str, usage: int,
                  inactive: int) -> None:
    """A /proc/self/cgroup and /sys/fs/cgroup of one memory group ``/job/rank`` under ``tmp_path``."""
    root = tmp_path / "cgroup"
    if version == 2:
        (root / "job" / "rank").mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text("cpu memory\n")
        files, stat, line = ("memory.max", "memory.current"), f"anon 5\ninactive_file {inactive}\n", "0::/job/rank\n"
    else:
        (root / "memory" / "job" / "rank").mkdir(parents=True, exist_ok=True)
        files, stat, line = (("memory.limit_in_bytes", "memory.usage_in_bytes"),
                             f"inactive_file 0\ntotal_inactive_file {inactive}\n", "4:memory:/job/rank\n0::/\n")
        root = root / "memory"
    for level, text in ((root, "max" if version == 2 else str(2**63 - 4096)), (root / "job", limit),
                        (root / "job" / "rank", "max" if version == 2 else str(2**63 - 4096))):
        (level / files[0]).write_text(text + "\n")
        (level / files[1]).write_text(f"{usage}\n")
        (level / "memory.stat").write_text(stat)
    (tmp_path / "self-cgroup").write_text(line)
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path / "cgroup")
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "self-cgroup")


@pytest.mark.parametrize("version", [1, 2])
def test_available_memory_is_what_the_tightest_cgroup_limit_leaves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   version: int) -> None:
    """A limit on a group above the process's counts; reclaimable page cache is not taken; no limit: the host's."""
    import psutil

    mib = 2**20
    _fake_cgroups(tmp_path, monkeypatch, version, str(1800 * mib), usage=1000 * mib, inactive=200 * mib)
    assert memory.memory_limit_bytes() == 1800 * mib
    assert memory.available_bytes() == 1000 * mib  # 1800 - (1000 - 200)
    _fake_cgroups(tmp_path, monkeypatch, version, "max" if version == 2 else str(2**63 - 4096), usage=mib, inactive=0)
    assert memory.memory_limit_bytes() is None
    assert memory.available_bytes() == pytest.approx(psutil.virtual_memory().available, rel=0.05)
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "missing")
    assert memory.memory_limit_bytes() is None


def test_a_small_cgroup_limit_gives_the_training_command_a_budget(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Under a memory limit below 8 GiB a rank, no --memory-budget: a budget of 60% of what the limit leaves,
    per rank of the machine, logged; an explicit budget or a roomy limit is left alone."""
    import argparse

    from gnnscale.train.cli import budget_from_limit

    mib = 2**20
    monkeypatch.setattr(memory, "memory_limit_bytes", lambda: 1800 * mib)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1200 * mib)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    args = argparse.Namespace(memory_budget=None)
    with caplog.at_level("INFO", logger="gnnscale.train"):
        budget_from_limit(args)
    assert args.memory_budget == 360.0  # 0.6 x 1200 / 2
    assert "a memory cgroup limits this machine to 1800 MiB, 1200 MiB of it free: --memory-budget 360" in caplog.text
    given = argparse.Namespace(memory_budget=500.0)
    budget_from_limit(given)
    assert given.memory_budget == 500.0
    monkeypatch.setattr(memory, "memory_limit_bytes", lambda: 64 * 2**30)  # 32 GiB a rank: not small
    roomy = argparse.Namespace(memory_budget=None)
    budget_from_limit(roomy)
    assert roomy.memory_budget is None


def test_inference_batches_are_sized_by_bytes_and_do_not_change_the_outputs(
        world: gs.World, one_part: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gnnscale.inference as inference

    graph = gs.open_graph(one_part, world)
    model = gs.GNN(gs.ModelConfig(model="sage", num_layers=2, hidden=16), graph.feature_dim, graph.num_classes)
    assert inference.batch_rows(graph, 500) == 500  # small rows: the given batch
    whole = gs.layerwise_inference(graph, model, batch_size=500).rows
    monkeypatch.setattr(inference, "BATCH_BYTES", 64 * graph.feature_dim * 4)
    rows = inference.batch_rows(graph, 500)
    assert 1 <= rows < 64
    # Other batches sum a node's messages in another order: equal up to float rounding (an absolute 1e-6 failed
    # with unseeded weights, a row's values near 4 differing by 2 ulp).
    torch.testing.assert_close(gs.layerwise_inference(graph, model, batch_size=500).rows, whole, rtol=1e-5, atol=1e-5)
