"""Time the synthetic generator and report its peak memory and the structure it planted.

    python scripts/bench_synthetic.py                                  # 1M nodes, 10M edges, 100 features
    python scripts/bench_synthetic.py --num-nodes 10000000 --feat-dim 16 --json bench_out/synthetic_100m.json

Peak RSS is the process high-water mark (``ru_maxrss``) right after generation, so
run one size per process.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from dataclasses import asdict
from pathlib import Path


from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
from gnnscale.train.cli import strict_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--feat-dim", type=int, default=100)
    parser.add_argument("--chunk-edges", type=int, default=SyntheticConfig.chunk_edges)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", action="store_true", help="print stage timings to stderr")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    config = SyntheticConfig(num_nodes=args.num_nodes, avg_degree=args.avg_degree, feat_dim=args.feat_dim,
                             chunk_edges=args.chunk_edges, seed=args.seed)
    baseline_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    ds = generate_synthetic(config, progress=args.progress)
    seconds = time.perf_counter() - start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB

    output_bytes = sum(a.nbytes for a in (ds.indptr, ds.indices, ds.features, ds.labels, ds.train_masks,
                                          ds.val_masks, ds.test_masks, ds.extra["community"]))
    degrees = ds.in_degrees()
    src, dst = ds.edges()
    community = ds.extra["community"]
    result = {
        "config": asdict(config),
        "num_nodes": ds.num_nodes,
        "num_edges": ds.num_edges,
        "seconds": round(seconds, 2),
        "peak_rss_gib": round(peak_rss / 2**30, 3),
        "rss_before_gib": round(baseline_rss / 2**30, 3),
        "output_gib": round(output_bytes / 2**30, 3),
        "avg_degree": round(ds.num_edges / ds.num_nodes, 4),
        "max_degree": int(degrees.max()),
        "isolated_fraction": round(float((degrees == 0).mean()), 4),
        "same_label_edge_fraction": round(float((ds.labels[src] == ds.labels[dst]).mean()), 4),
        "intra_community_edge_fraction": round(float((community[src] == community[dst]).mean()), 4),
    }
    width = max(map(len, result))
    for key, value in result.items():
        if key != "config":
            print(f"{key:<{width}}  {value:,}" if isinstance(value, int) else f"{key:<{width}}  {value}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(strict_json(result))
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
