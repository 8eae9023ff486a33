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
    train.add_argument("--batch-size", type=int, default=1024)
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--lr", type=float, default=0.01)
    train.add_argument("--weight-decay", type=float, default=5e-4)
    train.add_argument("--patience", type=int, default=0, help="early-stop after this many evaluations without "
                       "improvement; 0 = off")
    train.add_argument("--eval-every", type=int, default=1)
    train.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--out", type=Path, default=None, help="run folder for metrics.json "
                        "(default: runs/<dataset>-<model>-seed<seed>)")
    parser.add_argument("--quiet", action="store_true", help="log only warnings and the final result")
    return parser


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write ``payload`` so that ``path`` is either absent or complete, never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> dict:
    """Load, build, train and write ``metrics.json``; returns its contents."""
    from gnnscale.nn import ModelConfig
    from gnnscale.train.node_classification import NodeClassificationTrainer, TrainConfig
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
                               seed=args.seed, device=args.device)
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
    try:
        run(args)
    except (ValueError, FileNotFoundError) as exc:  # user input problems: one line, non-zero exit
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
