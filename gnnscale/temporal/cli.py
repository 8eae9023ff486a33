"""Command line of ``scripts/train_temporal.py``: TGN temporal link prediction on an event stream.

``python scripts/train_temporal.py ...`` trains in one process; ``torchrun --nproc_per_node=N
scripts/train_temporal.py ... --staleness K`` trains on N ranks with the node memory sharded by
owner (a METIS partition of the training interactions) and replicas at most K steps behind;
``--parallelism memory`` makes every rank a memory group with a whole memory and its own time
segment of the training stream (DistTGL's memory parallelism); ``--parallelism epoch`` gives every
rank a whole memory and the whole stream, each rank a step behind the previous one with its own
negatives (DistTGL's epoch parallelism).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

from gnnscale.options import WIRE_DTYPES, NoEffect, Parser, add_section, flags_in_errors, run_command

log = logging.getLogger("gnnscale.temporal")

DATASETS = ("wikipedia", "collegemsg", "csv", "snap", "npz", "synthetic", "dense-synthetic")
GENERATED = ("synthetic", "dense-synthetic")


def _add_model_options(model: argparse._ArgumentGroup) -> None:
    """TGN's sizes and policies."""
    model.add_argument("--memory-dim", type=int, default=100)
    model.add_argument("--time-dim", type=int, default=100)
    model.add_argument("--embedding-dim", type=int, default=100)
    model.add_argument("--heads", type=int, default=2, help="attention heads over past events")
    model.add_argument("--dropout", type=float, default=0.1, help="dropout in the embedding's attention")
    model.add_argument("--aggregator", choices=("last", "mean"), default="last", help="how one batch's messages "
                       "to a node are combined")
    model.add_argument("--no-edge-features", action="store_true", help="ignore the events' feature columns")
    model.add_argument("--init", choices=("xavier", "torch"), default="xavier", help="initial weights: as the "
                       "reference TGN (xavier) or nn.Linear's default (torch, what runs before this option used)")
    model.add_argument("--static-memory", action="store_true", help="add a learnable vector per node to the "
                       "dynamic memory the embedding reads (DistTGL's static node memory; num_nodes x memory-dim "
                       "more parameters, trained sparsely)")


def _add_loader_options(loader: argparse._ArgumentGroup) -> None:
    """Batches, neighbours and negatives."""
    loader.add_argument("--batch-size", type=int, default=200, help="consecutive events per step (on several "
                        "ranks: the global batch). With --neighbor-cutoff batch a batch never sees its "
                        "own events, so smaller batches see more recent history: 20 reached Wikipedia's AP "
                        "targets here, with 10x the steps per epoch")
    loader.add_argument("--sync-every", type=int, default=1, metavar="S", help="batches per optimizer step: "
                        "gradients accumulate over S consecutive batches while the memory advances every batch; "
                        "on several ranks one gradient sum per S batches")
    loader.add_argument("--num-neighbors", type=int, default=10, help="past events each node attends over")
    loader.add_argument("--sampling", choices=("recent", "uniform"), default="recent")
    loader.add_argument("--neighbor-cutoff", choices=("batch", "event"), default="event", help="a query's "
                        "neighbours are events strictly before its own event (event, as TGN/TGL: its batch's "
                        "earlier events too) or strictly before its batch's first event (batch: the rule before "
                        "this default, which needs small batches)")
    loader.add_argument("--train-negatives", choices=("all", "train", "seen"), default="all", help="where training "
                        "negatives come from: every destination of the stream (all), the training events' "
                        "destinations (train, as the reference TGN), or those seen up to the batch (seen); "
                        "evaluation draws from every destination")


def _add_distributed_options(dist: argparse._ArgumentGroup) -> None:
    """How several ranks share the memory and the stream."""
    dist.add_argument("--parallelism", choices=("sharded", "memory", "epoch"), default="sharded", help="sharded: "
                      "one node memory owned by rank, every rank a share of each global batch; memory: every rank "
                      "holds a whole memory and trains on its own time segment, gradients averaged each step "
                      "(DistTGL); epoch: every rank holds a whole memory and walks the whole stream, rank r r steps "
                      "behind with its own negatives, so an epoch trains every event once per rank (DistTGL)")
    dist.add_argument("--staleness", type=int, default=0, metavar="K", help="sharded: the most global steps a "
                      "read of node memory may be behind other ranks' writes; 0 = synchronous, the single-process "
                      "semantics; K >= 1 sends the writes of every K steps in one exchange that runs while the "
                      "next step computes")
    dist.add_argument("--memory-cache-rows", type=int, default=None, metavar="ROWS", help="sharded: each rank's "
                      "memory table holds the nodes it owns plus ROWS others, least recently read evicted first, "
                      "missing rows fetched from their owners (default: every node on every rank, nothing fetched)")
    dist.add_argument("--partition-method", choices=("metis", "random"), default="metis", help="how node memory "
                      "is assigned to ranks: METIS on the training interactions (few remote reads) or random")
    dist.add_argument("--wire-dtype", choices=WIRE_DTYPES, default="float32", help="sharded: how memory rows "
                      "(and a bounded cache's fetched memory and mail rows) cross ranks, d values a row: float32 "
                      "exact (4d bytes); float16 (2d) within 2^-11 relative; bfloat16 (2d) within 2^-8 relative; "
                      "int8 (d+4) within max|row|/254 absolute. Times travel exactly; messages are rebuilt from "
                      "the rows on arrival, so they never travel")
    dist.add_argument("--grad-dtype", choices=("float32", "bfloat16"), default="float32", help="the dtype "
                      "gradients are summed in across ranks: bfloat16 halves the bytes of every gradient sum (on a "
                      "slow link most of a run's traffic) at 8 significant bits per rank's gradient and partial sum")
    dist.add_argument("--event-split", choices=("balanced", "owner"), default="balanced", help="which rank computes "
                      "an event: the owner of its source (fewer remote reads), or that owner up to an equal share "
                      "of each batch (no rank waits for a busier one)")


def build_parser() -> argparse.ArgumentParser:
    """The command line: the sections of :mod:`gnnscale.options` plus TGN's own options."""
    parser = Parser(
        prog="gnnscale-train-temporal",
        description="Temporal link prediction with TGN (memory + temporal attention) on a chronological "
                    "70/15/15 split with TGN's inductive protocol; writes metrics.json with val/test AP and MRR, "
                    "transductive and inductive.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, default="wikipedia",
                      help="wikipedia/collegemsg: the dataset folder (default: ../shared/datasets/<dataset>); csv: "
                           "a JODIE-layout file u,i,ts,label[,features]; snap: 'src dst time' lines; npz: arrays "
                           "src, dst, t [, edge_features, labels]; synthetic: a generated stream of bursty users and "
                           "communities (--num-nodes, --num-events, --seed); dense-synthetic: a generated dense "
                           "stream, few nodes with long histories and drifting interests (same options)")
    add_section(parser, "data", group=data)
    data.add_argument("--num-nodes", type=int, default=None, help="synthetic, dense-synthetic: users plus items "
                      "(default 100,000 and 800)")
    data.add_argument("--num-events", type=int, default=None, help="synthetic, dense-synthetic: events in the stream "
                      "(default 2,000,000 and 80,000)")
    data.add_argument("--new-node-fraction", type=float, default=0.1, help="share of the nodes appearing after the "
                      "validation cut held out of training (inductive evaluation)")
    _add_model_options(parser.add_argument_group("model"))
    # TGN's Adam has no weight decay, and it evaluates after every epoch; lr: None is the trainer's default_lr,
    # 5e-4 (TGN's own 1e-4 converged several times slower on Wikipedia), times R for R memory groups.
    optimisation = add_section(parser, "optimisation", without=("--weight-decay", "--eval-every"), lr=None)
    optimisation.add_argument("--eval-negatives", type=int, default=10, help="negative destinations per event "
                              "for MRR")
    _add_loader_options(parser.add_argument_group("loader"))
    _add_distributed_options(add_section(parser, "distributed"))
    # The temporal trainer's checkpoints stop the run on a failed write (no --on-checkpoint-error policy).
    add_section(parser, "checkpoint", without=("--on-checkpoint-error",))
    add_section(parser, "run")
    return parser


def _one_process(args: argparse.Namespace, world_size: int) -> bool:
    return world_size == 1


def _memory_groups(args: argparse.Namespace, world_size: int) -> bool:
    """Every rank holds a whole memory: memory or epoch parallelism."""
    return world_size > 1 and args.parallelism in ("memory", "epoch")


NO_EFFECT = (
    NoEffect("--staleness", _one_process, "one process reads every node memory exactly"),
    NoEffect("--partition-method", _one_process, "one process owns every node memory"),
    NoEffect("--event-split", _one_process, "one process computes every event"),
    NoEffect("--parallelism", _one_process, "one process is one memory group"),
    NoEffect("--staleness", _memory_groups, "each rank reads its own whole memory exactly"),
    NoEffect("--memory-cache-rows", _one_process, "one process holds every node memory"),
    NoEffect("--memory-cache-rows", _memory_groups, "each rank holds every node memory"),
    NoEffect("--partition-method", _memory_groups, "each rank holds every node memory"),
    NoEffect("--event-split", _memory_groups, "each rank computes all events of its batches"),
    NoEffect("--wire-dtype", _one_process, "a world of one sends no rows over a wire"),
    NoEffect("--grad-dtype", _one_process, "a world of one sums no gradients"),
    NoEffect("--wire-dtype", _memory_groups, "each rank holds every node memory: no memory row crosses ranks"),
    NoEffect("--failure-timeout", _one_process, "a world of one has no other rank to wait for"),
    NoEffect("--num-nodes", lambda args, _: args.dataset not in GENERATED, "only --dataset synthetic and "
             "dense-synthetic are generated"),
    NoEffect("--num-events", lambda args, _: args.dataset not in GENERATED, "only --dataset synthetic and "
             "dense-synthetic are generated"),
    NoEffect("--data-dir", lambda args, _: args.dataset in GENERATED, f"--dataset {'/'.join(GENERATED)} is generated"),
)
"""Given options that cannot matter for the run: :func:`main` warns about each (rank 0 only)."""


def generated_stream(args: argparse.Namespace):
    """The stream of ``--dataset synthetic`` or ``dense-synthetic``, sized by ``--num-nodes``/``--num-events``
    where given, else by its config's defaults."""
    from gnnscale.data.temporal_dense import DenseStreamConfig, generate_dense_stream
    from gnnscale.data.temporal_synthetic import TemporalStreamConfig, generate_temporal_stream

    config, generate = (TemporalStreamConfig, generate_temporal_stream) if args.dataset == "synthetic" else \
        (DenseStreamConfig, generate_dense_stream)
    sizes = {name: getattr(args, name) for name in ("num_nodes", "num_events") if getattr(args, name) is not None}
    return generate(config(**sizes, seed=args.seed))


def run(args: argparse.Namespace) -> dict:
    from gnnscale.data.temporal import chronological_split, load_temporal
    from gnnscale.distributed.env import read_env

    env = read_env()
    if env.rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    path = args.data_dir
    if path is None and args.dataset not in ("wikipedia", "collegemsg", *GENERATED):
        raise ValueError(f"--dataset {args.dataset} needs --data-dir FILE")
    start = time.perf_counter()
    if args.dataset in GENERATED:
        events = generated_stream(args)
    else:
        events = load_temporal(args.dataset, path if path is not None else
                               Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / args.dataset)
    if args.no_edge_features:
        events.edge_features = None
    split = chronological_split(events, new_node_fraction=args.new_node_fraction, seed=args.seed)
    log.info("loaded %s: %d nodes, %d events, %d edge features in %.1fs; train/val/test events %d/%d/%d, "
             "%d new nodes held out", events.name, events.num_nodes, events.num_events, events.num_edge_features,
             time.perf_counter() - start, split.train.sum(), split.val.sum(), split.test.sum(), len(split.new_nodes))
    out = args.out if args.out is not None else Path("runs") / (
        f"{events.name}-tgn-seed{args.seed}" + (f"-{env.world_size}r-" + (
            args.parallelism if args.parallelism != "sharded" else f"k{args.staleness}") if env.is_distributed else "")
        + (f"-{args.wire_dtype}" if args.wire_dtype != "float32" and env.is_distributed else "")
        + (f"-grad-{args.grad_dtype}" if args.grad_dtype != "float32" and env.is_distributed else ""))
    if not env.is_distributed and args.staleness:
        log.info("one process: every read is exact, --staleness %d has nothing to bound", args.staleness)
    best = _train(args, events, split, env, out)
    metrics = _metrics(args, events.name, best, env)
    if env.is_main:
        from gnnscale.train.cli import publish_metrics

        ranks = "" if not env.is_distributed else f" on {env.world_size} ranks" + (
            f" ({args.parallelism} parallelism)" if args.parallelism != "sharded" else f" (K={args.staleness}: staleness max "
            f"{metrics['staleness_max']}, mean {metrics['staleness_mean']:.3f})")
        publish_metrics(out / "metrics.json", metrics,
                        f"{events.name} tgn{ranks}: test AP {metrics['test_ap']:.4f} (inductive "
                        f"{metrics['test_ap_inductive']:.4f}), test MRR {metrics['test_mrr']:.4f}; val AP "
                        f"{metrics['val_ap']:.4f}; best epoch {best['best_epoch']}/{best['epochs_run']}")
    return metrics


def _metrics(args: argparse.Namespace, name: str, best: dict, env) -> dict:
    """``metrics.json``: the run's settings, the best epoch's figures, medians over epochs, the history."""
    def median(key: str) -> float:
        return statistics.median(r[key] for r in best["history"])

    several = env.is_distributed
    return {"dataset": name, "model": "tgn", "world_size": env.world_size, "staleness": args.staleness,
            "parallelism": best["parallelism"] if several else "none", "neighbor_cutoff": args.neighbor_cutoff,
            **{k: v for k, v in best.items() if k.startswith(("val_", "test_"))},
            "best_epoch": best["best_epoch"], "epochs_run": best["epochs_run"], "seconds": best["seconds"],
            "train_events_per_second": median("train_events_per_second"),
            "wire_dtype": args.wire_dtype if several else "float32",
            "grad_dtype": args.grad_dtype if several else "float32",
            "train_mib_sent_per_epoch": median("train_mib_sent"),
            "train_grad_mib_reduced_per_epoch": median("train_grad_mib_reduced"),
            "staleness_max": best["staleness_max_run"], "staleness_mean": best["staleness_mean_run"],
            "remote_read_fraction": best["remote_read_fraction"], "fetched_rows": best["fetched_rows_run"],
            "num_nodes": best["num_nodes"], "memory_rows_per_rank": best["memory_rows_per_rank"],
            "peak_rss_mib_per_rank": best["peak_rss_mib_per_rank"],
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "history": best["history"]}


def _train(args: argparse.Namespace, events, split, env, out: Path) -> dict:
    """The job (a world of one, or torchrun's) and the public API's temporal trainer in it."""
    import gnnscale as gs

    config = gs.TemporalTrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                                    num_neighbors=args.num_neighbors, sampling=args.sampling,
                                    eval_negatives=args.eval_negatives, patience=args.patience, seed=args.seed,
                                    device=args.device, staleness=args.staleness,
                                    event_split=args.event_split, neighbor_cutoff=args.neighbor_cutoff,
                                    parallelism=args.parallelism, sync_every=args.sync_every,
                                    memory_cache_rows=args.memory_cache_rows, train_negatives=args.train_negatives,
                                    wire_dtype=args.wire_dtype, grad_dtype=args.grad_dtype,
                                    checkpoint_every=args.checkpoint_every, resume=args.resume,
                                    partition_method=args.partition_method)
    memory_config = gs.MemoryConfig(memory_dim=args.memory_dim, time_dim=args.time_dim,
                                    edge_dim=events.num_edge_features, aggregator=args.aggregator)
    tgn_config = gs.TGNConfig(embedding_dim=args.embedding_dim, heads=args.heads, dropout=args.dropout,
                              init=args.init, static_memory=args.static_memory)
    # The trainer holds the job's groups: it must be gone when the job is left, so only its results leave the block.
    # The library names its arguments; inside the job a failing rank reports before main() sees the error.
    with gs.init(args.device, failure_timeout=args.failure_timeout, env=env) as world, flags_in_errors(build_parser()):
        return gs.TemporalLinkTrainer(events, split, world=world, memory_config=memory_config, tgn_config=tgn_config,
                                      config=config, out=out).fit()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scripts/train_temporal.py`` and ``gnnscale-train-temporal``; returns the exit status."""
    return run_command(build_parser(), sys.argv[1:] if argv is None else argv, run, NO_EFFECT)
