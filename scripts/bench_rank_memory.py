"""Per-rank memory: one process against 4 partitioned ranks, and memory-mapped features against resident ones.

    python scripts/bench_rank_memory.py                                   # 300k nodes, ~3M edges, 100 features
    python scripts/bench_rank_memory.py --num-nodes 50000 --epochs 1      # a quick look

One graph (the community-structured synthetic one), partitioned by ``python -m partition`` into a 1-part and a
4-part folder.  Model: SAGE 2 x 16, fanouts 10,25, batch 1000 (issue 28's).  Every run is the training command
with ``OMP_NUM_THREADS=1``; while it runs, every process of it (torchrun's ranks) has its RSS polled from /proc
(the peak RSS of each process is also its VmHWM, which metrics.json's memory account records).  Runs:

* ``bare``: an interpreter that imported torch and gnnscale's trainer (issue 28's baseline);
* ``empty`` and ``empty4``: the ``one`` and ``four`` runs on a 2,000-node graph of the same kind: what a process
  of a run holds whatever the data (libraries loaded while training, the process group, threads), the second
  baseline;
* ``one``: 1 process on the 1-part folder;
* ``four``: 4 ranks, ``--topology partitioned --cache-mb 0``;
* ``four-global``: ``four`` with a quarter of the batch per rank (``--batch-size 250``): a step covers the 1,000
  seeds of ``one``'s step, as data parallelism at an unchanged global batch trains (``--batch-size`` is per rank);
* ``mapped``: ``one`` with ``--memory-budget`` just above the partition's minimum, so the owned features stay
  memory-mapped (:mod:`gnnscale.distributed.mapped`);
* ``four-budget``: 4 ranks with the defaults and ``--memory-budget`` a quarter of ``one``'s peak above ``bare``.

Reported: the 4 ranks' peak RSS above ``bare``, summed, over ``one``'s (target <= 1.3); ``one``'s peak above
``bare`` over its folder's bytes (target <= 2); the first again with ``four-global``; both again above the
``empty`` runs instead of ``bare``; ``mapped``'s median epoch time over ``one``'s and whether their accuracies are
identical.  Times on a shared host are noisy: the ratio is of medians over epochs after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BATCH = 1000
MODEL = ["--model", "sage", "--num-layers", "2", "--hidden", "16", "--fanouts", "10,25", "--quiet"]
PARTITIONED = ["--topology", "partitioned", "--cache-mb", "0"]
TARGET_SUM, TARGET_FOLDER = 1.3, 2.0
MIB = 2**20


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=300_000, help="nodes of the synthetic graph")
    parser.add_argument("--avg-degree", type=float, default=10.0, help="its mean in-degree (the issue's size: 1M "
                        "nodes at 15)")
    parser.add_argument("--feat-dim", type=int, default=100, help="features per node")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of every run (evaluation after the last)")
    parser.add_argument("--work", type=Path, default=None, help="folder for the partitions and runs (default: a "
                        "temporary one); partition folders already there are reused")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed for each run")
    return parser


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def anon_bytes(pid: int) -> int:
    """RssAnon of process ``pid`` (bytes): its RSS less file pages (libraries, memory maps), 0 if gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next((int(line.split()[1]) * 1024 for line in handle if line.startswith("RssAnon:")), 0)
    except OSError:
        return 0


def poll_peaks(command: list[str], timeout: float) -> tuple[dict[int, int], dict[int, int], str]:
    """Run ``command``; the peak RSS and peak anonymous RSS (bytes) of each of its processes, polled every 50 ms,
    and its output.

    Raises:
        RuntimeError: the command failed or ran past ``timeout``.
    """
    with tempfile.TemporaryFile() as output:
        proc = subprocess.Popen(command, env=_env(), stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
        root, peaks, anon, deadline = psutil.Process(proc.pid), {}, {}, time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{' '.join(command)} ran past {timeout:.0f}s")
            try:
                for child in [root, *root.children(recursive=True)]:
                    peaks[child.pid] = max(peaks.get(child.pid, 0), child.memory_info().rss)
                    anon[child.pid] = max(anon.get(child.pid, 0), anon_bytes(child.pid))
            except psutil.Error:  # a process ended between the listing and the read
                pass
            time.sleep(0.05)
        output.seek(0)
        text = output.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{text[-3000:]}")
    return peaks, anon, text


def bare_peak() -> int:
    """Peak RSS of an interpreter that imported torch and the trainer (bytes)."""
    code = "import torch, gnnscale, gnnscale.train.trainer; from gnnscale.memory import peak_rss_bytes; " \
           "print(peak_rss_bytes())"
    return int(subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                              check=True).stdout.strip())


def progress(message: str) -> None:
    """A line on stderr: a run at the issue's size takes tens of minutes."""
    print(f"[bench_rank_memory {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def partition(args: argparse.Namespace, parts: int, folder: Path, num_nodes: int | None = None) -> Path:
    if not (folder / "manifest.json").exists():
        progress(f"partitioning {num_nodes or args.num_nodes} nodes into {parts} part(s): {folder}")
        subprocess.run([sys.executable, "-m", "partition", "--num-nodes", str(num_nodes or args.num_nodes), "--avg-degree",
                        str(args.avg_degree), "--feat-dim", str(args.feat_dim), "--num-parts", str(parts), "--out",
                        str(folder), "--quiet", "--force"], env=_env(), check=True, cwd=ROOT, capture_output=True)
    return folder


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def train(args: argparse.Namespace, name: str, folder: Path, ranks: int, extra: list[str], batch: int = BATCH) -> dict:
    """One training run (``batch`` seeds per step and rank): its metrics, the polled peaks of its ranks, and its
    epoch times."""
    out = args.work / "runs" / name
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] \
        if ranks > 1 else [sys.executable]
    command = [*launch, str(ROOT / "scripts" / "train_node_classification.py"), "--partitions", str(folder), *MODEL,
               "--batch-size", str(batch), "--epochs", str(args.epochs), "--eval-every", str(args.epochs), "--out",
               str(out), *extra]
    started = time.perf_counter()
    progress(f"run {name}: {ranks} rank(s), batch {batch}{' ' if extra else ''}{' '.join(extra)}")
    peaks, anon, _ = poll_peaks(command, args.timeout)
    metrics = json.loads((out / "metrics.json").read_text())
    account = metrics["memory"]["end"]
    hwm = [r["peak_rss_mib"] for r in account["ranks"]]
    # torchrun's agent is the launch process; the ranks are the processes whose peaks match no agent.
    ranks_pids = sorted(peaks, key=peaks.get, reverse=True)[:ranks] if ranks == 1 else \
        sorted((pid for pid in peaks if pid != proc_pid(peaks)), key=peaks.get, reverse=True)[:ranks]
    epochs = [h["epoch_seconds"] for h in metrics["history"]]
    run = {"name": name, "ranks": ranks, "command": " ".join(["python", *command[1:]]),
            "peak_rss_mib": hwm, "polled_peak_rss_mib": [round(peaks[p] / MIB, 1) for p in ranks_pids],
            "polled_peak_anon_mib": [round(anon[p] / MIB, 1) for p in ranks_pids],
            "epoch_seconds": epochs, "median_epoch_s": statistics.median(epochs[1:] or epochs),
            "val": metrics["val"], "test": metrics["test"], "wall_s": round(time.perf_counter() - started, 1),
            "account": account}
    progress(f"run {name}: done in {run['wall_s']} s, peak RSS per rank {hwm} MiB, test {metrics['test']}")
    return run


def proc_pid(peaks: dict[int, int]) -> int:
    """The launch process (torchrun's agent): the first started, the smallest pid of a fresh run."""
    return min(peaks)


def mapped_budget(folder: Path) -> float:
    """A budget (MiB) just above partition 0's minimum plus its features: they must stay mapped."""
    from gnnscale.budget import plan_graph
    from partition.load import load_partition

    part = load_partition(folder, 0)
    return round(plan_graph(part, 1e9).minimum_mb + part.features.nbytes / MIB, 1)


def print_account(run: dict) -> None:
    for rank in run["account"]["ranks"]:
        held = ", ".join(f"{k} {v}" for k, v in rank["resident_mib"].items() if v)
        mapped = ", ".join(f"{k} {v}" for k, v in rank["mapped_mib"].items())
        print(f"  {run['name']} rank {rank['rank']}: {held}; accounted {rank['accounted_mib']}; mapped: {mapped or '-'};"
              f" rss {rank['rss_mib']} ({rank['rss_file_mib']} in files), peak {rank['peak_rss_mib']} MiB")


def summarise(bare: float, folder: int, runs: dict[str, dict]) -> dict:
    one, four, mapped = runs["one"], runs["four"], runs["mapped"]
    above_one = one["peak_rss_mib"][0] - bare
    above_four = sum(p - bare for p in four["peak_rss_mib"])
    above_global = sum(p - bare for p in runs["four-global"]["peak_rss_mib"])
    data_one = one["peak_rss_mib"][0] - runs["empty"]["peak_rss_mib"][0]
    data_four = sum(p - e for p, e in zip(four["peak_rss_mib"], runs["empty4"]["peak_rss_mib"]))
    return {"bare_mib": bare, "one_folder_mib": round(folder / MIB, 1), "one_above_bare_mib": round(above_one, 1),
            "four_above_bare_sum_mib": round(above_four, 1), "sum_ratio": round(above_four / above_one, 2),
            "four_global_above_bare_sum_mib": round(above_global, 1),
            "sum_ratio_global": round(above_global / above_one, 2),
            "folder_ratio": round(above_one / (folder / MIB), 2), "one_above_empty_mib": round(data_one, 1),
            "four_above_empty_sum_mib": round(data_four, 1), "sum_ratio_empty": round(data_four / data_one, 2),
            "folder_ratio_empty": round(data_one / (folder / MIB), 2),
            "mapped_time_ratio": round(mapped["median_epoch_s"] / one["median_epoch_s"], 2),
            "mapped_accuracy_identical": (mapped["val"], mapped["test"]) == (one["val"], one["test"]),
            "one_peak_anon_mib": one["polled_peak_anon_mib"][0], "mapped_peak_anon_mib": mapped["polled_peak_anon_mib"][0],
            "four_peak_anon_sum_mib": round(sum(four["polled_peak_anon_mib"]), 1),
            "empty_peak_anon_mib": runs["empty"]["polled_peak_anon_mib"][0],
            "empty4_peak_anon_sum_mib": round(sum(runs["empty4"]["polled_peak_anon_mib"]), 1),
            "mapped_peak_above_bare_mib": round(mapped["peak_rss_mib"][0] - bare, 1)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="bench-rank-memory-"))
    one_folder, four_folder = (partition(args, k, args.work / f"parts{k}") for k in (1, 4))
    bare = round(bare_peak() / MIB, 1)
    empty1, empty4 = (partition(args, k, args.work / f"empty{k}", 2000) for k in (1, 4))
    runs = {"empty": train(args, "empty", empty1, 1, []),
            "empty4": train(args, "empty4", empty4, 4, PARTITIONED),
            "one": train(args, "one", one_folder, 1, []),
            "four": train(args, "four", four_folder, 4, PARTITIONED),
            "four-global": train(args, "four-global", four_folder, 4, PARTITIONED, batch=BATCH // 4)}
    runs["mapped"] = train(args, "mapped", one_folder, 1, ["--memory-budget", str(mapped_budget(one_folder))])
    quarter = round((runs["one"]["peak_rss_mib"][0] - bare) / 4, 1)
    runs["four-budget"] = train(args, "four-budget", four_folder, 4, ["--memory-budget", str(quarter)])
    summary = summarise(bare, folder_bytes(one_folder), runs)
    print(f"graph: {args.num_nodes} nodes, avg degree {args.avg_degree}, {args.feat_dim} features; bare interpreter "
          f"{bare} MiB; 1-part folder {summary['one_folder_mib']} MiB")
    print(f"{'run':12} {'ranks':>5} {'peak RSS per rank (MiB)':>32} {'polled peak anon (MiB)':>32} "
          f"{'median epoch s':>15} {'val':>7} {'test':>7}")
    for run in runs.values():
        print(f"{run['name']:12} {run['ranks']:5d} {str(run['peak_rss_mib']):>32} "
              f"{str(run['polled_peak_anon_mib']):>32} {run['median_epoch_s']:15.2f} {run['val']:7.4f} {run['test']:7.4f}")
    print("memory account at the end (MiB):")
    for run in runs.values():
        print_account(run)
    print(f"4 ranks summed above bare / one process above bare: {summary['sum_ratio']} (target <= {TARGET_SUM})")
    print(f"the same at one process's global batch ({BATCH // 4} seeds per rank): {summary['sum_ratio_global']}")
    print(f"one process above bare / its folder: {summary['folder_ratio']} (target <= {TARGET_FOLDER})")
    print(f"above the empty runs instead: 4 ranks summed / one process {summary['sum_ratio_empty']}, one process / "
          f"its folder {summary['folder_ratio_empty']}")
    print(f"anonymous memory only (polled): 4 ranks summed above empty4 "
          f"{summary['four_peak_anon_sum_mib'] - summary['empty4_peak_anon_sum_mib']:.1f} MiB, one above empty "
          f"{summary['one_peak_anon_mib'] - summary['empty_peak_anon_mib']:.1f} MiB, mapped above empty "
          f"{summary['mapped_peak_anon_mib'] - summary['empty_peak_anon_mib']:.1f} MiB")
    print(f"mapped / resident median epoch time: {summary['mapped_time_ratio']}; accuracy identical: "
          f"{summary['mapped_accuracy_identical']}; four-budget ({quarter} MiB per rank) test "
          f"{runs['four-budget']['test']:.4f} vs four {runs['four']['test']:.4f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                         "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
