"""What ``load_partition``'s semantic checks cost, against the load they guard.

    python scripts/bench_load_checks.py                    # 1M nodes, ~10M edges, 100-d features, K=4
    python scripts/bench_load_checks.py --parts DIR        # an existing partition folder

Partitions the synthetic benchmark graph (the one ``bench_partition.py`` and
``bench_distributed.py`` use) with ``python -m partition``, unless ``--parts`` names a folder,
then for every rank, in a fresh child process each, twice:

* ``warm``: the folder's files in the page cache (a rank starting on the host that just wrote
  them): reading is a memory copy, the fastest a load can be;
* ``cold``: the page cache dropped first (``/proc/sys/vm/drop_caches``; needs root, else
  skipped with a note): a rank starting on a fresh host, reading from disk.

Each child times:

* ``open``: ``load_partition(DIR, rank, check=False)`` (manifest, headers, memory maps);
* ``read``: reading every array of the rank into memory, which training does at start
  (``resident`` copies of the graph, features and labels): the load the checks guard;
* ``checks``: :func:`partition.load.check_partition` on what was opened, after the read, so
  that it is charged only its own work (run first, as ``load_partition`` does, it would pay
  part of the same disk reads instead of ``read``).

Reported per rank and as the median: seconds of each, and ``checks / (open + read)``,
the cost of the checks as a share of loading; the target is below 0.10.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--parts", type=Path, default=None, help="an existing partition folder (default: "
                        "partition the synthetic graph into a temporary folder)")
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--feat-dim", type=int, default=100)
    parser.add_argument("--num-parts", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_load_checks.json")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def child(parts: Path, rank: int) -> dict:
    """One rank's timings, in this (fresh) process."""
    from partition.format import PART_ARRAYS
    from partition.load import check_partition, load_partition

    start = time.perf_counter()
    part = load_partition(parts, rank, check=False)
    opened = time.perf_counter()
    arrays = {name: getattr(part, name) for name in PART_ARRAYS}
    total = sum(int(np.array(array).nbytes) for array in arrays.values())  # np.array copies: a real read
    np.array(part.book.orig2new)  # the shared map too: the checks read it
    read = time.perf_counter()
    check_partition(parts, part.manifest, rank, arrays, part.book.orig2new)
    checked = time.perf_counter()
    return {"rank": rank, "open_s": opened - start, "read_s": read - opened, "checks_s": checked - read,
            "bytes": total, "num_nodes": part.num_nodes, "num_edges": part.num_edges}


def drop_page_cache() -> str | None:
    """Empty the page cache; the reason when this process may not."""
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as error:
        return f"cannot drop the page cache ({error.strerror}; run as root)"
    return None


def measure(parts: Path, num_parts: int, mode: str) -> dict:
    """Every rank's timings in ``mode`` (warm or cold), printed as they come, and their medians."""
    ranks = []
    for rank in range(num_parts):
        if mode == "cold" and (reason := drop_page_cache()) is not None:
            print(f"cold: skipped: {reason}")
            return {"skipped": reason}
        done = subprocess.run([sys.executable, __file__, "--parts", str(parts), "--child", str(rank)],
                              check=True, capture_output=True, text=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r["checks_share"] = r["checks_s"] / (r["open_s"] + r["read_s"])
        ranks.append(r)
        print(f"{mode} rank {rank}: {r['num_nodes']:,} nodes, {r['num_edges']:,} in-edges, {r['bytes'] / 2**20:.0f} "
              f"MiB; open {r['open_s']:.3f}s, read {r['read_s']:.3f}s, checks {r['checks_s']:.3f}s: checks = "
              f"{r['checks_share']:.3f} of loading", flush=True)
    median = {key: statistics.median(r[key] for r in ranks) for key in ("open_s", "read_s", "checks_s",
                                                                        "checks_share")}
    met = "met" if median["checks_share"] < TARGET else "NOT MET"
    print(f"{mode}: median over {len(ranks)} ranks: checks {median['checks_s']:.3f}s = {median['checks_share']:.3f} "
          f"of loading (open {median['open_s']:.3f}s + read {median['read_s']:.3f}s); target < {TARGET}: {met}")
    return {"ranks": ranks, "median": median}


TARGET = 0.10


def main() -> None:
    args = build_parser().parse_args()
    if args.child is not None:
        print(json.dumps(child(args.parts, args.child)))
        return
    with tempfile.TemporaryDirectory(prefix="bench_load_checks_") as tmp:
        parts = args.parts
        if parts is None:
            parts = Path(tmp) / "parts"
            print(f"partitioning {args.num_nodes:,} synthetic nodes into {args.num_parts} ...", flush=True)
            subprocess.run([sys.executable, "-m", "partition", "--dataset", "synthetic", "--num-nodes",
                            str(args.num_nodes), "--feat-dim", str(args.feat_dim), "--num-parts", str(args.num_parts),
                            "--out", str(parts), "--quiet"], check=True, stdout=subprocess.DEVNULL)
        num_parts = json.loads((parts / "manifest.json").read_text())["num_parts"]
        results = {mode: measure(parts, num_parts, mode) for mode in ("warm", "cold")}
    from gnnscale.train.cli import strict_json

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json({**results, "target": TARGET}))


if __name__ == "__main__":
    main()
