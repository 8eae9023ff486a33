"""Command line of ``scripts/train_temporal.py``: TGN temporal link prediction on an event stream."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("gnnscale.temporal")

DATASETS = ("wikipedia", "collegemsg", "csv", "snap", "npz")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnscale-train-temporal",
        description="Temporal link prediction with TGN (memory + temporal attention) on a chronological "
                    "70/15/15 split with TGN's inductive protocol; writes metrics.json with val/test AP and MRR, "
                    "transductive and inductive.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, default="wikipedia",
                      help="wikipedia/collegemsg: the dataset folder; csv: a JODIE-layout file u,i,ts,label[,features]; "
                           "snap: 'src dst time' lines; npz: arrays src, dst, t [, edge_features, labels]")
    data.add_argument("--data-dir", type=Path, default=None, help="dataset folder or file (default: "
                      "../shared/datasets/<dataset> for wikipedia and collegemsg)")
    data.add_argument("--new-node-fraction", type=float, default=0.1, help="share of the nodes appearing after the "
                      "validation cut held out of training (inductive evaluation)")
    model = parser.add_argument_group("model")
    model.add_argument("--memory-dim", type=int, default=100)
    model.add_argument("--time-dim", type=int, default=100)
    model.add_argument("--embedding-dim", type=int, default=100)
    model.add_argument("--heads", type=int, default=2)
    model.add_argument("--dropout", type=float, default=0.1)
    model.add_argument("--aggregator", choices=("last", "mean"), default="last", help="how one batch's messages "
                       "to a node are combined")
    model.add_argument("--no-edge-features", action="store_true", help="ignore the events' feature columns")
    train = parser.add_argument_group("training")
    train.add_argument("--batch-size", type=int, default=200, help="consecutive events per step")
    train.add_argument("--num-neighbors", type=int, default=10, help="past events each node attends over")
    train.add_argument("--sampling", choices=("recent", "uniform"), default="recent")
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--lr", type=float, default=1e-4)
    train.add_argument("--patience", type=int, default=5, help="early stop after this many epochs without a "
                       "better validation AP; 0 = off")
    train.add_argument("--eval-negatives", type=int, default=10, help="negative destinations per event for MRR")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None, help="run folder for metrics.json "
                        "(default: runs/<dataset>-tgn-seed<seed>)")
    parser.add_argument("--quiet", action="store_true", help="log only warnings and the final result")
    return parser


def run(args: argparse.Namespace) -> dict:
    from gnnscale.data.temporal import chronological_split, load_temporal
    from gnnscale.temporal import MemoryConfig, TGNConfig
    from gnnscale.temporal.train import TemporalLinkTrainer, TemporalTrainConfig
    from gnnscale.train.cli import write_json_atomic

    if not 0.0 <= args.new_node_fraction < 1.0:
        raise ValueError(f"--new-node-fraction must be in [0, 1), got {args.new_node_fraction}")
    path = args.data_dir
    if path is None:
        if args.dataset not in ("wikipedia", "collegemsg"):
            raise ValueError(f"--dataset {args.dataset} needs --data-dir FILE")
        path = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / args.dataset
    start = time.perf_counter()
    events = load_temporal(args.dataset, path)
    if args.no_edge_features:
        events.edge_features = None
    split = chronological_split(events, new_node_fraction=args.new_node_fraction, seed=args.seed)
    log.info("loaded %s: %d nodes, %d events, %d edge features in %.1fs; train/val/test events %d/%d/%d, "
             "%d new nodes held out", events.name, events.num_nodes, events.num_events, events.num_edge_features,
             time.perf_counter() - start, split.train.sum(), split.val.sum(), split.test.sum(), len(split.new_nodes))
    config = TemporalTrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                                 num_neighbors=args.num_neighbors, sampling=args.sampling,
                                 eval_negatives=args.eval_negatives, patience=args.patience, seed=args.seed,
                                 device=args.device)
    memory_config = MemoryConfig(memory_dim=args.memory_dim, time_dim=args.time_dim,
                                 edge_dim=events.num_edge_features, aggregator=args.aggregator)
    tgn_config = TGNConfig(embedding_dim=args.embedding_dim, heads=args.heads, dropout=args.dropout)
    trainer = TemporalLinkTrainer(events, split, memory_config=memory_config, tgn_config=tgn_config, config=config)
    best = trainer.fit()
    out = args.out if args.out is not None else Path("runs") / f"{events.name}-tgn-seed{args.seed}"
    metrics = {"dataset": events.name, "model": "tgn", "world_size": 1,
               **{k: v for k, v in best.items() if k.startswith(("val_", "test_"))},
               "best_epoch": best["best_epoch"], "epochs_run": best["epochs_run"], "seconds": best["seconds"],
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "history": best["history"]}
    write_json_atomic(out / "metrics.json", metrics)
    print(f"{events.name} tgn: test AP {metrics['test_ap']:.4f} (inductive {metrics['test_ap_inductive']:.4f}), "
          f"test MRR {metrics['test_mrr']:.4f}; val AP {metrics['val_ap']:.4f}; best epoch "
          f"{best['best_epoch']}/{best['epochs_run']} -> {out / 'metrics.json'}", flush=True)
    return metrics


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: no metrics.json written", file=sys.stderr, flush=True)
        return 130
    return 0
