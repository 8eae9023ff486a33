"""The whole ``python -m partition`` command with ``--method kaminpar`` against ``--method metis``, side by side.

    python scripts/bench_partition_methods.py                 # 1M nodes, ~19M stored edges, 100-d features, K=4
    python scripts/bench_partition_methods.py --graph DIR     # reuse an edge-list folder (skip generation)
    python scripts/bench_partition_methods.py --out-of-core default   # also KaMinPar with --out-of-core
    python scripts/bench_partition_methods.py --num-nodes 3000 --datasets '' --out /tmp/x.json   # a smoke run

The graph is the repository's community-structured synthetic graph (``generate_synthetic``: planted
communities, power-law degrees, 10% training nodes), generated once by ``bench_partition.py``'s
generator child and saved as an edge-list folder (each undirected edge once; the loader adds the
reverse: about 19.0M stored edges at 1M nodes and ``--avg-degree 19``).  Each side is the whole
command in a fresh child process -- load, partition, rebalance, relabel, write, checksum --
``python -m partition --dataset edgelist --data-dir DIR --num-parts K --seed 0 --method M``, timed
from spawn to exit, its peak RSS the child's own ``ru_maxrss`` (``os.wait4``).  The sides alternate
which goes first in each repeat; the host is shared, so time ratios are noisy (medians of
``--repeats``).

Printed: time, peak RSS, edge cut (fraction of undirected edges cut) and balance (max/mean of nodes,
training nodes, in-edges) of each side, and each KaMinPar context's ratios to METIS against the
issue's targets (RSS <= 0.4x, time <= 0.7x, cut <= 1.02x, every balance within 1.03).

**What the rebalance pass costs in cut.**  Each method's manifest records the partitioner's own cut
(before the pass) and the folder's cut (after it); the second table lists both, per method, for the
1M graph and for ``--datasets`` (cora, citeseer, tolokers from ``--datasets-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_partition import our_parts, quality, run_child  # noqa: E402 - scripts/ is on the path above

from gnnscale.train.cli import strict_json  # noqa: E402

TARGETS = {"peak_rss_gib": 0.4, "wall_seconds": 0.7, "edge_cut": 1.02}
TOLERANCE = 1.03


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--avg-degree", type=float, default=19.0)
    parser.add_argument("--feat-dim", type=int, default=100)
    parser.add_argument("--num-parts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic graph")
    parser.add_argument("--contexts", default="default,fast", help="KaMinPar contexts to run, comma-separated")
    parser.add_argument("--out-of-core", default="", metavar="CONTEXTS", help="KaMinPar contexts to run also with "
                        "--out-of-core (the CSC built on disk by an external sort), comma-separated; e.g. default")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--graph", type=Path, default=None, help="an existing edge-list folder to partition "
                        "(default: generate the synthetic graph into the work folder)")
    parser.add_argument("--datasets", default="cora,citeseer,tolokers", help="real datasets for the rebalance "
                        "cost table, comma-separated ('' for none)")
    parser.add_argument("--datasets-dir", type=Path, default=ROOT.parent / "shared" / "datasets")
    parser.add_argument("--no-verify", action="store_true", help="skip verifying each side's folder once")
    parser.add_argument("--child-timeout", type=float, default=3600.0)
    parser.add_argument("--workdir", type=Path, default=None, help="where the graph and outputs go (default: a "
                        "temporary folder, removed at the end)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_partition_methods.json")
    return parser


def sides(contexts: str, out_of_core: str = "") -> list[tuple[str, list[str]]]:
    """``(name, extra partition options)`` of each side: METIS first, then one per KaMinPar context, then one per
    context of ``out_of_core`` with ``--out-of-core`` (named ``kaminpar:C:ooc``)."""
    return [("metis", ["--method", "metis"])] + [
        (f"kaminpar:{c}", ["--method", "kaminpar", "--kaminpar-context", c]) for c in contexts.split(",") if c] + [
        (f"kaminpar:{c}:ooc", ["--method", "kaminpar", "--kaminpar-context", c, "--out-of-core"])
        for c in out_of_core.split(",") if c]


def partition_once(data: list[str], options: list[str], out: Path, log: Path, timeout: float) -> tuple[dict, dict]:
    """Run the whole command once: its time and peak RSS, and the manifest it wrote."""
    command = [sys.executable, "-m", "partition", *data, "--seed", "0", *options, "--out", str(out), "--force"]
    result = run_child(command, log, timeout)
    return result, json.loads((out / "manifest.json").read_text())


def rebalance_cost(manifest: dict) -> dict:
    """The partitioner's own cut and the folder's, both in undirected edges and as fractions of them."""
    info, num_undirected = manifest["partitioning"], manifest["num_edges"] / 2
    own = info.get("metis_cut_undirected_edges", info.get("kaminpar_cut_undirected_edges"))
    final = manifest["quality"]["num_cut_edges"] / 2
    return {"own_cut": round(own / num_undirected, 5), "final_cut": round(final / num_undirected, 5),
            "moved_nodes": info.get("rebalanced_nodes", 0),
            "own_balance": info.get(f"{info['method']}_balance")}


def measure(name: str, options: list[str], args: argparse.Namespace, work: Path, graph: dict,
            repeat: int) -> dict:
    """One side on the synthetic graph: time, RSS, cut and balance (from the folder), rebalance cost, verified."""
    data = ["--dataset", "edgelist", "--data-dir", str(graph["dir"])]
    out = work / f"out_{name.replace(':', '_')}"
    result, manifest = partition_once(["--num-parts", str(args.num_parts), *data], options, out,
                                      work / f"{name.replace(':', '_')}_{repeat}.log", args.child_timeout)
    result.update(quality(our_parts(out), graph["edges"], graph["train"], args.num_parts))
    result["stages"] = manifest["stages"]
    result["rebalance"] = rebalance_cost(manifest)
    if not args.no_verify and repeat == 0:
        run_child([sys.executable, "-m", "partition", "verify", str(out), "--quiet", *data],
                  work / f"verify_{name.replace(':', '_')}.log", args.child_timeout)
        result["verified"] = True
    print(f"repeat {repeat} {name:>18}: {result['wall_seconds']:7.1f} s  peak RSS {result['peak_rss_gib']:6.3f} GiB  "
          f"cut {result['edge_cut']:.2%}  balance {result['balance']}", file=sys.stderr, flush=True)
    return result


def graph_folder(args: argparse.Namespace, work: Path) -> Path:
    """The edge-list folder: ``--graph``, or the synthetic graph generated now by bench_partition's child."""
    if args.graph is not None:
        return args.graph
    command = [sys.executable, str(ROOT / "scripts" / "bench_partition.py"), "--child", "generate", "--data",
               str(work / "graph"), "--num-nodes", str(args.num_nodes), "--avg-degree", str(args.avg_degree),
               "--feat-dim", str(args.feat_dim), "--seed", str(args.seed), "--skip-dgl"]
    generation = run_child(command, work / "generate.log", args.child_timeout)
    print(f"generated the graph in {generation['wall_seconds']} s", file=sys.stderr, flush=True)
    return work / "graph" / "edgelist"


def real_datasets(args: argparse.Namespace, work: Path) -> dict:
    """Rebalance cost per method on each of ``--datasets``: the partitioner's cut, the folder's, nodes moved."""
    table = {}
    for dataset in [d for d in args.datasets.split(",") if d]:
        data = ["--dataset", dataset, "--data-dir", str(args.datasets_dir / dataset)]
        for name, options in sides(args.contexts):
            _, manifest = partition_once(["--num-parts", str(args.num_parts), *data], options, work / "real",
                                         work / "real.log", args.child_timeout)
            table[f"{dataset} {name}"] = {**rebalance_cost(manifest), "balance": manifest["quality"]["balance"]}
    return table


def summarize(results: dict[str, list[dict]]) -> dict:
    summary = {}
    for name, runs in results.items():
        summary[name] = {key: statistics.median(r[key] for r in runs)
                         for key in ("wall_seconds", "peak_rss_gib", "edge_cut")}
        summary[name]["balance"] = {k: max(r["balance"][k] for r in runs) for k in runs[0]["balance"]}
        summary[name]["rebalance"] = runs[0]["rebalance"]
    for name in [n for n in results if n != "metis"]:
        ratios = {key: round(summary[name][key] / summary["metis"][key], 3) for key in TARGETS}
        met = {key: ratios[key] <= TARGETS[key] for key in TARGETS}
        # The same constraints met as METIS's folder: each within 1.03, or no further above it than METIS's
        # (the rebalance pass can stop a hair above 1.03 on a small graph, after either method); 4 places.
        met["balance"] = all(value <= max(TOLERANCE, summary["metis"]["balance"][key]) + 5e-5
                             for key, value in summary[name]["balance"].items())
        summary[name].update(ratio_over_metis=ratios, targets_met=met)
    return summary


def print_tables(summary: dict, rebalance_table: dict, graph: dict) -> None:
    names = [n for n in summary if n in ("metis",) or n.startswith("kaminpar")]
    print(f"graph: {graph['num_nodes']:,} nodes, {graph['num_stored_edges']:,} stored edges")
    print(f"{'':<26}" + "".join(f"{n:>18}" for n in names))
    rows = (("wall_seconds", "wall time, s", "{:.1f}"), ("peak_rss_gib", "peak RSS, GiB", "{:.3f}"),
            ("edge_cut", "edge cut", "{:.2%}"))
    for key, label, fmt in rows:
        print(f"{label:<26}" + "".join(f"{fmt.format(summary[n][key]):>18}" for n in names))
    for key in ("nodes", "train", "edges"):
        print(f"{'balance ' + key + ' max/mean':<26}" + "".join(f"{summary[n]['balance'][key]:>18.4f}" for n in names))
    for name in names[1:]:
        ratios, met = summary[name]["ratio_over_metis"], summary[name]["targets_met"]
        print(f"{name} / metis: " + ", ".join(f"{key} {ratios[key]:.3f}x (target <= {TARGETS[key]}: "
                                              f"{'met' if met[key] else 'NOT met'})" for key in TARGETS)
              + f", balance within {TOLERANCE} or METIS's: {'met' if met['balance'] else 'NOT met'}")
    table = {f"synthetic {n}": summary[n]["rebalance"] for n in names} | rebalance_table
    print(f"\n{'rebalance pass':<30}{'own cut':>10}{'after pass':>12}{'cost':>10}{'moved':>10}")
    for label, row in table.items():
        print(f"{label:<30}{row['own_cut']:>10.2%}{row['final_cut']:>12.2%}"
              f"{row['final_cut'] - row['own_cut']:>+10.2%}{row['moved_nodes']:>10,}")


def main() -> None:
    args = build_parser().parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_partition_methods_", dir=args.workdir) as tmp:
        work = Path(tmp)
        folder = graph_folder(args, work)
        edges = np.load(folder / "edges.npy", mmap_mode="r")
        graph = {"dir": folder, "edges": edges, "train": np.load(folder / "train_mask.npy")[0]}
        facts = {"num_nodes": int(graph["train"].shape[0]), "num_stored_edges": 2 * int(edges.shape[0])}
        results: dict[str, list[dict]] = {name: [] for name, _ in sides(args.contexts, args.out_of_core)}
        for repeat in range(args.repeats):
            order = sides(args.contexts, args.out_of_core)
            for name, options in order if repeat % 2 == 0 else order[::-1]:
                results[name].append(measure(name, options, args, work, graph, repeat))
        rebalance_table = real_datasets(args, work)
    summary = summarize(results)
    print_tables(summary, rebalance_table, facts)
    report = {"command": " ".join([Path(sys.executable).name] + sys.argv), "graph": facts,
              "num_parts": args.num_parts, "repeats": args.repeats, "targets": TARGETS,
              "environment": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                              "loadavg_end": os.getloadavg()},
              "summary": summary, "rebalance_cost": rebalance_table, "runs": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json(report))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
