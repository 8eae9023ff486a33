"""TGN on 2 ranks against one process: training throughput and accuracy of each parallel mode, over seeds.

    python scripts/bench_temporal_scale.py                    # Wikipedia, batch 20, seeds 0-2, early stopping
    python scripts/bench_temporal_scale.py --seeds 0 --epochs 3 --patience 0   # a quick look

For every seed it runs the README's Wikipedia recipe (``--batch-size 20 --epochs 30 --patience 4``)
in one process, then under ``torchrun --standalone --nproc_per_node=RANKS`` once per mode (plus
``--rank-args``, if given, in the multi-rank runs only):
``--parallelism memory`` (a whole node memory per rank, each on its own time segment),
``--parallelism sharded`` (one memory sharded by owner, replicas at most ``--staleness`` steps
behind) and, when asked for, ``--parallelism epoch`` (a whole memory per rank, every rank the
whole stream a step behind the previous one: its events/s count each event once per epoch
although every rank trains on it, so its time to accuracy is the figure to compare).  Every process runs with ``OMP_NUM_THREADS=1``.  From each run's ``metrics.json``:
training events per second (the median over its epochs; training only, evaluation excluded),
test AP over all events and averaged per batch (TGN's), inductive test AP, the peak RSS of
each rank, the training seconds up to the best epoch, and the training seconds each run took to
first reach the same seed's single-process best validation AP (time to accuracy; the ratio to the
single process's own is printed under the table).  The table gives mean ± std over the seeds and, for each mode, the ratio of its
events/s to the single process's and its AP change, against the target (>= ``--target-speedup``
with |AP change| <= ``--ap-tolerance``, 0.005 by default).  Writes ``runs/bench_temporal_scale.json`` and
prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from bench_temporal_staleness import ROOT, run_training

from gnnscale.train.cli import strict_json

AP_TOLERANCE = 0.005
FIGURES = ("train_events_per_second", "test_ap", "test_ap_per_batch", "test_ap_inductive", "peak_rss_mib",
           "train_seconds_to_best")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", default="wikipedia",
                        choices=("wikipedia", "collegemsg", "csv", "snap", "npz", "dense-synthetic"))
    parser.add_argument("--data-dir", type=Path, default=None, help="passed on to train_temporal.py")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated")
    parser.add_argument("--modes", default="memory,sharded", help="--parallelism values to run on RANKS ranks "
                        "(memory, sharded, epoch); sharded:K runs the sharded mode at staleness K instead of "
                        "--staleness, e.g. memory,epoch,sharded:0,sharded:4")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=2, help="K of the sharded mode")
    parser.add_argument("--batch-size", type=int, default=20, help="events per step (sharded: the global batch; "
                        "memory: each group's batch)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--patience", type=int, default=4)
    parser.add_argument("--neighbor-cutoff", choices=("batch", "event"), default="batch")
    parser.add_argument("--rank-args", default="", help="further train_temporal.py options for the multi-rank runs "
                        "only (the single process runs the recipe), e.g. \"--sync-every 4 --lr 1e-3\"")
    parser.add_argument("--target-speedup", type=float, default=1.6)
    parser.add_argument("--ap-tolerance", type=float, default=AP_TOLERANCE,
                        help="largest |test AP change| against one process that meets the target")
    parser.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds allowed for each run")
    parser.add_argument("--workdir", type=Path, default=None, help="run folders and logs (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_temporal_scale.json")
    parser.add_argument("--from-json", type=Path, nargs="+", metavar="JSON", help="run nothing: summarise the runs "
                        "of earlier outputs together (e.g. seeds run in separate invocations) and write --out")
    return parser


def valid_mode(mode: str) -> bool:
    """memory, epoch, sharded or sharded:K with K a non-negative integer."""
    name, colon, k = mode.partition(":")
    return name in ("memory", "epoch") and not colon or name == "sharded" and (not colon or k.isdigit())


def train_args(args: argparse.Namespace, seed: int, mode: str | None) -> list[str]:
    cmd = ["--dataset", args.dataset, "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
           "--patience", str(args.patience), "--seed", str(seed), "--neighbor-cutoff", args.neighbor_cutoff]
    if args.data_dir is not None:
        cmd += ["--data-dir", str(args.data_dir)]
    if mode is not None:
        name, _, k = mode.partition(":")
        cmd += ["--parallelism", name] + (["--staleness", k or str(args.staleness)] if name == "sharded" else [])
        cmd += shlex.split(args.rank_args)
    return cmd


def summarise(runs: list[dict]) -> dict:
    """Mean and std over seeds of each figure (peak RSS: the largest rank's)."""
    out = {}
    for name in FIGURES:
        values = [max(r["peak_rss_mib_per_rank"]) if name == "peak_rss_mib" else
                  sum(e["train_seconds"] for e in r["history"][:r["best_epoch"]]) if name == "train_seconds_to_best"
                  else r[name] for r in runs]
        out[name] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                     "values": values}
    out["best_epochs"] = [r["best_epoch"] for r in runs]
    out["rss_mib_per_rank"] = [r["peak_rss_mib_per_rank"] for r in runs]
    return out


def verdicts(configs: dict[str, dict], target: float, tolerance: float) -> dict[str, dict]:
    """Each multi-rank mode against the single process: speedup, AP change (of the means and per seed),
    whether the AP is within ``tolerance`` and whether the target (speedup and AP) is met."""
    base = configs["single"]
    out = {}
    for name, summary in configs.items():
        if name == "single":
            continue
        speedup = summary["train_events_per_second"]["mean"] / base["train_events_per_second"]["mean"]
        change = summary["test_ap"]["mean"] - base["test_ap"]["mean"]
        per_seed = [a - b for a, b in zip(summary["test_ap"]["values"], base["test_ap"]["values"])]
        within = abs(change) <= tolerance
        out[name] = {"speedup": speedup, "test_ap_change": change, "test_ap_change_per_seed": per_seed,
                     "ap_within_tolerance": bool(within), "met": bool(speedup >= target and within)}
    return out


def table(configs: dict[str, dict], judged: dict[str, dict], target: float, tolerance: float) -> str:
    def cell(summary: dict, name: str, digits: int) -> str:
        return f"{summary[name]['mean']:.{digits}f} ± {summary[name]['std']:.{digits}f}"

    lines = ["| run | train events/s | speedup | test AP | AP change | test AP per batch | inductive AP "
             "| peak RSS per rank (MiB) | best epochs | training s to the best epoch | AP change per seed "
             "| AP within tolerance | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, summary in configs.items():
        verdict = judged.get(name)
        lines.append(
            f"| {name} | {cell(summary, 'train_events_per_second', 0)} | "
            f"{'-' if verdict is None else format(verdict['speedup'], '.2f') + 'x'} | {cell(summary, 'test_ap', 4)} | "
            f"{'-' if verdict is None else format(verdict['test_ap_change'], '+.4f')} | "
            f"{cell(summary, 'test_ap_per_batch', 4)} | {cell(summary, 'test_ap_inductive', 4)} | "
            f"{cell(summary, 'peak_rss_mib', 0)} | {summary['best_epochs']} | {cell(summary, 'train_seconds_to_best', 0)} | "
            f"{'-' if verdict is None else ' / '.join(format(c, '+.4f') for c in verdict['test_ap_change_per_seed'])} | "
            f"{'-' if verdict is None else ('yes' if verdict['ap_within_tolerance'] else 'NO')} | "
            f"{'-' if verdict is None else ('met' if verdict['met'] else 'NOT met')} |")
    lines.append(f"\nTarget: >= {target}x the single process's training events/s with |test AP change| "
                 f"<= {tolerance}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        print(f"error: --seeds must be comma-separated integers, got {args.seeds!r}", file=sys.stderr)
        return 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not seeds or args.ranks < 2 or not modes or not all(valid_mode(m) for m in modes):
        print("error: --seeds needs at least one integer, --ranks >= 2, --modes some of memory, sharded, "
              "sharded:K (K >= 0), epoch", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {"single": [], **{f"{m}, {args.ranks} ranks": [] for m in modes}}
    if args.from_json:
        seeds = []
        for path in args.from_json:
            earlier = json.loads(path.read_text())
            seeds += earlier["seeds"]
            for key in ("dataset", "batch_size", "epochs", "patience", "ranks", "staleness", "neighbor_cutoff",
                        "rank_args"):  # the settings the runs had
                setattr(args, key, earlier.get(key, getattr(args, key)))
            for name, found in earlier["runs"].items():
                runs.setdefault(name, []).extend(found)
        return report(args, sorted(seeds), {name: found for name, found in runs.items() if found})
    with tempfile.TemporaryDirectory(prefix="gnnscale-bench-scale-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            for name, mode in [("single", None)] + [(f"{m}, {args.ranks} ranks", m) for m in modes]:
                metrics = run_training(workdir, f"{mode or 'single'}-seed{seed}", 1 if mode is None else args.ranks,
                                       train_args(args, seed, mode), args.timeout)
                print(f"[bench] {name}, seed {seed}: test AP {metrics['test_ap']:.4f}, "
                      f"{metrics['train_events_per_second']:.0f} training events/s, best epoch "
                      f"{metrics['best_epoch']}/{metrics['epochs_run']}", flush=True)
                runs[name].append({k: v for k, v in metrics.items() if k != "args"})
    return report(args, seeds, runs)


def seconds_to_reach(run: dict, target: float) -> float | None:
    """Training seconds until ``run`` first reached validation AP ``target`` (``None``: it never did)."""
    spent = 0.0
    for epoch in run["history"]:
        spent += epoch["train_seconds"]
        if epoch["val_ap"] >= target:
            return spent
    return None


def time_to_accuracy(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per mode, per seed: training seconds to the same seed's single-process best validation AP, and
    the ratio of their sum to the single process's (``None`` where a run never got there)."""
    targets = [max(e["val_ap"] for e in r["history"]) for r in runs["single"]]
    out = {}
    for name, found in runs.items():
        seconds = [seconds_to_reach(r, target) for r, target in zip(found, targets)]
        out[name] = {"seconds": seconds, "ratio": None}
    base = sum(out["single"]["seconds"])
    for name, found in out.items():
        if name != "single" and all(s is not None for s in found["seconds"]):
            found["ratio"] = sum(found["seconds"]) / base
    return out


def report(args: argparse.Namespace, seeds: list[int], runs: dict[str, list[dict]]) -> int:
    """Summarise, judge, write the JSON and print the table."""
    configs = {name: summarise(found) for name, found in runs.items()}
    judged = verdicts(configs, args.target_speedup, args.ap_tolerance)
    reach = time_to_accuracy(runs)
    for name, verdict in judged.items():
        verdict["seconds_to_single_best"], verdict["time_to_accuracy_ratio"] = reach[name]["seconds"], reach[name]["ratio"]
    result = {"dataset": args.dataset, "seeds": seeds, "batch_size": args.batch_size, "epochs": args.epochs,
              "patience": args.patience, "ranks": args.ranks, "staleness": args.staleness,
              "neighbor_cutoff": args.neighbor_cutoff, "rank_args": args.rank_args, "ap_tolerance": args.ap_tolerance,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "summary": configs, "verdicts": judged, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json(result))
    print(table(configs, judged, args.target_speedup, args.ap_tolerance))
    print(f"\nTraining seconds to the single process's best validation AP, per seed: single "
          f"{[round(x) for x in reach['single']['seconds']]}")
    for name, verdict in judged.items():
        ratio = verdict["time_to_accuracy_ratio"]
        print(f"  {name}: {[None if x is None else round(x) for x in verdict['seconds_to_single_best']]} "
              f"({'never reached by some seed' if ratio is None else f'{ratio:.2f}x the single process'})")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
