"""Static link prediction with gnnscale: a GCN encoder, a dot-product decoder, the 85/5/10 edge split.

Runs unchanged in one process and on several ranks of one machine::

    python examples/link_prediction.py
    torchrun --nproc_per_node=2 examples/link_prediction.py

The default graph is Cora from ../shared/datasets when present, else a synthetic community graph;
under torchrun every rank takes its METIS share of it.
Prints the test ROC-AUC, MRR and Hits@20/50 at the epoch of the best validation ROC-AUC.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

import gnnscale as gs
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic

CORA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "cora"


def default_dataset():
    if CORA.is_dir():
        return gs.load_dataset("cora", CORA)
    return generate_synthetic(SyntheticConfig(num_nodes=3000, avg_degree=8, num_classes=5, feat_dim=32, seed=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=30, help="training epochs (default 30)")
    parser.add_argument("--fanouts", default="10,10", help="neighbours per layer, input side first (default 10,10)")
    parser.add_argument("--batch-size", type=int, default=512, help="seed edges per batch and rank (default 512)")
    args = parser.parse_args()
    torch.manual_seed(0)  # the same initial weights on every rank
    with gs.init() as world:
        graph = gs.Graph.from_dataset(default_dataset(), world)  # on N ranks: this rank's METIS share
        split = gs.split_edges(graph, num_val=0.05, num_test=0.1, seed=0)
        fanouts = [int(f) for f in args.fanouts.split(",")]
        task = gs.LinkTask(graph, split, fanouts=fanouts, batch_size=args.batch_size, gcn_norm=True)
        encoder = world.wrap(gs.GNN(gs.ModelConfig(model="gcn", num_layers=len(fanouts), hidden=128, dropout=0.0),
                                    graph.feature_dim, 64))
        decoder = gs.DotDecoder()
        optimizer = torch.optim.Adam(encoder.parameters(), lr=0.01)
        best_val, best = -1.0, None
        for epoch in range(args.epochs):
            loss = task.train_epoch(encoder, decoder, optimizer, epoch)
            val = task.evaluate(encoder, decoder, "val")
            if val["roc_auc"] > best_val:
                best_val, best = val["roc_auc"], copy.deepcopy(encoder.state_dict())
            if world.is_main:
                print(f"epoch {epoch:3d}  loss {loss:.4f}  val ROC-AUC {val['roc_auc']:.4f}")
        encoder.load_state_dict(best)
        test = task.evaluate(encoder, decoder, "test")
        if world.is_main:
            print(f"test ROC-AUC {test['roc_auc']:.4f}  MRR {test['mrr']:.4f}  "
                  f"Hits@20 {test['hits@20']:.4f}  Hits@50 {test['hits@50']:.4f}")


if __name__ == "__main__":
    main()
