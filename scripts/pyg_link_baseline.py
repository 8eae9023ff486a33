"""PyG's own link-prediction example (examples/link_pred.py), run in PyG's environment on a split we hand it.

Not part of gnnscale and never imported by it: ``scripts/bench_link_prediction.py`` runs it with the
Python of a separate environment that has ``torch-geometric`` (e.g. 2.8.1 from the registry)::

    python3.11 -m venv /tmp/pyg && /tmp/pyg/bin/pip install torch==2.13.0 torch-geometric==2.8.1 scikit-learn
    /tmp/pyg/bin/python scripts/pyg_link_baseline.py --data split.npz --seed 0

It reads the features and the train/val/test edges of one split from ``--data`` (written by the
benchmark, so both sides train and score the same edges), then does what the example does: a
2-layer ``GCNConv`` encoder (128, 64), a dot-product decoder, Adam at 0.01, 100 full-batch epochs with
fresh ``negative_sampling`` each epoch, ROC-AUC by scikit-learn.  ``--pyg-split`` instead lets
``RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True, add_negative_train_samples=False)``
split the whole graph itself.  Prints one JSON line: the last epoch's val/test ROC-AUC (what the
example prints: its best-val bookkeeping never updates), the test ROC-AUC at the best val, and the
training time.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv
from torch_geometric.transforms import RandomLinkSplit
from torch_geometric.utils import negative_sampling


class Net(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, out: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(in_channels, hidden), GCNConv(hidden, out)

    def encode(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    @staticmethod
    def decode(z: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        return (z[pairs[0]] * z[pairs[1]]).sum(-1)


def both_ways(edges: torch.Tensor) -> torch.Tensor:
    return torch.cat([edges, edges.flip(0)], dim=1)


def load_split(path: str, pyg_split: bool, seed: int) -> tuple[Data, Data, Data]:
    arrays = np.load(path, allow_pickle=False)
    t = {k: torch.from_numpy(arrays[k]) for k in arrays.files}
    x = t["x"].float()
    if pyg_split:
        every = torch.cat([t["train_pos"], t["val_pos"], t["test_pos"]], dim=1)
        torch.manual_seed(seed)
        split = RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True, add_negative_train_samples=False)
        return split(Data(x=x, edge_index=both_ways(every)))

    def stage(message: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor | None) -> Data:
        label_index = pos if neg is None else torch.cat([pos, neg], dim=1)
        label = torch.cat([torch.ones(pos.shape[1]), torch.zeros(0 if neg is None else neg.shape[1])])
        return Data(x=x, edge_index=both_ways(message), edge_label_index=label_index, edge_label=label)

    train_val = torch.cat([t["train_pos"], t["val_pos"]], dim=1)
    return (stage(t["train_pos"], t["train_pos"], None), stage(t["train_pos"], t["val_pos"], t["val_neg"]),
            stage(train_val, t["test_pos"], t["test_neg"]))


@torch.no_grad()
def auc(model: Net, data: Data) -> float:
    model.eval()
    out = model.decode(model.encode(data.x, data.edge_index), data.edge_label_index).sigmoid()
    return float(roc_auc_score(data.edge_label.numpy(), out.numpy()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="npz with x, train_pos, val_pos, val_neg, test_pos, test_neg")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--pyg-split", action="store_true", help="split with RandomLinkSplit instead of --data's")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    train, val, test = load_split(args.data, args.pyg_split, args.seed)
    model = Net(train.num_features, 128, 64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    criterion = torch.nn.BCEWithLogitsLoss()
    best_val, test_at_best, seconds = 0.0, 0.0, 0.0
    for _ in range(args.epochs):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        z = model.encode(train.x, train.edge_index)
        neg = negative_sampling(edge_index=train.edge_index, num_nodes=train.num_nodes,
                                num_neg_samples=train.edge_label_index.size(1), method="sparse")
        pairs = torch.cat([train.edge_label_index, neg], dim=-1)
        labels = torch.cat([train.edge_label, train.edge_label.new_zeros(neg.size(1))])
        criterion(model.decode(z, pairs).view(-1), labels).backward()
        optimizer.step()
        seconds += time.perf_counter() - start
        val_auc, test_auc = auc(model, val), auc(model, test)
        if val_auc > best_val:
            best_val, test_at_best = val_auc, test_auc
    print(json.dumps({"val_auc": val_auc, "test_auc": test_auc, "test_auc_at_best_val": test_at_best,
                      "train_seconds": seconds, "train_edges": int(train.edge_label_index.size(1))}))


if __name__ == "__main__":
    main()
