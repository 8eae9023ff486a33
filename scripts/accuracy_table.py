"""Reproduce the README's accuracy table: every recipe over its seeds or splits, mean and std.

    python scripts/accuracy_table.py                      # all recipes (tens of minutes on 2 cores)
    python scripts/accuracy_table.py --only cora-gcn      # one recipe
    python scripts/accuracy_table.py --data-root ../shared/datasets --out runs/accuracy

Writes ``OUT/<recipe>/<run>/metrics.json`` per run and ``OUT/summary.json``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--out", type=Path, default=Path("runs/accuracy"))
    parser.add_argument("--only", nargs="*", choices=sorted(RECIPES), help="run only these recipes")
    args = parser.parse_args()

    summary = {}
    for name in args.only or RECIPES:
        dataset, train_args, varies, count, target, published = RECIPES[name]
        scores = []
        for i in range(count):
            out = args.out / name / f"{varies}{i}"
            cli = ["--dataset", dataset, "--data-dir", str(args.data_root / dataset), *train_args,
                   f"--{varies}", str(i), "--out", str(out), "--quiet"]
            if train_main(cli) != 0:
                raise SystemExit(f"{name} {varies} {i} failed")
            scores.append(json.loads((out / "metrics.json").read_text())["test"])
        metric = json.loads((out / "metrics.json").read_text())["metric"]
        summary[name] = {"metric": metric, "mean": statistics.mean(scores), "std": statistics.pstdev(scores),
                         "scores": scores, "over": f"{count} {varies}s", "target": target, "published": published,
                         "command": " ".join(["python scripts/train_node_classification.py", *cli[:-4]])}
        print(f"{name}: {metric} {summary[name]['mean']:.4f} ± {summary[name]['std']:.4f}", flush=True)
    write_json_atomic(args.out / "summary.json", summary)

    print("\n| recipe | metric | mean ± std | over | target | published |\n|---|---|---|---|---|---|")
    for name, row in summary.items():
        print(f"| {name} | {row['metric']} | {row['mean']:.4f} ± {row['std']:.4f} | {row['over']} | "
              f"≥ {row['target']} | {row['published']} |")


if __name__ == "__main__":
    main()
