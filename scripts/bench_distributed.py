"""Distributed training on one host: gnnscale (1, 2, 4 ranks) against DistDGL (1 server, 2 trainers).

    python scripts/bench_distributed.py                           # 1M nodes, ~10M edges, 3 epochs
    python scripts/bench_distributed.py --num-nodes 100000 --epochs 2 --ranks 2    # a quick look

One run, one graph: the community-structured synthetic graph (``generate_synthetic``,
power-law degrees, 100 features, 10 classes, 10% training nodes) is generated once in a
child process and saved both as a ``dgl.save_graphs`` file (DistDGL's input) and as an
edge-list folder (ours).  The model and schedule are DistDGL's example's on both sides:
GraphSAGE (mean) with 2 layers, hidden 16, fanouts 10,25 (input side first), batch 1000 seeds
per trainer, Adam lr 0.003, dropout 0.5, no weight decay, one evaluation after the last epoch
(layer-wise over all neighbours, on both sides).

* **gnnscale, K ranks**: ``python -m partition --dataset edgelist --num-parts K`` (timed apart),
  then ``torchrun --standalone --nproc_per_node=K scripts/train_node_classification.py
  --partitions DIR ...``; epoch times, bytes sent and cache hit rate come from its
  ``metrics.json``.
* **DistDGL**: ``scripts/distdgl_baseline.py`` (its docstring says exactly what runs): 1 server
  and 2 trainers under torchrun, the only DistDGL layout that runs on one machine.

Epoch time is the median over epochs after the first (both sides warm up in epoch 1) or over
all epochs when there are fewer than 3.  Reported ratio: gnnscale with 2 ranks / DistDGL with 2
trainers (target <= 0.5).  Every process runs with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from distdgl_baseline import generate_graph, run_distdgl  # noqa: E402
from gnnscale.train.cli import strict_json  # noqa: E402

TARGET_RATIO = 0.5
MODEL_ARGS = ["--model", "sage", "--num-layers", "2", "--hidden", "16", "--fanouts", "10,25", "--batch-size", "1000",
              "--lr", "0.003", "--dropout", "0.5", "--weight-decay", "0"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--feat-dim", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="seed of the graph and of both trainings")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--ranks", default="1,2,4", help="gnnscale world sizes to run (2 is compared with DistDGL)")
    parser.add_argument("--cache-mb", type=float, default=64.0, help="gnnscale's feature cache per rank")
    parser.add_argument("--skip-distdgl", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed for each child run")
    parser.add_argument("--workdir", type=Path, default=None, help="graph, partitions and logs (default: a "
                        "temporary folder, removed at the end)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_distributed.json")
    return parser


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def steady(seconds: list[float]) -> float:
    """Median epoch time, leaving out the warm-up epoch when there are enough."""
    return statistics.median(seconds[1:] if len(seconds) >= 3 else seconds)


def run_logged(command: list[str], log_path: Path, timeout: float) -> float:
    """Run ``command`` with output to ``log_path``; seconds taken.  Raises with the log's tail on failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with open(log_path, "w") as handle:
        try:
            done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout, env=env,
                                  cwd=ROOT)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{' '.join(command[:5])} ... ran past {timeout:.0f} s; log: {log_path}") from None
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:5])} ... exited {done.returncode}:\n"
                           f"{log_path.read_text()[-3000:]}")
    return time.perf_counter() - start


def run_ours(work: Path, ranks: int, args: argparse.Namespace) -> dict:
    parts, out = work / f"parts-{ranks}", work / f"gnnscale-{ranks}"
    partition_seconds = run_logged(
        [sys.executable, "-m", "partition", "--dataset", "edgelist", "--data-dir", str(work / "data" / "edgelist"),
         "--num-parts", str(ranks), "--out", str(parts), "--force"], work / f"partition-{ranks}.log", args.timeout)
    run_logged([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                str(ROOT / "scripts" / "train_node_classification.py"), "--partitions", str(parts), "--out", str(out),
                *MODEL_ARGS, "--epochs", str(args.epochs), "--eval-every", str(args.epochs), "--seed", str(args.seed),
                "--cache-mb", str(args.cache_mb)], work / f"gnnscale-{ranks}.log", args.timeout)
    metrics = json.loads((out / "metrics.json").read_text())
    history = metrics["history"]
    epoch_seconds = [h["epoch_seconds"] for h in history]
    result = {"framework": "gnnscale", "ranks": ranks, "partition_seconds": partition_seconds,
              "epoch_seconds": epoch_seconds, "epoch_time": steady(epoch_seconds),
              "val_acc": metrics["val"], "test_acc": metrics["test"],
              # One rank fetches nothing remote and has no cache.
              "bytes_sent_per_epoch": statistics.median(h.get("bytes_sent", 0) for h in history),
              "cache_hit_rate": statistics.median(h.get("cache_hit_rate", 1.0) for h in history),
              "stage_seconds": {s: statistics.median(h[f"{s}_s"] for h in history)
                                for s in ("sample", "gather", "compute", "wait")}}
    log(f"gnnscale {ranks} rank(s): epoch {result['epoch_time']:.2f} s (all {[round(s, 2) for s in epoch_seconds]}), "
        f"val {result['val_acc']:.4f}, test {result['test_acc']:.4f}, sent {result['bytes_sent_per_epoch'] / 2**20:.1f} "
        f"MiB/epoch, cache hit {result['cache_hit_rate']:.1%}")
    return result


def print_table(results: list[dict], ratio: float | None) -> None:
    print("\n| run | epoch s (median) | val acc | test acc | MiB sent / epoch | cache hit |")
    print("|---|---|---|---|---|---|")
    for r in results:
        name = f"gnnscale, {r['ranks']} rank(s)" if r["framework"] == "gnnscale" else \
            f"DistDGL, 1 server + {r['num_trainers']} trainers"
        sent = f"{r['bytes_sent_per_epoch'] / 2**20:.1f}" if "bytes_sent_per_epoch" in r else "-"
        hit = f"{r['cache_hit_rate']:.1%}" if "cache_hit_rate" in r else "-"
        print(f"| {name} | {r['epoch_time']:.2f} | {r['val_acc']:.4f} | {r['test_acc']:.4f} | {sent} | {hit} |")
    if ratio is not None:
        print(f"\nepoch-time ratio gnnscale 2 ranks / DistDGL 2 trainers: {ratio:.2f} (target <= {TARGET_RATIO})")


def main() -> None:
    args = build_parser().parse_args()
    ranks = [int(k) for k in args.ranks.split(",") if k.strip()]
    with tempfile.TemporaryDirectory(prefix="gnnscale-bench-dist-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        log(f"generating the graph ({args.num_nodes:,} nodes) in {work / 'data'}")
        graph_bin, facts = generate_graph(work / "data", num_nodes=args.num_nodes, avg_degree=args.avg_degree,
                                          feat_dim=args.feat_dim, seed=args.seed, timeout=args.timeout)
        results = []
        if not args.skip_distdgl:
            distdgl = run_distdgl(graph_bin, work / "distdgl", epochs=args.epochs, num_trainers=2,
                                  timeout=args.timeout, log=log, seed=args.seed)
            distdgl["epoch_time"] = steady(distdgl["epoch_seconds"])
            results.append(distdgl)
        for k in ranks:
            results.append(run_ours(work, k, args))
    ours2 = next((r for r in results if r["framework"] == "gnnscale" and r["ranks"] == 2), None)
    distdgl = next((r for r in results if r["framework"] == "distdgl"), None)
    ratio = ours2["epoch_time"] / distdgl["epoch_time"] if ours2 and distdgl else None
    print_table(results, ratio)
    summary = {"graph": facts, "epochs": args.epochs, "model": MODEL_ARGS, "results": results,
               "ratio_epoch_time_2_ranks": ratio, "target_ratio": TARGET_RATIO,
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
               "command": " ".join(sys.argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json(summary))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
