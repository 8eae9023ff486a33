"""Time our single-process training pipeline against DGL's standard pipeline on the same graph.

    python scripts/bench_single_process.py                      # 1M nodes, degree 10, 100 features, 1 worker
    python scripts/bench_single_process.py --num-nodes 200000 --epochs 2 --repeats 3 --out runs/bench_200k.json
    python scripts/bench_single_process.py --num-nodes 200000 --repeats 1 --profile 20   # + cProfile hotspots

What runs, with the same hyper-parameters on both sides (3-layer GraphSAGE-mean, hidden 256,
ReLU + dropout 0.5 between layers, fanouts 15,10,5 from the input side, batch 1024, Adam
lr 0.01 with weight decay 5e-4, the same training nodes, CPU), each side with ``--workers``
loader workers:

* **ours**: ``gnnscale.train.trainer.Trainer`` in a world of one (pure-torch ``gnnscale.nn.GNN``)
  fed by ``gnnscale.pipeline.PrefetchLoader`` over the vectorised sampling kernel with ``--workers``
  worker threads; validation accuracy from ``trainer.evaluate()``.
* **dgl**: ``dgl.dataloading.DataLoader`` over ``dgl.dataloading.NeighborSampler([15, 10, 5],
  prefetch_node_feats=["feat"], prefetch_labels=["label"])`` with ``num_workers=--workers``
  (worker processes), and three ``dgl.nn.SAGEConv(..., "mean")`` layers: the training loop of
  DGL's ``examples/pytorch/graphsage/node_classification.py``.  Validation accuracy from the
  same example's layer-wise full-neighbour inference, which is also what ours does.
* **dgl-alloc** (``--sides`` default includes it): the DGL side again, launched with glibc's
  ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` set to what
  ``gnnscale.pipeline.keep_freed_memory`` sets for our side.  It shows how much of the
  difference is that allocator setting alone (a user of DGL can set it by hand).

The graph is generated once and saved as ``.npy`` files in a temporary folder; every
measurement runs in a fresh child process that loads them, so generation is never timed and
each side's peak RSS is its own.  Each repeat runs every side (rotating which goes first,
since the machine is shared) with seed = repeat index.  A child: one sampling-only pass over
the training nodes (``--workers`` workers, block structure only, no features), one pass that
also gathers features (ours: measures the workers' gather bandwidth), ``--epochs`` timed
training epochs, then one validation evaluation.

Gather bandwidth: bytes of feature rows our workers gathered per second of gathering, against
a plain contiguous copy (``Tensor.copy_``) of the same number of bytes on the same number of
threads, measured in the same child.

Threads: each child gets ``--threads`` torch/DGL/OpenMP threads (default 1: on this 2-core
machine one worker plus one compute thread fill the cores; with the cores oversubscribed every
OpenMP parallel region waits a scheduler time slice for a descheduled thread, so
multi-threaded timings there measure the load, not the pipelines).

Before the timed passes each child draws a few batches untimed from each loader.  Epoch time
is the median over all ``repeats x epochs`` epochs; the other figures are medians over
repeats.  Ratios are ours / DGL: below 1 is better for times and RSS, above 1 is better for
batches per second.
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
from gnnscale.distributed.env import DistEnv, init_runtime  # noqa: E402
from gnnscale.pipeline import LoaderConfig, PrefetchLoader, keep_freed_memory  # noqa: E402
from gnnscale.train.trainer import Trainer, TrainConfig  # noqa: E402
from partition.load import whole_graph_partition  # noqa: E402
from samplers import SamplerConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

SIDES = ("ours", "dgl", "dgl-alloc")
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str((1 << 31) - 1)}
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
    parser.add_argument("--threads", type=int, default=1, help="torch, DGL and OpenMP threads in every child")
    parser.add_argument("--workers", type=int, default=1, help="loader workers on every side (ours: threads; "
                        "DGL: DataLoader worker processes)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="which pipelines to run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic graph")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="after the timed epochs, cProfile one "
                        "more epoch per side and keep its top N functions by own time (0: off)")
    parser.add_argument("--child-timeout", type=float, default=3600.0, help="seconds before a child is killed")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_single_process.json"))
    # Internal: the parent re-runs this script as a child for one side.
    parser.add_argument("--child", choices=("ours", "dgl"), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, got {args.workers}")
    if "ours" not in args.sides or not {"dgl", "dgl-alloc"} & set(args.sides):
        parser.error("--sides needs ours and at least one of dgl, dgl-alloc")
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
    """Our pipeline: the sampling kernel + PrefetchLoader (worker threads) + the Trainer, in a world of one."""

    def __init__(self, data: dict[str, np.ndarray], num_classes: int, seed: int, workers: int) -> None:
        dataset = GraphDataset(name="synthetic", indptr=data["indptr"], indices=data["indices"],
                               features=data["features"], labels=data["labels"], train_masks=data["train_mask"],
                               val_masks=data["val_mask"], test_masks=data["test_mask"], num_classes=num_classes)
        keep_freed_memory()  # what the training command does in main()
        self.trainer = Trainer.on_partition(
            whole_graph_partition(dataset), init_runtime(DistEnv()), split=0,
            model_config=ModelConfig(model="sage", num_layers=len(FANOUTS), hidden=HIDDEN, dropout=DROPOUT),
            sampler_config=SamplerConfig(fanouts=FANOUTS),
            config=TrainConfig(batch_size=BATCH_SIZE, lr=LR, weight_decay=WEIGHT_DECAY,
                               eval_batch_size=EVAL_BATCH_SIZE, seed=seed, num_workers=workers))
        trainer = self.trainer
        self.loader, self.epoch = trainer.loader, 0
        self.sample_loader = PrefetchLoader(trainer.sampler.sample, trainer.graph.train_ids, trainer.features.rows,
                                            trainer.graph.labels, LoaderConfig(batch_size=BATCH_SIZE, num_workers=workers,
                                                                         seed=seed, gather_features=False))

    def warm_up(self) -> None:
        warm_up(self.sample_loader)
        warm_up(self.loader)

    def sample_pass(self) -> tuple[int, float]:
        return timed_pass(self.sample_loader, lambda batch: None)

    def gather_pass(self) -> tuple[int, float]:
        count, seconds = timed_pass(self.loader, lambda batch: None)
        stats = self.loader.stats
        self.gathered = {"gathered_bytes": stats.gathered_bytes, "gather_thread_seconds": stats.gather,
                         "gather_gb_per_s": stats.gathered_bytes / stats.gather / 1e9,
                         "copy_gb_per_s": plain_copy_bandwidth(stats.gathered_bytes // max(count, 1))}
        return count, seconds

    def train_epoch(self) -> float:
        self.epoch += 1
        loss, times = self.trainer.train_epoch(self.epoch)
        self.times.append(times)
        return loss

    def val_accuracy(self) -> float:
        return self.trainer.evaluate()[0]


def plain_copy_bandwidth(num_bytes: int, repeats: int = 20) -> float:
    """GB/s of ``Tensor.copy_`` between two contiguous, already-touched float tensors of ``num_bytes``."""
    src = torch.rand(max(num_bytes // 4, 1))
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return src.numel() * 4 / statistics.median(times) / 1e9


class DGLSide:
    """DGL's standard pipeline: dgl.dataloading.DataLoader + NeighborSampler + dgl.nn.SAGEConv."""

    def __init__(self, data: dict[str, np.ndarray], num_classes: int, seed: int, workers: int) -> None:
        self.workers = workers
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
                                          drop_last=False, num_workers=self.workers)

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
    side = (OursSide if args.child == "ours" else DGLSide)(data, args.num_classes, args.repeat, args.workers)
    side.times = []
    result: dict = {"side": args.child, "repeat": args.repeat, "source_digest": source_digest(),
                    "rss_data_gib": rss_data / 2**30,
                    "rss_built_gib": rss_bytes() / 2**30}
    side.warm_up()
    num_batches, seconds = side.sample_pass()
    result.update(num_batches=num_batches, sample_seconds=seconds, sample_batches_per_s=num_batches / seconds)
    num_batches, seconds = side.gather_pass()
    result.update(gather_seconds=seconds, gather_batches_per_s=num_batches / seconds, **getattr(side, "gathered", {}))
    epoch_seconds, losses = [], []
    for _ in range(args.epochs):
        start = time.perf_counter()
        losses.append(side.train_epoch())
        epoch_seconds.append(time.perf_counter() - start)
    result.update(epoch_seconds=epoch_seconds, losses=losses, epoch_times=side.times,
                  peak_rss_train_gib=peak_rss_bytes() / 2**30)
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
    child = "ours" if side == "ours" else "dgl"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", child, "--data", str(folder),
               "--repeat", str(repeat), "--result", str(result_path), "--epochs", str(args.epochs),
               "--threads", str(args.threads), "--workers", str(args.workers), "--num-classes", str(args.num_classes),
               "--profile", str(args.profile)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               DGLBACKEND="pytorch")
    if side == "dgl-alloc":
        env.update(MALLOC_ENV)
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.child_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} child (repeat {repeat}) exited with {proc.returncode}; its stderr:\n{proc.stderr}")
    result = json.loads(result_path.read_text())
    result["child_seconds"] = time.perf_counter() - start
    return result


def summarize(results: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Per figure: the median of every side that ran, and ours / that side."""
    rows = {
        "epoch_seconds": lambda rs: statistics.median(s for r in rs for s in r["epoch_seconds"]),
        "sample_batches_per_s": lambda rs: statistics.median(r["sample_batches_per_s"] for r in rs),
        "gather_batches_per_s": lambda rs: statistics.median(r["gather_batches_per_s"] for r in rs),
        "eval_seconds": lambda rs: statistics.median(r["eval_seconds"] for r in rs),
        "val_accuracy": lambda rs: statistics.median(r["val_accuracy"] for r in rs),
        "peak_rss_train_gib": lambda rs: statistics.median(r["peak_rss_train_gib"] for r in rs),
        "peak_rss_gib": lambda rs: statistics.median(r["peak_rss_gib"] for r in rs),
    }
    summary = {}
    for name, reduce in rows.items():
        row = {side: reduce(rs) for side, rs in results.items() if rs}
        for side in list(row):
            if side != "ours":
                row[f"ours/{side}"] = row["ours"] / row[side] if row[side] else float("nan")
        summary[name] = row
    ours = results["ours"]
    summary["gather_bandwidth"] = {
        "gather_gb_per_s": statistics.median(r["gather_gb_per_s"] for r in ours),
        "copy_gb_per_s": statistics.median(r["copy_gb_per_s"] for r in ours),
        "ratio": statistics.median(r["gather_gb_per_s"] / r["copy_gb_per_s"] for r in ours),
    }
    summary["ours_epoch_split"] = {key: statistics.median(t[key] for r in ours for t in r["epoch_times"])
                                   for key in ("wait_s", "compute_s", "sample_s", "gather_s")}
    return summary


LABELS = {
    "epoch_seconds": "epoch time, s (median)",
    "sample_batches_per_s": "sampling only, batches/s",
    "gather_batches_per_s": "sampling + feature gather, batches/s",
    "eval_seconds": "validation inference, s",
    "val_accuracy": "val accuracy after epochs",
    "peak_rss_train_gib": "peak RSS after training, GiB",
    "peak_rss_gib": "peak RSS incl. inference, GiB",
}


def print_table(summary: dict[str, dict[str, float]], sides: list[str]) -> None:
    width = max(map(len, LABELS.values()))
    others = [side for side in sides if side != "ours"]
    header = ["ours"] + others + [f"ours/{side}" for side in others]
    print(f"{'':<{width}}" + "".join(f"  {h:>14}" for h in header))
    for name, label in LABELS.items():
        row = summary[name]
        print(f"{label:<{width}}" + "".join(f"  {row[h]:>14.3f}" for h in header))
    gather = summary["gather_bandwidth"]
    print(f"feature gather {gather['gather_gb_per_s']:.2f} GB/s per worker thread; plain copy of the same bytes "
          f"{gather['copy_gb_per_s']:.2f} GB/s; ratio {gather['ratio']:.3f}")
    split = summary["ours_epoch_split"]
    print("ours, per epoch: trainer waiting {wait_s:.2f} s, computing {compute_s:.2f} s; workers sampling "
          "{sample_s:.2f} s, gathering {gather_s:.2f} s".format(**split))


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    validate(parser, args)
    if args.child:
        args.result.write_text(json.dumps(run_child(args)))
        return

    commit = git_commit()
    sides = [side for side in SIDES if side in args.sides]
    results: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="bench_single_process_") as tmp:
        folder = Path(tmp)
        graph = save_graph(args, folder)
        print(f"graph: {graph}", file=sys.stderr)
        for repeat in range(args.repeats):
            for side in sides[repeat % len(sides):] + sides[:repeat % len(sides)]:
                result = run_side(args, side, repeat, folder)
                results[side].append(result)
                print(f"repeat {repeat} {side:>9}: epochs {[round(s, 2) for s in result['epoch_seconds']]} s, "
                      f"val {result['val_accuracy']:.4f}, sampling {result['sample_batches_per_s']:.2f} batches/s, "
                      f"peak RSS {result['peak_rss_gib']:.2f} GiB", file=sys.stderr)
                if "profile" in result:
                    print(f"--- cProfile of one {side} epoch (repeat {repeat}) ---\n{result['profile']}",
                          file=sys.stderr)
    digests = sorted({r["source_digest"] for side in sides for r in results[side]})
    if len(digests) > 1:
        print(f"WARNING: the library sources changed during the run ({len(digests)} versions: {digests}); "
              f"the repeats did not all run the same code, rerun for a clean comparison", file=sys.stderr)
    summary = summarize(results)
    print_table(summary, sides)
    report = {
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "graph": graph,
        "settings": {"fanouts": FANOUTS, "hidden": HIDDEN, "num_layers": len(FANOUTS), "dropout": DROPOUT,
                     "batch_size": BATCH_SIZE, "lr": LR, "weight_decay": WEIGHT_DECAY,
                     "eval_batch_size": EVAL_BATCH_SIZE, "epochs": args.epochs, "repeats": args.repeats,
                     "threads": args.threads, "workers": args.workers, "sides": sides,
                     "dgl_alloc_env": MALLOC_ENV,
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
