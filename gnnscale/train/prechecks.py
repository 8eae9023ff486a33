"""The node classification command's checks that depend on the job, run before anything is written.

Under torchrun without ``--partitions`` rank 0 writes ``<out>/partitions`` before the trainer starts; an
option the trainer would refuse afterwards (a weight per rank of ``--rank-capacity``, a topology budget the
graph exceeds, a checkpoint of another world size) would leave that folder behind.  So the same refusals are
made here first, from the command line, the world size, the checkpoint and the graph's size alone, with the
trainer's own messages.  Every rank finds the same (its inputs are the same on every rank): a
:class:`JobOptionError` is printed by rank 0 only, one line per job.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gnnscale.options import JobOptionError


def check_job_options(args: argparse.Namespace, world_size: int, out: Path) -> None:
    """What the command line, the world size and ``out``'s checkpoint decide.

    Raises:
        JobOptionError: the first option the trainer would refuse.
    """
    try:
        _check_options(args, world_size, out)
    except ValueError as err:
        raise JobOptionError(str(err)) from None


def _check_options(args: argparse.Namespace, world_size: int, out: Path) -> None:
    from gnnscale.distributed.capacity import parse_capacity

    if world_size > 1:
        parse_capacity(args.rank_capacity, world_size)
        if args.topology == "partitioned":
            check_replicated_needs(args, replicated=False)
    if args.resume and world_size > 1 and args.partitions is None and (out / "checkpoint.pt").exists():
        from gnnscale.train.checkpoint import load_checkpoint

        # Before rank 0 writes <out>/partitions, what is known before the data (the trainer compares the whole
        # fingerprint when it resumes; elsewhere nothing is written before it does).
        load_checkpoint(out / "checkpoint.pt", {"world_size": world_size})


def check_replicated_needs(args: argparse.Namespace, *, replicated: bool) -> None:
    """The options that need the replicated topology, given whether the run gets it (the trainer's messages).

    Raises:
        ValueError: ``--cache-policy vip`` with a cache on a partitioned topology that cannot rank it (no halo
            copy, seeds dealt by capacity, or more than two layers), or ``--rank-capacity auto`` there.
    """
    if replicated:
        return
    halo_ranks_vip = args.topology_budget_mb > 0 and args.rank_capacity is None and args.num_layers <= 2
    if args.cache_policy == "vip" and args.cache_mb != 0 and not halo_ranks_vip:
        raise ValueError("--cache-policy vip needs every node a batch can reach: the whole graph structure on "
                         "every rank (--topology replicated, or auto within --topology-budget-mb), or the "
                         "partitioned topology's halo copy (--topology-budget-mb > 0, no --rank-capacity, at most "
                         "two layers); or use another --cache-policy")
    if args.rank_capacity == "auto":
        raise ValueError("--rank-capacity auto times each rank's steps alone, which needs the replicated "
                         "topology (sampling without requests): raise --topology-budget-mb, or give the "
                         "weights, e.g. --rank-capacity 2,1")


def needs_graph_size(args: argparse.Namespace, world_size: int) -> bool:
    """Whether :func:`check_graph_size` can refuse anything: several ranks and a topology that may not fit."""
    if world_size == 1 or args.topology == "partitioned":
        return False
    return args.topology == "replicated" or args.cache_policy == "vip" or args.rank_capacity == "auto"


def check_graph_size(args: argparse.Namespace, num_nodes: int, num_edges: int) -> None:
    """What the whole graph's size decides: ``--topology replicated`` within ``--topology-budget-mb``, and the
    options that need the topology ``auto`` resolves to (a world of more than one).

    Raises:
        JobOptionError: with the trainer's message.
    """
    from samplers.distributed import structure_bytes

    size = structure_bytes(num_nodes, num_edges)
    fits = size <= args.topology_budget_mb * 2**20
    try:
        if args.topology == "replicated" and not fits:
            raise ValueError(f"--topology replicated needs {size / 2**20:.1f} MiB per rank for the whole graph "
                             f"structure, over --topology-budget-mb {args.topology_budget_mb:g}; raise the "
                             f"budget or use --topology partitioned")
        check_replicated_needs(args, replicated=args.topology != "partitioned" and fits)
    except ValueError as err:
        raise JobOptionError(str(err)) from None
