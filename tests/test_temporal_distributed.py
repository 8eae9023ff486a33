"""TGN on 2 gloo ranks with node memory sharded by owner: K = 0 is the single-process run, and no
read is ever more than K global steps behind its owner.  With memory parallelism (a whole memory per
rank, each on its own time segment) evaluation starts from the memory a single process reaches.

One spawned job trains every configuration in a loop (importing torch twice on two cores costs
more than the runs).  The staleness bound is checked twice: by the trainer's own counters, and
by recomputing every remote read's staleness here from the raw logs (each read's node, step
and version; each owner's writes), independently of how the replicas are refreshed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distributed_helpers import run_ranks
import gnnscale as gs
from gnnscale.data.temporal import TemporalEvents, chronological_split
from gnnscale.temporal import MemoryConfig, TGNConfig
from gnnscale.temporal.sharded import partition_interactions
from gnnscale.temporal.train import TemporalLinkTrainer, TemporalTrainConfig

STALENESS = (0, 1, 4)
BOUNDED = [("bounded", 0), ("bounded", 2)]
WIDE, CACHE = 4000, 600


def stream(num_events: int = 1500, num_nodes: int = 120, seed: int = 0) -> TemporalEvents:
    """A bipartite stream where users return to the same few items (as in Wikipedia), with equal times."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, num_nodes // 2, num_events)
    favourite = rng.integers(num_nodes // 2, num_nodes, num_nodes // 2)
    items = np.where(rng.random(num_events) < 0.7, favourite[users], rng.integers(num_nodes // 2, num_nodes, num_events))
    t = np.sort(rng.integers(0, 3000, num_events)).astype(np.float64)
    return TemporalEvents(src=users.astype(np.int64), dst=items.astype(np.int64), t=t, edge_features=None,
                          labels=None, num_nodes=num_nodes, name="toy")


def build(events: TemporalEvents, staleness: int, runtime=None, owner=None, record: bool = False,
          neighbor_cutoff: str = "batch", parallelism: str = "sharded", lr: float = 1e-3, sampling: str = "recent",
          sync_every: int = 1, cache_rows: int | None = None, static: bool = False, wire_dtype: str = "float32",
          grad_dtype: str = "float32", batch_size: int = 60):
    """A small TGN, in float64: rank and single-process runs differ only by float rounding (partial
    sums over ranks, GEMMs of other shapes), which Adam amplifies in near-zero gradient entries;
    float64 keeps that far below the 1e-5 under test, so what the test sees is the semantics.
    A lossy ``wire_dtype`` encodes float32 rows: that model stays in float32."""
    split = chronological_split(events, seed=0)
    trainer = TemporalLinkTrainer(events, split, memory_config=MemoryConfig(memory_dim=16, time_dim=16),
                                  # nn.Linear's initial weights: the toy learns within 2 epochs from them
                                  # (the "memory groups learn" check), not from Xavier's, twice the scale.
                                  tgn_config=TGNConfig(embedding_dim=16, heads=2, dropout=0.0, init="torch",
                                                       static_memory=static),
                                  config=TemporalTrainConfig(epochs=2, batch_size=batch_size, num_neighbors=5, seed=5,
                                                             lr=lr, staleness=staleness, patience=0,
                                                             neighbor_cutoff=neighbor_cutoff, sampling=sampling,
                                                             parallelism=parallelism, sync_every=sync_every,
                                                             memory_cache_rows=cache_rows, wire_dtype=wire_dtype,
                                                             grad_dtype=grad_dtype),
                                  runtime=runtime, owner=owner, record=record)
    if wire_dtype == "float32":
        trainer.model.double()
    return trainer


def ranks_job(rank: int, method: str) -> dict:
    from gnnscale.distributed.env import init_runtime, read_env

    torch.set_num_threads(1)
    events = stream()
    runtime = init_runtime(read_env(), "cpu", timeout=60.0)
    results = {}
    try:
        split = chronological_split(events, seed=0)
        train = split.train
        owner = partition_interactions(events.src[train], events.dst[train], events.num_nodes, runtime.world_size,
                                       method=method, seed=0)
        # Keyed by K (batch cutoff), "event": K = 0 with TGN's per-event neighbour cutoff, and
        # ("bounded", K): on a stream of WIDE nodes, a table of the owned nodes plus CACHE cached rows.
        wide = stream(num_nodes=WIDE)
        wide_train = chronological_split(wide, seed=0).train
        wide_owner = partition_interactions(wide.src[wide_train], wide.dst[wide_train], WIDE, runtime.world_size,
                                            method=method, seed=0)
        runs = [(k, k, "batch", None) for k in STALENESS] + [("event", 0, "event", None)] + \
            [(("bounded", k), k, "batch", CACHE) for k in (0, 2)]
        for key, k, cutoff, cache in runs:
            data, owners = (events, owner) if cache is None else (wide, wide_owner)
            trainer = build(data, k, runtime, owners, record=True, neighbor_cutoff=cutoff, cache_rows=cache)
            metrics = trainer.fit()
            reads, writes = trainer.shard.log.arrays()
            state = trainer.model.memory.state
            held = torch.nonzero(state.slot >= 0).squeeze(1)
            results[key] = {"memory": state.memory[state.rows(held)].numpy().copy(), "held": held.numpy(),
                          "rows": metrics["memory_rows_per_rank"], "fetched": metrics["fetched_rows_run"],
                          "owned": trainer.shard.owned.numpy().copy(),
                          "test_ap": metrics["test_ap"], "val_ap": metrics["val_ap"],
                          "test_ap_per_batch": metrics["test_ap_per_batch"],
                          "staleness_max": metrics["staleness_max_run"],
                          "staleness_mean": metrics["staleness_mean_run"],
                          "reads_run": metrics["reads_run"], "remote_reads": metrics["remote_reads_run"],
                          "reads": reads, "writes": writes,
                          "loss": metrics["loss"],
                          "best_epoch_val_ap": metrics["history"][metrics["best_epoch"] - 1]["val_ap"]}
        # Memory groups: weights held still (lr 1e-12), so each group's memory depends on the stream alone;
        # then trained, with uniform neighbours (each group draws its own).  Epoch parallelism the same way.
        for key, lr, sampling, every in (("memory-still", 1e-12, "recent", 1), ("memory", 1e-3, "uniform", 1),
                                         ("memory-sync3", 1e-3, "recent", 3), ("epoch-still", 1e-12, "recent", 1),
                                         ("epoch", 1e-3, "recent", 1), ("epoch-static", 1e-3, "recent", 2)):
            trainer = build(events, 0, runtime, parallelism=key.split("-")[0], lr=lr, sampling=sampling,
                            sync_every=every, static=key.endswith("static"))
            batches = []
            trainer._step = _recording(trainer._step, batches)
            steps = []
            trainer.optimizer.register_step_post_hook(lambda *_: steps.append(1))
            metrics = trainer.fit()
            results[key] = {"memory": trainer.model.memory.state.memory.numpy().copy(), **metrics, "steps": len(steps),
                            "batches": batches,
                            "weights": torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()]).numpy()}
        # No lr given: memory groups scale the base rate by their number, the other modes keep it.
        results["default_lr"] = {mode: build(events, 0, runtime, owner if mode == "sharded" else None,
                                             parallelism=mode, lr=None).lr for mode in ("sharded", "memory", "epoch")}
        # Float32 memory: exact rows, then int8 rows on the wire (K = 1).
        for dtype in ("float32", "int8"):
            trainer = build(events, 1, runtime, owner, wire_dtype=dtype)
            if dtype == "float32":
                trainer.model.float()
            metrics = trainer.fit()
            params = [p for p in trainer.model.parameters() if p.requires_grad]
            results[f"trained-{dtype}"] = {"test_ap": metrics["test_ap"], "val_ap": metrics["val_ap"],
                                           "sent": [r["train_mib_sent"] for r in metrics["history"]],
                                           "grad": [r["train_grad_mib_reduced"] for r in metrics["history"]],
                                           "grad_floats": sum(p.numel() for p in params) + len(params),
                                           "steps": len(trainer._batches(trainer.train_event_ids))}
        results["buckets"] = small_buckets(events, runtime, owner)
        results["wire"] = {dtype: wire_rows(runtime, dtype) for dtype in ("float32", "float16", "bfloat16", "int8")}
        results["grad"] = {dtype: grad_sum(build(events, 0, runtime, owner, grad_dtype=dtype))
                           for dtype in ("float32", "bfloat16")}
        runtime.barrier()
    finally:
        runtime.close()
    return results


WIRE_NODES, WIRE_DIM = 16, 6


def small_buckets(events: TemporalEvents, runtime, owner) -> dict:
    """The K = 0 run again with gradient buckets of 4 KiB: which bucket each start was, and whether it
    came while the backward ran."""
    from gnnscale.distributed import gradsum

    default, gradsum.BUCKET_BYTES = gradsum.BUCKET_BYTES, 4096
    try:
        trainer = build(events, 0, runtime, owner)
    finally:
        gradsum.BUCKET_BYTES = default
    starts, start = [], trainer.gradients._start
    trainer.gradients._start = lambda index: (starts.append((index, trainer.gradients._armed)), start(index))[1]
    metrics = trainer.fit()
    return {"memory": trainer.model.memory.state.memory.numpy().copy(), "loss": metrics["loss"],
            "test_ap": metrics["test_ap"], "buckets": len(trainer.gradients.buckets), "starts": starts}


def rank_gradient(rank: int, size: int) -> torch.Tensor:
    """What rank ``rank`` puts in every gradient: values from 1e-3 to 1e3 in magnitude, either sign."""
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(size, generator=generator, dtype=torch.float64) * 10.0 ** (
        torch.rand(size, generator=generator, dtype=torch.float64) * 6 - 3)


def grad_sum(trainer) -> dict:
    """The trainer's gradient sum over ranks, each rank's gradients set to :func:`rank_gradient`: the
    summed gradients (flattened) and the payload counted."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    mine = rank_gradient(trainer.rank, sum(p.numel() for p in params))
    for p, part in zip(params, mine.split([p.numel() for p in params])):
        p.grad = part.view_as(p).clone()
    trainer._reduce_gradients()()
    return {"summed": torch.cat([p.grad.reshape(-1) for p in params]).numpy(),
            "payload": trainer.grad_comm.stats.reduced_bytes, "floats": mine.numel() + len(params)}


def wire_rows(runtime, dtype: str) -> dict:
    """Rows through :class:`ShardedMemory` in wire dtype ``dtype``, two ways.  Dense (K = 0): one step whose
    events 0 -> 4, 1 -> 5, 2 -> 6, 3 -> 7 are computed by ranks 0, 1, 0, 1 (the owners of those even and
    odd nodes), each rank writing rows it drew itself, then flushed.  Bounded (a cache of 4 rows): the
    same step with each rank reading only its own nodes, then a second step reading the other rank's
    four: fetched whole (memory and the step's mail).  Returns each table's rows of nodes 0..7, the
    rows this rank wrote, and the bytes it sent."""
    from gnnscale.distributed.comm import Exchanger
    from gnnscale.temporal.memory import MemoryView, TemporalMemory
    from gnnscale.temporal.sharded import ShardedMemory, StepWrites

    rank, out = runtime.rank, {}
    nodes = torch.arange(8)
    for name, cache in (("dense", None), ("bounded", 4)):
        memory = TemporalMemory(WIRE_NODES, MemoryConfig(memory_dim=WIRE_DIM, time_dim=4))
        shard = ShardedMemory(memory, torch.arange(WIRE_NODES) % 2, staleness=0, cache_rows=cache, wire_dtype=dtype,
                              exchanger=Exchanger(runtime.sample_group, rank, runtime.world_size))
        step = StepWrites(step=0, src=torch.arange(4), dst=torch.arange(4, 8), t=torch.arange(1.0, 5.0, dtype=torch.float64),
                          e=None, ranks=torch.tensor([0, 1, 0, 1]))
        ends = step.ends(rank)
        shard.read(nodes if cache is None else ends)
        # Rows of mixed scales (x 0.01 to 1000), and one exactly zero: what int8's per-row scale must carry.
        sent = torch.randn(ends.numel(), WIRE_DIM, generator=torch.Generator().manual_seed(rank)) * \
            torch.tensor([1e-2, 1.0, 1e3, 0.0])[:, None]
        shard.write(step, MemoryView(ends, sent, torch.full((ends.numel(),), 10.5 + rank, dtype=torch.float64)))
        shard.end_step()
        if cache is not None:
            shard.read(nodes[nodes % 2 != rank])
        state = memory.state
        rows = state.rows(nodes)
        out[name] = {"sent": sent.numpy(), "bytes": shard.exchanger.stats.bytes_sent,
                     **{field: getattr(state, field)[rows].numpy().copy()
                        for field in ("memory", "last_update", "mail", "mail_time", "has_mail")}}
    return out


def _recording(step, batches: list):
    """``step`` (a trainer's ``_step``), noting the first event id of every training batch it computes."""
    def recorded(batch, *args, train: bool, **kwargs):
        if train:
            batches.append(int(batch[0]))
        return step(batch, *args, train=train, **kwargs)
    return recorded


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return run_ranks(ranks_job, 2, "random", timeout=300.0)


def single_run(events: TemporalEvents, cutoff: str) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = build(events, 0, neighbor_cutoff=cutoff)
        metrics = trainer.fit()
    finally:
        torch.set_num_threads(threads)
    return {"memory": trainer.model.memory.state.memory.numpy().copy(), "cutoff": cutoff, **metrics}


@pytest.fixture(scope="module", params=["batch", "event", "bounded"])
def single(request) -> dict:
    if request.param == "bounded":
        return {**single_run(stream(num_nodes=WIDE), "batch"), "key": ("bounded", 0)}
    return {**single_run(stream(), request.param), "key": 0 if request.param == "batch" else "event"}


def test_k0_on_two_ranks_is_the_single_process_run(two_ranks, single):
    """For either neighbour cutoff, and (batch cutoff) with a bounded cache."""
    for rank in range(2):
        got = two_ranks[rank][single["key"]]
        # Every row a rank holds, after two epochs and the final evaluation.
        np.testing.assert_allclose(got["memory"], single["memory"][got["held"]], atol=1e-5, rtol=0)
        assert abs(got["test_ap"] - single["test_ap"]) <= 0.002
        assert abs(got["test_ap_per_batch"] - single["test_ap_per_batch"]) <= 0.002
        assert abs(got["loss"] - single["loss"]) <= 1e-5
    assert two_ranks[0][single["key"]]["remote_reads"] > 0  # the ranks really read each other's nodes
    assert two_ranks[0]["event"]["loss"] != two_ranks[0][0]["loss"]  # the cutoff reached the ranks


LAST_OF_ONE = {"training": 277, "evaluation": 224}
"""Batch sizes whose last batch is one event on the toy stream (832 training, 225 validation and test events),
so that one of 2 ranks has no share of it: in training (Wikipedia's 80,181 training events at batch 20 crashed
sharded training at the end of epoch 1 this way), and in evaluation."""


def last_batch_of_one_job(rank: int) -> dict:
    from gnnscale.distributed.env import init_runtime, read_env

    torch.set_num_threads(1)
    events = stream()
    runtime = init_runtime(read_env(), "cpu", timeout=60.0)
    results = {}
    try:
        train = chronological_split(events, seed=0).train
        owner = partition_interactions(events.src[train], events.dst[train], events.num_nodes, runtime.world_size,
                                       method="random", seed=0)
        for where, size in LAST_OF_ONE.items():
            metrics = build(events, 0, runtime, owner, batch_size=size).fit()
            results[where] = {"loss": metrics["loss"], "test_ap": metrics["test_ap"]}
        runtime.barrier()
    finally:
        runtime.close()
    return results


def test_sharded_memory_runs_when_a_rank_has_no_share_of_a_batch():
    """K = 0 with a last batch of one event, in training and in evaluation: the rank without a share takes the
    step idle, and the run is still the single-process run."""
    events = stream()
    counts = {name: int(np.count_nonzero(getattr(chronological_split(events, seed=0), name)))
              for name in ("train", "val", "test")}
    assert counts["train"] % LAST_OF_ONE["training"] == 1
    assert counts["val"] % LAST_OF_ONE["evaluation"] == counts["test"] % LAST_OF_ONE["evaluation"] == 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = {where: build(events, 0, batch_size=size).fit() for where, size in LAST_OF_ONE.items()}
    finally:
        torch.set_num_threads(threads)
    for got in run_ranks(last_batch_of_one_job, 2, timeout=240.0):
        for where in LAST_OF_ONE:
            assert abs(got[where]["loss"] - single[where]["loss"]) <= 1e-5, where
            assert abs(got[where]["test_ap"] - single[where]["test_ap"]) <= 0.002, where


def test_attention_over_an_empty_share_is_empty():
    """TGN's attention on zero queries (a rank's empty share of a batch), with and without masks drawn ahead."""
    from gnnscale.temporal.tgn import DropoutMasks, TemporalAttention

    layer = TemporalAttention(8, 0, 4, TGNConfig(embedding_dim=6, heads=2, dropout=0.1))
    for masks in (None, DropoutMasks(attention=torch.ones(0, 2, 1, 3), merge=torch.ones(0, 6))):
        out = layer(torch.zeros(0, 8), torch.zeros(0, 4), torch.randn(5, 8), torch.zeros(0, 3, dtype=torch.int64),
                    torch.zeros(0, 3, 4), torch.zeros(0, 3, dtype=torch.bool), masks)
        assert out.shape == (0, 6)
        out.sum().backward()


@pytest.mark.parametrize("k", [0, 2])
def test_a_bounded_cache_holds_fewer_rows_and_fetches_the_rest(two_ranks, k):
    """4000 nodes: each rank holds its owned nodes and 600 more, fewer than the dense table's 4000, and
    fetched rows it lacked; K = 0 is still the single-process run (above), K = 2 keeps its bound."""
    got = [two_ranks[rank][("bounded", k)] for rank in range(2)]
    owned = [int(two_ranks[rank][("bounded", k)]["owned"].sum()) for rank in range(2)]
    assert got[0]["rows"] == [owned[0] + CACHE, owned[1] + CACHE] and max(got[0]["rows"]) <= 0.7 * WIDE
    assert got[0]["fetched"] > 0
    assert two_ranks[0][0]["rows"] == [120, 120]


@pytest.mark.parametrize("k", STALENESS)
def test_final_pass_repeats_the_best_epochs_validation_for_any_k(two_ranks, k):
    # Every pass refreshes the replicas at the same points of its own steps (begin_pass).
    for rank in range(2):
        assert two_ranks[rank][k]["val_ap"] == two_ranks[rank][k]["best_epoch_val_ap"]


def test_memory_groups_evaluate_from_the_memory_one_process_reaches(two_ranks):
    """Rank 1 replays segment 0 in epoch 1, rank 0 carries its memory on into segment 1 in epoch 2:
    either way the memory evaluation starts from is the single process's."""
    trainer = build(stream(), 0, lr=1e-12)
    single = trainer.fit()
    for rank in range(2):
        got = two_ranks[rank]["memory-still"]
        np.testing.assert_allclose(got["memory"], trainer.model.memory.state.memory.numpy(), atol=1e-6, rtol=0)
        for epoch in range(2):
            assert got["history"][epoch]["val_ap"] == pytest.approx(single["history"][epoch]["val_ap"], abs=1e-6)
    # The groups trained on different segments: their losses are not the single process's epoch losses.
    assert two_ranks[0]["memory-still"]["history"][0]["loss"] != pytest.approx(single["history"][0]["loss"], abs=1e-6)


def test_memory_groups_agree_on_weights_and_metrics_and_learn(two_ranks):
    first, second = two_ranks[0]["memory"], two_ranks[1]["memory"]
    np.testing.assert_array_equal(first["weights"], second["weights"])
    np.testing.assert_array_equal(first["memory"], second["memory"])
    assert [r["val_ap"] for r in first["history"]] == [r["val_ap"] for r in second["history"]]
    assert first["test_ap"] == second["test_ap"] and first["parallelism"] == "memory"
    assert first["remote_reads_run"] == 0 and len(first["peak_rss_mib_per_rank"]) == 2
    still = two_ranks[0]["memory-still"]  # the same run with weights held still: training helped
    assert first["val_ap"] > still["val_ap"] + 0.03


def test_memory_groups_scale_the_default_learning_rate_by_their_number(two_ranks):
    from gnnscale.temporal.train import BASE_LR, default_lr

    for rank in range(2):
        assert two_ranks[rank]["default_lr"] == {"sharded": BASE_LR, "memory": 2 * BASE_LR, "epoch": BASE_LR}
    assert default_lr("memory", 1) == BASE_LR and default_lr("memory", 4) == 4 * BASE_LR


def test_sync_every_steps_once_per_s_batches_on_every_group(two_ranks):
    """14 training batches of 60 over 2 groups: 7 steps per epoch each, and with S = 3 three (after
    batches 3, 6 and the last); every step is a gradient sum both ranks join, or the run would hang."""
    for rank in range(2):
        assert two_ranks[rank]["memory"]["steps"] == 2 * 7
        assert two_ranks[rank]["memory-sync3"]["steps"] == 2 * 3
    np.testing.assert_array_equal(two_ranks[0]["memory-sync3"]["weights"], two_ranks[1]["memory-sync3"]["weights"])
    assert not np.array_equal(two_ranks[0]["memory-sync3"]["weights"], two_ranks[0]["memory"]["weights"])


def test_one_memory_group_is_one_process():
    events = stream()
    runs = [build(events, 0, parallelism=mode) for mode in ("sharded", "memory", "epoch")]
    sharded, memory, epoch = (trainer.fit() for trainer in runs)
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0].model.memory.state.memory.numpy(), other.model.memory.state.memory.numpy())
    assert sharded["test_ap"] == memory["test_ap"] == epoch["test_ap"]
    assert sharded["loss"] == memory["loss"] == epoch["loss"]


def test_epoch_parallel_ranks_each_walk_the_whole_stream_one_step_apart(two_ranks):
    """14 training batches of 60: every rank trains on all 14 in order each epoch, rank 1 a step behind
    rank 0 (15 steps an epoch, which both join: 30 optimizer steps); with weights held still every
    rank's memory, and so evaluation, is the single process's; trained, the ranks agree on weights."""
    single = build(stream(), 0)
    starts = [int(batch[0]) for batch in single._batches(single.train_event_ids)]
    for rank in range(2):
        got = two_ranks[rank]["epoch"]
        assert got["batches"] == starts * 2 and got["steps"] == 2 * 15 and got["parallelism"] == "epoch"
    still = build(stream(), 0, lr=1e-12)
    reference = still.fit()
    for rank in range(2):
        got = two_ranks[rank]["epoch-still"]
        np.testing.assert_allclose(got["memory"], still.model.memory.state.memory.numpy(), atol=1e-6, rtol=0)
        assert got["val_ap"] == pytest.approx(reference["val_ap"], abs=1e-6)
    first, second = two_ranks[0]["epoch"], two_ranks[1]["epoch"]
    np.testing.assert_array_equal(first["weights"], second["weights"])
    assert first["test_ap"] == second["test_ap"] and first["remote_reads_run"] == 0
    assert first["val_ap"] > two_ranks[0]["epoch-still"]["val_ap"] + 0.03  # training helped


def test_static_memory_gradients_are_summed_over_ranks_as_sparse_rows(two_ranks):
    """Epoch parallelism with static node memory and S = 2: the table's sparse gradients travel as dense
    rows and come back sparse, so every rank's SparseAdam moves the same rows the same way."""
    first, second = two_ranks[0]["epoch-static"], two_ranks[1]["epoch-static"]
    np.testing.assert_array_equal(first["weights"], second["weights"])
    assert first["weights"].size == two_ranks[0]["epoch"]["weights"].size + 120 * 16  # a row of 16 per node
    assert np.count_nonzero(first["weights"][-120 * 16:]) > 0  # the static rows (the last parameter) trained


def test_memory_groups_cover_the_stream_once_per_epoch_and_walk_it_in_order():
    trainer = build(stream(), 0)
    batches = trainer._batches(trainer.train_event_ids)
    trainer.groups, state = 3, trainer.model.memory.state
    length = -(-len(batches) // 3)
    walked = {rank: [] for rank in range(3)}
    for epoch in (1, 2, 3, 4):
        seen = []
        for rank in range(3):
            trainer.rank = rank
            state.memory.fill_(float(rank + 1))
            trainer._own_memory = state.state_dict()
            own = trainer._enter_segment(batches, epoch)
            assert len(own) == length  # every group takes the same number of steps
            mine = [b for b in own if b is not None]
            seen += mine
            walked[rank] += [int(b[0]) for b in mine]
            carried = bool((state.memory == rank + 1).all())
            # Carried on from the group's last epoch, except at the stream's start and in epoch 1 (replayed).
            assert carried == (epoch > 1 and int(mine[0][0]) != int(batches[0][0]))
        assert np.array_equal(np.sort(np.concatenate(seen)), trainer.train_event_ids)
    for starts in walked.values():  # on through the stream, back to its start once in 3 epochs
        steps = np.diff(starts)
        assert np.all((steps > 0) | (np.array(starts[1:]) == batches[0][0]))
        assert np.sum(steps < 0) == 1


def brute_force_staleness(reads: np.ndarray, writes_by_node: dict[int, np.ndarray]) -> np.ndarray:
    """For each read (node, step, version): ``step - m`` for the earliest write ``m`` of the other rank
    with ``version < m < step``, else 0."""
    out = np.zeros(len(reads), dtype=np.int64)
    for i, (node, step, version) in enumerate(reads):
        steps = writes_by_node.get(int(node), np.empty(0, np.int64))
        missed = steps[(steps > version) & (steps < step)]
        if missed.size:
            out[i] = step - missed.min()
    return out


@pytest.mark.parametrize("key", list(STALENESS) + BOUNDED)
def test_no_read_is_more_than_k_steps_behind_the_other_ranks_writes(two_ranks, key):
    k = key if isinstance(key, int) else key[1]
    ages = []
    for rank in range(2):
        writes = two_ranks[1 - rank][key]["writes"]
        by_node = {int(node): np.sort(writes[writes[:, 0] == node, 1]) for node in np.unique(writes[:, 0])}
        ages.append(brute_force_staleness(two_ranks[rank][key]["reads"], by_node))
    ages = np.concatenate(ages)
    assert ages.size == two_ranks[0][key]["reads_run"]  # every counted read is in the log
    assert ages.max() <= k
    if k > 0:
        assert ages.max() == k  # reads do lag, by up to the bound: the check above can fail
    # The trainer's counters (over the whole run) are the same numbers.
    assert two_ranks[0][key]["staleness_max"] == ages.max()
    assert two_ranks[0][key]["staleness_mean"] == pytest.approx(ages.mean())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
def test_memory_rows_cross_ranks_in_the_wire_dtype_within_its_bound(two_ranks, dtype):
    """Flushed rows land on every rank, the writer's own table included, as the same decoded rows, each
    within the codec's bound of what was written (float32: exactly); times exact; the bytes sent are
    the codec's (4 rows of WIRE_DIM values plus an 8-byte time)."""
    from gnnscale.distributed import wire

    dense = [two_ranks[rank]["wire"][dtype]["dense"] for rank in range(2)]
    np.testing.assert_array_equal(dense[0]["memory"], dense[1]["memory"])
    for writer in range(2):
        sent = torch.from_numpy(dense[writer]["sent"])
        got = torch.from_numpy(dense[0]["memory"][writer::2])
        assert bool(((got.double() - sent.double()).abs() <= wire.error_bound(dtype, sent)).all())
        assert (dtype == "float32") == torch.equal(got, sent)  # a lossy code really encoded the rows
        np.testing.assert_array_equal(dense[0]["last_update"][writer::2], 10.5 + writer)
        assert dense[writer]["bytes"] == 4 * ({"float32": 4, "int8": 1}.get(dtype, 2) * WIRE_DIM +
                                              (4 if dtype == "int8" else 0) + 8)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_bounded_cache_fetches_memory_and_mail_in_the_wire_dtype(two_ranks, dtype):
    """Each rank fetched the other's four nodes: memory and mail within the bound of the owner's rows,
    times and the mail flag exact."""
    from gnnscale.distributed import wire

    bounded = [two_ranks[rank]["wire"][dtype]["bounded"] for rank in range(2)]
    for reader in range(2):
        owner = 1 - reader
        for field in ("memory", "mail"):
            held = torch.from_numpy(bounded[owner][field][owner::2])
            got = torch.from_numpy(bounded[reader][field][owner::2])
            assert bool(((got.double() - held.double()).abs() <= wire.error_bound(dtype, held)).all())
        # The owner's memory rows are decoded int8 rows already, which encode again without loss; its mail,
        # two such rows side by side at different scales, does not.
        mail = [torch.from_numpy(bounded[rank]["mail"][owner::2]) for rank in (reader, owner)]
        assert (dtype == "float32") == torch.equal(*mail)
        for field in ("last_update", "mail_time", "has_mail"):
            np.testing.assert_array_equal(bounded[reader][field][owner::2], bounded[owner][field][owner::2])
        assert bounded[reader]["has_mail"][owner::2].all()


def test_int8_memory_rows_train_on_fewer_bytes(two_ranks):
    """A trained run (K = 1, float32 memory of 16 values) sends 16 + 4 + 8 instead of 64 + 8 bytes a row,
    every epoch; the ranks agree, and the rounding reached the model.  (What it does to accuracy is
    measured on real streams: scripts/bench_temporal_staleness.py --wire-dtypes.)"""
    exact, int8 = two_ranks[0]["trained-float32"], two_ranks[0]["trained-int8"]
    assert all(e > 0 for e in exact["sent"])
    np.testing.assert_allclose(np.array(int8["sent"]) / np.array(exact["sent"]), 28 / 72, rtol=1e-12)
    assert two_ranks[1]["trained-int8"]["test_ap"] == int8["test_ap"]
    assert int8["test_ap"] != exact["test_ap"]
    # Every step sums every float32 gradient and one flag per parameter.
    for run in (exact, int8):
        assert run["grad"] == [run["steps"] * run["grad_floats"] * 4 / 2**20] * 2


def test_gradients_summed_in_bfloat16_are_within_its_bound_on_half_the_bytes(two_ranks):
    """float32 (here float64 weights: the model of these tests) sums exactly; bfloat16 within 8 significant
    bits of each rank's gradient and of the sum, on 2 bytes a value instead of 8."""
    exact, half = two_ranks[0]["grad"]["float32"], two_ranks[0]["grad"]["bfloat16"]
    g0, g1 = (rank_gradient(rank, exact["summed"].size).numpy() for rank in range(2))
    np.testing.assert_array_equal(exact["summed"], g0 + g1)
    bound = 2.0**-8 * (2 + 2.0**-8) * (np.abs(g0) + np.abs(g1))
    assert (np.abs(half["summed"] - (g0 + g1)) <= bound).all()
    assert not np.array_equal(half["summed"], g0 + g1)
    np.testing.assert_array_equal(two_ranks[1]["grad"]["bfloat16"]["summed"], half["summed"])
    assert exact["payload"] == 8 * exact["floats"] and half["payload"] == 2 * half["floats"]


def test_gradient_buckets_start_during_the_backward_in_order_and_sum_the_same(two_ranks):
    """With 4 KiB buckets: every step starts every bucket once, in bucket order; most of them while the
    backward runs; and the run is the one-bucket run exactly (each element the same sum)."""
    for rank in range(2):
        got, whole = two_ranks[rank]["buckets"], two_ranks[rank][0]
        assert got["buckets"] >= 4
        indices = [index for index, _ in got["starts"]]
        assert indices == list(range(got["buckets"])) * (len(indices) // got["buckets"]) and indices
        assert sum(armed for _, armed in got["starts"]) > len(indices) // 2
        np.testing.assert_array_equal(got["memory"], whole["memory"])
        assert got["loss"] == whole["loss"] and got["test_ap"] == whole["test_ap"]


def test_owners_are_a_metis_partition_of_the_interaction_graph():
    events = stream(num_events=3000, num_nodes=400)
    owner = partition_interactions(events.src, events.dst, events.num_nodes, 2, method="metis")
    assert set(np.unique(owner)) == {0, 1}
    assert abs(int((owner == 0).sum()) - 200) <= 0.05 * 400
    cut = np.mean(owner[events.src] != owner[events.dst])
    random = partition_interactions(events.src, events.dst, events.num_nodes, 2, method="random")
    assert cut < np.mean(random[events.src] != random[events.dst])


def test_bench_and_command_line_on_two_ranks(tmp_path):
    """``scripts/bench_temporal_staleness.py`` runs ``train_temporal.py`` under torchrun on 2 ranks for real,
    with memory rows sent exactly and as int8."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    events = stream(num_events=800, num_nodes=600)
    np.savez(tmp_path / "events.npz", src=events.src, dst=events.dst, t=events.t)
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(root / "scripts" / "bench_temporal_staleness.py"), "--dataset", "npz",
                           "--data-dir", str(tmp_path / "events.npz"), "--ks", "2", "--epochs", "1",
                           "--batch-size", "50", "--skip-single", "--workdir", str(tmp_path / "work"),
                           "--rank-args", "--memory-cache-rows 200", "--wire-dtypes", "float32,int8",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "| 2 ranks | 2 | float32 | 1 |" in done.stdout and "| 2 ranks | 2 | int8 | 1 |" in done.stdout
    run, int8 = json.loads(out.read_text())["runs"]
    # int8 rows of 100 memory values: flushed 100 + 4 + 8 bytes instead of 408, fetched (memory and its
    # 200-value mail) 104 + 204 + 24 instead of 1224.
    ratio = float(re.search(r"K = 2, wire int8: ([0-9.]+)x float32's bytes", done.stdout).group(1))
    assert int8["wire_dtype"] == "int8" and 0.27 <= ratio <= 0.28
    assert ratio == pytest.approx(int8["train_mib_sent_per_epoch"] / run["train_mib_sent_per_epoch"], abs=1e-3)
    assert run["world_size"] == 2 and run["staleness"] == 2
    assert 0 <= run["staleness_max"] <= 2 and run["staleness_mean"] <= run["staleness_max"]
    assert 0.0 < run["remote_read_fraction"] < 1.0 and run["train_events_per_second"] > 0
    assert 0.0 <= run["test_ap"] <= 1.0
    metrics = json.loads((tmp_path / "work" / "k2-2r" / "metrics.json").read_text())
    assert metrics["history"][0]["staleness_max"] <= run["staleness_max"]
    # The bounded table reached the ranks: owned nodes plus 200 (or more, had a step needed more).
    n = int(max(events.src.max(), events.dst.max())) + 1
    assert metrics["args"]["memory_cache_rows"] == 200 and metrics["num_nodes"] == n
    assert all(rows < n for rows in metrics["memory_rows_per_rank"]) and metrics["fetched_rows"] > 0


def test_scale_bench_runs_one_process_and_memory_groups(tmp_path):
    """``scripts/bench_temporal_scale.py``: one process, 2 memory groups and 2 shards at K=0 under torchrun, for real."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    events = stream(num_events=800, num_nodes=600)
    np.savez(tmp_path / "events.npz", src=events.src, dst=events.dst, t=events.t)
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(root / "scripts" / "bench_temporal_scale.py"), "--dataset", "npz",
                           "--data-dir", str(tmp_path / "events.npz"), "--seeds", "0", "--modes", "memory,sharded:0",
                           "--epochs", "2", "--patience", "0", "--batch-size", "50", "--workdir", str(tmp_path / "work"),
                           "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "| memory, 2 ranks |" in done.stdout and "| single |" in done.stdout
    result = json.loads(out.read_text())
    (sharded,) = result["runs"]["sharded:0, 2 ranks"]
    assert sharded["parallelism"] == "sharded" and sharded["staleness"] == 0 and sharded["remote_read_fraction"] > 0
    assert result["verdicts"]["sharded:0, 2 ranks"]["test_ap_change_per_seed"] == [pytest.approx(
        sharded["test_ap"] - result["runs"]["single"][0]["test_ap"])]
    (memory,) = result["runs"]["memory, 2 ranks"]
    assert memory["world_size"] == 2 and memory["parallelism"] == "memory" and memory["epochs_run"] == 2
    assert len(memory["peak_rss_mib_per_rank"]) == 2 and min(memory["peak_rss_mib_per_rank"]) > 50
    verdict = result["verdicts"]["memory, 2 ranks"]
    single = result["summary"]["single"]["train_events_per_second"]["mean"]
    assert verdict["speedup"] == pytest.approx(memory["train_events_per_second"] / single)
    # Time to accuracy: the single run reaches its own best at its best epoch, after that many epochs' training.
    (single_run,) = result["runs"]["single"]
    assert result["summary"]["single"]["train_seconds_to_best"]["values"] == [pytest.approx(
        sum(e["train_seconds"] for e in single_run["history"][:single_run["best_epoch"]]))]
    assert len(verdict["seconds_to_single_best"]) == 1 and "training seconds to the single" in done.stdout.lower()
    # Seeds run apart are summarised together from their outputs, running nothing.
    again = subprocess.run([sys.executable, str(root / "scripts" / "bench_temporal_scale.py"), "--from-json", str(out),
                            str(out), "--out", str(tmp_path / "both.json")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    both = json.loads((tmp_path / "both.json").read_text())
    assert both["seeds"] == [0, 0] and len(both["runs"]["memory, 2 ranks"]) == 2
    assert both["verdicts"]["memory, 2 ranks"]["speedup"] == pytest.approx(verdict["speedup"])


def test_negative_staleness_is_a_one_line_error(tmp_path, capsys):
    from gnnscale.temporal.cli import main

    events = stream(num_events=200, num_nodes=30)
    np.savez(tmp_path / "events.npz", src=events.src, dst=events.dst, t=events.t)
    assert main(["--dataset", "npz", "--data-dir", str(tmp_path / "events.npz"), "--staleness", "-1",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --staleness must be >= 0, got -1 (default 0)"]
    assert not (tmp_path / "run").exists()


def test_bad_parallel_options_are_one_line_errors(tmp_path, capsys):
    from gnnscale.temporal.cli import main

    assert main(["--dataset", "synthetic", "--sync-every", "0", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: --sync-every must be >= 1, got 0 (default 1)"]
    with pytest.raises(SystemExit) as stopped:  # argparse's choice check
        main(["--dataset", "synthetic", "--parallelism", "pipeline", "--out", str(tmp_path / "run")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --parallelism: invalid choice: 'pipeline'" in err[0]
    assert not (tmp_path / "run").exists()


def test_split_events_balances_each_batch_and_keeps_owners_where_it_can():
    from gnnscale.temporal.train import split_events

    rng = np.random.default_rng(0)
    for world_size in (2, 3, 4):
        for n in (1, 7, 50, 200):
            preferred = np.minimum(rng.geometric(0.5, n) - 1, world_size - 1)  # skewed towards rank 0
            ranks = split_events(preferred, world_size)
            cap = -(-n // world_size)
            counts = np.bincount(ranks, minlength=world_size)
            assert counts.max() <= cap and counts.sum() == n
            wanted = np.bincount(preferred, minlength=world_size)
            assert np.sum(ranks == preferred) == np.minimum(wanted, cap).sum()
            # within a rank, the events kept are the earliest it wanted
            for r in range(world_size):
                kept = np.flatnonzero((preferred == r) & (ranks == r))
                assert np.array_equal(kept, np.flatnonzero(preferred == r)[:kept.size])


def test_sharded_memory_and_config_errors():
    from gnnscale.distributed.comm import Exchanger
    from gnnscale.temporal.memory import TemporalMemory
    from gnnscale.temporal.sharded import ShardedMemory

    memory = TemporalMemory(10, MemoryConfig(memory_dim=4, time_dim=4))
    one = Exchanger(None, 0, 1)
    with pytest.raises(ValueError, match="staleness must be >= 0 global steps, got -1"):
        ShardedMemory(memory, torch.zeros(10, dtype=torch.int64), staleness=-1, exchanger=one)
    with pytest.raises(ValueError, match=r"owner has shape \(9,\), expected \(10,\)"):
        ShardedMemory(memory, torch.zeros(9, dtype=torch.int64), staleness=0, exchanger=one)
    with pytest.raises(ValueError, match=r"owner ranks must be in \[0, 1\), got \[0, 1\]"):
        ShardedMemory(memory, torch.arange(10) % 2, staleness=0, exchanger=one)
    with pytest.raises(ValueError, match="staleness must be >= 0 global steps, got -2"):
        TemporalTrainConfig(staleness=-2)
    with pytest.raises(ValueError, match="unknown event_split 'random'; choose balanced or owner"):
        TemporalTrainConfig(event_split="random")
    with pytest.raises(ValueError, match="unknown parallelism 'pipeline'; choose sharded or memory or epoch"):
        TemporalTrainConfig(parallelism="pipeline")
    with pytest.raises(ValueError, match="sync_every must be >= 1, got 0"):
        TemporalTrainConfig(sync_every=0)
    with pytest.raises(ValueError, match="unknown grad_dtype 'float16'; choose float32 or bfloat16"):
        TemporalTrainConfig(grad_dtype="float16")
    with pytest.raises(ValueError, match="unknown wire_dtype 'int4'; choose float32 or float16 or bfloat16 or int8"):
        TemporalTrainConfig(wire_dtype="int4")
    with pytest.raises(ValueError, match="--wire-dtype must be one of float32, float16, bfloat16, int8, got 'fp8'"):
        ShardedMemory(memory, torch.zeros(10, dtype=torch.int64), staleness=0, exchanger=one, wire_dtype="fp8")
    with pytest.raises(TypeError, match="wire dtype int8 encodes float32 memory only, and this one is torch.float64"):
        ShardedMemory(memory.double(), torch.zeros(10, dtype=torch.int64), staleness=0, exchanger=one, wire_dtype="int8")
    with pytest.raises(ValueError, match="unknown partition_method 'kaminpar'; choose metis or random"):
        TemporalTrainConfig(partition_method="kaminpar")
    events = stream(num_events=200, num_nodes=30)
    with gs.init() as world, pytest.raises(ValueError, match="give world or runtime, not both"):
        TemporalLinkTrainer(events, chronological_split(events), memory_config=MemoryConfig(memory_dim=4, time_dim=4),
                            tgn_config=TGNConfig(embedding_dim=4, heads=2), config=TemporalTrainConfig(),
                            world=world, runtime=world.runtime)


def test_unknown_bench_wire_dtype_is_a_one_line_error(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "scripts" / "bench_temporal_staleness.py"), "--wire-dtypes",
                           "float32,fp8", "--out", str(tmp_path / "bench.json")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and not (tmp_path / "bench.json").exists()
    assert done.stderr.strip().splitlines() == [
        "error: --wire-dtypes takes comma-separated values of float32, float16, bfloat16, int8, got 'float32,fp8'"]


def test_scale_bench_refuses_an_unknown_mode_in_one_line(tmp_path):
    """``--modes`` takes memory, epoch, sharded or sharded:K; anything else is refused before any run."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for modes in ("sharded:x", "memory:2", "sharded:-1", "pipeline"):
        done = subprocess.run([sys.executable, str(root / "scripts" / "bench_temporal_scale.py"), "--modes", modes,
                               "--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out.json")],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [
            "error: --seeds needs at least one integer, --ranks >= 2, --modes some of memory, sharded, "
            "sharded:K (K >= 0), epoch"], (modes, done.stderr)
        assert not (tmp_path / "work").exists() and not (tmp_path / "out.json").exists()
