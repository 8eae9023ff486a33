"""Command line of ``scripts/train_node_classification.py`` and the ``gnnscale-train`` console script."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from gnnscale.data.cli import add_dataset_arguments, dataset_from_args

DEFAULT_FANOUTS = (15, 10, 5)

log = logging.getLogger("gnnscale.train")


def fanout_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fanouts {text!r} is not a comma-separated list of integers, e.g. 15,10,5")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnscale-train",
        description="Mini-batch node classification with sampled neighbourhoods; evaluates layer-wise over all "
                    "neighbours and keeps the epoch with the best validation score.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataset_arguments(parser)
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
    train = parser.add_argument_group("training")
    train.add_argument("--fanouts", type=fanout_list, default=None,
                       help="neighbours per layer, input side first; -1 = all (default: 15,10,5 cut to --num-layers)")
    train.add_argument("--batch-size", type=int, default=1024, help="seed nodes per step and rank (with K ranks a "
                       "step covers K x this many)")
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--lr", type=float, default=0.01)
    train.add_argument("--weight-decay", type=float, default=5e-4)
    train.add_argument("--patience", type=int, default=0, help="early-stop after this many evaluations without "
                       "improvement; 0 = off")
    train.add_argument("--eval-every", type=int, default=1)
    train.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    pipe = parser.add_argument_group("input pipeline")
    pipe.add_argument("--num-workers", type=int, default=1, help="loader threads that sample and gather batches "
                      "ahead of training (single process); 0 = in the training thread")
    pipe.add_argument("--prefetch", type=int, default=2, help="batches prepared ahead of training (beyond those "
                      "the workers hold); distributed: 0 = no background thread")
    pipe.add_argument("--features-on-device", action="store_true", help="keep the whole feature table on the "
                      "device and send only ids (cuda, single process)")
    pipe.add_argument("--no-keep-freed-memory", dest="keep_freed_memory", action="store_false",
                      help="return freed memory to the system after every step (slower: pages fault in again)")
    dist = parser.add_argument_group(
        "distributed (torchrun)",
        "With --partitions, rank r of 'torchrun --nproc_per_node=K ...' trains on partition r of a folder written "
        "by 'python -m partition --num-parts K'; the dataset options are then not used.")
    dist.add_argument("--partitions", type=Path, default=None, help="partition folder: train distributed, one "
                      "partition per rank (a plain python launch is a world of one and needs a 1-part folder)")
    dist.add_argument("--cache-mb", type=float, default=64.0, help="MiB of remote feature rows cached per rank")
    dist.add_argument("--cache-policy", choices=("degree", "presample"), default="degree",
                      help="cache the remote nodes with most in-edges to owned nodes, or those most requested "
                           "while sampling a few batches first")
    dist.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint.pt if it exists "
                      "(use with torchrun --max-restarts)")
    dist.add_argument("--checkpoint-every", type=int, default=1, help="epochs between checkpoints; 0 = never")
    dist.add_argument("--failure-timeout", type=float, default=60.0, help="seconds without an answer after which "
                      "a rank is declared dead or hung and the others stop, naming it")
    parser.add_argument("--out", type=Path, default=None, help="run folder for metrics.json (and checkpoint.pt) "
                        "(default: runs/<dataset>-<model>-seed<seed>)")
    parser.add_argument("--quiet", action="store_true", help="log only warnings and the final result")
    return parser


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write ``payload`` so that ``path`` is either absent or complete, never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def build_configs(args: argparse.Namespace):
    """``(model_config, sampler_config, train_config)`` from the command line."""
    from gnnscale.nn import ModelConfig
    from gnnscale.train.node_classification import TrainConfig
    from samplers import SamplerConfig

    fanouts = args.fanouts if args.fanouts is not None else \
        list(DEFAULT_FANOUTS[:args.num_layers]) + [DEFAULT_FANOUTS[-1]] * max(0, args.num_layers - 3)
    model_config = ModelConfig(model=args.model, num_layers=args.num_layers, hidden=args.hidden,
                               dropout=args.dropout, input_dropout=args.input_dropout, heads=args.heads,
                               out_heads=args.out_heads, attn_dropout=args.attn_dropout,
                               residual=args.residual)
    # GCN needs Kipf weights from full-graph degrees, GAT attends to the node itself too.
    sampler_config = SamplerConfig(fanouts=fanouts, gcn_norm=args.model == "gcn", self_loops=args.model != "sage")
    train_config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                               weight_decay=args.weight_decay, patience=args.patience, eval_every=args.eval_every,
                               seed=args.seed, device=args.device, num_workers=args.num_workers,
                               prefetch=args.prefetch, features_on_device=args.features_on_device,
                               keep_freed_memory=args.keep_freed_memory)
    return model_config, sampler_config, train_config


def run(args: argparse.Namespace) -> dict:
    """Load, build, train and write ``metrics.json``; returns its contents."""
    from gnnscale.train.node_classification import NodeClassificationTrainer

    if args.partitions is not None:
        return run_distributed(args)
    if args.resume:
        log.warning("--resume has no effect without --partitions")
    model_config, sampler_config, train_config = build_configs(args)
    out = args.out if args.out is not None else Path("runs") / f"{args.dataset}-{args.model}-seed{args.seed}"

    start = time.perf_counter()
    dataset = dataset_from_args(args)
    log.info("loaded %r in %.1fs", dataset, time.perf_counter() - start)
    trainer = NodeClassificationTrainer(dataset, split=args.split, model_config=model_config,
                                        sampler_config=sampler_config, config=train_config)
    result = trainer.fit()
    metrics = {
        "dataset": dataset.name, "model": args.model, "metric": result.metric,
        "val": result.val, "test": result.test, "best_epoch": result.best_epoch,
        "epochs_run": result.epochs_run, "train_seconds": result.train_seconds, "world_size": 1,
        "split": args.split, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "history": result.history,
    }
    write_json_atomic(out / "metrics.json", metrics)
    print(f"{dataset.name} {args.model}: test {result.metric} {result.test:.4f} "
          f"(val {result.val:.4f}, best epoch {result.best_epoch}/{result.epochs_run}, "
          f"{result.train_seconds:.1f}s training) -> {out / 'metrics.json'}", flush=True)
    return metrics


def run_distributed(args: argparse.Namespace) -> dict:
    """Train on partition ``rank`` of ``--partitions``; rank 0 writes ``metrics.json``."""
    from gnnscale.distributed.env import read_env
    from gnnscale.distributed.job import joined_job
    from gnnscale.train.distributed import DistConfig, DistNodeClassificationTrainer
    from partition.format import read_manifest
    from partition.load import load_partition

    if args.failure_timeout <= 0:
        raise ValueError(f"--failure-timeout must be > 0 seconds, got {args.failure_timeout}")
    env = read_env()
    if env.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    manifest = read_manifest(args.partitions)
    if manifest["num_parts"] != env.world_size:
        raise ValueError(f"{args.partitions} holds {manifest['num_parts']} partition(s) but this job has "
                         f"{env.world_size} rank(s): launch torchrun with {manifest['num_parts']} processes in all "
                         f"(--nnodes x --nproc_per_node), or re-partition with --num-parts {env.world_size}")
    model_config, sampler_config, train_config = build_configs(args)
    dist_config = DistConfig(cache_mb=args.cache_mb, cache_policy=args.cache_policy, prefetch=args.prefetch,
                             checkpoint_every=args.checkpoint_every, resume=args.resume)
    name = (manifest.get("dataset") or {}).get("name") or args.partitions.name
    out = args.out if args.out is not None else Path("runs") / f"{name}-{args.model}-seed{args.seed}-{env.world_size}r"
    part = load_partition(args.partitions, env.rank)
    with joined_job(env, args.device, args.failure_timeout) as runtime:
        trainer = DistNodeClassificationTrainer(part, runtime, split=args.split, model_config=model_config,
                                                sampler_config=sampler_config, config=train_config,
                                                dist_config=dist_config, out=out)
        result = trainer.fit()
    metrics = {
        "dataset": name, "model": args.model, "metric": result.metric, "val": result.val, "test": result.test,
        "best_epoch": result.best_epoch, "epochs_run": result.epochs_run, "train_seconds": result.train_seconds,
        "world_size": env.world_size, "partitions": str(args.partitions), "split": args.split,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "history": result.history,
    }
    if env.is_main:
        write_json_atomic(out / "metrics.json", metrics)
        print(f"{name} {args.model} on {env.world_size} rank(s): test {result.metric} {result.test:.4f} "
              f"(val {result.val:.4f}, best epoch {result.best_epoch}/{result.epochs_run}, "
              f"{result.train_seconds:.1f}s training) -> {out / 'metrics.json'}", flush=True)
    return metrics


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
    args = build_parser().parse_args(_join_negative_fanouts(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    from gnnscale.distributed.watchdog import EXIT_PEER_FAILURE, PeerFailure

    from gnnscale import interrupt

    interrupt.install()
    try:
        run(args)
    except PeerFailure as exc:  # another rank died or hung: name it, and let torchrun restart the job
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_PEER_FAILURE
    except (ValueError, FileNotFoundError) as exc:  # user input problems: one line, non-zero exit
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the loader's workers were stopped on the way out; nothing was written
        print("interrupted: no metrics.json written", file=sys.stderr, flush=True)
        return 130
    return 0
