"""TGN on a synthetic stream of a million nodes: training throughput and memory per rank at 1, 2 and 4 ranks.

    python scripts/bench_temporal_synthetic.py                                  # 1M nodes, 400k events
    python scripts/bench_temporal_synthetic.py --num-nodes 100000 --num-events 50000 --ranks 1,2   # a quick look

Every run trains one epoch of ``scripts/train_temporal.py --dataset synthetic`` (the generated stream
of bursty users and communities, deterministic by seed) at ``--batch-size``, in one process and
under ``torchrun --standalone`` on each rank count, in the sharded mode at ``--staleness`` with
each rank's memory table bounded to its owned nodes plus ``--cache-rows`` others (``dense``: every
node on every rank, the default before the bounded cache).  Every process runs with
``OMP_NUM_THREADS=1``; with more ranks than cores the ranks share cores, which the table says.
From each run's ``metrics.json``: training events per second (training only), memory-table rows
per rank against the node count N (target: <= 0.6 N at 2 ranks), rows fetched from owners, peak
RSS per rank, and test AP.  Writes ``runs/bench_temporal_synthetic.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

from bench_temporal_staleness import ROOT, run_training

from gnnscale.train.cli import strict_json

ROWS_TARGET = 0.6  # memory-table rows per rank at 2 ranks, as a share of the nodes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--num-events", type=int, default=400_000)
    parser.add_argument("--ranks", default="1,2,4", help="rank counts, comma-separated (1: one process)")
    parser.add_argument("--batch-size", type=int, default=200, help="global batch")
    parser.add_argument("--staleness", type=int, default=4, help="K of the sharded runs")
    parser.add_argument("--cache-rows", default="50000", help="rows each rank holds beyond its owned nodes, or "
                        "'dense' (every node); several, comma-separated, run each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed for each run")
    parser.add_argument("--workdir", type=Path, default=None, help="run folders and logs (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_temporal_synthetic.json")
    return parser


def parse(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    caches = [c.strip() for c in args.cache_rows.split(",") if c.strip()]
    if not ranks or min(ranks) < 1 or not caches or not all(c == "dense" or c.isdigit() for c in caches):
        raise ValueError("--ranks takes integers >= 1 and --cache-rows 'dense' or integers >= 0, comma-separated")
    return ranks, caches


def row(metrics: dict, ranks: int, cache: str, base: float | None) -> dict:
    rows = metrics["memory_rows_per_rank"] if ranks > 1 else [metrics["num_nodes"]]
    speed = metrics["train_events_per_second"]
    return {"ranks": ranks, "cache_rows": cache if ranks > 1 else "-", "train_events_per_second": speed,
            "speedup": None if base is None else speed / base, "num_nodes": metrics["num_nodes"],
            "memory_rows_per_rank": rows, "max_rows_share": max(rows) / metrics["num_nodes"],
            "fetched_rows": metrics.get("fetched_rows", 0), "peak_rss_mib_per_rank": metrics["peak_rss_mib_per_rank"],
            "test_ap": metrics["test_ap"], "staleness_max": metrics["staleness_max"]}


def table(rows: list[dict], cores: int) -> str:
    lines = ["| ranks | cache rows | train events/s | x 1 process | memory rows per rank (share of N) | rows fetched "
             "| peak RSS per rank (MiB) | test AP | staleness max |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shared = " (ranks share cores)" if r["ranks"] > cores else ""
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}"
        lines.append(f"| {r['ranks']}{shared} | {r['cache_rows']} | {r['train_events_per_second']:.0f} | {speedup} | "
                     f"{max(r['memory_rows_per_rank']):,} ({r['max_rows_share']:.2f}) | {r['fetched_rows']:,} | "
                     f"{max(r['peak_rss_mib_per_rank']):.0f} | {r['test_ap']:.4f} | {r['staleness_max']} |")
    two = [r for r in rows if r["ranks"] == 2]
    if two:
        best = min(r["max_rows_share"] for r in two)
        lines.append(f"\nMemory-table rows per rank at 2 ranks: {best:.2f} N (target <= {ROWS_TARGET} N: "
                     f"{'met' if best <= ROWS_TARGET else 'NOT met'}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rank_counts, caches = parse(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    common = ["--dataset", "synthetic", "--num-nodes", str(args.num_nodes), "--num-events", str(args.num_events),
              "--seed", str(args.seed), "--batch-size", str(args.batch_size), "--epochs", "1", "--patience", "0"]
    rows, base = [], None
    with tempfile.TemporaryDirectory(prefix="gnnscale-bench-synthetic-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for ranks in rank_counts:
            for cache in (caches if ranks > 1 else ["-"]):
                extra = [] if ranks == 1 else ["--staleness", str(args.staleness)] + (
                    [] if cache == "dense" else ["--memory-cache-rows", cache])
                metrics = run_training(workdir, f"{ranks}r-{cache}", ranks, common + extra, args.timeout)
                if ranks == 1:
                    base = metrics["train_events_per_second"]
                rows.append(row(metrics, ranks, cache, base))
                print(f"[bench] {ranks} ranks, cache {cache}: {rows[-1]['train_events_per_second']:.0f} events/s, "
                      f"rows per rank {rows[-1]['memory_rows_per_rank']}", flush=True)
    result = {"num_nodes": args.num_nodes, "num_events": args.num_events, "batch_size": args.batch_size,
              "staleness": args.staleness, "seed": args.seed, "epochs": 1,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json(result))
    print(table(rows, os.cpu_count() or 1))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
