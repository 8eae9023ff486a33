"""Your own model, loss and loop on 1..N ranks: a GIN-style network, which gnnscale does not ship.

    python examples/custom_model.py
    torchrun --standalone --nproc_per_node=2 examples/custom_model.py

The built-in synthetic graph (5,000 nodes in 5 planted communities) is generated on every rank; on several
ranks each keeps its METIS share of it.  The model follows the layer-wise protocol (``num_layers`` and
``layer(index, block, h)``), so gnnscale can evaluate it over all neighbours.
"""

import torch
import torch.nn.functional as F
from torch import nn

import gnnscale as gs


class GIN(nn.Module):
    """GIN layers (Xu et al., 2019): ``MLP((1 + eps) h_v + aggregate(h_u))``.  Mean rather than sum over the
    neighbours, so that a sampled neighbourhood and the full one (at inference) are on one scale."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(a, hidden), nn.ReLU(), nn.Linear(hidden, b))
                                  for a, b in zip(dims, dims[1:]))
        self.eps = nn.Parameter(torch.zeros(num_layers))
        self.num_layers = num_layers

    def layer(self, index: int, block: gs.Block, h: torch.Tensor) -> torch.Tensor:
        out = self.mlps[index]((1 + self.eps[index]) * h[:block.num_dst] + gs.spmm_mean(block, h))
        return F.relu(out) if index < self.num_layers - 1 else out

    def forward(self, blocks: list[gs.Block], x: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(blocks):
            x = self.layer(index, block, x)
        return x


def main(epochs: int = 5) -> float:
    with gs.init() as world:
        torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
        dataset = gs.load_dataset("synthetic", None, num_nodes=5000, avg_degree=8, num_classes=5, feat_dim=32,
                                  seed=0)
        graph = gs.Graph.from_dataset(dataset, world)
        loader = gs.NodeLoader(graph, graph.train_ids, fanouts=[10, 10], batch_size=256, seed=0)
        model = world.wrap(GIN(graph.feature_dim, 64, graph.num_classes))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for epoch in range(epochs):
            model.train()
            loader.set_epoch(epoch)
            for batch in loader:
                loss = F.cross_entropy(model(batch.blocks, batch.x), batch.y, label_smoothing=0.1)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            outputs = gs.layerwise_inference(graph, model)
            val = outputs.score(graph.val_ids)  # over every rank's validation nodes
            if world.is_main:
                print(f"epoch {epoch}: loss {loss.item():.4f}, validation accuracy {val:.4f}", flush=True)
        test = outputs.score(graph.test_ids)
        if world.is_main:
            print(f"GIN on {world.size} rank(s): test accuracy {test:.4f}", flush=True)
        return test


if __name__ == "__main__":
    main()
