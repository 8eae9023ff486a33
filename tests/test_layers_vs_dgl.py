"""Our pure-torch layers against DGL's reference layers, same weights, same sampled blocks."""

import os

import numpy as np
import pytest
import torch

from conftest import import_dgl_or_skip

os.environ.setdefault("DGLBACKEND", "pytorch")
pytestmark = pytest.mark.dgl
dgl = import_dgl_or_skip()  # skips this module where the [dgl] extra is not installed
from dgl.nn import GATConv as DGLGATConv  # noqa: E402
from dgl.nn import GraphConv as DGLGraphConv  # noqa: E402
from dgl.nn import SAGEConv as DGLSAGEConv  # noqa: E402

from gnnscale.batch import Block  # noqa: E402
from gnnscale.data.dataset import csc_from_edges  # noqa: E402
from gnnscale.nn import GATConv, GCNConv, SAGEConv  # noqa: E402
from samplers import NeighborSampler, SamplerConfig  # noqa: E402

ATOL = 1e-5


def to_dgl(block: Block) -> dgl.DGLGraph:
    empty = torch.empty(0, dtype=torch.int64)
    return dgl.create_block(("csc", (block.indptr, block.indices, empty)),
                            num_src_nodes=block.num_src, num_dst_nodes=block.num_dst)


@pytest.fixture(scope="module")
def blocks() -> list[Block]:
    """Blocks sampled from a random graph, including zero-in-degree destinations."""
    rng = np.random.default_rng(0)
    # Nodes 300..309 have no in-edges, so every block has destinations that receive nothing.
    src, dst = rng.integers(0, 310, 1500), rng.integers(0, 300, 1500)
    indptr, indices = csc_from_edges(src, dst, 310, symmetrize=False)
    sampler = NeighborSampler(indptr, indices, SamplerConfig(fanouts=[-1, 4]))
    batch = sampler.sample(torch.cat([torch.arange(0, 300, 7), torch.arange(300, 310)]), rng=np.random.default_rng(0))
    assert all((block.in_degrees() == 0).any() for block in batch.blocks)
    return batch.blocks


@pytest.mark.parametrize("in_dim,out_dim", [(12, 5), (5, 12)])
def test_sage_matches_dgl(blocks, in_dim, out_dim):
    torch.manual_seed(1)
    ours = SAGEConv(in_dim, out_dim)
    ref = DGLSAGEConv(in_dim, out_dim, "mean")
    with torch.no_grad():
        ref.fc_self.weight.copy_(ours.lin_self.weight)
        ref.fc_self.bias.copy_(torch.randn(out_dim))
        ours.lin_self.bias.copy_(ref.fc_self.bias)
        ref.fc_neigh.weight.copy_(ours.lin_neigh.weight)
    for block in blocks:
        x = torch.randn(block.num_src, in_dim)
        torch.testing.assert_close(ours(block, x), ref(to_dgl(block), x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("in_dim,out_dim", [(12, 5), (5, 12)])
def test_gcn_matches_dgl_both_norm(blocks, in_dim, out_dim):
    torch.manual_seed(2)
    ours = GCNConv(in_dim, out_dim)
    ref = DGLGraphConv(in_dim, out_dim, norm="both", allow_zero_in_degree=True)
    with torch.no_grad():
        ours.bias.copy_(torch.randn(out_dim))
        ref.weight.copy_(ours.lin.weight.T)
        ref.bias.copy_(ours.bias)
    for block in blocks:
        x = torch.randn(block.num_src, in_dim)
        torch.testing.assert_close(ours(block, x), ref(to_dgl(block), x), atol=ATOL, rtol=0)


def test_gcn_edge_weight_matches_dgl(blocks):
    torch.manual_seed(3)
    ours = GCNConv(6, 4)
    ref = DGLGraphConv(6, 4, norm="none", allow_zero_in_degree=True)
    with torch.no_grad():
        ref.weight.copy_(ours.lin.weight.T)
    for block in blocks:
        weight = torch.rand(block.num_edges)
        weighted = Block(indptr=block.indptr, indices=block.indices, src_ids=block.src_ids,
                         num_dst=block.num_dst, edge_weight=weight)
        x = torch.randn(block.num_src, 6)
        torch.testing.assert_close(ours(weighted, x), ref(to_dgl(block), x, edge_weight=weight), atol=ATOL, rtol=0)


@pytest.mark.parametrize("heads", [1, 4])
def test_gat_matches_dgl(blocks, heads):
    torch.manual_seed(4)
    ours = GATConv(10, 3, heads)
    ref = DGLGATConv(10, 3, heads, allow_zero_in_degree=True)
    with torch.no_grad():
        ours.bias.copy_(torch.randn(heads * 3))
        ref.fc.weight.copy_(ours.fc.weight)
        ref.attn_l.copy_(ours.attn_l)
        ref.attn_r.copy_(ours.attn_r)
        ref.bias.copy_(ours.bias)
    for block in blocks:
        x = torch.randn(block.num_src, 10)
        torch.testing.assert_close(ours(block, x), ref(to_dgl(block), x), atol=ATOL, rtol=0)


def test_gat_gradients_match_dgl(blocks):
    torch.manual_seed(5)
    ours, ref = GATConv(10, 3, 2), DGLGATConv(10, 3, 2, allow_zero_in_degree=True)
    with torch.no_grad():
        ref.fc.weight.copy_(ours.fc.weight)
        ref.attn_l.copy_(ours.attn_l)
        ref.attn_r.copy_(ours.attn_r)
    block = blocks[0]
    # DGL's libxsmm SpMM kernel fails its own null check in this backward pass; the plain kernel is the reference.
    dgl.use_libxsmm(False)
    x = torch.randn(block.num_src, 10)
    ours(block, x).square().sum().backward()
    ref(to_dgl(block), x).square().sum().backward()
    torch.testing.assert_close(ours.attn_l.grad, ref.attn_l.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.fc.weight.grad, ref.fc.weight.grad, atol=1e-4, rtol=1e-4)
