"""Our TGN against the reference TGN (twitter-research/tgn), side by side: training epoch time and AP per epoch.

    git clone https://github.com/twitter-research/tgn /path/to/tgn && git -C /path/to/tgn checkout d55bbe6
    pip install -e .[tgn-reference]         # pandas and scikit-learn, which the reference imports
    python scripts/bench_tgn_reference.py --reference /path/to/tgn

For each dataset (Wikipedia and CollegeMsg from ``../shared/datasets`` by default) the script
converts our stream into the reference's input (``data/ml_<name>.csv`` with 1-based node and
event ids, and all-zero 172-wide edge and node feature arrays, which its loader requires) in a
work folder, and runs the reference's ``train_self_supervised.py --use_memory`` (TGN-attn, every
other option its default: batch 200, lr 1e-4, memory 172) for ``--epochs`` epochs, unmodified.
One call of it fails on Python >= 3.11: ``random.sample`` of a set, which Python 3.11 refuses;
the run passes the set's elements as a tuple (what older Python did itself), by wrapping
``random.sample`` in the reference's process, nothing else.  Then our command runs the same epochs
at batch 200 with ``--neighbor-cutoff event`` (TGN's rule), no edge features, our defaults
otherwise, plus ``--our-args`` if given (e.g. ``"--train-negatives train"``).  Both run with
``--threads`` torch threads.

Compared: the training time of an epoch (training only, without validation: the reference's
``epoch_times``, our ``train_seconds``; the median over epochs) and, after each epoch, the
validation AP as TGN computes it (averaged per batch of 200 positives and 200 negatives: the
reference's ``val_aps``, our ``val_ap_per_batch``).  The test AP is each side's final figure (the
reference: the model after the last epoch; ours: the best epoch by validation AP).  Targets:
our epoch <= 0.33x the reference's, and our AP within 0.005 of its AP after every epoch.
With ``--runs N`` each side trains N times (the reference's own ``--n_runs N``, which continues
its random state from run to run; ours with ``--seed`` 0..N-1) and the comparison is between the
means over runs after each epoch, reported with their spread: on a small stream one run of either
side moves by more than 0.005 from run to run.
Writes ``runs/bench_tgn_reference.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gnnscale.train.cli import strict_json

ROOT = Path(__file__).resolve().parents[1]
FEATURE_WIDTH = 172  # the reference's loader and model expect 172-wide feature arrays
TIME_RATIO_TARGET, AP_TOLERANCE = 0.33, 0.005

# Runs in the reference's process: random.sample of a set as Python < 3.11 did it, then its script.
WRAPPER = """
import os, random, runpy, sys
_sample = random.sample
random.sample = lambda population, k, **kw: _sample(tuple(population) if isinstance(population, (set, frozenset))
                                                   else population, k, **kw)
import torch
torch.set_num_threads(int(sys.argv[1]))
script = sys.argv[2]
sys.path.insert(0, os.path.dirname(script))  # its imports are relative to its checkout
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True, help="a checkout of twitter-research/tgn (d55bbe6)")
    parser.add_argument("--datasets", default="wikipedia,collegemsg", help="comma-separated: wikipedia, collegemsg")
    parser.add_argument("--data-root", type=Path, default=ROOT.parent / "shared" / "datasets")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1,
                        help="training runs of each side; AP compared as means over runs")
    parser.add_argument("--our-args", default="", help="further train_temporal.py options for our side, e.g. "
                        "\"--train-negatives train\"")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each side")
    parser.add_argument("--timeout", type=float, default=3 * 3600.0, help="seconds allowed for each run")
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "tgn-reference",
                        help="converted inputs, the reference's outputs, our run folders and logs")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_tgn_reference.json")
    return parser


def write_reference_input(events, folder: Path) -> None:
    """The reference's ``data/ml_<name>.{csv,npy}`` and ``ml_<name>_node.npy``: ids 1-based (0 is its
    padding), event ``idx`` 1..E indexing the edge features, whose row 0 is the padding event."""
    import pandas as pd

    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    labels = np.zeros(events.num_events) if events.labels is None else events.labels
    pd.DataFrame({"u": events.src + 1, "i": events.dst + 1, "ts": events.t, "label": labels,
                  "idx": np.arange(1, events.num_events + 1)}).to_csv(data / f"ml_{events.name}.csv")
    np.save(data / f"ml_{events.name}.npy", np.zeros((events.num_events + 1, FEATURE_WIDTH), np.float32))
    np.save(data / f"ml_{events.name}_node.npy", np.zeros((events.num_nodes + 1, FEATURE_WIDTH), np.float32))


class _Results(pickle.Unpickler):
    """The reference's results file holds lists of numpy floats: nothing else is loaded."""

    ALLOWED = {("numpy", "dtype"), ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"the reference's results file holds {module}.{name}, not a number")
        return super().find_class(module, name)


def run(label: str, cmd: list[str], log: Path, cwd: Path, threads: int, timeout: float) -> float:
    """Run ``cmd`` with ``threads`` threads, output to ``log``; its wall seconds (a failure exits, with the log's tail)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT))
    print(f"[bench] {label} (log: {log})", flush=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise SystemExit(f"error: {label} failed with exit code {done.returncode}; the end of {log}:\n{tail}")
    return time.perf_counter() - start


def reference_run(args: argparse.Namespace, events, folder: Path) -> dict:
    write_reference_input(events, folder)
    script = args.reference.resolve() / "train_self_supervised.py"
    options = ["-d", events.name, "--use_memory", "--n_epoch", str(args.epochs), "--prefix", "gnnscale-bench",
               "--n_runs", str(args.runs)]
    run(f"reference: {script} {' '.join(options)}", [sys.executable, "-c", WRAPPER, str(args.threads),
        str(script), *options], folder / "reference.log", folder, args.threads, args.timeout)
    runs = []
    for i in range(args.runs):  # its run i > 0 writes <prefix>_<i>.pkl
        with open(folder / "results" / ("gnnscale-bench.pkl" if i == 0 else f"gnnscale-bench_{i}.pkl"), "rb") as f:
            found = _Results(f).load()
        runs.append({"epoch_seconds": [float(x) for x in found["epoch_times"]],
                     "val_ap_per_batch": [float(x) for x in found["val_aps"]],
                     "val_ap_inductive_per_batch": [float(x) for x in found["new_nodes_val_aps"]],
                     "test_ap_per_batch": float(found["test_ap"]),
                     "test_ap_inductive_per_batch": float(found["new_node_test_ap"])})
    return summarise(runs)


def our_run(args: argparse.Namespace, name: str, folder: Path) -> dict:
    runs = []
    for seed in range(args.runs):
        out = folder / ("ours" if args.runs == 1 else f"ours-seed{seed}")
        cmd = [str(ROOT / "scripts" / "train_temporal.py"), "--dataset", name, "--data-dir",
               str(args.data_root / name), "--batch-size", "200", "--neighbor-cutoff", "event", "--no-edge-features",
               "--epochs", str(args.epochs), "--patience", "0", "--seed", str(seed), "--out", str(out),
               "--checkpoint-every", "0", *shlex.split(args.our_args)]  # timed: no checkpoint per epoch
        run(f"ours: {' '.join(cmd)}", [sys.executable, *cmd], out.with_suffix(".log"), ROOT, args.threads,
            args.timeout)
        metrics = json.loads((out / "metrics.json").read_text())
        runs.append({"epoch_seconds": [e["train_seconds"] for e in metrics["history"]],
                     "val_ap_per_batch": [e["val_ap_per_batch"] for e in metrics["history"]],
                     "val_ap_inductive_per_batch": [e["val_ap_per_batch_inductive"] for e in metrics["history"]],
                     "test_ap_per_batch": metrics["test_ap_per_batch"],
                     "test_ap_inductive_per_batch": metrics["test_ap_per_batch_inductive"],
                     "best_epoch": metrics["best_epoch"], "seed": seed})
    return summarise(runs)


def summarise(runs: list[dict]) -> dict:
    """One side over its runs: every run, the epoch seconds pooled, and per epoch the mean AP and its spread."""
    def per_epoch(key: str, statistic=statistics.fmean) -> list[float]:
        return [statistic(epoch) for epoch in zip(*(r[key] for r in runs))]

    return {"runs": runs, "epoch_seconds": [s for r in runs for s in r["epoch_seconds"]],
            "val_ap_per_batch": per_epoch("val_ap_per_batch"),
            "val_ap_per_batch_std": per_epoch("val_ap_per_batch", statistics.pstdev),
            "val_ap_inductive_per_batch": per_epoch("val_ap_inductive_per_batch"),
            "test_ap_per_batch": statistics.fmean(r["test_ap_per_batch"] for r in runs),
            "test_ap_inductive_per_batch": statistics.fmean(r["test_ap_inductive_per_batch"] for r in runs)}


def compare(ours: dict, reference: dict) -> dict:
    ratio = statistics.median(ours["epoch_seconds"]) / statistics.median(reference["epoch_seconds"])
    gaps = [a - b for a, b in zip(ours["val_ap_per_batch"], reference["val_ap_per_batch"])]
    return {"epoch_time_ratio": ratio, "val_ap_gaps": gaps, "time_met": ratio <= TIME_RATIO_TARGET,
            "ap_met": all(abs(g) <= AP_TOLERANCE for g in gaps)}


def table(results: dict) -> str:
    lines = ["| dataset | side | training s per epoch (median) | val AP per batch, epochs 1.. | test AP per batch "
             "(inductive) |", "|---|---|---|---|---|"]
    for name, found in results.items():
        for side in ("ours", "reference"):
            row = found[side]
            aps = " / ".join(f"{x:.4f}" + (f" ± {s:.4f}" if len(row["runs"]) > 1 else "")
                             for x, s in zip(row["val_ap_per_batch"], row["val_ap_per_batch_std"]))
            lines.append(f"| {name} | {side} | {statistics.median(row['epoch_seconds']):.1f} | {aps} | "
                         f"{row['test_ap_per_batch']:.4f} ({row['test_ap_inductive_per_batch']:.4f}) |")
        verdict = found["comparison"]
        gaps = " / ".join(f"{g:+.4f}" for g in verdict["val_ap_gaps"])
        lines.append(f"| {name} | ours / reference | {verdict['epoch_time_ratio']:.2f} "
                     f"({'met' if verdict['time_met'] else 'NOT met'}: <= {TIME_RATIO_TARGET}) | {gaps} "
                     f"({'met' if verdict['ap_met'] else 'NOT met'}: within {AP_TOLERANCE}) | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    if not (args.reference / "train_self_supervised.py").is_file():
        print(f"error: {args.reference} has no train_self_supervised.py; pass a checkout of twitter-research/tgn "
              "(commit d55bbe6) as --reference", file=sys.stderr)
        return 2
    if not names or not set(names) <= {"wikipedia", "collegemsg"} or min(args.epochs, args.threads, args.runs) < 1:
        print("error: --datasets takes wikipedia and/or collegemsg; --epochs, --threads and --runs must be >= 1",
              file=sys.stderr)
        return 2
    from gnnscale.data.temporal import load_temporal

    results = {}
    for name in names:
        events = load_temporal(name, args.data_root / name)
        folder = args.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        found = {"reference": reference_run(args, events, folder), "ours": our_run(args, name, folder)}
        found["comparison"] = compare(found["ours"], found["reference"])
        results[name] = found
        print(f"[bench] {name}: epoch ratio {found['comparison']['epoch_time_ratio']:.2f}, val AP gaps "
              f"{[round(g, 4) for g in found['comparison']['val_ap_gaps']]}", flush=True)
    result = {"epochs": args.epochs, "runs": args.runs, "threads": args.threads, "our_args": args.our_args, "reference": str(args.reference),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "timed": "training only, per epoch",
              "datasets": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json(result))
    print(table(results))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
