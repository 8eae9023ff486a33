"""Command line: ``python -m partition ...`` (or ``gnnscale-partition``) and ``... verify DIR``.

Exit status: 0 on success; 1 when ``verify`` finds a problem; 2 for bad input (options, a dataset that
fails to load, an existing ``--out``); 130 when interrupted.  Every failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import warnings
from pathlib import Path

from gnnscale.data.cli import add_dataset_arguments, dataset_from_args
from gnnscale.options import Parser, check_out, check_ranges
from partition.config import BALANCE_CONSTRAINTS, METHODS, PartitionConfig
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
        with monitor.stage("load"):  # features read page by page when written, never all resident
            dataset = dataset_from_args(args, map_features=True)
        log.info("loaded %r", dataset)
        manifest = partition_graph(dataset, args.out, config, force=args.force, command=command, monitor=monitor)
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
