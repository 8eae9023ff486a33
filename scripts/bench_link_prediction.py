"""Static link prediction against the anchors, side by side: accuracy vs PyG, 2 ranks vs 1, MRR/Hits, DGL speed.

Sections (all by default; ``--only`` picks some):

* ``pyg``: Cora and CiteSeer, the 85/5/10 split of PyG's example drawn once (ours, seed 0) and handed to
  PyG's own example (``scripts/pyg_link_baseline.py``, run with ``--pyg-python``: an environment with
  ``torch-geometric``) and to gnnscale with the same protocol: 2-layer GCN (128, 64), dot decoder, Adam
  0.01, 100 full-batch epochs, as many fresh negatives as positives with both ends uniform (the example's
  ``negative_sampling``; ``negative_sampling="global"`` here), no seed-edge exclusion (the
  example's full batch would otherwise exclude every training edge).  Test ROC-AUC after the last epoch
  (what the example prints), mean over ``--seeds`` model seeds.
* ``ranks``: the same protocol on Cora in one process and under ``torchrun --nproc_per_node=2``.
* ``static``: CollegeMsg and Wikipedia taken as static undirected graphs (timestamps dropped; no node
  features, so every node gets a fixed random 64-d feature row), the same split, mini-batch training
  (fanouts 10,10, seed edges and reverses excluded); test ROC-AUC, MRR and Hits@20/50 at the epoch of
  the best val ROC-AUC, each positive ranked against the whole set of test negatives (OGB's ogbl-collab
  convention).
* ``dgl``: training edges per second on a synthetic community graph, GCN (128, 64) with fanouts 10,10 and
  batches of 512 seed edges, one uniform negative each: gnnscale's LinkLoader against DGL's ``DataLoader``
  with ``as_edge_prediction_sampler(NeighborSampler, exclude="reverse_id", negative_sampler=Uniform(1))``
  (needs dgl: run with the DGL environment's Python).  Median epoch of ``--repeats`` after a warm-up one.

Writes ``--out`` (JSON) and prints a table.  Example::

    python scripts/bench_link_prediction.py --pyg-python /tmp/pyg/bin/python --out link.json
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

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gnnscale as gs  # noqa: E402
from gnnscale.data.dataset import GraphDataset, csc_from_edges  # noqa: E402
from gnnscale.link_task import LinkTask  # noqa: E402

DATASETS = ROOT.parent / "shared" / "datasets"
SECTIONS = ("pyg", "ranks", "static", "dgl")


def load_graph_dataset(name: str) -> GraphDataset:
    """Cora/CiteSeer as loaded for node tasks; CollegeMsg/Wikipedia as static graphs with random features;
    ``synthetic`` the community graph of the throughput section."""
    if name in ("cora", "citeseer"):
        return gs.load_dataset(name, DATASETS / name)
    if name == "synthetic":
        from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

        return generate_synthetic(SyntheticConfig(num_nodes=20_000, avg_degree=10, num_classes=8, feat_dim=64, seed=0))
    from gnnscale.data.temporal import load_temporal

    events = load_temporal(name, DATASETS / name)
    indptr, indices = csc_from_edges(events.src, events.dst, events.num_nodes, symmetrize=True)
    n = events.num_nodes
    features = np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)
    every = np.ones(n, dtype=bool)
    return GraphDataset(name=name, indptr=indptr, indices=indices, features=features, labels=np.zeros(n),
                        train_masks=every, val_masks=every, test_masks=every, num_classes=1)


def train_ours(graph: gs.Graph, split, *, seed: int, epochs: int, fanouts: list[int], batch_size: int,
               exclude: str, world: gs.World, negatives: str = "uniform") -> dict:
    """Train the GCN + dot decoder; test metrics after the last epoch and at the best val ROC-AUC."""
    torch.manual_seed(seed)
    task = LinkTask(graph, split, fanouts=fanouts, batch_size=batch_size, gcn_norm=True, exclude=exclude, seed=seed,
                    num_workers=1, negative_sampling=negatives)
    model = world.wrap(gs.GNN(gs.ModelConfig(model="gcn", num_layers=2, hidden=128, dropout=0.0),
                              graph.feature_dim, 64))
    decoder = gs.DotDecoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    best_val, at_best, seconds = -1.0, {}, 0.0
    for epoch in range(epochs):
        start = time.perf_counter()
        task.train_epoch(model, decoder, optimizer, epoch)
        seconds += time.perf_counter() - start
        val = task.evaluate(model, decoder, "val")
        if val["roc_auc"] > best_val:
            best_val, at_best = val["roc_auc"], task.evaluate(model, decoder, "test")
    last = task.evaluate(model, decoder, "test")
    return {"test": last, "test_at_best_val": at_best, "train_seconds": seconds,
            "train_edges": int(split.train_pos.shape[1])}


def full_batch(graph: gs.Graph, split, seed: int, epochs: int, world: gs.World) -> dict:
    """PyG's example's protocol: every training edge in one batch per rank, full neighbourhoods."""
    return train_ours(graph, split, seed=seed, epochs=epochs, fanouts=[-1, -1], batch_size=split.train_pos.shape[1],
                      exclude="none", world=world, negatives="global")


# ---------------------------------------------------------------------- sections
def section_pyg(args: argparse.Namespace) -> dict:
    out = {}
    for name in ("cora", "citeseer"):
        with gs.init() as world:
            graph = gs.Graph.from_dataset(load_graph_dataset(name), world)
            split = gs.split_edges(graph, seed=0)
            ours = [full_batch(graph, split, seed, args.epochs, world) for seed in range(args.seeds)]
        data = Path(tempfile.mkdtemp()) / f"{name}.npz"
        dataset = load_graph_dataset(name)
        np.savez(data, x=dataset.features, train_pos=split.train_pos, val_pos=split.val_pos, val_neg=split.val_neg,
                 test_pos=split.test_pos, test_neg=split.test_neg)
        pyg = [run_json([args.pyg_python, str(ROOT / "scripts" / "pyg_link_baseline.py"), "--data", str(data),
                         "--seed", str(seed), "--epochs", str(args.epochs)]) for seed in range(args.seeds)]
        out[name] = {"ours": ours, "pyg": pyg, "ours_test_auc": mean(r["test"]["roc_auc"] for r in ours),
                     "pyg_test_auc": mean(r["test_auc"] for r in pyg)}
        out[name]["difference"] = out[name]["ours_test_auc"] - out[name]["pyg_test_auc"]
    return out


def section_ranks(args: argparse.Namespace) -> dict:
    from partition import PartitionConfig, partition_graph

    folder = Path(tempfile.mkdtemp()) / "cora-2"
    partition_graph(load_graph_dataset("cora"), folder, PartitionConfig(num_parts=2))
    runs: dict[str, list] = {"1": [], "2": []}
    for seed in range(args.seeds):
        common = [str(Path(__file__).resolve()), "--worker", "--seed", str(seed), "--epochs", str(args.epochs)]
        runs["1"].append(run_json([sys.executable, *common]))
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        runs["2"].append(run_json([torchrun, "--standalone", "--nproc_per_node=2", *common, "--partitions",
                                   str(folder)]))
    one, two = (mean(r["test"]["roc_auc"] for r in runs[k]) for k in ("1", "2"))
    return {"runs": runs, "one_process_test_auc": one, "two_ranks_test_auc": two, "difference": two - one}


def worker(args: argparse.Namespace) -> None:
    """One run of the ``ranks`` section (under torchrun when ``--partitions`` is given); JSON on rank 0's stdout."""
    with gs.init() as world:
        graph = gs.open_graph(args.partitions, world) if args.partitions else \
            gs.Graph.from_dataset(load_graph_dataset("cora"), world)
        split = gs.split_edges(graph, seed=0)
        result = full_batch(graph, split, args.seed, args.epochs, world)
        if world.is_main:
            print(json.dumps(result))


def section_static(args: argparse.Namespace) -> dict:
    out = {}
    for name in ("collegemsg", "wikipedia"):
        with gs.init() as world:
            graph = gs.Graph.from_dataset(load_graph_dataset(name), world)
            split = gs.split_edges(graph, seed=0)
            out[name] = train_ours(graph, split, seed=0, epochs=args.static_epochs, fanouts=[10, 10],
                                   batch_size=1024, exclude="reverse", world=world)
    return out


def mean(values) -> float:
    return float(statistics.fmean(list(values)))


def run_json(command: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(results: dict) -> None:
    rows = []
    for name, r in results.get("pyg", {}).items():
        rows.append((f"{name} test ROC-AUC, ours vs PyG example", f"{r['ours_test_auc']:.4f}",
                     f"{r['pyg_test_auc']:.4f}", f"{r['difference']:+.4f}"))
    if "ranks" in results:
        r = results["ranks"]
        rows.append(("cora test ROC-AUC, 2 ranks vs 1 process", f"{r['two_ranks_test_auc']:.4f}",
                     f"{r['one_process_test_auc']:.4f}", f"{r['difference']:+.4f}"))
    for name, r in results.get("static", {}).items():
        t = r["test_at_best_val"]
        rows.append((f"{name} (static) test AUC / MRR / Hits@20 / Hits@50 at best val",
                     f"{t['roc_auc']:.4f} / {t['mrr']:.4f} / {t['hits@20']:.4f} / {t['hits@50']:.4f}", "", ""))
    if "dgl" in results:
        r = results["dgl"]
        rows.append(("training edges/s, ours vs DGL DataLoader", f"{r['ours_edges_per_s']:.0f}",
                     f"{r['dgl_edges_per_s']:.0f}", f"x{r['ratio']:.2f}"))
        rows.append(("loader edges/s (no model), ours vs DGL DataLoader", f"{r['ours_loader_edges_per_s']:.0f}",
                     f"{r['dgl_loader_edges_per_s']:.0f}", f"x{r['loader_ratio']:.2f}"))
    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"{'measure':<{width}}  {'ours':>36}  {'baseline':>10}  {'diff/ratio':>10}")
    for row in rows:
        print(f"{row[0]:<{width}}  {row[1]:>36}  {row[2]:>10}  {row[3]:>10}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections, comma-separated ({', '.join(SECTIONS)})")
    parser.add_argument("--pyg-python", help="Python of an environment with torch-geometric (section pyg)")
    parser.add_argument("--seeds", type=int, default=3, help="model seeds per side (default 3)")
    parser.add_argument("--epochs", type=int, default=100, help="full-batch epochs (default 100, PyG's example)")
    parser.add_argument("--static-epochs", type=int, default=20, help="epochs on the static graphs (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per side (section dgl, default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--out", default="bench_link_prediction.json", help="JSON results file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--partitions", help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        worker(args)
        return
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    if "pyg" in sections and not args.pyg_python:
        parser.error("section pyg needs --pyg-python, the Python of an environment with torch-geometric")
    from bench_link_dgl import section_dgl

    runners = {"pyg": section_pyg, "ranks": section_ranks, "static": section_static, "dgl": section_dgl}
    results = {"command": " ".join(sys.argv)}
    for section in sections:
        started = time.perf_counter()
        results[section] = runners[section](args)
        print(f"[{section}] done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        Path(args.out).write_text(json.dumps(results, indent=2))
    print_table(results)


if __name__ == "__main__":
    main()
