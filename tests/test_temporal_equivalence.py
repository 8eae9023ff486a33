"""Sharded K = 0 on 2 gloo ranks is one process's run, with dropout: the same loss at every training step
and the same node memory at the end, within float tolerance.

Dropout is where this used to break: each rank drew masks for its own share of the batch, so which
mask a query got depended on the number of ranks and on which rank computed it.  Now every rank
draws the masks of the whole global batch from the generator state one process has
(``TGN.dropout_masks``) and keeps its own rows.  The model runs in float64, so what differs between
the runs (partial sums over ranks, GEMMs of other shapes) stays far below the tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distributed_helpers import run_ranks
from gnnscale.data.temporal import chronological_split
from gnnscale.temporal import MemoryConfig, TGNConfig
from gnnscale.temporal.sharded import partition_interactions
from gnnscale.temporal.train import TemporalLinkTrainer, TemporalTrainConfig
from test_temporal_distributed import stream

DROPOUT = 0.3
"""High, so that a mask drawn differently moves the loss well beyond the tolerance."""


def train(runtime=None, dropout: float = DROPOUT) -> dict:
    """Two epochs at K = 0 (event cut-off, the default); the global loss of every training step (this
    rank's share: the shares sum to it) and the final memory of every node this rank holds."""
    events = stream(num_events=1200, num_nodes=100, seed=7)  # users returning to a few favourite items
    split = chronological_split(events, seed=0)
    owner = None
    if runtime is not None:
        owner = partition_interactions(events.src[split.train], events.dst[split.train], events.num_nodes,
                                       runtime.world_size, method="random", seed=0)
    trainer = TemporalLinkTrainer(events, split, memory_config=MemoryConfig(memory_dim=16, time_dim=16),
                                  tgn_config=TGNConfig(embedding_dim=16, heads=2, dropout=dropout),
                                  config=TemporalTrainConfig(epochs=2, batch_size=50, num_neighbors=5, seed=3,
                                                             lr=1e-3, staleness=0),
                                  runtime=runtime, owner=owner)
    trainer.model.double()
    losses = []
    step = trainer._step

    def recorded(batch, *args, train: bool, **kwargs):
        out = step(batch, *args, train=train, **kwargs)
        if train:
            losses.append(float(out["loss"]))
        return out
    trainer._step = recorded
    metrics = trainer.fit()
    state = trainer.model.memory.state
    held = torch.nonzero(state.slot >= 0).squeeze(1)
    return {"losses": np.array(losses), "held": held.numpy(), "memory": state.memory[state.rows(held)].numpy().copy(),
            "test_ap": metrics["test_ap"], "batches": len(trainer._batches(trainer.train_event_ids))}


def ranks_job(rank: int) -> dict:
    from gnnscale.distributed.env import init_runtime, read_env

    torch.set_num_threads(1)
    runtime = init_runtime(read_env(), "cpu", timeout=60.0)
    try:
        return train(runtime)
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def single() -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train()
    finally:
        torch.set_num_threads(threads)


def test_sharded_k0_with_dropout_is_the_single_process_run(single):
    ranks = run_ranks(ranks_job, 2, timeout=120.0)
    steps = single["losses"].size
    assert steps == 2 * single["batches"] >= 20 and all(rank["losses"].size == steps for rank in ranks)
    # Each rank's loss is its share of the global batch's mean: the sum is the global loss.
    loss_gap = np.abs(ranks[0]["losses"] + ranks[1]["losses"] - single["losses"]).max()
    memory_gap = max(np.abs(rank["memory"] - single["memory"][rank["held"]]).max() for rank in ranks)
    print(f"max |loss difference| over {steps} steps: {loss_gap:.3g}; max |memory difference|: {memory_gap:.3g}")
    np.testing.assert_allclose(ranks[0]["losses"] + ranks[1]["losses"], single["losses"], atol=1e-9, rtol=0)
    assert np.all(ranks[0]["losses"] != 0) and np.all(ranks[1]["losses"] != 0)  # both ranks computed events
    for rank in ranks:
        np.testing.assert_allclose(rank["memory"], single["memory"][rank["held"]], atol=1e-9, rtol=0)
    assert abs(ranks[0]["test_ap"] - single["test_ap"]) <= 1e-6


def test_dropout_reaches_the_compared_losses(single):
    """The tolerance above is far below what dropout changes: without it, the losses differ."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain = train(dropout=0.0)
    finally:
        torch.set_num_threads(threads)
    assert np.abs(plain["losses"] - single["losses"]).max() > 1e-3
