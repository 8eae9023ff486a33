"""Partition the same synthetic graph with ours (``python -m partition``) and DGL's ``partition_graph``.

    python scripts/bench_partition.py                       # 1M nodes, ~10M edges, 100-d features, K=4, 3 repeats
    python scripts/bench_partition.py --num-nodes 10000000 --feat-dim 16 --num-parts 8 --skip-dgl --repeats 1 \\
        --out runs/bench_partition_scale.json               # the 100M-edge scale case, ours only

The graph (``generate_synthetic``: planted communities, power-law degrees, 10% training
nodes) is generated once, in a child process of its own, and saved twice in a temporary
folder: as a ``dgl.save_graphs`` file for DGL, and as an edge-list folder (``edges.npy``
holding each undirected edge once, ``features.npy``, ``labels.npy``, masks) for ours --
the same graph, each side reading its own native format.  ``--ours-on-dgl-file`` adds a
third side: ours reading DGL's ``.bin`` file through our ``dgl`` loader (which imports
torch and dgl, as DGL's side must).

Every measurement is a fresh child process, timed by the wall clock from spawn to exit,
with its own peak RSS (``ru_maxrss`` of that child, from ``os.wait4``), so generation is
never counted.  The sides alternate which goes first in each repeat (the machine is shared).

* **ours**: ``python -m partition --dataset edgelist --data-dir DIR --num-parts K --out OUT``
  (METIS k-way, balance nodes,train,edges, 1-hop halo, seed 0, sha256 of every file).
* **DGL**: ``dgl.distributed.partition_graph(g, "graph", K, out, part_method="metis",
  balance_ntypes=g.ndata["train_mask"], balance_edges=True, return_mapping=True)`` after
  ``dgl.load_graphs``; the child then saves the partition of every original node
  (from ``node_map`` and the returned ``orig_nids``).

Edge cut (fraction of edges whose endpoints lie in different partitions) and balance
(max/mean of nodes, training nodes and in-edges per partition) are computed here, the same
way for both sides, from each side's node assignment.  Ours is also checked with
``python -m partition verify --dataset edgelist`` (not timed).  Reported: medians over
repeats, and ratios ours/DGL (below 1 is better for all three).
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
import threading
import time
from pathlib import Path

import numpy as np

from gnnscale.train.cli import strict_json

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"wall_seconds": 0.5, "peak_rss_gib": 0.5, "edge_cut": 1.0}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--feat-dim", type=int, default=100)
    parser.add_argument("--num-parts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic graph")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-dgl", action="store_true", help="ours only (the scale case)")
    parser.add_argument("--ours-on-dgl-file", action="store_true", help="also run ours on DGL's .bin file")
    parser.add_argument("--no-verify", action="store_true", help="skip verifying our output")
    parser.add_argument("--child-timeout", type=float, default=3600.0)
    parser.add_argument("--workdir", type=Path, default=None, help="where the graph and outputs go (default: a "
                        "temporary folder, removed at the end)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_partition.json")
    # Internal: this script re-runs itself as the generator and as DGL's side.
    parser.add_argument("--child", choices=("generate", "dgl"), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    return parser


# ====================================================================== children
def generate(args: argparse.Namespace) -> None:
    """Child: generate the graph and save it in both formats under ``args.data``."""
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

    ds = generate_synthetic(SyntheticConfig(num_nodes=args.num_nodes, avg_degree=args.avg_degree,
                                            feat_dim=args.feat_dim, seed=args.seed))
    src, dst = ds.edges()
    folder = args.data / "edgelist"
    folder.mkdir(parents=True)
    once = src < dst  # the graph is symmetric: each undirected edge once; the loader adds the reverse
    np.save(folder / "edges.npy", np.stack([src[once], dst[once]], axis=1))
    del once
    np.save(folder / "features.npy", ds.features)
    np.save(folder / "labels.npy", ds.labels)
    for name in ("train", "val", "test"):
        np.save(folder / f"{name}_mask.npy", getattr(ds, f"{name}_masks"))
    facts = {"num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "num_features": ds.num_features,
             "num_train": int(ds.train_masks[0].sum()), "config": ds.extra["config"]}
    if not args.skip_dgl:
        os.environ.setdefault("DGLBACKEND", "pytorch")
        import dgl
        import torch

        graph = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=ds.num_nodes)
        graph.ndata["feat"] = torch.from_numpy(ds.features)
        graph.ndata["label"] = torch.from_numpy(ds.labels)
        for name in ("train", "val", "test"):
            graph.ndata[f"{name}_mask"] = torch.from_numpy(getattr(ds, f"{name}_masks")[0])
        dgl.save_graphs(str(args.data / "graph.bin"), [graph])
    (args.data / "graph.json").write_text(json.dumps(facts, allow_nan=False))


def dgl_side(args: argparse.Namespace) -> None:
    """Child: DGL's partition_graph on graph.bin, then save the partition of every original node."""
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import dgl

    (graph,), _ = dgl.load_graphs(str(args.data / "graph.bin"))
    graph.ndata["train_mask"] = graph.ndata["train_mask"].bool()  # save_graphs stores bool as uint8
    out = args.data / "dgl_out"
    orig_nids, _ = dgl.distributed.partition_graph(
        graph, "graph", args.num_parts, str(out), part_method="metis", balance_ntypes=graph.ndata["train_mask"],
        balance_edges=True, return_mapping=True)
    node_map = json.loads((out / "graph.json").read_text())["node_map"]
    ranges = np.asarray(node_map["_N"] if isinstance(node_map, dict) else node_map, dtype=np.int64)
    new_parts = np.repeat(np.arange(args.num_parts, dtype=np.int64), ranges[:, 1] - ranges[:, 0])
    parts = np.empty_like(new_parts)
    parts[orig_nids.numpy()] = new_parts
    np.save(args.data / "dgl_parts.npy", parts)


# ====================================================================== parent
def run_child(command: list[str], log_path: Path, timeout: float) -> dict:
    """Run ``command``; its wall time and peak RSS (this child's own ``ru_maxrss``)."""
    env = dict(os.environ, DGLBACKEND="pytorch", PYTHONPATH=str(ROOT))
    with open(log_path, "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}; the end of its output:\n{tail}")
    return {"wall_seconds": round(seconds, 2), "peak_rss_gib": round(usage.ru_maxrss * 1024 / 2**30, 3)}


def our_parts(out: Path) -> np.ndarray:
    """int64 [N]: the partition of every original node, from our folder's book."""
    manifest = json.loads((out / "manifest.json").read_text())
    offsets = np.asarray([0] + [end for _, end in manifest["node_ranges"]], dtype=np.int64)
    return np.searchsorted(offsets, np.load(out / "orig2new.npy"), side="right") - 1


def quality(parts: np.ndarray, edges: np.ndarray, train: np.ndarray, num_parts: int) -> dict:
    """Edge cut and balance (max/mean per partition of nodes, training nodes, in-edges) of an assignment.

    Args:
        edges: int [E/2, 2], each undirected edge once.
    """
    cut = float(np.mean(parts[edges[:, 0]] != parts[edges[:, 1]]))
    degrees = np.bincount(edges.ravel(), minlength=parts.shape[0])
    balance = {}
    for name, weights in (("nodes", None), ("train", train.astype(np.float64)), ("edges", degrees)):
        sums = np.bincount(parts, weights=weights, minlength=num_parts)
        balance[name] = round(float(sums.max() / sums.mean()), 4)
    return {"edge_cut": round(cut, 5), "balance": balance}


def measure(side: str, args: argparse.Namespace, work: Path, repeat: int, graph: dict) -> dict:
    out = work / f"{side}_out"
    if side == "dgl":
        command = [sys.executable, str(Path(__file__).resolve()), "--child", "dgl", "--data", str(work),
                   "--num-parts", str(args.num_parts)]
    else:
        data = ["--dataset", "dgl", "--data-dir", str(work / "graph.bin")] if side == "ours_dgl_file" else \
            ["--dataset", "edgelist", "--data-dir", str(work / "edgelist")]
        command = [sys.executable, "-m", "partition", *data, "--num-parts", str(args.num_parts), "--out", str(out),
                   "--seed", "0"]
    _remove(out)
    result = run_child(command, work / f"{side}_{repeat}.log", args.child_timeout)
    parts = np.load(work / "dgl_parts.npy") if side == "dgl" else our_parts(out)
    result.update(quality(parts, graph["edges"], graph["train"], args.num_parts))
    if side != "dgl":
        manifest = json.loads((out / "manifest.json").read_text())
        result["stages"] = manifest["stages"]
        result["own_report"] = manifest["quality"]
        if not args.no_verify and side == "ours" and repeat == 0:
            run_child([sys.executable, "-m", "partition", "verify", str(out), "--dataset", "edgelist",
                       "--data-dir", str(work / "edgelist")], work / "verify.log", args.child_timeout)
            result["verified"] = True
    _remove(out)
    print(f"repeat {repeat} {side:>13}: {result['wall_seconds']:7.1f} s  peak RSS {result['peak_rss_gib']:6.2f} GiB  "
          f"cut {result['edge_cut']:.2%}  balance {result['balance']}", file=sys.stderr, flush=True)
    return result


def _remove(path: Path) -> None:
    if path.exists():
        subprocess.run(["rm", "-rf", str(path)], check=True)


def summarize(results: dict[str, list[dict]]) -> dict:
    summary = {}
    for side, runs in results.items():
        summary[side] = {key: statistics.median(r[key] for r in runs)
                         for key in ("wall_seconds", "peak_rss_gib", "edge_cut")}
        summary[side]["balance"] = {k: statistics.median(r["balance"][k] for r in runs)
                                    for k in runs[0]["balance"]}
    if "dgl" in summary:
        summary["ratio_ours_over_dgl"] = {key: round(summary["ours"][key] / summary["dgl"][key], 3)
                                          for key in TARGETS}
        summary["targets"] = TARGETS
        summary["targets_met"] = {key: summary["ratio_ours_over_dgl"][key] <= TARGETS[key] for key in TARGETS}
    return summary


def print_table(summary: dict) -> None:
    sides = [s for s in ("ours", "ours_dgl_file", "dgl") if s in summary]
    names = {"ours": "ours", "ours_dgl_file": "ours(.bin)", "dgl": "DGL"}
    header = f"{'':<24}" + "".join(f"{names[s]:>12}" for s in sides)
    ratio = "ratio_ours_over_dgl" in summary
    print(header + (f"{'ours/DGL':>10}{'target':>8}" if ratio else ""))
    rows = (("wall_seconds", "wall time, s", "{:.1f}"), ("peak_rss_gib", "peak RSS, GiB", "{:.2f}"),
            ("edge_cut", "edge cut", "{:.2%}"))
    for key, label, fmt in rows:
        line = f"{label:<24}" + "".join(f"{fmt.format(summary[s][key]):>12}" for s in sides)
        if ratio:
            line += f"{summary['ratio_ours_over_dgl'][key]:>10.3f}{'<= ' + str(TARGETS[key]):>8}"
        print(line)
    for name in ("nodes", "train", "edges"):
        print(f"{'balance ' + name + ' max/mean':<24}" + "".join(f"{summary[s]['balance'][name]:>12.3f}"
                                                              for s in sides))


def main() -> None:
    args = build_parser().parse_args()
    if args.child == "generate":
        return generate(args)
    if args.child == "dgl":
        return dgl_side(args)
    sides = ["ours"] + (["ours_dgl_file"] if args.ours_on_dgl_file and not args.skip_dgl else []) + \
        ([] if args.skip_dgl else ["dgl"])
    with tempfile.TemporaryDirectory(prefix="bench_partition_", dir=args.workdir) as tmp:
        work = Path(tmp)
        command = [sys.executable, str(Path(__file__).resolve()), "--child", "generate", "--data", str(work),
                   "--num-nodes", str(args.num_nodes), "--avg-degree", str(args.avg_degree),
                   "--feat-dim", str(args.feat_dim), "--seed", str(args.seed)] + (["--skip-dgl"] if args.skip_dgl
                                                                                    else [])
        generation = run_child(command, work / "generate.log", args.child_timeout)
        facts = json.loads((work / "graph.json").read_text())
        print(f"graph: {facts['num_nodes']:,} nodes, {facts['num_edges']:,} directed edges, "
              f"{facts['num_features']} features, {facts['num_train']:,} training nodes "
              f"(generated in {generation['wall_seconds']} s)", file=sys.stderr, flush=True)
        graph = {"edges": np.load(work / "edgelist" / "edges.npy", mmap_mode="r"),
                 "train": np.load(work / "edgelist" / "train_mask.npy")[0]}
        results: dict[str, list[dict]] = {side: [] for side in sides}
        for repeat in range(args.repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                results[side].append(measure(side, args, work, repeat, graph))
    summary = summarize(results)
    print_table(summary)
    report = {"command": " ".join([Path(sys.executable).name] + sys.argv), "graph": facts,
              "generation": generation, "num_parts": args.num_parts, "repeats": args.repeats,
              "environment": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                              "loadavg_end": os.getloadavg()},
              "summary": summary, "runs": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json(report))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
