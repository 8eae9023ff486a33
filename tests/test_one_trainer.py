"""One trainer for every world size: a plain run and a run on a 1-part folder are the same run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distributed_helpers import partition_dataset
from gnnscale.data.synthetic import SyntheticConfig, generate_synthetic
from gnnscale.distributed.env import DistEnv, init_runtime
from gnnscale.nn import ModelConfig
from gnnscale.train.trainer import Trainer, TrainConfig
from partition.load import load_partition, whole_graph_partition
from samplers import SamplerConfig


def make_trainer(part, model: str, num_workers: int) -> Trainer:
    return Trainer.on_partition(part, init_runtime(DistEnv()), split=0,
                   model_config=ModelConfig(model=model, num_layers=2, hidden=16, heads=2),
                   sampler_config=SamplerConfig(fanouts=[5, 4], gcn_norm=model == "gcn", self_loops=model != "sage"),
                   config=TrainConfig(epochs=2, batch_size=128, seed=3, num_workers=num_workers))


@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_plain_run_and_one_part_folder_give_identical_batches_and_losses(model: str, tmp_path: Path) -> None:
    dataset = generate_synthetic(SyntheticConfig(num_nodes=3000, avg_degree=8, num_classes=4, feat_dim=16, seed=2))
    folder = partition_dataset(dataset, tmp_path / "one", 1)
    plain = make_trainer(whole_graph_partition(dataset), model, num_workers=2)
    on_disk = make_trainer(load_partition(folder, 0), model, num_workers=0)
    compared = 0
    for a, b in zip(plain.loader, on_disk.loader, strict=True):
        assert torch.equal(a.batch.seeds, b.batch.seeds)
        for block_a, block_b in zip(a.batch.blocks, b.batch.blocks, strict=True):
            for name in ("indptr", "indices", "src_ids", "edge_weight"):
                x, y = getattr(block_a, name), getattr(block_b, name)
                assert (x is None and y is None) or torch.equal(x, y), name
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        compared += 1
    assert compared == plain.steps > 1
    first, second = plain.fit(), on_disk.fit()
    assert [r["loss"] for r in first.history] == [r["loss"] for r in second.history]
    assert (first.val, first.test) == (second.val, second.test)
