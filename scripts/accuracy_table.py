"""Reproduce the README's accuracy table: every recipe over its seeds or splits, mean and std.

    python scripts/accuracy_table.py                      # all recipes (tens of minutes on 2 cores)
    python scripts/accuracy_table.py --only cora-gcn      # one recipe
    python scripts/accuracy_table.py --data-root ../shared/datasets --out runs/accuracy
    python scripts/accuracy_table.py --only cora-gcn --ranks 4   # distributed: 4 gloo ranks per run

Writes ``OUT/<recipe>/<run>/metrics.json`` per run and ``OUT/summary.json``; prints a Markdown table.
With ``--ranks K`` each dataset is partitioned once into ``OUT/partitions/<dataset>-<K>parts``
(METIS, reused when present) and every run is ``torchrun --standalone --nproc_per_node=K
scripts/train_node_classification.py --partitions DIR ...`` with the same recipe, its
``--batch-size`` divided by K (the option is per rank; so the global batch is the recipe's); the summary
gets ``"ranks": K`` (1 for single-process runs), so the two tables can be compared row by row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from gnnscale.train.cli import main as train_main
from gnnscale.train.cli import write_json_atomic

PLANETOID = ["--num-layers", "2", "--fanouts", "-1,-1", "--batch-size", "140", "--weight-decay", "5e-4"]
GCN = PLANETOID + ["--model", "gcn", "--hidden", "16", "--epochs", "200", "--lr", "0.01", "--dropout", "0.5"]
SAGE = PLANETOID + ["--model", "sage", "--hidden", "16", "--epochs", "200", "--lr", "0.01", "--dropout", "0.5"]
GAT = PLANETOID + ["--model", "gat", "--hidden", "8", "--heads", "8", "--epochs", "300", "--lr", "0.005",
                   "--dropout", "0.6", "--input-dropout", "0.6", "--attn-dropout", "0.6"]
TOLOKERS = ["--model", "sage", "--num-layers", "2", "--hidden", "128", "--fanouts", "10,10", "--batch-size", "512",
            "--epochs", "100", "--eval-every", "5", "--lr", "0.003", "--dropout", "0.2", "--weight-decay", "0",
            "--residual"]

# name -> (dataset, training arguments, what varies: "seed" or "split", how many, target, published)
RECIPES: dict[str, tuple[str, list[str], str, int, float, str]] = {
    "cora-gcn": ("cora", GCN, "seed", 5, 0.805, "0.815"),
    "cora-sage": ("cora", SAGE, "seed", 5, 0.79, "-"),
    "cora-gat": ("cora", GAT, "seed", 5, 0.815, "0.830"),
    "citeseer-gcn": ("citeseer", GCN, "seed", 5, 0.695, "0.703"),
    "tolokers-sage": ("tolokers", TOLOKERS, "split", 10, 0.820, "0.8243 ± 0.0044"),
}


SCRIPTS = Path(__file__).resolve().parent


def ensure_partitions(dataset: str, data_dir: Path, num_parts: int, root: Path) -> Path:
    """``root/<dataset>-<num_parts>parts``, partitioned with ``python -m partition`` unless already there."""
    from partition.format import read_manifest

    out = root / f"{dataset}-{num_parts}parts"
    if (out / "manifest.json").exists() and read_manifest(out)["num_parts"] == num_parts:
        return out
    command = [sys.executable, "-m", "partition", "--dataset", dataset, "--data-dir", str(data_dir),
               "--num-parts", str(num_parts), "--out", str(out), "--force", "--quiet"]
    if subprocess.run(command).returncode != 0:
        raise SystemExit(f"partitioning {dataset} into {num_parts} parts failed: {' '.join(command)}")
    return out


def run_distributed(num_ranks: int, partitions: Path, cli: list[str]) -> None:
    """One run on ``num_ranks`` local gloo ranks through torchrun (``python -m torch.distributed.run``)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={num_ranks}",
               str(SCRIPTS / "train_node_classification.py"), "--partitions", str(partitions), *cli]
    if subprocess.run(command).returncode != 0:
        raise SystemExit(f"distributed run failed: {' '.join(command)}")


def per_rank_batch(train_args: list[str], ranks: int) -> list[str]:
    """The recipe with ``--batch-size`` divided among ``ranks`` (it is per rank), so the global batch is the recipe's."""
    out = list(train_args)
    if ranks > 1 and "--batch-size" in out:
        i = out.index("--batch-size") + 1
        out[i] = str(max(1, int(out[i]) // ranks))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--out", type=Path, default=None, help="default: runs/accuracy, or runs/accuracy-<K>ranks "
                        "with --ranks K")
    parser.add_argument("--only", nargs="*", choices=sorted(RECIPES), help="run only these recipes")
    parser.add_argument("--ranks", type=int, default=1, help="train each run on this many local gloo ranks "
                        "(torchrun, one METIS partition per rank); 1 = single process")
    args = parser.parse_args()
    if args.ranks < 1:
        parser.error(f"--ranks must be >= 1, got {args.ranks}")
    if args.out is None:
        args.out = Path("runs/accuracy") if args.ranks == 1 else Path(f"runs/accuracy-{args.ranks}ranks")

    summary = {}
    for name in args.only or RECIPES:
        dataset, train_args, varies, count, target, published = RECIPES[name]
        scores = []
        data = ["--dataset", dataset, "--data-dir", str(args.data_root / dataset)]
        if args.ranks > 1:
            partitions = ensure_partitions(dataset, args.data_root / dataset, args.ranks, args.out / "partitions")
        for i in range(count):
            out = args.out / name / f"{varies}{i}"
            run_args = [*per_rank_batch(train_args, args.ranks), f"--{varies}", str(i), "--out", str(out), "--quiet"]
            if args.ranks > 1:
                run_distributed(args.ranks, partitions, run_args)
            elif train_main([*data, *run_args]) != 0:
                raise SystemExit(f"{name} {varies} {i} failed")
            scores.append(json.loads((out / "metrics.json").read_text())["test"])
        metric = json.loads((out / "metrics.json").read_text())["metric"]
        if args.ranks > 1:
            launcher = ["torchrun", "--standalone", f"--nproc_per_node={args.ranks}",
                        "scripts/train_node_classification.py", "--partitions", str(partitions)]
        else:
            launcher = ["python", "scripts/train_node_classification.py", *data]
        summary[name] = {"metric": metric, "mean": statistics.mean(scores), "std": statistics.pstdev(scores),
                         "scores": scores, "over": f"{count} {varies}s", "ranks": args.ranks, "target": target,
                         "published": published,
                         "command": " ".join([*launcher, *per_rank_batch(train_args, args.ranks), f"--{varies}"])}
        print(f"{name}: {metric} {summary[name]['mean']:.4f} ± {summary[name]['std']:.4f}", flush=True)
    write_json_atomic(args.out / "summary.json", summary)

    print("\n| recipe | ranks | metric | mean ± std | over | target | published |\n|---|---|---|---|---|---|---|")
    for name, row in summary.items():
        print(f"| {name} | {row['ranks']} | {row['metric']} | {row['mean']:.4f} ± {row['std']:.4f} | {row['over']} | "
              f"≥ {row['target']} | {row['published']} |")


if __name__ == "__main__":
    main()
