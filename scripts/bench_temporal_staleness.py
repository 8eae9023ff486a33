"""TGN with node memory sharded over 2 ranks: accuracy, throughput, bytes and observed staleness for each bound K.

    python scripts/bench_temporal_staleness.py                       # Wikipedia, K = 0,1,2,4,8, 3 epochs
    python scripts/bench_temporal_staleness.py --ks 0,4 --seeds 0,1,2 --epochs 10   # the issue's sweep
    python scripts/bench_temporal_staleness.py --dataset collegemsg --epochs 1 --ks 0,4   # a quick look
    python scripts/bench_temporal_staleness.py --ks 1 --wire-dtypes float32,float16,int8   # memory rows' codes

For every K the same command runs under ``torchrun --standalone --nproc_per_node=RANKS``
(``scripts/train_temporal.py --staleness K``, METIS owners, ``--patience 0``), plus one
single-process run of the same recipe as the reference.  Every process runs with
``OMP_NUM_THREADS=1``.  Figures come from each run's ``metrics.json``: test AP (transductive and
inductive) of the best epoch, training throughput (events per second, the median over epochs),
the memory rows sent per training pass (all ranks) beside the payload of one rank's gradient sums,
and the maximum and mean staleness of the remote reads, in global steps, as measured by the
ranks (:mod:`gnnscale.temporal.sharded`).  With several ``--seeds`` every configuration runs once
per seed and the table gives mean ± std over them, and each K's throughput against K = 0's
(target: K = 4 at >= 1.3x).  With several ``--wire-dtypes`` every K runs once per wire dtype
(``--wire-dtype``: how memory rows cross ranks), and each lossy code's bytes and test AP are given
against float32's at the same K.  Writes ``runs/bench_temporal_staleness.json`` and prints one
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gnnscale.options import WIRE_DTYPES
from gnnscale.train.cli import strict_json

ROOT = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", default="wikipedia", choices=("wikipedia", "collegemsg", "csv", "snap", "npz"))
    parser.add_argument("--data-dir", type=Path, default=None, help="passed on to train_temporal.py")
    parser.add_argument("--ks", default="0,1,2,4,8", help="staleness bounds to run, comma-separated")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=200, help="global batch (events per step, all ranks)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--neighbor-cutoff", choices=("batch", "event"), default="event")
    parser.add_argument("--seeds", default="0", help="comma-separated; every configuration runs once per seed")
    parser.add_argument("--rank-args", default="", help="further train_temporal.py options for the multi-rank runs, "
                        "e.g. \"--memory-cache-rows 2000\"")
    parser.add_argument("--wire-dtypes", default="float32", help="--wire-dtype values to run at every K, "
                        "comma-separated (float32, float16, bfloat16, int8)")
    parser.add_argument("--skip-single", action="store_true", help="no single-process reference run")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed for each run")
    parser.add_argument("--workdir", type=Path, default=None, help="run folders and logs (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_temporal_staleness.json")
    return parser


def run_training(workdir: Path, name: str, ranks: int, train_args: list[str], timeout: float) -> dict:
    """``scripts/train_temporal.py train_args`` in one process or under torchrun on ``ranks`` ranks, every
    process with ``OMP_NUM_THREADS=1``, its output in ``workdir/name.log``; its metrics.json (plus wall time)."""
    out = workdir / name
    train = [str(ROOT / "scripts" / "train_temporal.py"), *train_args, "--out", str(out),
             "--checkpoint-every", "0"]  # timed runs: a checkpoint per epoch would be timed too
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *train]
    else:
        cmd = [sys.executable, *train]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    print(f"[bench] {name}: {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    with open(workdir / f"{name}.log", "w") as log:
        done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = (workdir / f"{name}.log").read_text().splitlines()[-15:]
        raise SystemExit(f"error: run {name} failed with exit code {done.returncode}:\n" + "\n".join(tail))
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["wall_seconds"] = time.perf_counter() - start
    return metrics


def run_one(args: argparse.Namespace, workdir: Path, config: tuple[int, int, str], seed: int) -> dict:
    """One training run of ``config``: ranks, staleness bound and wire dtype."""
    ranks, k, wire = config
    name = (f"k{k}-{ranks}r" if ranks > 1 else "single") + (f"-{wire}" if wire != "float32" else "") + \
        (f"-seed{seed}" if seed else "")
    train = ["--dataset", args.dataset, "--no-edge-features", "--epochs", str(args.epochs), "--patience", "0",
             "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--seed", str(seed), "--staleness", str(k),
             "--neighbor-cutoff", args.neighbor_cutoff]
    if args.data_dir is not None:
        train += ["--data-dir", str(args.data_dir)]
    if ranks > 1:
        train += ["--wire-dtype", wire, *shlex.split(args.rank_args)]
    metrics = run_training(workdir, name, ranks, train, args.timeout)
    print(f"[bench] {name}: test AP {metrics['test_ap']:.4f}, {metrics['train_events_per_second']:.0f} events/s, "
          f"{metrics['train_mib_sent_per_epoch']:.1f} MiB sent per epoch, staleness max {metrics['staleness_max']} "
          f"mean {metrics['staleness_mean']:.3f}", flush=True)
    return metrics


K_TARGET, SPEEDUP_TARGET = 4, 1.3  # K = 4 at >= 1.3x the throughput of K = 0
AP_TOLERANCE = 0.005  # a lossy wire dtype's test AP against float32's (issue 15)


def mean_std(values: list[float], digits: int) -> str:
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f}" + (f" ± {std:.{digits}f}" if len(values) > 1 else "")


def _mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def table(groups: dict[tuple[int, int, str], list[dict]]) -> str:
    """One line per configuration (1 process, or K and wire dtype on several ranks), mean ± std over its seeds."""
    lines = ["| run | K | wire | seeds | test AP | inductive AP | test MRR | train events/s | x K = 0 | MiB sent / epoch "
             "| gradient MiB / epoch | staleness max | staleness mean | stale share of reads | remote share of reads |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    first_wire = next((wire for ranks, _, wire in groups if ranks > 1), "float32")
    k0 = groups.get((max(ranks for ranks, _, _ in groups), 0, first_wire))
    for (ranks, k, wire), rows in groups.items():
        many = ranks > 1
        speed = [r["train_events_per_second"] for r in rows]
        ratio = f"{statistics.fmean(speed) / _mean(k0, 'train_events_per_second'):.2f}" if many and k0 else "-"
        lines.append(
            f"| {f'{ranks} ranks' if many else '1 process'} | {k if many else '-'} | {wire if many else '-'} "
            f"| {len(rows)} | {mean_std([r['test_ap'] for r in rows], 4)} "
            f"| {mean_std([r['test_ap_inductive'] for r in rows], 4)} "
            f"| {mean_std([r['test_mrr'] for r in rows], 4)} | {mean_std(speed, 0)} | {ratio} "
            f"| {mean_std([r['train_mib_sent_per_epoch'] for r in rows], 1) if many else '-'} "
            f"| {mean_std([r['train_grad_mib_reduced_per_epoch'] for r in rows], 1) if many else '-'} "
            f"| {max(r['staleness_max'] for r in rows)} | {mean_std([r['staleness_mean'] for r in rows], 3)} "
            f"| {mean_std([r['history'][-1]['stale_read_fraction'] for r in rows], 3) if many else '-'} "
            f"| {mean_std([r['remote_read_fraction'] for r in rows], 3) if many else '-'} |")
    four = groups.get((max(ranks for ranks, _, _ in groups), K_TARGET, first_wire))
    if four and k0:
        ratio = _mean(four, "train_events_per_second") / _mean(k0, "train_events_per_second")
        lines.append(f"\nK = {K_TARGET} against K = 0: {ratio:.2f}x the training events/s (target >= "
                     f"{SPEEDUP_TARGET}x: {'met' if ratio >= SPEEDUP_TARGET else 'NOT met'}).")
    for (ranks, k, wire), rows in groups.items():
        exact = groups.get((ranks, k, "float32"))
        if ranks > 1 and wire != "float32" and exact:
            delta = _mean(rows, "test_ap") - _mean(exact, "test_ap")
            sent = _mean(rows, "train_mib_sent_per_epoch") / _mean(exact, "train_mib_sent_per_epoch")
            lines.append(f"K = {k}, wire {wire}: {sent:.3f}x float32's bytes, test AP {delta:+.4f} (within {AP_TOLERANCE}: "
                         f"{'yes' if abs(delta) <= AP_TOLERANCE else 'NO'}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ks = [int(k) for k in args.ks.split(",") if k.strip()]
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        wires = [wire.strip() for wire in args.wire_dtypes.split(",") if wire.strip()]
    except ValueError:
        print(f"error: --ks and --seeds must be comma-separated integers, got {args.ks!r} and {args.seeds!r}",
              file=sys.stderr)
        return 2
    if not ks or min(ks) < 0 or not seeds or args.ranks < 2 or args.epochs < 1:
        print("error: --ks needs integers >= 0, --seeds at least one, --ranks >= 2 and --epochs >= 1", file=sys.stderr)
        return 2
    if not wires or not set(wires) <= set(WIRE_DTYPES):
        print(f"error: --wire-dtypes takes comma-separated values of {', '.join(WIRE_DTYPES)}, got "
              f"{args.wire_dtypes!r}", file=sys.stderr)
        return 2
    configs = ([] if args.skip_single else [(1, 0, "float32")]) + [(args.ranks, k, wire) for k in ks for wire in wires]
    groups: dict[tuple[int, int, str], list[dict]] = {config: [] for config in configs}
    with tempfile.TemporaryDirectory(prefix="gnnscale-bench-temporal-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for seed in seeds:  # seeds outermost: a drifting machine touches every configuration alike
            for config in configs:
                groups[config].append({**run_one(args, workdir, config, seed), "seed": seed})
    result = {"dataset": args.dataset, "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
              "neighbor_cutoff": args.neighbor_cutoff,
              "ranks": args.ranks, "seeds": seeds, "rank_args": args.rank_args, "wire_dtypes": wires,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "runs": [{k: v for k, v in row.items() if k != "args"} for rows in groups.values() for row in rows]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json(result))
    print(table(groups))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
