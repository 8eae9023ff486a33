"""The trainer's input gather: table-ordered rows with a renumbered first block compute what the plain gather does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnscale.distributed.comm import Exchanger
from gnnscale.distributed.feature_store import DistTable
from gnnscale.nn import GNN, ModelConfig
from gnnscale.train.distributed import BufferRing, gather_inputs
from samplers import NeighborSampler, SamplerConfig
from samplers.neighbor import seed_sampling


def graph(num_nodes: int = 400, num_edges: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    from gnnscale.data.dataset import csc_from_edges

    rng = np.random.default_rng(0)
    return csc_from_edges(rng.integers(0, num_nodes, num_edges), rng.integers(0, num_nodes, num_edges), num_nodes,
                          symmetrize=True)


@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_renumbered_first_block_gives_the_same_logits(model: str) -> None:
    indptr, indices = graph()
    sampler = NeighborSampler(indptr, indices, SamplerConfig(fanouts=[5, 3], gcn_norm=model == "gcn",
                                                             self_loops=model != "sage"))
    seed_sampling(0)
    batch = sampler.sample(torch.arange(0, 400, 7))
    features = torch.randn(400, 12)
    table = DistTable(features, torch.tensor([0, 400]), Exchanger(None, 0, 1))
    torch.manual_seed(0)
    net = GNN(ModelConfig(model=model, num_layers=2, hidden=8, heads=2), 12, 3).eval()
    expected = net(batch.blocks, features[batch.input_ids])
    renumbered, x = gather_inputs(table, batch, BufferRing(2))
    assert renumbered.blocks[0].num_src == batch.blocks[0].num_src + batch.blocks[0].num_dst
    assert torch.equal(x, features[renumbered.blocks[0].src_ids])  # every row is its node's row
    assert torch.allclose(net(renumbered.blocks, x), expected, atol=1e-5)


def test_buffer_ring_reuses_a_buffer_only_after_size_takes() -> None:
    ring = BufferRing(3)
    template = torch.empty(0, 4)
    first = ring.take(10, template)
    others = [ring.take(10, template) for _ in range(2)]
    assert all(o.data_ptr() != first.data_ptr() for o in others)
    assert ring.take(8, template).data_ptr() == first.data_ptr()  # the fourth take reuses the first buffer
    assert ring.take(100, template).shape == (100, 4)  # grows when a batch is larger


@pytest.mark.parametrize("requires_grad", [False, True])
def test_sage_and_gcn_aggregate_in_either_order_with_the_same_result(requires_grad: bool) -> None:
    from gnnscale.nn.gcn import GCNConv
    from gnnscale.nn.sage import SAGEConv

    indptr, indices = graph()
    batch = NeighborSampler(indptr, indices, SamplerConfig(fanouts=[-1])).sample(torch.arange(50))
    x = torch.randn(batch.blocks[0].num_src, 32)
    for conv in (SAGEConv(32, 4), GCNConv(32, 4)):
        reference = conv(batch.blocks[0], x.detach().requires_grad_(True))  # projects first (narrowing, grad)
        out = conv(batch.blocks[0], x.detach().requires_grad_(requires_grad))
        assert torch.allclose(out, reference, atol=1e-5)
