"""Command line of ``scripts/train_node_classification.py`` and the ``gnnscale-train`` console script."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from gnnscale.data.cli import add_dataset_arguments, dataset_from_args
from gnnscale.options import (GRAD_SYNCS, WIRE_DTYPES, JobOptionError, NoEffect, OutputError, Parser, add_section,
                              flags_in_errors, run_command, write_failure_reason)

DEFAULT_FANOUTS = (15, 10, 5)

log = logging.getLogger("gnnscale.train")


def fanout_list(text: str) -> list[int]:
    """``--fanouts`` from ``"15,10,5"``; argparse turns the error into a usage message."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fanouts {text!r} is not a comma-separated list of integers, e.g. 15,10,5")


def cache_size(text: str) -> float | str:
    """``--cache-mb``: auto, or a number of MiB (its range is checked with the other numeric options)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cache-mb {text!r} is neither auto nor a number of MiB, e.g. 256") \
            from None


def rank_capacity(text: str) -> str:
    """``--rank-capacity``: auto, or positive numbers (their count is checked against the world size)."""
    if text != "auto":
        try:
            weights = [float(part) for part in text.split(",") if part.strip()]
        except ValueError:
            weights = []
        if not weights or not all(0 < w < float("inf") for w in weights):
            raise argparse.ArgumentTypeError(f"--rank-capacity {text!r} is neither auto nor positive comma-separated "
                                             f"numbers, one per rank, e.g. 2,1")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The command line: the sections of :mod:`gnnscale.options` plus the GNN's own options."""
    parser = Parser(
        prog="gnnscale-train",
        description="Mini-batch node classification (--task node) or static link prediction (--task link) with "
                    "sampled neighbourhoods on 1..N ranks; keeps the epoch with the best validation score.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataset_arguments(parser)
    parser.add_argument("--task", choices=("node", "link"), default="node", help="node: classify nodes (their "
                        "labels); link: predict edges (a random 85/5/10 split of the graph's edges, seed edges and "
                        "their reverses left out of their batch's neighbourhoods; ROC-AUC, MRR, Hits@20/50)")
    _add_link_arguments(parser.add_argument_group("link prediction (--task link)"))
    model = parser.add_argument_group("model")
    model.add_argument("--model", choices=("sage", "gcn", "gat"), default="sage")
    model.add_argument("--num-layers", type=int, default=3)
    model.add_argument("--hidden", type=int, default=256, help="hidden width (per head for gat)")
    model.add_argument("--dropout", type=float, default=0.5, help="dropout between layers")
    model.add_argument("--input-dropout", type=float, default=0.0, help="dropout on input features")
    model.add_argument("--residual", action="store_true", help="residual pre-LayerNorm blocks with input and "
                       "output projections (deep models, heterophilous graphs)")
    model.add_argument("--heads", type=int, default=8, help="gat: heads in hidden layers")
    model.add_argument("--out-heads", type=int, default=1, help="gat: heads in the output layer (averaged)")
    model.add_argument("--attn-dropout", type=float, default=0.6, help="gat: dropout on attention weights")
    model.add_argument("--edge-features", action="store_true", help="gat: use the dataset's edge features in the "
                       "attention scores (every sampled edge carries its features)")
    add_section(parser, "optimisation", lr=0.01)
    loader = parser.add_argument_group("loader")
    loader.add_argument("--batch-size", type=int, default=1024, help="seed nodes per step and rank (with K ranks "
                        "a step covers K x this many)")
    loader.add_argument("--fanouts", type=fanout_list, default=None, help="neighbours per layer, input side "
                        "first; -1 = all (default: 15,10,5 cut to --num-layers)")
    add_section(parser, "loader", group=loader)
    add_section(parser, "distributed", group=add_distributed_arguments(parser))
    output = add_section(parser, "checkpoint")
    output.add_argument("--save-predictions", action="store_true", help="after training, write every node's "
                        "output (logits) of the best epoch to <out>/predictions/: one .npy per rank with the nodes' "
                        "original ids, and a manifest (read them with gnnscale.read_outputs)")
    add_section(parser, "run")
    return parser


def _add_link_arguments(link: argparse._ArgumentGroup) -> None:
    link.add_argument("--decoder", choices=("dot", "mlp"), default="dot", help="scores a pair from its two "
                      "embeddings (--hidden wide): inner product, or an MLP over their elementwise product")
    link.add_argument("--num-negatives", type=int, default=1, help="negative pairs per positive in training")
    link.add_argument("--negative-sampling", choices=("uniform", "degree", "global"), default="uniform",
                      help="uniform: the positive's source with a uniform destination; degree: destination by "
                           "degree^0.75; global: both ends uniform (PyG's example)")
    link.add_argument("--exclude", choices=("reverse", "self", "none"), default="reverse", help="seed edges left "
                      "out of their own batch's sampled neighbourhoods: with their reverses, alone, or none")
    link.add_argument("--val-fraction", type=float, default=0.05, help="share of the edges held out for validation")
    link.add_argument("--test-fraction", type=float, default=0.1, help="share of the edges held out for testing")


def add_distributed_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The options of more than one rank (the shared ones follow from :func:`gnnscale.options.add_section`)."""
    dist = parser.add_argument_group("distributed", "Under 'torchrun --nproc_per_node=K', rank r trains on "
                                     "partition r: of --partitions, or of a folder rank 0 first writes to "
                                     "<out>/partitions. A plain python launch is a world of one.")
    dist.add_argument("--partitions", type=Path, default=None, help="folder from 'python -m partition "
                      "--num-parts K' (the dataset options are then not used)")
    dist.add_argument("--cache-mb", type=cache_size, default="auto", metavar="auto|MIB",
                      help="MiB of remote feature rows cached per rank (0: none); auto = every row --cache-policy "
                           "ranks (vip: every remote row a batch can reach, so batches make no exchange) while "
                           "they fit a quarter of the memory available at start, shared among the machine's ranks")
    dist.add_argument("--cache-policy", choices=("auto", "degree", "presample", "vip"), default="auto",
                      help="which remote rows to cache: degree = the nodes with most in-edges to owned nodes; "
                           "presample = those most requested while sampling a few batches first; vip = those most "
                           "likely inputs of this rank's batches, from the fanouts (SALIENT++; needs the replicated "
                           "topology, or the partitioned one's halo copy with at most two layers); auto = vip "
                           "where it can be ranked, else degree")
    dist.add_argument("--topology", choices=("auto", "partitioned", "replicated"), default="auto",
                      help="replicated: every rank holds the whole graph structure and samples without requests, "
                           "only feature rows move; partitioned: each rank holds its own in-edges and a copy of its "
                           "halo's, and asks owners for the rest; auto: replicated when it fits "
                           "--topology-budget-mb")
    dist.add_argument("--topology-budget-mb", type=float, default=1024.0, help="MiB per rank for the whole graph "
                      "structure, or in the partitioned topology for the copy of the halo's in-edges (8 bytes "
                      "per node and per edge; 0: no copy)")
    dist.add_argument("--memory-budget", type=float, default=None, metavar="MIB", help="MiB each rank may hold "
                      "above the interpreter (also a world of one; default: none, or under a memory cgroup limit "
                      "below 8 GiB a rank 60%% of what it leaves): owned feature rows that do not fit stay "
                      "memory-mapped, the topology, the feature cache and the loader's buffers are sized to it (each "
                      "decision logged); below what the partition itself needs it is an error naming the minimum")
    dist.add_argument("--rank-capacity", type=rank_capacity, default=None, metavar="auto|W0,W1,...",
                      help="deal every step's seeds among ranks in proportion to their speed (heterogeneous "
                           "machines): auto = timed on a few steps alone at the start, then re-dealt after every "
                           "epoch from its real steps' busy time; or one weight per rank; default: each rank "
                           "trains its own training nodes")
    dist.add_argument("--grad-sync", choices=GRAD_SYNCS, default="step",
                      help="step: each update waits for its own step's gradient sum (DDP, the single-machine "
                           "step); late: a step's sum runs while the next step computes and each update applies "
                           "the previous step's sum (one step stale), hiding the network and the ranks' "
                           "step-to-step jitter")
    dist.add_argument("--wire-dtype", choices=WIRE_DTYPES, default="float32",
                      help="how remote feature rows (cache fill included) and evaluation's halo embeddings cross "
                           "the wire, d values a row: float32 exact (4d bytes); float16 (2d) within 2^-11 relative, "
                           "beyond +-65504 clamped; bfloat16 (2d) within 2^-8 relative; int8 (d+4) within "
                           "max|row|/254 absolute. GCN degrees stay exact")
    return dist


def _not_gat(args: argparse.Namespace, world_size: int) -> bool:
    return args.model != "gat"


def _partitioned(args: argparse.Namespace, world_size: int) -> bool:
    return args.partitions is not None


SYNTHETIC_OPTIONS = ("--num-nodes", "--avg-degree", "--num-classes", "--feat-dim")

def _link(args: argparse.Namespace, world_size: int) -> bool:
    return args.task == "link"


NO_EFFECT = (
    *(NoEffect(name, lambda args, world_size: args.task == "node", "only --task link predicts edges")
      for name in ("--decoder", "--num-negatives", "--negative-sampling", "--exclude", "--val-fraction",
                   "--test-fraction")),
    *(NoEffect(name, _link, "--task link does not support it yet")
      for name in ("--rank-capacity", "--grad-sync", "--features-on-device")),
    *(NoEffect(name, _not_gat, "only --model gat has attention") for name in ("--heads", "--out-heads",
                                                                            "--attn-dropout")),
    *(NoEffect(name, _partitioned, "the graph comes from --partitions")
      for name in ("--dataset", "--data-dir", *SYNTHETIC_OPTIONS)),
    *(NoEffect(name, lambda args, world_size: args.dataset != "synthetic", "only --dataset synthetic generates "
               "a graph") for name in SYNTHETIC_OPTIONS),
    NoEffect("--data-dir", lambda args, world_size: args.dataset == "synthetic", "--dataset synthetic is "
             "generated, not read"),
    NoEffect("--features-on-device", lambda args, world_size: not args.device.startswith("cuda"),
             "with --device cpu the feature table is already there"),
    NoEffect("--on-checkpoint-error", lambda args, world_size: args.checkpoint_every == 0, "--checkpoint-every 0 "
             "writes no checkpoint"),
    NoEffect("--failure-timeout", lambda args, world_size: world_size == 1, "a world of one has no other rank "
             "to wait for"),
    NoEffect("--wire-dtype", lambda args, world_size: world_size == 1, "a world of one sends no rows over a wire"),
    NoEffect("--topology", lambda args, world_size: world_size == 1, "a world of one holds the whole graph"),
    NoEffect("--rank-capacity", lambda args, world_size: world_size == 1, "a world of one trains every seed"),
    NoEffect("--grad-sync", lambda args, world_size: world_size == 1, "a world of one sums no gradients"),
    NoEffect("--topology-budget-mb", lambda args, world_size: world_size == 1, "a world of one holds the whole "
             "graph"),
)
"""Given options that cannot matter for the run: :func:`main` warns about each (rank 0 only)."""


def strict_json(payload: dict) -> str:
    """``payload`` as JSON that strict parsers accept: a NaN or infinite number becomes null, and its place is
    listed under ``"not_computed"`` with the reason."""
    absent: dict[str, str] = {}

    def finite(value: Any, where: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            absent[where] = (f"{value}: not a number; the metric is undefined on these nodes or events (e.g. "
                             f"ROC-AUC over one class), or training diverged")
            return None
        if isinstance(value, dict):
            return {key: finite(item, f"{where}.{key}".lstrip(".")) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return value

    clean = finite(payload, "")
    if absent:
        clean["not_computed"] = absent
    return json.dumps(clean, indent=2, default=str, allow_nan=False) + "\n"


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write ``payload`` (see :func:`strict_json`) so that ``path`` is either absent or complete, never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(strict_json(payload))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def publish_metrics(path: Path, metrics: dict, line: str) -> None:
    """Write ``metrics`` to ``path``, then print the result ``line`` pointing at it (stdout).

    A write that fails loses nothing: the line and the metrics JSON are printed to stdout first, then
    :class:`~gnnscale.options.OutputError` (one line naming the folder) is raised.
    """
    try:
        write_json_atomic(path, metrics)
    except OSError as err:
        print(f"{line} (metrics.json not written; the metrics follow)", flush=True)
        print(strict_json(metrics), end="", flush=True)
        raise OutputError(f"cannot write {path.name} in {path.parent} ({write_failure_reason(err)}); the result "
                          f"line and the metrics JSON are on stdout above; make the folder writable, or give "
                          f"another --out next time") from None
    print(f"{line} -> {path}", flush=True)


def default_num_workers(cores: int, world_size: int, grad_sync: str) -> int:
    """``--num-workers`` when not given: a loader thread where a rank has a core to spare for it, or where it
    overlaps waits on peers that each step would otherwise sit out (DDP's per-step gradient sum; 2 emulated
    machines of 1 core: 1.54 s per epoch with it, 1.76 without).  With ``--grad-sync late`` nothing waits on
    a step's sum and on one core the thread costs more than the exchanges it hides (the 1M-node graph, 64
    MiB cache: 1.86 s per epoch without it, 2.19 with; all rows cached: 1.63 and 1.62; medians of 4)."""
    return 1 if cores >= 2 or (world_size > 1 and grad_sync == "step") else 0


def build_configs(args: argparse.Namespace):
    """``(model_config, sampler_config, train_config, cache_config)`` from the command line."""
    from gnnscale.nn import ModelConfig
    from gnnscale.train.trainer import CacheConfig, TrainConfig
    from samplers import SamplerConfig

    if args.num_workers is None:  # recorded resolved in metrics.json's args
        from gnnscale.distributed.env import cores_per_rank, read_env

        env = read_env()
        args.num_workers = default_num_workers(cores_per_rank(env), env.world_size, args.grad_sync)
    fanouts = args.fanouts if args.fanouts is not None else \
        list(DEFAULT_FANOUTS[:args.num_layers]) + [DEFAULT_FANOUTS[-1]] * max(0, args.num_layers - 3)
    model_config = ModelConfig(model=args.model, num_layers=args.num_layers, hidden=args.hidden,
                               dropout=args.dropout, input_dropout=args.input_dropout, heads=args.heads,
                               out_heads=args.out_heads, attn_dropout=args.attn_dropout,
                               residual=args.residual, edge_features=args.edge_features)
    # GCN needs Kipf weights from full-graph degrees, GAT attends to the node itself too.
    sampler_config = SamplerConfig(fanouts=fanouts, gcn_norm=args.model == "gcn", self_loops=args.model != "sage")
    train_config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                               weight_decay=args.weight_decay, patience=args.patience, eval_every=args.eval_every,
                               seed=args.seed, num_workers=args.num_workers,
                               prefetch=args.prefetch, features_on_device=args.features_on_device,
                               checkpoint_every=args.checkpoint_every, resume=args.resume,
                               on_checkpoint_error=args.on_checkpoint_error,
                               rank_capacity=args.rank_capacity, grad_sync=args.grad_sync)
    cache_config = CacheConfig(cache_mb=args.cache_mb, cache_policy=args.cache_policy, wire_dtype=args.wire_dtype,
                               topology=args.topology, topology_budget_mb=args.topology_budget_mb,
                               memory_budget=args.memory_budget)
    return model_config, sampler_config, train_config, cache_config


def apply_process_settings(args: argparse.Namespace) -> None:
    """The process-wide settings of a training command: the allocator and torch's global generator."""
    import torch

    from gnnscale.pipeline import keep_freed_memory, limit_arenas

    limit_arenas()  # before the loader's and gloo's threads allocate
    budget_from_limit(args)
    # Under a budget freed memory goes back to the system as glibc does by default: keeping it, even with the
    # heap capped at a tenth of the budget, fragmented the heap with evaluation's buffers (100M edges, 2 ranks,
    # --memory-budget 1500: peak 3.84 GiB a rank kept, 3.89 with both thresholds at a tenth, 3.38 returned, at the
    # same epoch time; docs/memory.md).
    if args.keep_freed_memory and args.memory_budget is None:
        keep_freed_memory()
    torch.manual_seed(args.seed)


def budget_from_limit(args: argparse.Namespace) -> None:
    """Without ``--memory-budget``, under a memory cgroup limit below
    :data:`~gnnscale.pipeline.allocator.KEEP_MIN_LIMIT_BYTES` per rank of the machine (a container's, an emulated
    machine's): set the budget to :data:`gnnscale.budget.LIMIT_SHARE` of what the limit leaves now, per rank, and
    say so.  Sizing by the host's memory instead, the feature cache took a quarter of the host."""
    from gnnscale.budget import LIMIT_SHARE
    from gnnscale.memory import available_bytes, memory_limit_bytes
    from gnnscale.pipeline.allocator import KEEP_MIN_LIMIT_BYTES

    limit, ranks = memory_limit_bytes(), max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    if args.memory_budget is not None or limit is None or limit / ranks >= KEEP_MIN_LIMIT_BYTES:
        return
    left = available_bytes()
    args.memory_budget = max(1.0, math.floor(LIMIT_SHARE * left / ranks / 2**20))
    log.info("a memory cgroup limits this machine to %.0f MiB, %.0f MiB of it free: --memory-budget %g per rank "
             "(%.0f%% of it over %d rank(s)); pass --memory-budget to choose", limit / 2**20, left / 2**20,
             args.memory_budget, 100 * LIMIT_SHARE, ranks)


def run(args: argparse.Namespace) -> dict:
    """Train on 1..N ranks (a plain launch is a world of one) and write ``metrics.json`` from rank 0."""
    from gnnscale.distributed.env import read_env
    from gnnscale.distributed.job import joined_job

    env = read_env()
    if env.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    apply_process_settings(args)  # may set the memory budget, which the configs carry
    model_config, sampler_config, train_config, cache_config = build_configs(args)
    name = _run_name(args)
    suffix = f"-{env.world_size}r" if env.world_size > 1 else ""
    out = args.out if args.out is not None else Path("runs") / f"{name}-{args.model}-seed{args.seed}{suffix}"
    link = link_config(args)  # checked before any data is read
    _check_before_writing(args, env.world_size, out)
    # The library names its arguments; inside the job a failing rank reports before main() sees the error.
    with joined_job(env, args.device, args.failure_timeout) as runtime, flags_in_errors(build_parser()):
        # Nothing that holds a process group (the trainer) may outlive this block: see joined_job.
        result, facts = _fit(args, runtime, out, (model_config, sampler_config, train_config, cache_config), link)
    metrics = {
        "dataset": name, "task": args.task, "model": args.model, "metric": result.metric, "val": result.val, "test": result.test,
        "best_epoch": result.best_epoch, "epochs_run": result.epochs_run, "train_seconds": result.train_seconds,
        "world_size": env.world_size, **facts,
        "partitions": str(args.partitions) if args.partitions else None,
        "predictions": str(out / "predictions") if args.save_predictions else None,
        "split": args.split, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "history": result.history, "memory": result.memory,
    }
    link = facts.get("test_link")  # the test figures of --task link
    if env.is_main:
        publish_metrics(out / "metrics.json", metrics,
                        f"{name} {args.model} on {env.world_size} rank(s): test {result.metric} {result.test:.4f}"
                        + (f", MRR {link['mrr']:.4f}, Hits@20 {link['hits@20']:.4f}, Hits@50 {link['hits@50']:.4f}"
                           if link else "")
                        + f" (val {result.val:.4f}, best epoch {result.best_epoch}/{result.epochs_run}, "
                        f"{result.train_seconds:.1f}s training)")
    return metrics


def link_config(args: argparse.Namespace):
    """``--task link``'s :class:`~gnnscale.train.link.LinkConfig` (None for ``--task node``)."""
    if args.task != "link":
        return None
    from gnnscale.train.link import LinkConfig

    return LinkConfig(decoder=args.decoder, num_negatives=args.num_negatives, negative_sampling=args.negative_sampling,
                      exclude=args.exclude, val_fraction=args.val_fraction, test_fraction=args.test_fraction)


def _fit(args: argparse.Namespace, runtime, out: Path, configs: tuple, link) -> tuple[Any, dict]:
    """Train this rank's partition; ``(TrainResult, facts of the run for metrics.json)``, plain values only."""
    from gnnscale.train.trainer import Trainer

    model_config, sampler_config, train_config, cache_config = configs
    part = _open_partition(args, runtime, out)
    if link is not None:
        return _fit_link(args, part, runtime, out, configs, link)
    trainer = Trainer.on_partition(part, runtime, split=args.split, model_config=model_config,
                                   sampler_config=sampler_config, config=train_config, cache_config=cache_config,
                                   out=out, show_progress=not args.quiet)
    result = trainer.fit()
    if args.save_predictions:  # every rank writes its share: a collective
        trainer.predict().save(out / "predictions")
    return result, {"wire_dtype": trainer.wire_dtype, "steps_per_epoch": trainer.steps,
                    "topology": "replicated" if trainer.replicated else "partitioned"}


def _fit_link(args: argparse.Namespace, part, runtime, out: Path, configs: tuple, link) -> tuple[Any, dict]:
    """``--task link`` on this rank's partition; with ``--save-predictions`` every node's embedding is written."""
    from gnnscale.graph import Graph
    from gnnscale.inference import layerwise_inference
    from gnnscale.train.link import LinkTrainer
    from gnnscale.world import World

    model_config, sampler_config, train_config, cache_config = configs
    graph = Graph(part, World.from_runtime(runtime), split=args.split, wire_dtype=cache_config.wire_dtype,
                  memory_budget=cache_config.memory_budget)
    trainer = LinkTrainer(graph, model_config=model_config, sampler_config=sampler_config, config=train_config,
                          link=link, cache_config=cache_config, out=out)
    result = trainer.fit()
    if args.save_predictions:  # the encoder's embeddings, over the whole graph (test edges included)
        layerwise_inference(graph, trainer.encoder, batch_size=train_config.eval_batch_size,
                            self_loops=sampler_config.self_loops, gcn_norm=sampler_config.gcn_norm,
                            edge_features=model_config.edge_features).save(out / "predictions")
    return result, {"test_link": trainer.test, "steps_per_epoch": len(trainer.task.train),
                    "wire_dtype": graph.wire_dtype}


def _check_before_writing(args: argparse.Namespace, world_size: int, out: Path) -> None:
    """On every rank, before the job is joined: what the options, the world size, ``out``'s checkpoint and
    (with ``--partitions``) the manifest's graph size decide.  Without ``--partitions`` the graph's size is
    checked by rank 0 before it partitions (:func:`_partition_on_rank0`)."""
    from gnnscale.train.prechecks import check_graph_size, check_job_options, needs_graph_size

    check_job_options(args, world_size, out)
    if args.partitions is not None and needs_graph_size(args, world_size):
        from partition.format import read_manifest

        manifest = read_manifest(args.partitions)
        check_graph_size(args, manifest["num_nodes"], manifest["num_edges"])


def _run_name(args: argparse.Namespace) -> str:
    if args.partitions is None:
        return args.dataset
    from partition.format import read_manifest

    return (read_manifest(args.partitions).get("dataset") or {}).get("name") or args.partitions.name


def _open_partition(args: argparse.Namespace, runtime, out: Path):
    """This rank's partition: of ``--partitions``, of the whole dataset in a world of one, or of a folder
    rank 0 writes into ``OUT/partitions`` first when torchrun starts several ranks without ``--partitions``."""
    from partition.format import read_manifest
    from partition.load import load_partition, whole_graph_partition

    world, folder = runtime.world_size, args.partitions
    if folder is None and world == 1:
        start = time.perf_counter()
        dataset = dataset_from_args(args)
        log.info("loaded %r in %.1fs", dataset, time.perf_counter() - start)
        return whole_graph_partition(dataset)
    if folder is None:
        folder = out / "partitions"
        _partition_on_rank0(args, runtime, folder)
    num_parts = read_manifest(folder)["num_parts"]
    if num_parts != world:
        raise ValueError(f"{folder} holds {num_parts} partition(s) but this job has {world} rank(s): launch torchrun "
                         f"with {num_parts} processes in all (--nnodes x --nproc_per_node), or re-partition with "
                         f"--num-parts {world}")
    return load_partition(folder, runtime.rank)


def partition_command(args: argparse.Namespace, num_parts: int, folder: Path) -> list[str]:
    """The ``python -m partition`` command that partitions this run's dataset with the default settings."""
    command = [sys.executable, "-m", "partition", "--num-parts", str(num_parts), "--out", str(folder), "--force",
               "--dataset", args.dataset, "--split", str(args.split), "--seed", str(args.seed)]
    if args.data_dir is not None:
        command += ["--data-dir", str(args.data_dir)]
    if args.dataset == "synthetic":
        command += ["--num-nodes", str(args.num_nodes), "--avg-degree", str(args.avg_degree),
                    "--num-classes", str(args.num_classes), "--feat-dim", str(args.feat_dim)]
    if args.dataset == "edgelist" and getattr(args, "memory_budget", None) is not None:
        # The waiting ranks hold little: rank 0's child gets the rank budget, and goes out of core (or refuses
        # in one line) where the in-memory pipeline would exceed it.
        command += ["--memory-budget", f"{args.memory_budget:g}"]
    return command


def _partition_on_rank0(args: argparse.Namespace, runtime, folder: Path) -> None:
    """Rank 0 partitions (in a child process, so its heartbeat goes on); the others wait for its word.

    The folder must be visible to every rank: one host, or a shared file system across hosts.
    """
    import shlex
    import subprocess

    key = "partitioned"
    if runtime.rank == 0:
        word = _graph_size_verdict(args, runtime.world_size)
        if word == "ok":
            command = partition_command(args, runtime.world_size, folder)
            log.info("no --partitions: partitioning first, as: %s", shlex.join(["python", *command[1:]]))
            done = subprocess.run(command, stderr=subprocess.PIPE, text=True)
            lines = done.stderr.strip().splitlines()
            word = "ok" if done.returncode == 0 else "partitioning on rank 0 failed: " + (
                lines[-1].removeprefix("error: ") if lines else f"exit status {done.returncode}")
        runtime.store.set(key, word)
        runtime.store.add(f"{key}-done", 1)
    else:
        # Polled (store.get would block past the failure timeout while METIS runs); a dead rank 0 is
        # reported by the watchdog meanwhile.
        while runtime.store.add(f"{key}-done", 0) == 0:
            time.sleep(0.2)
        word = runtime.store.get(key).decode()
    if word != "ok":  # every rank learnt the same word: rank 0 alone prints it
        raise JobOptionError(word)


def _graph_size_verdict(args: argparse.Namespace, world_size: int) -> str:
    """``ok``, or why the whole graph's size refuses the options (rank 0, loading the dataset only when an
    option depends on it), before anything is written."""
    from gnnscale.train.prechecks import check_graph_size, needs_graph_size

    if not needs_graph_size(args, world_size):
        return "ok"
    try:
        dataset = dataset_from_args(args)
        check_graph_size(args, dataset.num_nodes, dataset.num_edges)
    except ValueError as err:  # bad data too: the word reaches every rank, rank 0 prints it
        return str(err)
    return "ok"


def _join_negative_fanouts(argv: list[str]) -> list[str]:
    # argparse takes "-1,-1" for an option name; "--fanouts=-1,-1" is what it understands.
    joined: list[str] = []
    for token in argv:
        if joined and joined[-1] == "--fanouts" and token.startswith("-"):
            joined[-1] = f"--fanouts={token}"
        else:
            joined.append(token)
    return joined


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scripts/train_node_classification.py`` and ``gnnscale-train``; returns the exit status."""
    argv = _join_negative_fanouts(sys.argv[1:] if argv is None else argv)
    return run_command(build_parser(), argv, run, NO_EFFECT)
