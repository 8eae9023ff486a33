"""One rank's feature gather, by the id map in block order against grouped with a renumbered block.

    python -m partition --dataset synthetic --num-nodes 1000000 --num-parts 1 --out parts/synthetic-1
    python scripts/bench_gather.py --partitions parts/synthetic-1

Takes a one-partition folder (the whole graph), plays rank 0 of two (it owns the first half of the
nodes and caches every other row, as ``--cache-mb`` large enough does), samples ``--batches``
batches of ``--batch-size`` training seeds, and times per batch, on one thread:

* ``grouped``: :meth:`DistTable.gather_batch` without the id map (rows found by search and sort,
  written grouped, the first block renumbered);
* ``ordered``: the same with the id map (owned and cached rows joined, gathered in block order);
* ``plain``: one gather from the whole table in block order, what a single process does.

It also counts what half-size batches cost: the input rows and edges of two batches of
``--batch-size`` seeds against one of twice as many (the 2-rank step against the 1-rank step on
the union of its seeds).  Prints a table; ``--out`` writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gnnscale.distributed.feature_store import DistTable  # noqa: E402
from gnnscale.pipeline.native import gather_rows  # noqa: E402
from partition.load import load_partition  # noqa: E402
from samplers import NeighborSampler, SamplerConfig  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--partitions", type=Path, required=True, help="a folder of ONE partition (the whole graph)")
    parser.add_argument("--batch-size", type=int, default=1000, help="seeds per rank and step")
    parser.add_argument("--fanouts", default="10,25")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the batches; medians reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON of the figures")
    return parser


def rank0_table(features: torch.Tensor, use_id_map: bool) -> DistTable:
    """Rank 0 of two without a process group: owns the first half, every other row cached (complete)."""
    num_nodes = features.shape[0]
    half = num_nodes // 2
    table = DistTable(features[:half].clone(), torch.tensor([0, half, num_nodes]),
                      types.SimpleNamespace(rank=0, world_size=2))  # type: ignore[arg-type]
    table.use_id_map, table.cache_complete = use_id_map, True
    table.cache_ids, table.cache_rows = torch.arange(half, num_nodes), features[half:].clone()
    table._where_map()  # joined now, as a cache fill does, not inside the timing
    return table


def time_per_batch(gather, batches: list, repeats: int) -> float:
    """Median over ``repeats`` passes of the mean milliseconds per batch."""
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            gather(batch)
        passes.append(1000 * (time.perf_counter() - start) / len(batches))
    return statistics.median(passes)


def half_batch_cost(sampler: NeighborSampler, train: torch.Tensor, args: argparse.Namespace) -> dict:
    """Input rows and edges of two batches of ``batch_size`` seeds over one batch of their union."""
    rng = np.random.default_rng(args.seed + 1)
    rows, edges = np.zeros(2), np.zeros(2)
    for _ in range(args.batches):
        seeds = train[torch.from_numpy(rng.choice(train.numel(), 2 * args.batch_size, replace=False))]
        for side, parts in enumerate(([seeds], list(seeds.split(args.batch_size)))):
            for part in parts:
                batch = sampler.sample(part, rng=rng)
                rows[side] += batch.input_ids.numel()
                edges[side] += sum(block.indices.numel() for block in batch.blocks)
    return {"input_rows_ratio": rows[1] / rows[0], "edges_ratio": edges[1] / edges[0],
            "input_rows_per_union_batch": rows[0] / args.batches}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    try:
        part = load_partition(args.partitions, 0)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if part.book.num_parts != 1:
        print(f"error: {args.partitions} holds {part.book.num_parts} partitions; give a one-partition folder "
              f"(python -m partition ... --num-parts 1)", file=sys.stderr)
        return 2
    features = torch.from_numpy(np.array(part.features, dtype=np.float32))
    sampler = NeighborSampler(np.array(part.indptr), np.array(part.indices),  # in memory, writable
                              SamplerConfig(fanouts=[int(f) for f in args.fanouts.split(",")]))
    train = torch.from_numpy(np.flatnonzero(part.train_masks[0]))
    rng = np.random.default_rng(args.seed)
    batches = [sampler.sample(train[torch.from_numpy(rng.choice(train.numel(), args.batch_size, replace=False))],
                              rng=rng) for _ in range(args.batches)]
    buffer = torch.empty(max(b.input_ids.numel() + b.blocks[0].num_dst for b in batches), features.shape[1])

    def take(rows: int, like: torch.Tensor) -> torch.Tensor:
        return buffer[:rows]

    grouped, ordered = rank0_table(features, False), rank0_table(features, True)
    result = {
        "grouped_ms": time_per_batch(lambda b: grouped.gather_batch(b, take), batches, args.repeats),
        "ordered_ms": time_per_batch(lambda b: ordered.gather_batch(b, take), batches, args.repeats),
        "plain_ms": time_per_batch(lambda b: gather_rows(features, b.input_ids, buffer[:b.input_ids.numel()]),
                                   batches, args.repeats),
        "input_rows_per_batch": statistics.mean(b.input_ids.numel() for b in batches),
        **half_batch_cost(sampler, train, args), "args": {k: str(v) for k, v in vars(args).items()}}
    print(f"| gather of one rank's batch ({result['input_rows_per_batch']:.0f} input rows x {features.shape[1]}) "
          f"| ms |\n|---|---|\n| grouped, first block renumbered | {result['grouped_ms']:.2f} |\n"
          f"| ordered by the id map | {result['ordered_ms']:.2f} |\n| plain, one process | {result['plain_ms']:.2f} |")
    print(f"2 x {args.batch_size} seeds against 1 x {2 * args.batch_size}: input rows "
          f"{result['input_rows_ratio']:.3f}x, edges {result['edges_ratio']:.3f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
