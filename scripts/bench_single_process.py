"""Time our single-process GraphSAGE training against DGL's standard pipeline on the same graph.

    python scripts/bench_single_process.py                      # 1M nodes, degree 10, 100 features
    python scripts/bench_single_process.py --num-nodes 200000 --epochs 2 --repeats 3 --out runs/bench_200k.json
    python scripts/bench_single_process.py --num-nodes 200000 --repeats 1 --profile 20   # + cProfile hotspots

What runs, with the same hyper-parameters on both sides (3-layer GraphSAGE-mean, hidden 256,
ReLU + dropout 0.5 between layers, fanouts 15,10,5 from the input side, batch 1024, Adam
lr 0.01 with weight decay 5e-4, the same training nodes, CPU):

* **ours**: ``samplers.NeighborSampler`` + ``NodeLoader`` feeding
  ``NodeClassificationTrainer.train_epoch`` (pure-torch ``gnnscale.nn.GNN``); validation
  accuracy from ``trainer.evaluate()``.
* **DGL**: ``dgl.dataloading.DataLoader`` over ``dgl.dataloading.NeighborSampler([15, 10, 5],
  prefetch_node_feats=["feat"], prefetch_labels=["label"])`` with ``num_workers=0`` (ours is
  single-process too), and three ``dgl.nn.SAGEConv(..., "mean")`` layers; the training loop
  of DGL's ``examples/pytorch/graphsage/node_classification.py``.  Validation accuracy from
  the same example's layer-wise full-neighbour inference (``MultiLayerFullNeighborSampler(1)``,
  8192 nodes per batch), which is also what ours does, so the two accuracies mean the same.

The graph is generated once by ``generate_synthetic`` and saved as ``.npy`` files in a
temporary folder; every measurement runs in a fresh child process that loads them, so
generation is never timed and each side's peak RSS (``ru_maxrss`` of the child) is its own.
Each repeat runs both sides (alternating which goes first, since the machine is shared)
with seed = repeat index.  A child: one sampling-only pass over the training nodes
(structure only), one pass that also gathers features and labels (what a training step
consumes), ``--epochs`` timed training epochs, then one validation evaluation.

Threads: each child gets ``--threads`` (default: all cores) via ``torch.set_num_threads``,
``dgl.utils.set_num_threads`` and ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, the same on both
sides.  With more than one thread DGL's sampler takes its fused sample-and-relabel kernel.
On a machine shared with other work use ``--threads 1``: with the cores oversubscribed every
OpenMP parallel region waits a scheduler time slice for a descheduled thread (measured on a
loaded 2-core machine: ``torch.sort`` of 42k int64 takes 0.6 ms on one thread, 190 ms on two),
so multi-threaded timings there measure the load, not the pipelines.

Before the timed passes each child draws a few batches untimed from each loader, so lazy
set-up and first touches of the graph are not counted as sampling time.

Epoch time is the median over all ``repeats x epochs`` epochs; the other figures are medians
over repeats.  Ratios are ours / DGL: below 1 is better for times and RSS, above 1 is better
for batches per second.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import platform
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.nn.functional as F
from torch import nn

# DGL prints a backend notice on import unless told which backend to use.
os.environ.setdefault("DGLBACKEND", "pytorch")
import dgl  # noqa: E402

from gnnscale.data.dataset import GraphDataset  # noqa: E402
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic  # noqa: E402
from gnnscale.nn import ModelConfig  # noqa: E402
from gnnscale.train.node_classification import NodeClassificationTrainer, TrainConfig  # noqa: E402
from samplers import NodeLoader, SamplerConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

SIDES = ("ours", "dgl")
FANOUTS = [15, 10, 5]
HIDDEN = 256
DROPOUT = 0.5
BATCH_SIZE = 1024
EVAL_BATCH_SIZE = 8192
WARMUP_BATCHES = 3
LR = 0.01
WEIGHT_DECAY = 5e-4
ARRAYS = ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--feat-dim", type=int, default=100)
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2, help="timed training epochs per side and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per side (seed = repeat index)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch, DGL and OpenMP threads "
                        "in every child")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic graph")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="after the timed epochs, cProfile one "
                        "more epoch per side and keep its top N functions by own time (0: off)")
    parser.add_argument("--child-timeout", type=float, default=3600.0, help="seconds before a child is killed")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_single_process.json"))
    # Internal: the parent re-runs this script as a child for one side.
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("epochs", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.profile < 0:
        parser.error(f"--profile must be >= 0 (0 turns profiling off), got {args.profile}")


# ====================================================================== child side
def source_digest() -> str:
    """sha256 of the library sources this benchmark runs (gnnscale/, samplers/), to catch edits mid-run."""
    digest = hashlib.sha256()
    for path in sorted(p for package in ("gnnscale", "samplers") for p in (REPO / package).rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def git_commit() -> str:
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def load_arrays(folder: Path) -> dict[str, np.ndarray]:
    return {name: np.load(folder / f"{name}.npy", allow_pickle=False) for name in ARRAYS}


def rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def warm_up(iterable, num_batches: int = WARMUP_BATCHES) -> None:
    """Draw a few batches untimed, so one-time costs (first touches, lazy set-up) stay out of the timings."""
    for i, _ in enumerate(iterable):
        if i + 1 >= num_batches:
            break


def timed_pass(iterable, consume) -> tuple[int, float]:
    """Iterate ``iterable`` calling ``consume`` on each item; ``(num_batches, seconds)``."""
    start = time.perf_counter()
    count = 0
    for item in iterable:
        consume(item)
        count += 1
    return count, time.perf_counter() - start


def profile_call(fn, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(top)
    return stream.getvalue()


class OursSide:
    """Our pipeline: NeighborSampler + NodeLoader + NodeClassificationTrainer."""

    def __init__(self, data: dict[str, np.ndarray], num_classes: int, seed: int) -> None:
        dataset = GraphDataset(name="synthetic", indptr=data["indptr"], indices=data["indices"],
                               features=data["features"], labels=data["labels"], train_masks=data["train_mask"],
                               val_masks=data["val_mask"], test_masks=data["test_mask"], num_classes=num_classes)
        self.trainer = NodeClassificationTrainer(
            dataset, split=0,
            model_config=ModelConfig(model="sage", num_layers=len(FANOUTS), hidden=HIDDEN, dropout=DROPOUT),
            sampler_config=SamplerConfig(fanouts=FANOUTS),
            config=TrainConfig(batch_size=BATCH_SIZE, lr=LR, weight_decay=WEIGHT_DECAY,
                               eval_batch_size=EVAL_BATCH_SIZE, seed=seed))
        trainer = self.trainer
        self.loader = NodeLoader(trainer.sampler, trainer.train_ids, BATCH_SIZE, shuffle=True, seed=seed)
        self.sample_loader = NodeLoader(trainer.sampler, trainer.train_ids, BATCH_SIZE, shuffle=True, seed=seed)

    def warm_up(self) -> None:
        warm_up(self.sample_loader)
        warm_up(self.loader)

    def sample_pass(self) -> tuple[int, float]:
        return timed_pass(self.sample_loader, lambda batch: None)

    def gather_pass(self) -> tuple[int, float]:
        # The same indexing NodeClassificationTrainer uses to gather a batch's inputs.
        features, labels = self.trainer.features, self.trainer.labels
        return timed_pass(self.sample_loader, lambda batch: (features[batch.input_ids], labels[batch.seeds]))

    def train_epoch(self) -> float:
        return self.trainer.train_epoch(self.loader)

    def val_accuracy(self) -> float:
        return self.trainer.evaluate()[0]


class DGLSide:
    """DGL's standard pipeline: dgl.dataloading.DataLoader + NeighborSampler + dgl.nn.SAGEConv."""

    def __init__(self, data: dict[str, np.ndarray], num_classes: int, seed: int) -> None:
        torch.manual_seed(seed)
        np.random.seed(seed)
        dgl.seed(seed)
        indptr, indices = torch.from_numpy(data["indptr"]), torch.from_numpy(data["indices"])
        self.graph = dgl.graph(("csc", (indptr, indices, torch.empty(0, dtype=torch.int64))),
                               num_nodes=indptr.numel() - 1)
        self.graph.ndata["feat"] = torch.from_numpy(data["features"])
        self.graph.ndata["label"] = torch.from_numpy(data["labels"])
        self.train_ids = torch.from_numpy(np.nonzero(data["train_mask"][0])[0])
        self.val_ids = torch.from_numpy(np.nonzero(data["val_mask"][0])[0])
        self.model = DGLSage(data["features"].shape[1], HIDDEN, num_classes)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        sampler = dgl.dataloading.NeighborSampler(FANOUTS, prefetch_node_feats=["feat"], prefetch_labels=["label"])
        self.loader = self._loader(sampler)
        self.sample_loader = self._loader(dgl.dataloading.NeighborSampler(FANOUTS))

    def _loader(self, sampler) -> dgl.dataloading.DataLoader:
        return dgl.dataloading.DataLoader(self.graph, self.train_ids, sampler, batch_size=BATCH_SIZE, shuffle=True,
                                          drop_last=False, num_workers=0)

    def warm_up(self) -> None:
        warm_up(self.sample_loader)
        warm_up(self.loader)

    def sample_pass(self) -> tuple[int, float]:
        return timed_pass(self.sample_loader, lambda batch: None)

    def gather_pass(self) -> tuple[int, float]:
        return timed_pass(self.loader, lambda batch: None)

    def train_epoch(self) -> float:
        self.model.train()
        total, count = 0.0, 0
        for _, _, blocks in self.loader:
            x, y = blocks[0].srcdata["feat"], blocks[-1].dstdata["label"]
            loss = F.cross_entropy(self.model(blocks, x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            total += loss.item() * y.numel()
            count += y.numel()
        return total / max(count, 1)

    def val_accuracy(self) -> float:
        logits = self.model.inference(self.graph, EVAL_BATCH_SIZE)
        labels = self.graph.ndata["label"][self.val_ids]
        return (logits[self.val_ids].argmax(-1) == labels).float().mean().item()


class DGLSage(nn.Module):
    """DGL's example GraphSAGE (examples/pytorch/graphsage/node_classification.py), widths as ours."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        widths = [in_dim] + [hidden] * (len(FANOUTS) - 1) + [out_dim]
        self.layers = nn.ModuleList(dgl.nn.SAGEConv(a, b, "mean") for a, b in zip(widths[:-1], widths[1:]))
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, blocks, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h

    @torch.no_grad()
    def inference(self, graph, batch_size: int) -> torch.Tensor:
        """Logits float [num_nodes, out_dim], layer by layer over all neighbours, as in DGL's example."""
        self.eval()
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
        loader = dgl.dataloading.DataLoader(graph, torch.arange(graph.num_nodes()), sampler, batch_size=batch_size,
                                            shuffle=False, drop_last=False, num_workers=0)
        h = graph.ndata["feat"]
        for i, layer in enumerate(self.layers):
            out = torch.empty(graph.num_nodes(), layer._out_feats)
            for input_nodes, output_nodes, blocks in loader:
                y = layer(blocks[0], h[input_nodes])
                out[output_nodes] = F.relu(y) if i != len(self.layers) - 1 else y
            h = out
        return h


def run_child(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    dgl.utils.set_num_threads(args.threads)

    data = load_arrays(args.data)
    rss_data = rss_bytes()
    side = (OursSide if args.child == "ours" else DGLSide)(data, args.num_classes, args.repeat)
    result: dict = {"side": args.child, "repeat": args.repeat, "source_digest": source_digest(),
                    "rss_data_gib": rss_data / 2**30,
                    "rss_built_gib": rss_bytes() / 2**30}
    side.warm_up()
    num_batches, seconds = side.sample_pass()
    result.update(num_batches=num_batches, sample_seconds=seconds, sample_batches_per_s=num_batches / seconds)
    num_batches, seconds = side.gather_pass()
    result.update(gather_seconds=seconds, gather_batches_per_s=num_batches / seconds)
    epoch_seconds, losses = [], []
    for _ in range(args.epochs):
        start = time.perf_counter()
        losses.append(side.train_epoch())
        epoch_seconds.append(time.perf_counter() - start)
    result.update(epoch_seconds=epoch_seconds, losses=losses, peak_rss_train_gib=peak_rss_bytes() / 2**30)
    start = time.perf_counter()
    result["val_accuracy"] = side.val_accuracy()
    result.update(eval_seconds=time.perf_counter() - start, peak_rss_gib=peak_rss_bytes() / 2**30)
    if args.profile:
        result["profile"] = profile_call(side.train_epoch, args.profile)
    return result


# ====================================================================== parent side
def save_graph(args: argparse.Namespace, folder: Path) -> dict:
    config = SyntheticConfig(num_nodes=args.num_nodes, avg_degree=args.avg_degree, feat_dim=args.feat_dim,
                             num_classes=args.num_classes, seed=args.seed)
    start = time.perf_counter()
    ds = generate_synthetic(config)
    seconds = time.perf_counter() - start
    train, val, test = ds.split(0)
    arrays = {"indptr": ds.indptr, "indices": ds.indices, "features": ds.features, "labels": ds.labels,
              "train_mask": train[None], "val_mask": val[None], "test_mask": test[None]}
    for name in ARRAYS:
        np.save(folder / f"{name}.npy", arrays[name], allow_pickle=False)
    return {"num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "num_features": ds.num_features,
            "num_classes": ds.num_classes, "num_train": int(train.sum()), "num_val": int(val.sum()),
            "generate_seconds": round(seconds, 2)}


def run_side(args: argparse.Namespace, side: str, repeat: int, folder: Path) -> dict:
    result_path = folder / f"{side}_{repeat}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--data", str(folder),
               "--repeat", str(repeat), "--result", str(result_path), "--epochs", str(args.epochs),
               "--threads", str(args.threads), "--num-classes", str(args.num_classes), "--profile", str(args.profile)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               DGLBACKEND="pytorch")
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.child_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} child (repeat {repeat}) exited with {proc.returncode}; its stderr:\n{proc.stderr}")
    result = json.loads(result_path.read_text())
    result["child_seconds"] = time.perf_counter() - start
    return result


def summarize(results: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    rows = {
        "epoch_seconds": lambda rs: statistics.median(s for r in rs for s in r["epoch_seconds"]),
        "sample_batches_per_s": lambda rs: statistics.median(r["sample_batches_per_s"] for r in rs),
        "gather_batches_per_s": lambda rs: statistics.median(r["gather_batches_per_s"] for r in rs),
        "eval_seconds": lambda rs: statistics.median(r["eval_seconds"] for r in rs),
        "val_accuracy": lambda rs: statistics.median(r["val_accuracy"] for r in rs),
        "peak_rss_train_gib": lambda rs: statistics.median(r["peak_rss_train_gib"] for r in rs),
        "peak_rss_gib": lambda rs: statistics.median(r["peak_rss_gib"] for r in rs),
        "rss_data_gib": lambda rs: statistics.median(r["rss_data_gib"] for r in rs),
    }
    summary = {}
    for name, reduce in rows.items():
        ours, dgl = reduce(results["ours"]), reduce(results["dgl"])
        summary[name] = {"ours": ours, "dgl": dgl, "ratio": ours / dgl if dgl else float("nan")}
    return summary


LABELS = {
    "epoch_seconds": "epoch time, s (median)",
    "sample_batches_per_s": "sampling only, batches/s",
    "gather_batches_per_s": "sampling + feature gather, batches/s",
    "eval_seconds": "validation inference, s",
    "val_accuracy": "val accuracy after epochs",
    "peak_rss_train_gib": "peak RSS after training, GiB",
    "peak_rss_gib": "peak RSS incl. inference, GiB",
    "rss_data_gib": "RSS with data loaded, GiB",
}


def print_table(summary: dict[str, dict[str, float]]) -> None:
    width = max(map(len, LABELS.values()))
    print(f"{'':<{width}}  {'ours':>9}  {'DGL':>9}  {'ours/DGL':>9}")
    for name, row in summary.items():
        print(f"{LABELS[name]:<{width}}  {row['ours']:>9.3f}  {row['dgl']:>9.3f}  {row['ratio']:>9.3f}")


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    validate(parser, args)
    if args.child:
        args.result.write_text(json.dumps(run_child(args)))
        return

    commit = git_commit()
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="bench_single_process_") as tmp:
        folder = Path(tmp)
        graph = save_graph(args, folder)
        print(f"graph: {graph}", file=sys.stderr)
        for repeat in range(args.repeats):
            for side in (SIDES if repeat % 2 == 0 else SIDES[::-1]):
                result = run_side(args, side, repeat, folder)
                results[side].append(result)
                print(f"repeat {repeat} {side:>4}: epochs {[round(s, 2) for s in result['epoch_seconds']]} s, "
                      f"val {result['val_accuracy']:.4f}, sampling {result['sample_batches_per_s']:.2f} batches/s, "
                      f"peak RSS {result['peak_rss_gib']:.2f} GiB", file=sys.stderr)
                if "profile" in result:
                    print(f"--- cProfile of one {side} epoch (repeat {repeat}) ---\n{result['profile']}",
                          file=sys.stderr)
    digests = sorted({r["source_digest"] for side in SIDES for r in results[side]})
    if len(digests) > 1:
        print(f"WARNING: the library sources changed during the run ({len(digests)} versions: {digests}); "
              f"the repeats did not all run the same code, rerun for a clean comparison", file=sys.stderr)
    summary = summarize(results)
    print_table(summary)
    report = {
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "graph": graph,
        "settings": {"fanouts": FANOUTS, "hidden": HIDDEN, "num_layers": len(FANOUTS), "dropout": DROPOUT,
                     "batch_size": BATCH_SIZE, "lr": LR, "weight_decay": WEIGHT_DECAY,
                     "eval_batch_size": EVAL_BATCH_SIZE, "epochs": args.epochs, "repeats": args.repeats,
                     "threads": args.threads, "dgl_num_workers": 0,
                     "dgl_eval": "layer-wise full-neighbour inference (MultiLayerFullNeighborSampler(1))"},
        "code": {"git_commit_at_start": commit, "source_digests": digests, "consistent": len(digests) == 1},
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "dgl": dgl.__version__,
                        "cpu_count": os.cpu_count(), "loadavg_end": os.getloadavg()},
        "summary": summary,
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
