"""The ``dgl`` section of ``bench_link_prediction.py``: link-prediction training edges/s, gnnscale vs DGL.

Both sides train the same model shape (2-layer GCN 128 -> 64, dot decoder, BCE, Adam 0.01) on the
training edges of the same 85/5/10 split of a synthetic community graph, message passing over the
training edges only, fanouts 10,10, 512 seed edges and one uniform negative each per batch, seed
edges and their reverses excluded from the sampled neighbourhoods.  DGL: ``dgl.dataloading.DataLoader``
(in-process, its default) with ``as_edge_prediction_sampler(NeighborSampler([10, 10]),
exclude="reverse_id", negative_sampler=Uniform(1))`` and ``dgl.nn.GraphConv`` (``norm="both"``).  gnnscale:
:class:`gnnscale.LinkLoader` (one prefetch thread) and its ``GCNConv`` without ``gcn_norm``, which is
``GraphConv(norm="both")`` exactly (block degrees, no self-loops).  One warm-up epoch, then the median
of ``--repeats`` epochs each,
the two sides alternating; the same again for the loaders alone (sampling, exclusion, negatives and
the gathering of input rows, no model), which is what the two frameworks do differently.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import gnnscale as gs

FANOUTS = [10, 10]
BATCH = 512


def section_dgl(args: argparse.Namespace) -> dict:
    from bench_link_prediction import load_graph_dataset

    dataset = load_graph_dataset("synthetic")
    with gs.init() as world:
        graph = gs.Graph.from_dataset(dataset, world)
        split = gs.split_edges(graph, seed=0)
        ours_epoch, dgl_epoch = ours_side(graph, split), dgl_side(dataset, split)
        ours_epoch(0, True), dgl_epoch(True)  # warm-up
        # Alternating epochs: the shared machine's load drifts, and both sides should see the same drift.
        times: dict[str, list[float]] = {"ours": [], "dgl": [], "ours_loader": [], "dgl_loader": []}
        for repeat in range(args.repeats):
            times["ours"].append(ours_epoch(repeat + 1, True))
            times["dgl"].append(dgl_epoch(True))
            times["ours_loader"].append(ours_epoch(repeat + 1, False))
            times["dgl_loader"].append(dgl_epoch(False))
    edges = split.train_pos.shape[1]
    result = {"graph": {"nodes": dataset.num_nodes, "train_edges": edges}, "epoch_s": times,
              **{f"{side}_edges_per_s": edges / statistics.median(t) for side, t in times.items()}}
    result["ratio"] = result["ours_edges_per_s"] / result["dgl_edges_per_s"]
    result["loader_ratio"] = result["ours_loader_edges_per_s"] / result["dgl_loader_edges_per_s"]
    return result


def ours_side(graph: gs.Graph, split) -> Callable[[int, bool], float]:
    """``epoch(e, train)``: one timed epoch of gnnscale's side (seconds); ``train=False`` runs the loader alone."""
    torch.manual_seed(0)
    loader = gs.LinkLoader(graph, gs.rank_share(split.train_pos, graph), fanouts=FANOUTS, batch_size=BATCH,
                           held_out=torch.from_numpy(split.held_out("train")), num_workers=1)
    model = gs.GNN(gs.ModelConfig(model="gcn", num_layers=2, hidden=128, dropout=0.0), graph.feature_dim, 64)
    decoder = gs.DotDecoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def epoch(e: int, train: bool) -> float:
        loader.set_epoch(e)
        start = time.perf_counter()
        for batch in loader:
            if not train:  # the loader alone: sampled, gathered, handed over
                continue
            h = model(batch.blocks, batch.x)
            loss = gs.link_loss(decoder(h, batch.pos), decoder(h, batch.neg))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return time.perf_counter() - start

    return epoch


class DGLGCN(nn.Module):
    def __init__(self, in_dim: int) -> None:
        super().__init__()
        import dgl.nn as dglnn

        self.convs = nn.ModuleList([dglnn.GraphConv(in_dim, 128, allow_zero_in_degree=True),
                                    dglnn.GraphConv(128, 64, allow_zero_in_degree=True)])

    def forward(self, blocks, x):
        h = torch.relu(self.convs[0](blocks[0], x))
        return self.convs[1](blocks[1], h)


def dgl_side(dataset, split) -> Callable[[bool], float]:
    """``epoch(train)``: one timed epoch of DGL's side (seconds); ``train=False`` runs the loader alone."""
    import dgl

    src, dst = torch.from_numpy(split.train_pos[0]), torch.from_numpy(split.train_pos[1])
    num = src.numel()
    g = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=dataset.num_nodes)
    reverse = torch.cat([torch.arange(num, 2 * num), torch.arange(num)])
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler(FANOUTS), exclude="reverse_id", reverse_eids=reverse,
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(1))
    loader = dgl.dataloading.DataLoader(g, torch.arange(num), sampler, batch_size=BATCH, shuffle=True)
    features = torch.from_numpy(dataset.features)
    torch.manual_seed(0)
    model = DGLGCN(features.shape[1])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def score(pairs, h):
        u, v = pairs.edges()
        return (h[u] * h[v]).sum(-1)

    def epoch(train: bool) -> float:
        start = time.perf_counter()
        for input_nodes, pos, neg, blocks in loader:
            x = features[input_nodes]
            if not train:
                continue
            h = model(blocks, x)
            loss = gs.link_loss(score(pos, h), score(neg, h))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return time.perf_counter() - start

    return epoch


if __name__ == "__main__":
    raise SystemExit("run scripts/bench_link_prediction.py --only dgl")
