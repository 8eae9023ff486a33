"""Command line: ``python -m partition ...`` (or ``gnnscale-partition``) and ``... verify DIR``.

Exit status: 0 on success; 1 when ``verify`` finds a problem; 2 for bad input (options, a dataset that
fails to load, an existing ``--out``); 130 when interrupted.  Every failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import signal
import sys
import tempfile
import warnings
from pathlib import Path

from gnnscale.data.cli import add_dataset_arguments, dataset_from_args
from gnnscale.data.dataset import GraphDataset
from gnnscale.options import Parser, check_out, check_ranges
from partition.config import BALANCE_CONSTRAINTS, METHODS, PartitionConfig
from partition.external import OutOfCorePlan, edge_file_rows, in_memory_bytes, load_out_of_core, plan_memory
from partition.format import PartitionError
from partition.partitioner import partition_graph
from partition.report import StageMonitor, format_report
from partition.verify import format_shares, verify
from partition.writer import check_output

log = logging.getLogger("partition")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gnnscale-partition",
        description="Partition a graph for distributed training: METIS (multi-constraint), KaMinPar or random "
                    "assignment, "
                    "contiguous relabelling, halo lists, per-partition memory-mappable arrays and a checksummed "
                    "manifest, written atomically.",
        epilog="Check a folder with: gnnscale-partition verify DIR [--dataset ... to compare with the source]",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataset_arguments(parser)
    group = parser.add_argument_group("partitioning")
    group.add_argument("--num-parts", type=int, required=True, help="number of partitions K, 1 <= K <= nodes")
    group.add_argument("--out", type=Path, required=True, help="partition folder to create")
    group.add_argument("--method", choices=METHODS, default="metis", help="metis: multi-constraint METIS; "
                       "kaminpar: KaMinPar (needs gnnscale[kaminpar]), a similar cut in a fraction of the memory; "
                       "random: seeded random assignment")
    group.add_argument("--kaminpar-threads", type=int, default=1, help="threads of --method kaminpar (more than "
                       "one: faster, but a seed no longer fixes the result)")
    group.add_argument("--kaminpar-context", default="default", help="KaMinPar preset of --method kaminpar: "
                       "default, fast, strong, terapart (compressed graph: least memory), eco, ...")
    group.add_argument("--balance", default=",".join(BALANCE_CONSTRAINTS),
                       help="balance constraints, comma-separated subset of " + ",".join(BALANCE_CONSTRAINTS)
                       + " (train: the training nodes of --split); METIS gets one weight column each, KaMinPar "
                       "their sum, and the rebalance pass holds each within 1.03")
    group.add_argument("--part-weights", metavar="W0,W1,...", help="relative partition sizes, one positive number "
                       "per partition (e.g. 1,2: partition 1 twice partition 0, for a rank twice as fast); every "
                       "--balance constraint targets these shares; None = equal")
    group.add_argument("--no-rebalance", action="store_true", help="keep METIS' (or KaMinPar's) assignment even "
                       "where it misses its balance tolerance (1.03 per constraint): smaller cut, worse balance")
    group.add_argument("--halo-hops", type=int, default=1, help="list non-owned nodes within this many in-hops")
    lean = parser.add_argument_group("memory (an edge-list folder: --dataset edgelist)")
    lean.add_argument("--out-of-core", action="store_true", help="never hold the edge list: build the CSC on disk "
                      "by an external sort (chunks of edges.npy or the text file, buckets merged one at a time), "
                      "then partition and write from memory-mapped arrays; the same folder as without it")
    lean.add_argument("--memory-budget", type=float, metavar="MIB", help="MiB the command may hold: picks the "
                      "out-of-core chunk sizes, switches to --out-of-core when the in-memory estimate is above it, "
                      "and refuses in one line a graph that cannot fit (estimates: docs/partitioning.md)")
    lean.add_argument("--scratch-dir", type=Path, help="where --out-of-core keeps its sorted buckets and CSC "
                      "(about 16 bytes per edge, removed at the end); default: beside --out")
    group.add_argument("--force", action="store_true", help="replace an existing partition folder (only once "
                       "the new one is complete)")
    parser.add_argument("--quiet", action="store_true", help="no per-stage progress lines")
    return parser


def build_verify_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gnnscale-partition verify",
        description="Check a partition folder: checksums, id ranges, ownership, structure, halos; with --dataset "
                    "also that every edge, feature, label and mask equals the source's.  Exits 1 at the first "
                    "problem, naming it.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("dir", type=Path, help="the partition folder")
    add_dataset_arguments(parser, default=None)
    parser.add_argument("--no-checksums", action="store_true", help="skip hashing the files (sizes are still "
                        "checked)")
    parser.add_argument("--quiet", action="store_true", help="print only the result")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m partition`` and ``gnnscale-partition``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    program = "python -m partition" if sys.argv[0].endswith("__main__.py") else Path(sys.argv[0]).name
    command = f"{program} {shlex.join(argv)}"
    shown = warnings.showwarning
    # Warnings are user-facing here: one line each, not a file:line fragment of source.
    warnings.showwarning = lambda message, category, *rest: print(f"warning: {message}", file=sys.stderr)
    try:
        return verify_main(argv[1:]) if argv[:1] == ["verify"] else partition_main(argv, command)
    finally:
        warnings.showwarning = shown


def partition_main(argv: list[str], command: str) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_output(args.quiet)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a killed run cleans up like Ctrl-C
    try:
        check_ranges(parser, args)
        config = PartitionConfig(num_parts=args.num_parts, method=args.method, balance=args.balance,
                                 halo_hops=args.halo_hops, seed=args.seed, split=args.split,
                                 rebalance=not args.no_rebalance, part_weights=args.part_weights,
                                 kaminpar_threads=args.kaminpar_threads, kaminpar_context=args.kaminpar_context)
        check_output(args.out, args.force)  # before a load that may take minutes
        check_out(args.out)
        monitor = StageMonitor(log.info)
        with contextlib.ExitStack() as scratch:  # the out-of-core CSC lives until the folder is written
            dataset = _load(args, config, monitor, scratch)
            log.info("loaded %r", dataset)
            manifest = partition_graph(dataset, args.out, config, force=args.force, command=command,
                                       monitor=monitor)
    except (ValueError, OSError) as exc:  # bad input, a dataset that fails to load, an existing --out
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: nothing written to {args.out}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(format_report(manifest))
    print(f"wrote {args.out} ({config.num_parts} partitions); check it with: gnnscale-partition verify {args.out}")
    return 0


def _load(args: argparse.Namespace, config: PartitionConfig, monitor: StageMonitor,
          scratch: contextlib.ExitStack) -> GraphDataset:
    """The dataset to partition: in memory, or with ``--out-of-core`` (or a ``--memory-budget`` the in-memory
    pipeline would exceed) its CSC built on disk in a scratch folder that ``scratch`` removes."""
    lean, plan = args.out_of_core, OutOfCorePlan()
    if args.dataset != "edgelist":
        if lean or args.memory_budget is not None:
            raise ValueError(f"--{'out-of-core' if lean else 'memory-budget'} reads an edge-list folder, not "
                             f"--dataset {args.dataset}: write the graph as one (edges.npy, features.npy, labels.npy;"
                             f" gnnscale/data/edgelist.py) and pass --dataset edgelist --data-dir DIR")
    elif lean or args.memory_budget is not None:
        num_nodes, rows = edge_file_rows(Path(args.data_dir))
        if not lean and in_memory_bytes(config.method, rows) > args.memory_budget * 2**20:
            log.info("the in-memory pipeline would need about %.0f MiB, above --memory-budget %g MiB: out of core",
                     in_memory_bytes(config.method, rows) / 2**20, args.memory_budget)
            lean = True
        if lean:  # the file's rows stand for the entries until the sort has counted them
            plan = plan_memory(args.memory_budget, num_nodes, rows, method=config.method,
                               context=config.kaminpar_context, exact=False)
    if not lean:
        with monitor.stage("load"):  # features read page by page when written, never all resident
            return dataset_from_args(args, map_features=True)
    parent = args.scratch_dir or next(p for p in [args.out.absolute(), *args.out.absolute().parents] if p.is_dir())
    check_out(parent, "--scratch-dir")
    folder = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix=f".{args.out.name}.scratch-",
                                                                    dir=parent)))
    log.info("out of core: edges read %s rows at a time, buckets of up to %s keys, in %s", f"{plan.chunk_edges:,}",
             f"{plan.bucket_edges:,}", folder)
    with monitor.stage("load"):  # count, scatter and sort are its parts
        dataset = load_out_of_core(Path(args.data_dir), folder, plan, seed=args.seed, stage=monitor.stage)
    plan_memory(args.memory_budget, dataset.num_nodes, dataset.num_edges, method=config.method,
                context=config.kaminpar_context)  # the exact count: refuse before the partitioner runs
    return dataset


def verify_main(argv: list[str]) -> int:
    args = build_verify_parser().parse_args(argv)
    _setup_output(args.quiet)
    try:
        dataset = dataset_from_args(args, map_features=True) if args.dataset is not None else None
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = verify(args.dir, dataset, checksums=not args.no_checksums, log=lambda line: log.info("ok: %s", line))
    except (PartitionError, FileNotFoundError) as exc:
        print(f"verify failed: {exc}", file=sys.stderr)
        return 1
    compared = f", equal to dataset {summary['dataset']}" if summary["dataset"] else ""
    shares = f"; shares {format_shares(summary['shares'])}" if summary["shares"] else ""
    print(f"OK {args.dir}: {summary['num_parts']} partitions, {summary['num_nodes']:,} nodes, "
          f"{summary['num_edges']:,} edges{compared}" + ("" if summary["checksums"] else " (checksums skipped)")
          + shares)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _setup_output(quiet: bool) -> None:
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
