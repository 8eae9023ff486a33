"""``scripts/bench_cluster.py``'s plan and verdicts, without running a cluster: every lossy wire-dtype run has
its float32 twin (same options but the dtype), and the 1 Gbit/s verdict compares the best pair."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_cluster", ROOT / "scripts" / "bench_cluster.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_every_wire_dtype_run_has_its_float32_twin():
    bench = load_bench()
    configs = bench.configurations(["10gbit", "1gbit", "100mbit"])
    by = {c.name: c for c in configs}
    assert len(by) == len(configs), "run names must be unique: results are keyed by name"
    lossy = [c for c in configs if "--wire-dtype" in c.extra]
    assert {c.name for c in lossy} >= {"1gbit cache 0 int8", "1gbit cache 0 int8 late", "1gbit cache 64 int8"}
    for config in lossy:
        dtype = config.extra[config.extra.index("--wire-dtype") + 1]
        twin = by[config.name.replace(f" {dtype}", "")]
        assert [a for a in config.extra if a not in ("--wire-dtype", dtype)] == twin.extra
        assert (twin.rate, twin.slow) == (config.rate, config.slow)


def row(name: str, epoch_s: float, val: float, extra: list[str], rate: str = "1gbit") -> dict:
    return {"name": name, "machines": 2, "rate": rate, "extra": extra, "slow_machines": [], "epoch_s": epoch_s,
            "cpu_s": 2 * epoch_s, "val": val}


def test_the_wire_verdict_takes_the_best_pair_and_checks_accuracy():
    bench = load_bench()
    base = row("base", 2.0, 0.95, [], rate="-") | {"machines": 1}
    results = [base, row("1gbit cache 64", 2.4, 0.95, ["--cache-mb", "64"]),
               row("1gbit cache 64 int8", 2.2, 0.95, ["--cache-mb", "64", "--wire-dtype", "int8"]),
               row("1gbit cache 0", 5.0, 0.95, ["--cache-mb", "0"]),
               row("1gbit cache 0 int8", 2.5, 0.95, ["--cache-mb", "0", "--wire-dtype", "int8"])]
    bench.add_ratios(results)
    [line] = [v for v in bench.verdicts(results) if v.startswith("1 Gbit/s")]
    assert "1gbit cache 0 int8 epoch 0.50x float32's (1gbit cache 0)" in line and line.endswith(": met")
    results[-1]["val_delta"] = -0.006  # as fast, but the accuracy moved too far
    [line] = [v for v in bench.verdicts(results) if v.startswith("1 Gbit/s")]
    assert line.endswith("NOT met")


def test_only_keeps_each_runs_own_baseline():
    bench = load_bench()
    configs = bench.configurations(["10gbit"])
    picked = bench.select(configs, {"half-core 4 machines"})
    assert [c.name for c in picked] == ["half-core 1 machines", "half-core 4 machines"]
    assert [c.name for c in bench.select(configs, {"10gbit"})] == ["base", "10gbit"]
    assert len(bench.select(configs, set())) == len(configs)
    four = picked[-1]
    assert four.slow == (0, 1, 2, 3) and four.machines == 4  # every machine at half a core, as its baseline
    assert picked[0].slow == (0,) and picked[0].machines == 1


def test_the_plot_draws_the_panels_whose_runs_exist(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib: pip install -e .[bench]")
    bench = load_bench()
    results = [row(f"half-core {n} machines", 5.0 / (0.8 * n) if n > 1 else 5.0, 0.95, [], rate="10gbit")
               | {"machines": n, "baseline": "half-core 1 machines"} for n in (1, 2, 4)]
    bench.add_ratios(results)
    assert [round(r["efficiency"], 6) for r in results] == [1.0, 0.8, 0.8]
    bench.plot(results, tmp_path / "ranks.png")
    assert (tmp_path / "ranks.png").stat().st_size > 1000
    bench.plot([], tmp_path / "none.png")  # nothing to draw: no file
    assert not (tmp_path / "none.png").exists()


def test_only_with_an_unknown_run_is_an_error_naming_it():
    bench = load_bench()
    with pytest.raises(ValueError, match=r"--only names no run called '10 gbit'; the runs are: base, base busy host"):
        bench.select(bench.configurations(["10gbit"]), {"10gbit", "10 gbit"})
