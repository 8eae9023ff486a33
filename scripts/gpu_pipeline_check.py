"""Check the host-to-device mini-batch pipeline on a GPU with batches sampled and saved on the CPU.

Sampling and replay are separate steps, so the GPU side is measured on exactly the batches a CPU
run samples (both steps also run on the GPU machine itself: nothing here needs DGL)::

    # 1. Sample and save (265 MiB, about 10 s):
    python scripts/gpu_pipeline_check.py save --out runs/gpu_check_data
    # 2. Copy the repository and the folder to the GPU machine (runs/ is git-ignored: never commit the folder,
    #    step 1 regenerates it), then run the check there (a few minutes at most) -- it needs torch and numpy
    #    only, not an installed gnnscale:
    python scripts/gpu_pipeline_check.py check runs/gpu_check_data --out runs/gpu_pipeline_check.json
    # Here, without a GPU, the same check runs end to end on the CPU (bandwidths are then null):
    python scripts/gpu_pipeline_check.py check runs/gpu_check_data --device cpu --epochs 1

``save`` generates a planted-community synthetic graph (``generate_synthetic``), samples
``--num-batches`` batches of ``--batch-size`` seed nodes (a seeded permutation of all nodes)
with ``samplers.NeighborSampler`` (batch ``i`` drawn with ``batch_rng(seed, 0, i)``), and writes
``batch_{i:04d}.pt`` (``MiniBatch.save``), ``features.npy``, ``labels.npy`` and, last,
``manifest.json``.

``check`` imports neither ``samplers`` nor the data generator.  It measures:

* **plain copies** (reference): a pinned host tensor the size of the median batch's features
  copied to the device (``non_blocking``, timed with CUDA events, median of several), and a
  pageable one the size of the median batch's ids and block structure;
* **host features**: a ``PrefetchLoader`` (``--workers`` threads, pinned slots) whose sample
  function replays the saved batches (seeds ``0..n-1``, batch size 1, no shuffle: task ``i``
  is saved batch ``i``, so the loader only gathers rows, it does not sample), feeding a
  ``DeviceFeeder`` that copies each batch on a side stream while the previous one trains a
  GraphSAGE ``GNN`` (hidden 256, one layer per fanout) with Adam -- the loop of
  ``Trainer.train_epoch``, ``loss.item()`` every step included;
* **features on device**: the same with the feature table on the device
  (``DeviceFeeder(device, device_features=table)``, ``gather_features=False``): only ids and
  block structure cross the bus.

Per epoch (after ``--warmup`` untimed epochs): wall time; ``wait``, the trainer blocked on the host
pipeline (``loader.stats.wait``); device busy time, the sum of CUDA-event intervals on the
compute stream from before each forward to after each ``optimizer.step()``; the **device idle
share** ``(wall - busy) / wall`` (the compute stream's idle time between steps: copies on the
side stream do not count as work, and launch gaps inside a step count as busy, so it is a lower
bound); and the **H2D bandwidth** of our copies, bytes moved (features, labels, ids and blocks)
over the summed side-stream time between CUDA events recorded around each batch's copies (with
features on device that time includes selecting the rows on the device).
``h2d_ratio_to_pinned`` divides it by the plain pinned copy's bandwidth; ``copy_efficiency``
divides the time plain copies of the same bytes would take (features at the pinned rate, the
pageable structure at the pageable rate) by the measured time, so 1.0 means our copies run as
fast as plain ones.  On ``--device cpu`` busy time is wall-clock step time and the
bandwidth fields are null.

Exit status: 0 on success, 2 on a usage or data error (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
# The GPU machine's Python may be too new to pip-install the package (requires-python <3.12): import it from the
# checkout.  Appended, not prepended, so an installed gnnscale (or a test's import blocker) still comes first.
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from gnnscale.batch import MiniBatch  # noqa: E402
from gnnscale.nn import GNN, ModelConfig  # noqa: E402
from gnnscale.pipeline import LoadedBatch, LoaderConfig, PrefetchLoader, batch_rng, keep_freed_memory  # noqa: E402
from gnnscale.pipeline.device import DeviceBatch, DeviceFeeder  # noqa: E402
from gnnscale.train.cli import strict_json  # noqa: E402

FORMAT = 1
MANIFEST = "manifest.json"
LR = 0.01
WEIGHT_DECAY = 5e-4
COPY_REPEATS = 10
COPY_WARMUP = 2
CONFIGS = {"host_features": "host features", "device_features": "features on device"}


class CheckError(Exception):
    """A usage or data problem, reported as one line and exit status 2."""


# ====================================================================== save (CPU)
def cmd_save(args: argparse.Namespace) -> dict:
    """Generate the graph, sample and save the batches; returns the manifest."""
    # Imported here only: `check` replays saved batches and needs neither the samplers nor the generator.
    from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
    from samplers import NeighborSampler, SamplerConfig

    fanouts = parse_fanouts(args.fanouts)
    for name in ("num_nodes", "feat_dim", "num_batches", "batch_size", "num_classes"):
        if getattr(args, name) < 1:
            raise CheckError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.seed < 0:
        raise CheckError(f"--seed must be >= 0, got {args.seed}")
    needed = args.num_batches * args.batch_size
    if needed > args.num_nodes:
        raise CheckError(f"--num-batches x --batch-size = {needed} seed nodes, more than --num-nodes "
                         f"{args.num_nodes}; lower one of them")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    # The manifest is written last: a folder whose save was interrupted has none, and `check` refuses it.
    (out / MANIFEST).unlink(missing_ok=True)

    start = time.perf_counter()
    try:
        dataset = generate_synthetic(SyntheticConfig(num_nodes=args.num_nodes, feat_dim=args.feat_dim,
                                                     num_classes=args.num_classes, avg_degree=args.avg_degree,
                                                     seed=args.seed))
    except (TypeError, ValueError) as error:
        raise CheckError(f"cannot generate the graph: {error}") from None
    generated = time.perf_counter() - start
    log(f"generated {dataset.num_nodes:,} nodes, {dataset.num_edges:,} edges in {generated:.1f} s")

    sampler = NeighborSampler(dataset.indptr, dataset.indices, SamplerConfig(fanouts=fanouts))
    order = torch.from_numpy(np.random.default_rng(args.seed).permutation(args.num_nodes)[:needed])
    files, sample_seconds, input_nodes, edges = [], [], [], []
    for i in range(args.num_batches):
        seeds = order[i * args.batch_size:(i + 1) * args.batch_size]
        began = time.perf_counter()
        batch = sampler.sample(seeds, rng=batch_rng(args.seed, 0, i))
        sample_seconds.append(time.perf_counter() - began)
        name = f"batch_{i:04d}.pt"
        batch.save(out / name)
        files.append(name)
        input_nodes.append(int(batch.input_ids.numel()))
        edges.append(sum(block.num_edges for block in batch.blocks))
    np.save(out / "features.npy", dataset.features, allow_pickle=False)
    np.save(out / "labels.npy", dataset.labels, allow_pickle=False)

    manifest = {
        "format": FORMAT,
        "num_nodes": dataset.num_nodes, "num_edges": dataset.num_edges, "feat_dim": dataset.num_features,
        "num_classes": dataset.num_classes, "num_batches": args.num_batches, "batch_size": args.batch_size,
        "fanouts": fanouts, "seed": args.seed, "avg_degree": args.avg_degree,
        "files": files,
        "input_nodes": input_nodes, "edges": edges,
        "sample_seconds": sample_seconds,
        "created_with": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                         "cpu_count": os.cpu_count(), "generate_seconds": generated},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    log(f"sampled {args.num_batches} batches in {sum(sample_seconds):.1f} s "
        f"(median {statistics.median(input_nodes):,.0f} input nodes, {statistics.median(edges):,.0f} edges); "
        f"wrote {out} ({size / 2**20:.0f} MiB)")
    return manifest


def parse_fanouts(text: str) -> list[int]:
    try:
        fanouts = [int(part) for part in text.split(",")]
    except ValueError:
        raise CheckError(f"--fanouts must be comma-separated integers such as 15,10,5, got {text!r}") from None
    if not fanouts or any(f < 1 for f in fanouts):
        raise CheckError(f"--fanouts must be positive integers such as 15,10,5, got {text!r}")
    return fanouts


# ====================================================================== check (GPU)
@dataclass
class Saved:
    """What ``save`` wrote, loaded into host memory."""

    folder: Path
    manifest: dict
    batches: list[MiniBatch]
    features: torch.Tensor
    labels: torch.Tensor

    @property
    def num_layers(self) -> int:
        return len(self.batches[0].blocks)


def load_saved(folder: Path) -> Saved:
    """Load and sanity-check a folder written by ``save``; :class:`CheckError` says what is wrong."""
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckError(f"{path} not found; create the folder with `{Path(__file__).name} save --out {folder}`")
    try:
        manifest = json.loads(path.read_text())
        files, feat_dim, num_nodes = manifest["files"], int(manifest["feat_dim"]), int(manifest["num_nodes"])
        num_classes = int(manifest["num_classes"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise CheckError(f"{path} is not a manifest written by `save` ({type(error).__name__}: {error})") from None
    if manifest.get("format") != FORMAT:
        raise CheckError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT}; rerun `save`")
    if not files:
        raise CheckError(f"{path} lists no batches; rerun `save`")
    missing = [name for name in files + ["features.npy", "labels.npy"] if not (folder / name).is_file()]
    if missing:
        raise CheckError(f"{folder} lacks {len(missing)} file(s) the manifest lists, e.g. {missing[0]}; rerun `save`")
    features = torch.from_numpy(np.load(folder / "features.npy", allow_pickle=False))
    labels = torch.from_numpy(np.load(folder / "labels.npy", allow_pickle=False)).to(torch.int64)
    if features.shape != (num_nodes, feat_dim) or features.dtype != torch.float32:
        raise CheckError(f"features.npy is {features.dtype} {tuple(features.shape)}, the manifest says float32 "
                         f"({num_nodes}, {feat_dim})")
    if labels.shape != (num_nodes,) or labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
        raise CheckError(f"labels.npy has shape {tuple(labels.shape)} or values outside [0, {num_classes}); "
                         f"the manifest says {num_nodes} nodes and {num_classes} classes")
    batches = []
    for name in files:
        try:
            batch = MiniBatch.load(folder / name)
        except Exception as error:  # noqa: BLE001 -- any unreadable file is a data error
            raise CheckError(f"cannot load {folder / name}: {type(error).__name__}: {error}") from None
        if int(batch.input_ids.max()) >= num_nodes or int(batch.seeds.max()) >= num_nodes:
            raise CheckError(f"{folder / name} holds node ids >= num_nodes {num_nodes}")
        if batches and len(batch.blocks) != len(batches[0].blocks):
            raise CheckError(f"{folder / name} has {len(batch.blocks)} blocks, the first batch "
                             f"{len(batches[0].blocks)}")
        batches.append(batch)
    return Saved(folder=folder, manifest=manifest, batches=batches, features=features, labels=labels)


def resolve_device(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise CheckError(f"--device {text!r} is not a device ({error})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CheckError(f"--device {text} requested but torch {torch.__version__} sees no CUDA device; "
                             f"use --device cpu to run the check on the CPU")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CheckError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) visible")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise CheckError(f"--device must be cpu or cuda[:N], got {text!r}")
    return device


def nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def structure_bytes(batch: MiniBatch) -> int:
    """Bytes of a batch's seeds and blocks (what ``MiniBatch.to`` moves)."""
    total = nbytes(batch.seeds)
    for block in batch.blocks:
        total += nbytes(block.indptr) + nbytes(block.indices) + nbytes(block.src_ids) + nbytes(block.edge_weight)
    return total


def plain_copy_gbps(num_bytes: int, device: torch.device, pinned: bool) -> float | None:
    """Bandwidth (GB/s, 1e9 bytes) of copying ``num_bytes`` from a pinned (or pageable) host tensor to ``device``:
    median over :data:`COPY_REPEATS` ``non_blocking`` copies into a preallocated tensor, timed by CUDA events."""
    if device.type != "cuda":
        return None
    source = torch.empty(max(num_bytes // 4, 1), dtype=torch.float32, pin_memory=pinned)
    source.fill_(1.0)  # touch every page
    target = torch.empty_like(source, device=device)
    seconds = []
    for repeat in range(COPY_WARMUP + COPY_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source, non_blocking=True)
        end.record()
        end.synchronize()
        if repeat >= COPY_WARMUP:
            seconds.append(start.elapsed_time(end) / 1e3)
    return nbytes(source) / statistics.median(seconds) / 1e9


class TimedFeeder(DeviceFeeder):
    """A :class:`DeviceFeeder` that also times its side-stream work with CUDA events and counts the bytes it moves.

    The copies themselves are the library's (``DeviceFeeder._issue``); this only records an event on the
    side stream before and after them.
    """

    def __init__(self, device: torch.device, device_features: torch.Tensor | None = None) -> None:
        super().__init__(device, device_features)
        self.reset()

    def reset(self) -> None:
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.batches = 0
        self.feature_bytes = 0
        self.other_bytes = 0
        self.copy_seconds = 0.0

    def _issue(self, loaded: LoadedBatch) -> tuple[DeviceBatch, object]:
        start = None
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
        issued = super()._issue(loaded)
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.stream)
            self.events.append((start, end))
        self.batches += 1
        self.other_bytes += structure_bytes(loaded.batch) + nbytes(loaded.y)
        if self.device_features is None:
            self.feature_bytes += nbytes(loaded.x)
        return issued

    def side_stream_seconds(self) -> float | None:
        """Summed side-stream time of this epoch's copies (call after the device is synchronised)."""
        if not self.cuda:
            return None
        return sum(start.elapsed_time(end) for start, end in self.events) / 1e3


def train_epoch(model: GNN, optimizer: torch.optim.Optimizer, feeder: TimedFeeder, loader: PrefetchLoader,
                device: torch.device) -> dict:
    """One pass, as ``Trainer.train_epoch`` does it, with the device's busy time measured."""
    cuda = device.type == "cuda"
    feeder.reset()
    model.train()
    steps, loss_sum, seeds, busy, first_batch = 0, 0.0, 0, 0.0, None
    step_events = []
    began = time.perf_counter()
    item: DeviceBatch
    for item in feeder(loader):
        if first_batch is None:
            first_batch = time.perf_counter() - began
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            step_began = time.perf_counter()
        loss = F.cross_entropy(model(item.batch.blocks, item.x), item.y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            step_events.append((start, end))
        loss_sum += loss.item() * item.y.numel()
        if not cuda:
            busy += time.perf_counter() - step_began
        seeds += item.y.numel()
        steps += 1
    if cuda:
        torch.cuda.synchronize(device)
        busy = sum(start.elapsed_time(end) for start, end in step_events) / 1e3
    wall = time.perf_counter() - began
    if feeder.batches != steps:
        raise RuntimeError(f"the timing hook saw {feeder.batches} batches for {steps} steps: "
                           f"TimedFeeder._issue no longer matches gnnscale/pipeline/device.py")
    copy = feeder.side_stream_seconds()
    moved = feeder.feature_bytes + feeder.other_bytes
    stats = loader.stats
    first_batch = first_batch or 0.0
    return {
        "epoch_s": wall, "steps": steps, "loss": loss_sum / max(seeds, 1),
        "wait_s": stats.wait, "wait_share": stats.wait / wall, "first_batch_s": first_batch,
        "gather_s": stats.gather, "sample_s": stats.sample, "issue_s": feeder.copy_seconds,
        "device_busy_s": busy, "device_idle_share": max(0.0, wall - busy) / wall,
        "device_idle_share_after_first_batch": max(0.0, wall - first_batch - busy) / max(wall - first_batch, 1e-12),
        "h2d_feature_bytes": feeder.feature_bytes, "h2d_other_bytes": feeder.other_bytes,
        "h2d_s": copy, "h2d_gbps": None if copy is None or copy <= 0 else moved / copy / 1e9,
    }


def run_config(saved: Saved, device: torch.device, features_on_device: bool, args: argparse.Namespace,
               reference: dict) -> dict:
    """Train ``--warmup`` + ``--epochs`` epochs on the replayed batches; per-epoch results and their medians."""
    cuda = device.type == "cuda"
    manifest = saved.manifest
    torch.manual_seed(int(manifest["seed"]))
    model = GNN(ModelConfig(model="sage", num_layers=saved.num_layers, hidden=args.hidden),
                int(manifest["feat_dim"]), int(manifest["num_classes"])).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    table = saved.features.to(device) if features_on_device else None
    feeder = TimedFeeder(device, table)

    def replay(seeds: torch.Tensor, rng: np.random.Generator | None = None) -> MiniBatch:
        # The loader's "seeds" are batch numbers (batch size 1, no shuffle): task i replays saved batch i.
        return saved.batches[int(seeds[0])]

    loader = PrefetchLoader(replay, torch.arange(len(saved.batches)), saved.features, saved.labels, LoaderConfig(
        batch_size=1, num_workers=args.workers, prefetch=args.prefetch, shuffle=False, pin_memory=cuda,
        gather_features=not features_on_device))
    epochs = []
    for epoch in range(args.warmup + args.epochs):
        result = train_epoch(model, optimizer, feeder, loader, device)
        if not math.isfinite(result["loss"]):
            raise RuntimeError(f"loss is {result['loss']} in epoch {epoch}")
        if epoch >= args.warmup:
            epochs.append(result)
        log(f"{CONFIGS['device_features' if features_on_device else 'host_features']}, epoch {epoch}"
            f"{' (warm-up)' if epoch < args.warmup else ''}: {result['epoch_s']:.3f} s, wait {result['wait_s']:.3f} s, "
            f"idle {result['device_idle_share']:.1%}, loss {result['loss']:.4f}")
    return {"epochs": epochs, "summary": summarize(epochs, reference, features_on_device)}


def median_of(epochs: list[dict], key: str) -> float | None:
    values = [e[key] for e in epochs if e[key] is not None]
    return statistics.median(values) if values else None


def summarize(epochs: list[dict], reference: dict, features_on_device: bool) -> dict:
    summary = {key: median_of(epochs, key) for key in (
        "epoch_s", "wait_s", "wait_share", "first_batch_s", "device_busy_s", "device_idle_share",
        "device_idle_share_after_first_batch", "h2d_s", "h2d_gbps")}
    steps = epochs[0]["steps"]
    feature_bytes = epochs[0]["h2d_feature_bytes"] / steps
    other_bytes = epochs[0]["h2d_other_bytes"] / steps
    summary.update(steps_per_epoch=steps, h2d_feature_bytes_per_batch=feature_bytes,
                   h2d_other_bytes_per_batch=other_bytes, final_loss=epochs[-1]["loss"])
    pinned, pageable = reference["pinned_gbps"], reference["pageable_gbps"]
    h2d, copy_s = summary["h2d_gbps"], summary["h2d_s"]
    summary["h2d_ratio_to_pinned"] = None if h2d is None or not pinned else h2d / pinned
    if copy_s and pinned and pageable:
        plain_s = steps * (feature_bytes / (pinned * 1e9) + other_bytes / (pageable * 1e9))
        summary["copy_efficiency"] = plain_s / copy_s
    else:
        summary["copy_efficiency"] = None
    return summary


def cmd_check(args: argparse.Namespace) -> dict:
    for name, least in (("epochs", 1), ("warmup", 0), ("workers", 0), ("prefetch", 0), ("hidden", 1)):
        if getattr(args, name) < least:
            raise CheckError(f"--{name} must be >= {least}, got {getattr(args, name)}")
    device = resolve_device(args.device)
    saved = load_saved(args.folder)
    manifest = saved.manifest
    log(f"loaded {len(saved.batches)} batches, features {tuple(saved.features.shape)} from {args.folder}")
    keep_freed_memory()  # as the trainer does by default
    if device.type == "cuda":
        torch.cuda.set_device(device)
    x_sizes = sorted(int(b.input_ids.numel()) * saved.features.shape[1] * saved.features.element_size()
                     for b in saved.batches)
    other_sizes = sorted(structure_bytes(b) for b in saved.batches)
    reference = {"pinned_bytes": statistics.median(x_sizes), "pageable_bytes": statistics.median(other_sizes)}
    reference["pinned_gbps"] = plain_copy_gbps(int(reference["pinned_bytes"]), device, pinned=True)
    reference["pageable_gbps"] = plain_copy_gbps(int(reference["pageable_bytes"]), device, pinned=False)
    results = {"host_features": run_config(saved, device, False, args, reference),
               "device_features": run_config(saved, device, True, args, reference)}
    report = {
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "data": {key: manifest[key] for key in ("num_nodes", "num_edges", "feat_dim", "num_classes", "num_batches",
                                                "batch_size", "fanouts", "seed")}
                | {"folder": str(args.folder), "median_input_nodes": statistics.median(manifest["input_nodes"]),
                   "median_edges": statistics.median(manifest["edges"]),
                   "median_cpu_sample_s": statistics.median(manifest["sample_seconds"]),
                   "created_with": manifest["created_with"]},
        "settings": {"device": str(device), "epochs": args.epochs, "warmup": args.warmup, "workers": args.workers,
                     "prefetch": args.prefetch, "model": "sage", "num_layers": saved.num_layers, "hidden": args.hidden,
                     "lr": LR, "weight_decay": WEIGHT_DECAY, "copy_repeats": COPY_REPEATS},
        "environment": {
            "python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "cuda": torch.version.cuda, "device_name": device_name(device), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            # The replay measures the pipeline alone: nothing samples during the check.
            "dgl_imported": "dgl" in sys.modules, "samplers_imported": "samplers" in sys.modules},
        "reference": reference,
        "results": results,
        "h2d_ratio_to_pinned": results["host_features"]["summary"]["h2d_ratio_to_pinned"],
    }
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json(report))
    log(f"wrote {args.out}")
    return report


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def fmt(value: float | None, width: int, digits: int = 2) -> str:
    """``value`` right-aligned in ``width`` with ``digits`` decimals, or a dash for a missing value."""
    return "-".rjust(width) if value is None else f"{value:>{width}.{digits}f}"


def print_table(report: dict) -> None:
    env, reference = report["environment"], report["reference"]
    print(f"device {report['settings']['device']} ({env['device_name']}), torch {env['torch']}, "
          f"{report['data']['num_batches']} batches, median {report['data']['median_input_nodes']:,.0f} input nodes")
    print(f"{'':<20}  {'epoch s':>8}  {'wait s':>7}  {'idle':>6}  {'H2D GB/s':>8}  {'/pinned':>7}  "
          f"{'efficiency':>10}")
    rows: Iterable[tuple[str, dict]] = ((CONFIGS[key], value["summary"]) for key, value in report["results"].items())
    for label, s in rows:
        print(f"{label:<20}  {s['epoch_s']:>8.3f}  {s['wait_s']:>7.3f}  {s['device_idle_share']:>6.1%}  "
              f"{fmt(s['h2d_gbps'], 8)}  {fmt(s['h2d_ratio_to_pinned'], 7)}  "
              f"{fmt(s['copy_efficiency'], 10)}")
    print(f"{'plain pinned copy':<20}  {'':>8}  {'':>7}  {'':>6}  {fmt(reference['pinned_gbps'], 8)}  "
          f"({reference['pinned_bytes'] / 2**20:.1f} MiB)")
    print(f"{'plain pageable copy':<20}  {'':>8}  {'':>7}  {'':>6}  {fmt(reference['pageable_gbps'], 8)}  "
          f"({reference['pageable_bytes'] / 2**20:.1f} MiB)")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ====================================================================== command line
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Run `save`, then `check` on the GPU machine (copy the folder there "
                                            "if `save` ran elsewhere); the script's docstring explains the measurements.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{save,check}")
    save = commands.add_parser("save", help="sample batches on the CPU and save them",
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    save.add_argument("--out", type=Path, required=True, help="folder to write (created; never commit it)")
    save.add_argument("--num-nodes", type=int, default=200_000)
    save.add_argument("--avg-degree", type=float, default=10.0)
    save.add_argument("--feat-dim", type=int, default=100)
    save.add_argument("--num-classes", type=int, default=10)
    save.add_argument("--num-batches", type=int, default=40)
    save.add_argument("--batch-size", type=int, default=1024, help="seed nodes per batch")
    save.add_argument("--fanouts", default="15,10,5", help="neighbours per layer, input side first")
    save.add_argument("--seed", type=int, default=0, help="seeds the graph, the seed order and the sampling")

    check = commands.add_parser("check", help="replay the saved batches through the loader and device feeder "
                                "(imports no sampler)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    check.add_argument("folder", type=Path, help="a folder written by `save`")
    check.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (no bandwidths then)")
    check.add_argument("--epochs", type=int, default=3, help="timed epochs per configuration")
    check.add_argument("--warmup", type=int, default=1, help="untimed epochs before them")
    check.add_argument("--workers", type=int, default=2, help="loader threads gathering feature rows")
    check.add_argument("--prefetch", type=int, default=2, help="batches kept ready beyond those being prepared")
    check.add_argument("--hidden", type=int, default=256, help="GraphSAGE hidden width")
    check.add_argument("--out", type=Path, default=Path("runs/gpu_pipeline_check.json"), help="JSON report")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "save":
            cmd_save(args)
        else:
            cmd_check(args)
    except CheckError as error:
        print(f"{Path(__file__).name}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
