"""The distributed feature store's batch gather: table-ordered rows with a renumbered first block compute what the plain gather does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnscale.distributed.comm import Exchanger
from gnnscale.distributed.feature_store import DistTable
from gnnscale.nn import GNN, ModelConfig
from samplers import NeighborSampler, SamplerConfig


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
    batch = sampler.sample(torch.arange(0, 400, 7), rng=np.random.default_rng(0))
    features = torch.randn(400, 12)
    table = DistTable(features, torch.tensor([0, 400]), Exchanger(None, 0, 1))
    torch.manual_seed(0)
    net = GNN(ModelConfig(model=model, num_layers=2, hidden=8, heads=2), 12, 3).eval()
    expected = net(batch.blocks, features[batch.input_ids])
    renumbered, x = table.gather_batch(batch, lambda rows, like: like.new_empty((rows, *like.shape[1:])))
    assert renumbered.blocks[0].num_src == batch.blocks[0].num_src + batch.blocks[0].num_dst
    assert torch.equal(x, features[renumbered.blocks[0].src_ids])  # every row is its node's row
    assert torch.allclose(net(renumbered.blocks, x), expected, atol=1e-5)


def test_id_map_gathers_in_block_order_from_owned_and_cached_rows() -> None:
    """Rank 0 of two, every remote row cached: the batch comes back as it is, each row its node's."""
    indptr, indices = graph()
    batch = NeighborSampler(indptr, indices, SamplerConfig(fanouts=[5, 3])).sample(torch.arange(0, 400, 7),
                                                                                  rng=np.random.default_rng(0))
    features = torch.randn(400, 12)
    table = DistTable(features[:200].clone(), torch.tensor([0, 200, 400]), Exchanger(None, 0, 2))
    table.use_id_map, table.cache_complete = True, True
    table.cache_ids, table.cache_rows = torch.arange(200, 400), features[200:].clone()  # no exchange: no group
    same, x = table.gather_batch(batch, lambda rows, like: like.new_empty((rows, *like.shape[1:])))
    assert same is batch and torch.equal(x, features[batch.input_ids])
    assert table.rows.data_ptr() == table.cache_rows.data_ptr() - 200 * 12 * 4  # joined: one table, two views
    assert (table.stats.local_rows, table.stats.cache_hits, table.stats.remote_rows) == \
        (int((batch.input_ids < 200).sum()), int((batch.input_ids >= 200).sum()), 0)
    table.use_id_map = False
    with pytest.raises(ValueError, match=r"gather_ordered needs the id map: set use_id_map on a table whose graph "
                       r"fits \d+ MiB at 4 bytes a node"):
        table.gather_ordered(batch.input_ids, x)
    table.use_id_map = True
    table.cache_ids, table.cache_rows = torch.arange(300, 400), features[300:].clone()  # 200-299 missing now
    with pytest.raises(RuntimeError, match=r"rank 0 needs \d+ remote rows \(e.g. global id 2\d\d\) that a complete "
                       r"cache should hold"):
        table.gather_batch(batch, lambda rows, like: like.new_empty((rows, *like.shape[1:])))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_sage_and_gcn_aggregate_in_either_order_with_the_same_result(requires_grad: bool) -> None:
    from gnnscale.nn.gcn import GCNConv
    from gnnscale.nn.sage import SAGEConv

    indptr, indices = graph()
    batch = NeighborSampler(indptr, indices, SamplerConfig(fanouts=[-1])).sample(torch.arange(50), rng=np.random.default_rng(0))
    x = torch.randn(batch.blocks[0].num_src, 32)
    for conv in (SAGEConv(32, 4), GCNConv(32, 4)):
        reference = conv(batch.blocks[0], x.detach().requires_grad_(True))  # projects first (narrowing, grad)
        out = conv(batch.blocks[0], x.detach().requires_grad_(requires_grad))
        assert torch.allclose(out, reference, atol=1e-5)


def test_torchrun_environment_is_read_once_and_checked() -> None:
    from gnnscale.distributed.env import read_env

    assert read_env({}).world_size == 1 and not read_env({}).is_distributed
    full = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
            "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "3", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    env = read_env(full)
    assert (env.rank, env.world_size, env.restart_count, env.agent_store) == (1, 2, 3, True)
    with pytest.raises(ValueError, match="torchrun environment is incomplete: MASTER_ADDR not set"):
        read_env({k: v for k, v in full.items() if k != "MASTER_ADDR"})
    with pytest.raises(ValueError, match="non-integer value"):
        read_env(full | {"RANK": "one"})
    with pytest.raises(ValueError, match="RANK=2 / LOCAL_RANK=1 out of range for WORLD_SIZE=2"):
        read_env(full | {"RANK": "2"})


def test_epoch_seeds_differ_by_rank_and_epoch() -> None:
    from gnnscale.train.fit import epoch_seed

    seeds = {epoch_seed(0, e, r) for e in range(5) for r in range(4)}
    assert len(seeds) == 20 and all(0 <= s < 2**32 for s in seeds)
    assert epoch_seed(0, 1, 0) == epoch_seed(0, 1, 0)


def test_checkpoint_round_trip_and_refusals(tmp_path) -> None:
    from gnnscale.train.checkpoint import load_checkpoint, save_checkpoint

    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"epoch": 3, "model": {"w": torch.ones(2)}, "fingerprint": {"lr": 0.01}})
    assert load_checkpoint(path, {"lr": 0.01})["epoch"] == 3
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind
    with pytest.raises(ValueError, match=r"was written by a different run \(lr = 0.01, this run has 0.1\)"):
        load_checkpoint(path, {"lr": 0.1})
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="is not a readable gnnscale checkpoint"):
        load_checkpoint(path, {})
