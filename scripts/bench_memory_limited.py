"""Machines with a memory limit: a graph one emulated machine cannot train with the defaults, trained by 4.

    sudo python scripts/bench_memory_limited.py                      # 1M nodes x 256 features, machines of 1800 MiB
    sudo python scripts/bench_memory_limited.py --num-nodes 200000 --machine-memory-mb 1100 --epochs 1   # a quick look

Every run is real multi-node torchrun through ``scripts/bench/emulated.py``: one network namespace per machine
(10 Gbit/s links), each machine half a core (a CPU quota, so that 4 fit this 2-core host) and, where it has one,
a memory limit (a memory cgroup: its torchrun agent, its rank and the page cache charged to them; a machine
that goes over it is killed by the kernel and reported OUT OF MEMORY).  The graph is the community-structured
synthetic one (``python -m partition --dataset synthetic``), partitioned into 1 and 4 parts; the model is
GraphSAGE 2 x 16, fanouts 10,25, a global batch of 1000 seeds (250 per rank on 4), Adam 0.003.  Runs:

* ``one, enough memory``: 1 machine limited only by the host (20 GiB): the reference accuracy and what one
  process of the defaults needs;
* ``one, limited, sized as the host``: 1 machine at ``--machine-memory-mb`` told it may use as much as the host
  has (``--memory-budget`` of the host's memory): what a framework that ignores the limit does; expected OUT OF
  MEMORY;
* ``one, limited``: the same with the defaults, which take a budget from the machine's limit
  (:func:`gnnscale.train.cli.budget_from_limit`): features memory-mapped when they do not fit it, slower;
* ``four, limited``: 4 machines at ``--machine-memory-mb``, the defaults.

Reported per run: how it ended, wall seconds, median epoch seconds, the peak of each machine's memory group
(MiB), and test accuracy against the reference.  Verdicts: the 4 limited machines finish, one limited machine
with the defaults is reported out of memory, and the 4 machines' accuracy is within ``--tolerance`` of the
reference.  Needs root and ``ip netns`` (see ``scripts/emulated_cluster.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench.emulated import ClusterError, ClusterSpec, EmulatedCluster, check_host  # noqa: E402

MODEL = ["--model", "sage", "--num-layers", "2", "--hidden", "16", "--fanouts", "10,25", "--lr", "0.003",
         "--dropout", "0.5", "--weight-decay", "0", "--checkpoint-every", "0", "--quiet"]
GLOBAL_BATCH = 1000
HOST_LIMIT_MB = 20 * 1024


@dataclass
class Run:
    """One run: its name, machines, memory limit per machine (MiB) and extra trainer arguments."""

    name: str
    machines: int
    limit_mb: int
    extra: list[str] = field(default_factory=list)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--feat-dim", type=int, default=256)
    parser.add_argument("--machine-memory-mb", type=int, default=1800, help="each limited machine's memory limit")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.01, help="accuracy difference allowed against the "
                        "reference")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "bench_memory_limited",
                        help="partitions, run folders and logs (kept; partitions are reused)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_memory_limited.json",
                        help="JSON; the Markdown table goes beside it")
    return parser


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def partition(args: argparse.Namespace, parts: int) -> Path:
    folder = args.workdir / f"parts-{parts}"
    if not (folder / "manifest.json").exists():
        log(f"partitioning the {args.num_nodes:,}-node synthetic graph ({args.feat_dim} features) in {parts}")
        subprocess.run([sys.executable, "-m", "partition", "--dataset", "synthetic", "--num-nodes",
                        str(args.num_nodes), "--avg-degree", str(args.avg_degree), "--feat-dim", str(args.feat_dim),
                        "--seed", str(args.seed), "--num-parts", str(parts), "--out", str(folder), "--force",
                        "--quiet"], check=True, cwd=ROOT)
    return folder


def runs(args: argparse.Namespace) -> list[Run]:
    limit = args.machine_memory_mb
    return [Run("one, enough memory", 1, HOST_LIMIT_MB),
            Run("one, limited, sized as the host", 1, limit, ["--memory-budget", str(HOST_LIMIT_MB)]),
            Run("one, limited", 1, limit), Run("four, limited", 4, limit)]


def execute(run: Run, args: argparse.Namespace) -> dict:
    """Run ``run`` on its emulated machines; its outcome, seconds, machine peaks and metrics."""
    slug = run.name.replace(", ", "-").replace(" ", "-")
    out = args.workdir / slug
    command = [str(ROOT / "scripts" / "train_node_classification.py"), "--partitions",
               str(partition(args, run.machines)), "--out", str(out), *MODEL, "--batch-size",
               str(GLOBAL_BATCH // run.machines), "--epochs", str(args.epochs), "--eval-every", str(args.epochs),
               "--seed", str(args.seed), *run.extra]
    spec = ClusterSpec(machines=run.machines, rate="10gbit" if run.machines > 1 else None,
                       slow_machines=tuple(range(run.machines)), memory_mb=run.limit_mb)
    (out / "metrics.json").unlink(missing_ok=True)
    start = time.perf_counter()
    with EmulatedCluster(spec, args.workdir / "logs") as cluster:
        machines = cluster.run(command, timeout=args.timeout, name=slug)
    result = {"name": run.name, "machines": run.machines, "limit_mb": run.limit_mb, "extra": run.extra,
              "seconds": time.perf_counter() - start, "peak_mb": [m.peak_mb for m in machines],
              "out_of_memory": any(m.out_of_memory for m in machines),
              "returncodes": [m.returncode for m in machines]}
    failed = [m for m in machines if m.returncode != 0 or m.out_of_memory]
    result["outcome"] = "trained" if not failed else failed[0].describe_failure()
    if not failed:
        metrics = json.loads((out / "metrics.json").read_text())
        result["test"] = metrics["test"]
        result["epoch_seconds"] = statistics.median(h["epoch_seconds"] for h in metrics["history"])
    return result


def table(results: list[dict], reference: float | None) -> str:
    lines = ["| run | machines x limit (MiB) | outcome | wall s | epoch s (median) | peak per machine (MiB) | "
             "test accuracy | vs enough memory |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        limit = "host" if r["limit_mb"] == HOST_LIMIT_MB else f"{r['limit_mb']:,}"
        peaks = ", ".join(f"{p:,.0f}" for p in r["peak_mb"] if p is not None) or "-"
        test = r.get("test")
        delta = f"{test - reference:+.4f}" if test is not None and reference is not None else "-"
        epoch = f"{r['epoch_seconds']:.2f}" if "epoch_seconds" in r else "-"
        lines.append(f"| {r['name']}{' ' + ' '.join(r['extra']) if r['extra'] else ''} | {r['machines']} x {limit} | "
                     f"{r['outcome']} | {r['seconds']:.1f} | {epoch} | {peaks} | "
                     f"{f'{test:.4f}' if test is not None else '-'} | {delta} |")
    return "\n".join(lines)


def verdicts(results: list[dict], tolerance: float) -> list[str]:
    by_name = {r["name"]: r for r in results}
    reference, four = by_name["one, enough memory"], by_name["four, limited"]
    one, defaults = by_name["one, limited, sized as the host"], by_name["one, limited"]
    lines = [f"4 limited machines train: {'met' if four['outcome'] == 'trained' else 'NOT met'} ({four['outcome']})",
             f"1 limited machine sized as the host is reported out of memory: "
             f"{'met' if one['out_of_memory'] else 'NOT met'} ({one['outcome']})",
             f"1 limited machine with the defaults (a budget from its limit): {defaults['outcome']}"
             + (f", epoch {defaults['epoch_seconds']:.2f} s against {four['epoch_seconds']:.2f} s on 4"
                if "epoch_seconds" in defaults and "epoch_seconds" in four else "")]
    if "test" in four and "test" in reference:
        delta = four["test"] - reference["test"]
        lines.append(f"accuracy of the 4 limited machines within {tolerance} of one with enough memory: "
                     f"{'met' if abs(delta) <= tolerance else 'NOT met'} ({four['test']:.4f} against "
                     f"{reference['test']:.4f}, {delta:+.4f})")
    if "peak_mb" in reference and reference["peak_mb"][0] is not None:
        lines.append(f"one machine with enough memory peaked at {reference['peak_mb'][0]:,.0f} MiB against a limit "
                     f"of {one['limit_mb']:,} MiB per machine")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_host()
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for run in runs(args):
        log(f"{run.name}: {run.machines} machine(s) of half a core, memory limit {run.limit_mb} MiB")
        results.append(execute(run, args))
        log(f"  {results[-1]['outcome']}, {results[-1]['seconds']:.1f} s, peaks {results[-1]['peak_mb']}")
    reference = results[0].get("test")
    text = table(results, reference) + "\n\n" + "\n".join(f"- {v}" for v in verdicts(results, args.tolerance))
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": results}, indent=2))
    args.out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
