"""The prefetching loader (gnnscale.pipeline.loader) and the CPU path of DeviceFeeder, on a small synthetic graph."""

from __future__ import annotations

import gc
import re
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from gnnscale.data.dataset import csc_from_edges
from gnnscale.pipeline import LoaderConfig, PrefetchLoader, batch_rng, epoch_order, split_batches
from gnnscale.pipeline.device import DeviceFeeder
from samplers import NeighborSampler, SamplerConfig

NUM_NODES = 3000
NUM_SEEDS = 1000
BATCH = 96  # 1000 = 10 * 96 + 40: the last batch is partial
THREAD_PREFIX = "gnnscale-loader"


@dataclass
class Graph:
    sampler: NeighborSampler
    seeds: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor


@pytest.fixture(scope="module")
def graph() -> Graph:
    rng = np.random.default_rng(7)
    src, dst = rng.integers(0, NUM_NODES, 12000), rng.integers(0, NUM_NODES, 12000)
    indptr, indices = csc_from_edges(src, dst, NUM_NODES, symmetrize=True)
    sampler = NeighborSampler(indptr, indices, SamplerConfig(fanouts=[5, 3]))
    seeds = torch.from_numpy(np.sort(rng.choice(NUM_NODES, NUM_SEEDS, replace=False))).to(torch.int64)
    generator = torch.Generator().manual_seed(7)
    features = torch.randn(NUM_NODES, 16, generator=generator, dtype=torch.float32)
    labels = torch.randperm(NUM_NODES, generator=generator)  # int64, distinct: a wrong row cannot match by chance
    return Graph(sampler, seeds, features, labels)


def make_loader(graph: Graph, sample=None, **config) -> PrefetchLoader:
    config.setdefault("batch_size", BATCH)
    return PrefetchLoader(sample or graph.sampler.sample, graph.seeds, graph.features, graph.labels,
                          LoaderConfig(**config))


def loader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


def wait_for_no_loader_threads(deadline_s: float = 5.0) -> list[str]:
    """Poll until no loader worker is alive; the names still alive at the deadline (empty on success)."""
    deadline = time.monotonic() + deadline_s
    while (alive := loader_threads()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return alive


@pytest.fixture(autouse=True)
def no_leftover_workers():
    yield
    assert wait_for_no_loader_threads() == [], "this test left loader workers running"


def snapshot(loaded) -> dict:
    """Everything a batch carries, copied out (x and y are views of reused buffers)."""
    batch = loaded.batch if hasattr(loaded, "batch") else loaded  # LoadedBatch or MiniBatch
    out = {"seeds": batch.seeds.clone(),
           "blocks": [(b.indptr.clone(), b.indices.clone(), b.src_ids.clone(), b.num_dst) for b in batch.blocks]}
    if hasattr(loaded, "batch"):
        out["x"] = None if loaded.x is None else loaded.x.clone()
        out["y"] = loaded.y.clone()
    return out


def assert_same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for i, (p, q) in enumerate(zip(a, b)):
        assert torch.equal(p["seeds"], q["seeds"]), f"batch {i}: seeds differ"
        assert len(p["blocks"]) == len(q["blocks"])
        for layer, (bp, bq) in enumerate(zip(p["blocks"], q["blocks"])):
            for name, tp, tq in zip(("indptr", "indices", "src_ids"), bp[:3], bq[:3]):
                assert torch.equal(tp, tq), f"batch {i} block {layer}: {name} differs"
            assert bp[3] == bq[3]
        for key in ("x", "y"):
            if key in p and key in q:
                assert torch.equal(p[key], q[key]), f"batch {i}: {key} differs"


def epoch_snapshots(loader, epochs: int = 2) -> list[list[dict]]:
    return [[snapshot(b) for b in loader] for _ in range(epochs)]


# ---------------------------------------------------------------------- 1. coverage
@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_every_seed_once_per_epoch(graph: Graph, num_workers: int) -> None:
    loader = make_loader(graph, num_workers=num_workers, shuffle=True, prefetch=2)
    assert len(loader) == 11
    orders = []
    for _ in range(2):
        sizes, seen = [], []
        for loaded in loader:
            sizes.append(loaded.batch.seeds.numel())
            seen.append(loaded.batch.seeds.clone())
        order = torch.cat(seen)
        assert sizes == [BATCH] * 10 + [NUM_SEEDS - 10 * BATCH]
        assert len(sizes) == len(loader)
        assert order.dtype == torch.int64
        assert torch.equal(order.sort().values, graph.seeds), "every seed exactly once"
        orders.append(order)
    assert not torch.equal(orders[0], orders[1]), "shuffle draws a new order every epoch"
    assert not torch.equal(orders[0], graph.seeds)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_drop_last_skips_the_partial_batch(graph: Graph, num_workers: int) -> None:
    loader = make_loader(graph, num_workers=num_workers, drop_last=True, seed=3)
    assert len(loader) == NUM_SEEDS // BATCH == 10
    for epoch in range(2):
        seen = [loaded.batch.seeds.clone() for loaded in loader]
        assert len(seen) == len(loader)
        assert all(s.numel() == BATCH for s in seen)
        # The skipped seeds are the tail of this epoch's order.
        expected = epoch_order(graph.seeds, shuffle=True, seed=3, epoch=epoch)[:10 * BATCH]
        assert torch.equal(torch.cat(seen), expected)
    # When the batch size divides the seed count, drop_last drops nothing.
    even = make_loader(graph, num_workers=num_workers, drop_last=True, batch_size=100)
    seen = [loaded.batch.seeds.clone() for loaded in even]
    assert len(even) == len(seen) == 10
    assert torch.equal(torch.cat(seen).sort().values, graph.seeds)


def test_no_shuffle_keeps_the_given_order(graph: Graph) -> None:
    loader = make_loader(graph, num_workers=2, shuffle=False)
    for _ in range(2):
        assert torch.equal(torch.cat([loaded.batch.seeds.clone() for loaded in loader]), graph.seeds)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_empty_seed_set_yields_no_batches(graph: Graph, num_workers: int) -> None:
    loader = PrefetchLoader(graph.sampler.sample, torch.empty(0, dtype=torch.int64), graph.features, graph.labels,
                            LoaderConfig(batch_size=BATCH, num_workers=num_workers))
    assert len(loader) == 0
    assert list(loader) == []


# ---------------------------------------------------------------------- 2. determinism
def test_same_seed_same_batches_and_a_different_seed_differs(graph: Graph) -> None:
    first = epoch_snapshots(make_loader(graph, num_workers=3, seed=5))
    second = epoch_snapshots(make_loader(graph, num_workers=3, seed=5))
    for a, b in zip(first, second):
        assert_same_batches(a, b)
    assert not torch.equal(first[0][0]["seeds"], first[1][0]["seeds"]), "the two epochs differ"

    other = epoch_snapshots(make_loader(graph, num_workers=3, seed=6), epochs=1)[0]
    assert any(not torch.equal(p["seeds"], q["seeds"]) for p, q in zip(first[0], other))
    # Without shuffling the seeds are the same, but the seed still drives the neighbour sampling.
    fixed5 = epoch_snapshots(make_loader(graph, num_workers=1, seed=5, shuffle=False), epochs=1)[0]
    fixed6 = epoch_snapshots(make_loader(graph, num_workers=1, seed=6, shuffle=False), epochs=1)[0]
    assert all(torch.equal(p["seeds"], q["seeds"]) for p, q in zip(fixed5, fixed6))
    assert any(not torch.equal(p["blocks"][0][2], q["blocks"][0][2]) for p, q in zip(fixed5, fixed6))


def test_every_batch_has_its_own_generator() -> None:
    draws = {key: batch_rng(*key).integers(0, 2**62, 4).tolist() for key in
             [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (5, 2, 3)]}
    assert len({tuple(d) for d in draws.values()}) == len(draws), "seed, epoch and index all change the stream"
    assert batch_rng(5, 2, 3).integers(0, 2**62, 4).tolist() == draws[(5, 2, 3)]


def test_batches_do_not_depend_on_worker_count_and_match_plain_sampling(graph: Graph) -> None:
    reference = epoch_snapshots(make_loader(graph, num_workers=0, seed=11))
    for num_workers, prefetch in [(1, 0), (3, 2)]:
        other = epoch_snapshots(make_loader(graph, num_workers=num_workers, prefetch=prefetch, seed=11))
        for a, b in zip(reference, other):
            assert_same_batches(a, b)
    for epoch, batches in enumerate(reference):  # pass e, batch i: the sampler called with generator (11, e, i, 0)
        order = epoch_order(graph.seeds, shuffle=True, seed=11, epoch=epoch)
        plain = [snapshot(graph.sampler.sample(seeds, rng=batch_rng(11, epoch, i)))
                 for i, seeds in enumerate(split_batches(order, BATCH, False))]
        assert_same_batches(batches, plain)


def test_a_pass_in_equal_batches_and_per_rank_generators(graph: Graph) -> None:
    loader = make_loader(graph, num_workers=0, seed=11)
    loader.config.num_batches = 3
    sizes = [loaded.y.numel() for loaded in loader]
    assert len(sizes) == len(loader) == 3 and max(sizes) - min(sizes) <= 1 and sum(sizes) == graph.seeds.numel()
    assert batch_rng(11, 0, 0, 1).random() != batch_rng(11, 0, 0, 0).random()


# ---------------------------------------------------------------------- 3. gathered rows
@pytest.mark.parametrize(("num_workers", "prefetch"), [(0, 2), (1, 0), (3, 2)])
def test_x_and_y_are_the_rows_of_the_batch(graph: Graph, num_workers: int, prefetch: int) -> None:
    loader = make_loader(graph, num_workers=num_workers, prefetch=prefetch)
    for _ in range(2):
        count = 0
        for loaded in loader:
            batch = loaded.batch
            assert loaded.index == count
            assert loaded.x.dtype == torch.float32 and loaded.x.shape == (batch.input_ids.numel(), 16)
            assert torch.equal(loaded.x, graph.features[batch.input_ids])
            assert loaded.y.dtype == torch.int64
            assert torch.equal(loaded.y, graph.labels[batch.seeds])
            count += 1
        assert count == len(loader)


# ---------------------------------------------------------------------- 4./5. shutdown
def slow_sample(graph: Graph, delay_s: float = 0.005):
    def sample(seeds, rng=None):
        time.sleep(delay_s)
        return graph.sampler.sample(seeds, rng=rng)
    return sample


@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("how", ["exception", "break", "keyboard_interrupt"])
def test_leaving_the_loop_early_stops_the_workers(graph: Graph, num_workers: int, how: str) -> None:
    loader = make_loader(graph, slow_sample(graph), num_workers=num_workers, batch_size=20)  # 50 batches
    received = 0

    def consume() -> None:
        nonlocal received
        for loaded in loader:
            received += 1
            if loaded.index == 2:
                assert len(loader_threads()) == num_workers, "workers run during the pass"
                if how == "exception":
                    raise RuntimeError("consumer failed")
                if how == "keyboard_interrupt":
                    raise KeyboardInterrupt
                break

    if how == "exception":
        with pytest.raises(RuntimeError, match="^consumer failed$"):
            consume()
    elif how == "keyboard_interrupt":
        with pytest.raises(KeyboardInterrupt):
            consume()
    else:
        consume()
    assert received == 3
    assert wait_for_no_loader_threads() == []
    # The loader is still usable: the next pass is complete.
    assert sum(1 for _ in loader) == len(loader) == 50
    assert wait_for_no_loader_threads() == []


@pytest.mark.parametrize("num_workers", [1, 3])
def test_no_worker_outlives_a_pass_or_the_loader(graph: Graph, num_workers: int) -> None:
    loader = make_loader(graph, num_workers=num_workers)
    assert sum(1 for _ in loader) == len(loader)
    assert wait_for_no_loader_threads() == []

    iterator = iter(loader)
    next(iterator)
    next(iterator)
    assert len(loader_threads()) == num_workers
    alive = weakref.ref(loader)
    del iterator, loader
    gc.collect()
    assert wait_for_no_loader_threads() == []
    assert alive() is None, "the loader is not kept alive by its (stopped) workers"


# ---------------------------------------------------------------------- 6. worker errors
@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_a_worker_exception_is_reraised_in_the_consumer(graph: Graph, num_workers: int) -> None:
    lock = threading.Lock()
    calls = 0
    failed: list[torch.Tensor] = []

    def sample(seeds, rng=None):
        nonlocal calls
        with lock:
            calls += 1
            fail = calls == 4
        if fail:
            failed.append(seeds.clone())
            raise ValueError("boom")
        return graph.sampler.sample(seeds, rng=rng)

    loader = make_loader(graph, sample, num_workers=num_workers, batch_size=20, seed=2)
    received = []
    with pytest.raises(ValueError, match="^boom$") as caught:
        for loaded in loader:
            received.append(loaded.batch.seeds.clone())
    assert caught.type is ValueError
    assert wait_for_no_loader_threads() == []
    # Every batch before the failed one was delivered, in order, and nothing after it.  (With several workers the
    # 4th call need not be batch 3: a worker may take a task and be overtaken before it calls the sampler.)
    expected = split_batches(epoch_order(graph.seeds, shuffle=True, seed=2, epoch=0), 20, False)
    failed_index = next(i for i, s in enumerate(expected) if torch.equal(s, failed[0]))
    if num_workers <= 1:
        assert failed_index == 3, "one sampling thread calls in batch order"
    assert len(received) == failed_index
    assert all(torch.equal(a, b) for a, b in zip(received, expected))
    assert calls < len(expected), "the workers stopped instead of sampling the whole epoch"


# ---------------------------------------------------------------------- 7. bounded prefetch, buffer lifetime
@pytest.mark.parametrize(("num_workers", "prefetch"), [(2, 1), (1, 0), (0, 2)])
def test_prefetch_is_bounded_by_the_buffer_slots(graph: Graph, num_workers: int, prefetch: int) -> None:
    # With workers the loader owns prefetch + num_workers + 2 buffer slots.  A worker takes a slot before it
    # starts sampling a batch, and the slot comes back only when the loader waits on the batch's
    # ``release_after`` events, so "sampled but not released" can never exceed the slot count, and the workers
    # fill every slot when the consumer is slow.  The consumer keeps its current and its previous batch (valid
    # until it asks for the batch after next), so while it holds batch k >= 1 sampling has started for at most
    # batches 0 .. k + slots - 2: started - consumed <= slots - 2 = prefetch + num_workers (one more while it
    # holds only batch 0).
    # Without workers a batch is sampled on demand, into one of two slots, and nothing is sampled ahead.
    slots = prefetch + num_workers + 2
    ahead = prefetch + num_workers if num_workers else 0  # from batch 1 on
    lock = threading.Lock()
    started = released = consumed = 0
    in_use_at_sample = []

    class ReleaseProbe:
        """Stands in for a CUDA event: the loader synchronizes it right before recycling the batch's slot."""

        def synchronize(self) -> None:
            nonlocal released
            with lock:
                released += 1

    def sample(seeds, rng=None):
        nonlocal started
        with lock:
            started += 1
            in_use_at_sample.append(started - released)
        time.sleep(0.005)
        return graph.sampler.sample(seeds, rng=rng)

    loader = make_loader(graph, sample, num_workers=num_workers, prefetch=prefetch, batch_size=50)  # 20 batches
    in_use, sampled_ahead = [], []
    for loaded in loader:
        loaded.release_after.append(ReleaseProbe())
        with lock:
            consumed += 1
            in_use.append(started - released)
            sampled_ahead.append(started - consumed - (loaded.index == 0))
        if loaded.index == 4 and num_workers:
            # Let the workers run ahead as far as they can: they fill every slot, then block.
            deadline = time.monotonic() + 5.0
            while started - released < slots and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)
            with lock:
                assert started - released == slots, "the workers fill every slot, and no more"
                assert started - consumed == ahead
        time.sleep(0.01)
        with lock:
            in_use.append(started - released)  # again, once the workers had time to run ahead
            sampled_ahead.append(started - consumed - (loaded.index == 0))
    assert max(in_use + in_use_at_sample) <= (slots if num_workers else 1)
    assert max(sampled_ahead) <= ahead
    # Every batch's release events were waited on by the end of the pass (the last ones in its ``finally``).
    assert started == consumed == released == len(loader) == 20


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_the_previous_batch_stays_valid_until_the_batch_after_next_is_requested(graph: Graph,
                                                                                num_workers: int) -> None:
    # LoadedBatch: x and y are "valid until the trainer asks for the batch after next".  A slow consumer lets
    # the workers refill every slot they are given before it looks at the previous batch again.
    loader = make_loader(graph, num_workers=num_workers, prefetch=1, batch_size=50)
    previous = None
    for loaded in loader:
        time.sleep(0.02)
        for held in (previous, loaded):
            if held is not None:
                assert torch.equal(held.x, graph.features[held.batch.input_ids]), f"batch {held.index}: x reused"
                assert torch.equal(held.y, graph.labels[held.batch.seeds]), f"batch {held.index}: y reused"
        previous = loaded


# ---------------------------------------------------------------------- 8. stats
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pass_stats(graph: Graph, num_workers: int) -> None:
    loader = make_loader(graph, num_workers=num_workers)
    for _ in range(2):  # the stats describe the last pass only
        gathered = 0
        for loaded in loader:
            gathered += loaded.x.numel() * 4
        stats = loader.stats
        assert stats.batches == len(loader) == 11
        assert stats.wait >= 0 and stats.gather >= 0
        assert stats.sample > 0
        assert stats.seconds > 0
        assert stats.gathered_bytes == gathered > 0
        assert stats.as_dict()["batches"] == 11 and stats.as_dict()["gathered_bytes"] == gathered


@pytest.mark.parametrize("num_workers", [0, 1])
def test_pass_stats_cpu_seconds_are_the_threads_own(graph: Graph, num_workers: int) -> None:
    """A sampler that sleeps spends wall time but no CPU: ``sample_cpu`` leaves the sleep out."""
    def sleepy(seeds: torch.Tensor, rng: np.random.Generator):
        time.sleep(0.02)
        return graph.sampler.sample(seeds, rng=rng)

    loader = make_loader(graph, sample=sleepy, num_workers=num_workers)
    for _ in loader:
        pass
    stats = loader.stats
    assert stats.sample >= 11 * 0.02
    assert 0 < stats.sample_cpu < stats.sample - 11 * 0.015, (stats.sample_cpu, stats.sample)
    assert 0 < stats.gather_cpu and stats.as_dict()["gather_cpu_s"] == stats.gather_cpu


# ---------------------------------------------------------------------- 9. config validation
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
    ({"num_workers": -1}, "num_workers must be >= 0 (0 samples in the trainer's thread), got -1"),
    ({"prefetch": -1}, "prefetch must be >= 0, got -1"),
])
def test_loader_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        LoaderConfig(**kwargs)


def test_loader_config_accepts_the_boundaries() -> None:
    config = LoaderConfig(batch_size=1, num_workers=0, prefetch=0)
    assert (config.batch_size, config.num_workers, config.prefetch) == (1, 0, 0)


# ---------------------------------------------------------------------- 10. features on the device
@pytest.mark.parametrize("num_workers", [0, 2])
def test_device_feeder_on_cpu(graph: Graph, num_workers: int) -> None:
    ids_only = make_loader(graph, num_workers=num_workers, gather_features=False)
    count = 0
    for loaded in ids_only:
        assert loaded.x is None
        assert torch.equal(loaded.y, graph.labels[loaded.batch.seeds])
        count += 1
    assert count == len(ids_only) and ids_only.stats.gathered_bytes == 0

    feeder = DeviceFeeder("cpu", device_features=graph.features)
    count = 0
    for item in feeder(ids_only):
        assert torch.equal(item.x, graph.features[item.batch.input_ids])
        assert torch.equal(item.y, graph.labels[item.batch.seeds])
        count += 1
    assert count == len(ids_only)

    # Without a device table the CPU feeder hands the loader's tensors through untouched (None stays None).
    for loader in (make_loader(graph, num_workers=num_workers), ids_only):
        delivered = []

        def tap():
            for loaded in loader:
                delivered.append(loaded)
                yield loaded

        for item in DeviceFeeder("cpu")(tap()):
            assert item.x is delivered[-1].x and item.y is delivered[-1].y
            assert item.batch is delivered[-1].batch and item.index == delivered[-1].index
        assert len(delivered) == len(loader)


def test_device_feeder_rejects_a_table_on_another_device(graph: Graph) -> None:
    on_meta = torch.empty(NUM_NODES, 16, device="meta")
    with pytest.raises(ValueError, match=re.escape("device_features is on meta, expected cpu")):
        DeviceFeeder("cpu", device_features=on_meta)


def test_a_second_concurrent_pass_is_refused(graph: Graph) -> None:
    loader = make_loader(graph, num_workers=2)
    first = iter(loader)
    next(first)
    with pytest.raises(RuntimeError, match="already in a pass; it runs one pass at a time"):
        next(iter(loader))
    first.close()
    assert len(list(loader)) == len(loader)  # once the first pass is closed, a new one runs


def test_negative_seed_is_rejected_up_front() -> None:
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        LoaderConfig(seed=-1)


def test_a_swallowed_ctrl_c_still_stops_the_pass(graph):
    """A SIGINT whose KeyboardInterrupt was lost (raised inside a __del__) stops the pass at the next batch."""
    import os
    import signal

    from gnnscale import interrupt

    previous = signal.getsignal(signal.SIGINT)
    interrupt.install()
    try:
        loader = make_loader(graph, num_workers=1)
        seen = 0
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:
                seen += 1
                if seen == 2:
                    try:
                        os.kill(os.getpid(), signal.SIGINT)
                        time.sleep(0.5)  # the handler raises in here ...
                    except KeyboardInterrupt:
                        pass  # ... and the exception is swallowed, as in a __del__
        assert seen == 2
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupt._requested.clear()


def test_num_batches_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_batches must be >= 1, got 0"):
        LoaderConfig(num_batches=0)
