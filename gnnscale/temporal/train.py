"""TGN training for temporal link prediction, in the event stream's order, on one rank or several.

One epoch replays the training events in batches of ``batch_size`` consecutive events
(chronological order is the point: the memory must see the past before the present).  For each
batch: apply the pending messages (``memory.updated()``), embed sources, destinations and one
random negative destination per event from their sampled past neighbours (strictly earlier
events only), take a gradient step on the link loss, persist the batch's nodes' memory and store
the batch's events as messages (see :mod:`gnnscale.temporal.memory`).

On several ranks (under torchrun) every rank walks the same global batches: each computes its share
of the batch's events, chosen by source owner (``event_split``; :class:`ShardedMemory` holds the
node memory by owner), the gradients are summed across ranks (the loss is a sum over the rank's
events divided by the global batch size, so the sum is the single-process mean), and every rank
draws the same negatives and the whole batch's dropout masks (keeping its events' rows).  With
``staleness=0`` and recent-neighbour sampling the run is the single-process run up to float rounding,
dropout included: the same loss every step and the same memory (tests/test_temporal_equivalence.py).
That is ``parallelism="sharded"``.

With ``parallelism="memory"`` (DistTGL's memory parallelism) every rank is a *memory group*: it
holds a whole node memory of its own and trains on its own contiguous segment of the training
stream, and the gradients of the R groups' batches are averaged every step, so each group keeps
the small batch accuracy needs while an epoch takes 1/R of the steps.  The stream is cut into R
segments of equal step count; in epoch ``e`` group ``g`` trains on segment ``(g + e - 1) mod R``,
so each group's memory walks the stream without a break: it carries on from where the group's
previous epoch ended and is reset only where the stream starts again.  In epoch 1 a group that
starts mid-stream first replays the earlier segments through its memory alone (no embeddings, no
gradients).  Evaluation continues from the memory of the group that has just trained on the last
segment, which every rank receives and evaluates alike.

With ``parallelism="epoch"`` (DistTGL's epoch parallelism) every rank also holds a whole memory, but
all ranks walk the *whole* training stream, rank ``r`` lagging ``r`` steps behind rank 0 and drawing
its own negatives, and the gradients of the R ranks' batches are averaged every step.  So in one
pass every event is trained on R times, with R negative sets and R successive versions of the
weights, for the time of one pass plus R - 1 steps and the gradient sums: what R epochs would
teach, in about the time of one, if extra passes over the same positives are worth what
sequential epochs are.  No memory rows travel: each rank's memory follows the stream alone.
Evaluation continues from rank 0's memory, which every rank receives.

Evaluation continues the stream from the memory reached at the end of training through the
validation events (and on through the test events), over all events so far for neighbours, and
reports for each split:

* ``ap``: average precision of positives against one random negative destination each;
* ``ap_per_batch``: TGN's AP, the same computed within each batch of ``batch_size`` events, then
  averaged over the batches;
* ``mrr``: mean reciprocal rank of each positive among ``eval_negatives`` random negative
  destinations (ties count half a place);
* the same, restricted to the *inductive* events (touching a node never seen in training),
  scored in the same pass.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gnnscale import interrupt
from gnnscale.distributed.comm import Exchanger
from gnnscale.distributed.wire import WIRE_DTYPES
from gnnscale.metrics import average_precision, mean_reciprocal_rank, per_batch_average_precision
from gnnscale.distributed.gradsum import GradientSum
from gnnscale.temporal.checkpoint import TemporalCheckpoint, restore, run_fingerprint, save_epoch
from gnnscale.temporal.memory import MemoryConfig, MemoryView
from gnnscale.temporal.sharded import ShardedMemory, StalenessStats, StepWrites
from gnnscale.temporal.tgn import TGN, Neighborhood, TGNConfig
from gnnscale.train.fit import FitState, epoch_seed, fit, seeded

log = logging.getLogger("gnnscale.temporal")

BASE_LR = 5e-4
"""The default Adam learning rate (TGN uses 1e-4, which converged several times slower on Wikipedia)."""

GRAD_DTYPES = ("float32", "bfloat16")
"""``grad_dtype`` choices (gloo sums bfloat16 in torch 2.2.1 and later)."""


@dataclass(kw_only=True)
class TemporalTrainConfig:
    """Optimisation and evaluation of a temporal link-prediction run."""

    epochs: int = 10
    """Passes over the training events."""
    batch_size: int = 200
    """Consecutive events per step."""
    lr: float | None = None
    """Adam learning rate; ``None``: :data:`BASE_LR`, times R for memory parallelism on R ranks
    (:func:`default_lr`)."""
    num_neighbors: int = 10
    """Past events each node attends over."""
    sampling: str = "recent"
    """Which past events: ``recent`` (most recent) or ``uniform``."""
    eval_negatives: int = 10
    """Negative destinations per positive for MRR."""
    patience: int = 0
    """Stop after this many epochs without a better validation AP; 0 (the default, as on the command
    line) never stops early, so ``epochs`` is exactly what runs; the best epoch is kept either way."""
    seed: int = 0
    """Seeds the model, the negatives and the neighbour sampling."""
    device: str = "cpu"
    staleness: int = 0
    """K: the most global steps a read of another rank's node memory may be behind (several ranks)."""
    event_split: str = "balanced"
    """Which rank computes an event of a global batch: ``owner`` of its source node, or ``balanced``:
    the source's owner up to an equal share of the batch per rank, the overflow to ranks with room
    (every step waits for the slowest rank, and bursts of one user's events are common)."""
    neighbor_cutoff: str = "event"
    """Which past events a query's neighbours come from: (TGN/TGL) those strictly before its own
    ``event``'s time, earlier events of its own batch included, or those strictly before its
    ``batch``'s first event time (docs/temporal.md, "No leakage")."""
    sync_every: int = 1
    """Batches per optimizer step: gradients are accumulated over ``sync_every`` consecutive batches
    (the memory still advances every batch), so ranks sum gradients once per that many batches."""
    memory_cache_rows: int | None = None
    """Sharded: rows of each rank's memory table for nodes owned elsewhere, evicted least recently read
    first (``None``: a dense table of every node)."""
    train_negatives: str = "all"
    """Where training negatives come from: ``all`` destinations of the stream, the destinations of the
    training events (``train``, the reference TGN's), or the training destinations ``seen`` up to the
    end of the batch.  Evaluation always draws from every destination."""
    parallelism: str = "sharded"
    """Several ranks: ``sharded`` (one memory, owned by rank; every rank computes a share of each global
    batch), ``memory`` (each rank a memory group with a whole memory and its own time segment) or
    ``epoch`` (each rank a whole memory and the whole stream, rank ``r`` ``r`` steps behind, its own
    negatives; an epoch trains every event once per rank)."""
    wire_dtype: str = "float32"
    """Sharded: how memory rows (and a bounded cache's fetched memory and mail rows) cross ranks:
    ``float32`` exactly, or ``float16``/``bfloat16``/``int8`` within the bounds of
    :mod:`gnnscale.distributed.wire`; times always travel exactly."""
    grad_dtype: str = "float32"
    """Several ranks: the dtype gradients are summed in: ``float32``, or ``bfloat16`` (half the bytes,
    float32's range, each rank's gradient and each partial sum rounded to 8 significant bits)."""
    checkpoint_every: int = 1
    """Checkpoint every this many epochs, and after the last (with an ``out`` folder); 0 never
    (:mod:`gnnscale.temporal.checkpoint`)."""
    resume: bool = False
    """Continue from the ``out`` folder's checkpoint when there is one."""
    partition_method: str = "metis"
    """Sharded, several ranks: how the trainer assigns node memory to ranks when not given owners
    (:func:`memory_owners`): ``metis`` on the training interactions (few remote reads) or ``random``."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "num_neighbors", "eval_negatives", "sync_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name, choices in (("sampling", ("recent", "uniform")), ("event_split", ("balanced", "owner")),
                              ("neighbor_cutoff", ("batch", "event")), ("train_negatives", ("all", "train", "seen")),
                              ("parallelism", ("sharded", "memory", "epoch")), ("wire_dtype", WIRE_DTYPES),
                              ("grad_dtype", GRAD_DTYPES), ("partition_method", ("metis", "random"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose {' or '.join(choices)}")
        for name, unit in (("staleness", " global steps"), ("patience", ""), ("checkpoint_every", " epochs")):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0{unit}, got {getattr(self, name)}")


def default_lr(parallelism: str, world_size: int) -> float:
    """The learning rate of a run that names none: :data:`BASE_LR`, times R for memory parallelism on R ranks.

    R memory groups average their gradients every step and each trains 1/R of the stream, so an epoch
    takes 1/R of one process's optimizer steps; scaling the rate by R (the linear scaling rule) keeps
    what an epoch teaches.  Measured on the dense SNAP stream at batch 20, 5 epochs, 3 seeds
    (docs/temporal.md, "Learning rate of memory parallelism"): test AP 0.8879 at 5e-4, 0.9214 at 1e-3,
    against one process's 0.9001.
    """
    return BASE_LR * world_size if parallelism == "memory" and world_size > 1 else BASE_LR


DENSE_EVENTS_PER_NODE = 100.0
"""Training events per node (both ends counted, over the nodes that have any) from which a stream counts as
dense: Wikipedia has 26, CollegeMsg 47; SNAP email-Eu-core Dept1 286, the synthetic dense stream 127."""


def dense_stream_warning(events, split, config: TemporalTrainConfig, world_size: int) -> str | None:
    """What to warn about before memory parallelism sums gradients over several batches on a dense stream
    (``None``: nothing).  Measured (docs/temporal.md, Dense streams): on the dense SNAP stream, batch 200,
    ``sync_every=4`` lost 0.165 test AP against one process on the mean of 3 seeds (0.7180 against 0.8831), and
    0.15 on issue 31's own dense stream, where ``sync_every=1`` is within 0.02 above one process."""
    if config.parallelism != "memory" or world_size == 1 or config.sync_every == 1:
        return None
    ends = np.concatenate([events.src[split.train], events.dst[split.train]])
    per_node = ends.size / max(np.unique(ends).size, 1)
    if per_node < DENSE_EVENTS_PER_NODE:
        return None
    return (f"memory parallelism with sync_every={config.sync_every} on a dense stream ({per_node:.0f} training "
            f"events per node, dense from {DENSE_EVENTS_PER_NODE:.0f}) lost 0.12-0.21 test AP against one process on "
            "the dense streams measured; sync_every=1 (the default) kept it (docs/temporal.md, Dense streams)")


MEMORY_BATCH_MEASURED = 200
"""The smallest batch at which memory parallelism kept within 0.01 test AP of one process on every stream measured
(Wikipedia, CollegeMsg, the dense SNAP stream, 3 seeds each); below it, :func:`small_batch_warning`."""


def small_batch_warning(config: TemporalTrainConfig, world_size: int) -> str | None:
    """What to warn about before memory groups train at a batch below :data:`MEMORY_BATCH_MEASURED` (``None``:
    nothing).  Measured (docs/temporal.md, the grid at batch 20, 5 epochs): CollegeMsg lost 0.034 test AP against one
    process on the mean of 3 seeds, every seed 0.024-0.052 below, where epoch parallelism was within 0.01."""
    if config.parallelism != "memory" or world_size == 1 or config.batch_size >= MEMORY_BATCH_MEASURED:
        return None
    return (f"memory parallelism at batch {config.batch_size} (below {MEMORY_BATCH_MEASURED}): at batch 20 it lost "
            "0.024-0.052 test AP against one process on CollegeMsg (3 seeds), where at 200 it was within 0.01 on "
            "every stream measured; consider --batch-size 200 or --parallelism epoch (docs/temporal.md, the grid)")


def memory_owners(events, split, runtime, *, method: str = "metis", seed: int = 0) -> np.ndarray:
    """int64 [num_nodes]: the rank owning each node's memory, the same on every rank of ``runtime``.

    Rank 0 partitions the training interactions (:func:`~gnnscale.temporal.sharded.partition_interactions`)
    and sends the result to the others, so every rank holds the same assignment whatever its own
    partitioner would have drawn.
    """
    import torch.distributed as dist

    from gnnscale.temporal.sharded import partition_interactions

    world_size = runtime.world_size
    owner = torch.zeros(events.num_nodes, dtype=torch.int64)
    if runtime.rank == 0:
        start = time.perf_counter()
        train = split.train
        owner = torch.from_numpy(partition_interactions(events.src[train], events.dst[train], events.num_nodes,
                                                        world_size, method=method, seed=seed))
        ranks = owner.numpy()[events.src[train]]
        cut = float(np.mean(ranks != owner.numpy()[events.dst[train]]))
        log.info("node memory: %s partition of the training interactions in %.1fs; nodes per rank %s, "
                 "training events per rank %s, %.1f%% of events cross ranks", method, time.perf_counter() - start,
                 np.bincount(owner.numpy(), minlength=world_size).tolist(),
                 np.bincount(ranks, minlength=world_size).tolist(), 100 * cut)
    if world_size > 1:
        dist.broadcast(owner, src=0, group=runtime.sample_group)
    return owner.numpy()


def split_events(preferred: np.ndarray, world_size: int) -> np.ndarray:
    """Rank of each event of a batch: its ``preferred`` rank while that rank has fewer than
    ``ceil(n / world_size)`` events (in batch order), else, in batch order, the ranks with room."""
    n = preferred.size
    cap = -(-n // world_size)
    order = np.argsort(preferred, kind="stable")
    counts = np.bincount(preferred, minlength=world_size)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank_position = np.empty(n, dtype=np.int64)
    rank_position[order] = np.arange(n) - np.repeat(starts, counts)
    assigned = preferred.copy()
    overflow = np.flatnonzero(rank_position >= cap)
    room = cap - np.minimum(counts, cap)
    assigned[overflow] = np.repeat(np.arange(world_size), room)[:overflow.size]
    return assigned


class TemporalLinkTrainer:
    """Trains a :class:`TGN` on the training events of ``split`` and evaluates on the rest.

    The same code trains in a world of one and on N ranks under torchrun (``world``); on N ranks, sharded,
    the trainer assigns node memory to ranks itself (:func:`memory_owners`, ``config.partition_method``).

    Args:
        events: the whole stream (:class:`gnnscale.TemporalEvents`).
        split: its :func:`~gnnscale.chronological_split`.
        world: the job (:func:`gnnscale.init`); its device is the training device.  ``None``: one
            process on ``config.device``.
        runtime: the process groups of a multi-rank job, for callers that manage them (instead of ``world``).
        owner: int64 [num_nodes], the rank owning each node's memory (several ranks, sharded; default:
            :func:`memory_owners`).
        record: keep every remote read and owned write (tests; :class:`ShardedMemory`).
        out: the run folder for checkpoints (``None``: none); every rank writes its memory share there.
    """

    def __init__(self, events, split, *, memory_config: MemoryConfig, tgn_config: TGNConfig,
                 config: TemporalTrainConfig, world=None, runtime=None, owner: np.ndarray | None = None,
                 record: bool = False, out: Path | None = None) -> None:
        if world is not None:
            if runtime is not None:
                raise ValueError("give world or runtime, not both")
            runtime = world.runtime
        self.events, self.split, self.config = events, split, config
        self.rank = 0 if runtime is None else runtime.rank
        self.world_size = 1 if runtime is None else runtime.world_size
        self.device = torch.device(config.device) if runtime is None else runtime.device
        # Memory and epoch parallelism: every rank holds a whole memory (a "group" of one rank), not sharded.
        self.groups = self.world_size if config.parallelism in ("memory", "epoch") else 1
        shards = self.world_size // self.groups
        if owner is None and shards > 1:
            owner = memory_owners(events, split, runtime, method=config.partition_method, seed=config.seed)
        if owner is None or shards == 1:
            owner = np.zeros(events.num_nodes, dtype=np.int64)
        with seeded(config.seed, torch.device("cpu")):  # seeded weights built on the CPU, the caller's RNG untouched
            self.model = TGN(events.num_nodes, memory_config, tgn_config).to(self.device)
        if tgn_config.static_memory and config.memory_cache_rows is not None:
            raise ValueError("static node memory is a table of every node on every rank, which a bounded "
                             "memory table cannot shrink: drop static memory or memory_cache_rows")
        # Adam, then SparseAdam for the static node memory's rows when the model has one.
        self.lr = default_lr(config.parallelism, self.world_size) if config.lr is None else config.lr
        if config.lr is None and self.lr != BASE_LR:
            log.info("learning rate %g: %g x %d memory groups (each epoch takes 1/%d of the steps; give lr to "
                     "choose another)", self.lr, BASE_LR, self.world_size, self.world_size)
        for warning in (dense_stream_warning(events, split, config, self.world_size),
                        small_batch_warning(config, self.world_size)):
            if warning is not None and self.rank == 0:
                log.warning(warning)
        self.optimizer, *self.sparse_optimizers = self.model.optimizers(self.lr)
        # Gradients travel on the training group (NCCL on CUDA); memory rows on the gloo group.
        self.grad_comm = Exchanger(None if runtime is None else runtime.group, self.rank, self.world_size)
        self.comm = Exchanger(None if runtime is None else runtime.sample_group, self.rank, self.world_size)
        self.gradients = None if self.world_size == 1 else GradientSum(
            [p for p in self.model.parameters() if p.requires_grad], self.grad_comm, dtype=config.grad_dtype,
            sparse=() if self.model.static is None else (self.model.static.weight,))
        self.shard = ShardedMemory(self.model.memory, torch.from_numpy(np.asarray(owner, dtype=np.int64)),
                                   staleness=config.staleness, record=record, cache_rows=config.memory_cache_rows,
                                   wire_dtype=config.wire_dtype,
                                   exchanger=self.comm if shards > 1 else Exchanger(None, 0, 1))
        # Who computes each event: the owner of its source, balanced per batch (see split_events).
        self.event_owner = np.asarray(owner)[events.src]
        self._build_samplers()
        # Negatives come from the `rng` every rank shares; neighbours ("uniform") from this rank's own.
        self.sample_rng = np.random.default_rng((config.seed, 0, self.rank))
        self.mrr_rng = np.random.default_rng((config.seed, 0, 3))
        self.edge_features = None if events.edge_features is None else \
            torch.from_numpy(events.edge_features).to(self.device)
        # Event ids of the neighbourhoods index the graph's own events: map them to stream positions.
        self.cpu_src, self.cpu_dst, self.cpu_t = (torch.from_numpy(a) for a in (events.src, events.dst, events.t))
        self.src = torch.from_numpy(events.src).to(self.device)
        self.dst = torch.from_numpy(events.dst).to(self.device)
        self.t = torch.from_numpy(events.t).to(self.device)
        # The rate the run uses, given or default, is what a resume must match.
        self.checkpoint = TemporalCheckpoint(out, config, comm=self.comm, fingerprint=run_fingerprint(
            events, split, dataclasses.replace(config, lr=self.lr), memory_config, tgn_config, owner, self.world_size))

    def _build_samplers(self) -> None:
        """Neighbours and negatives: training sees only training events as neighbours; evaluation sees every
        event before each query."""
        from samplers.temporal import (RandomDestinationSampler, SeenDestinationSampler, TemporalGraph,
                                       TemporalNeighborSampler)

        events, config = self.events, self.config
        train = np.flatnonzero(self.split.train)
        self.train_graph = TemporalGraph(events.src[train], events.dst[train], events.t[train], events.num_nodes)
        self.full_graph = TemporalGraph(events.src, events.dst, events.t, events.num_nodes)
        self.train_sampler = TemporalNeighborSampler(self.train_graph, config.num_neighbors, config.sampling)
        self.full_sampler = TemporalNeighborSampler(self.full_graph, config.num_neighbors, config.sampling)
        self.train_event_ids = train
        self.negatives = RandomDestinationSampler(np.unique(events.dst))
        self.train_negatives = self.negatives if config.train_negatives == "all" else \
            RandomDestinationSampler(events.dst[train]) if config.train_negatives == "train" else \
            SeenDestinationSampler(events.dst[train])

    # ------------------------------------------------------------------ one batch
    def _neighborhood(self, sampler, nodes: Tensor, times: Tensor, rng: np.random.Generator,
                      event_map: np.ndarray | None) -> Neighborhood:
        found = sampler.sample(nodes.cpu().numpy(), times.cpu().numpy(), rng)
        event_ids = found.event_ids if event_map is None else np.where(found.mask, event_map[found.event_ids.clip(0)], -1)
        return Neighborhood(neighbors=torch.from_numpy(found.neighbors).to(self.device),
                            times=torch.from_numpy(found.times).to(self.device),
                            event_ids=torch.from_numpy(event_ids).to(self.device),
                            mask=torch.from_numpy(found.mask).to(self.device))

    def event_ranks(self, batch: np.ndarray) -> np.ndarray:
        """The rank among the memory's shards computing each event of the global ``batch`` (all 0 where
        one rank holds the memory: one process, or a memory group)."""
        if self.shard.world_size == 1:
            return np.zeros(batch.size, dtype=np.int64)
        ranks = self.event_owner[batch]
        if self.config.event_split == "balanced":
            ranks = split_events(ranks, self.world_size)
        return ranks

    def local_positions(self, batch: np.ndarray) -> np.ndarray:
        """Positions in the global ``batch`` of the events this rank computes (all of them on one rank)."""
        return np.flatnonzero(self.event_ranks(batch) == self.shard.rank)

    def embed_batch(self, batch: np.ndarray, sampler, event_map: np.ndarray | None, rng: np.random.Generator,
                    eval_negatives: int = 0, positions: np.ndarray | None = None,
                    train: bool = False) -> tuple[Tensor, MemoryView]:
        """Embeddings of this rank's share of a global batch: its events' sources, destinations and
        ``1 + eval_negatives`` negatives per event (``[src; dst; negatives]``), with the memory they
        were computed from: ``(z, view)``.  ``positions``: this rank's share of the
        batch, when the caller has it (:meth:`local_positions`); ``train``: the batch is a training
        batch, whose negatives come from ``train_negatives``.

        Leakage-free: the memory has only the messages of earlier batches applied, and neighbours are
        drawn from events strictly before the batch's first event time (``neighbor_cutoff="batch"``: no
        event of the batch reaches its embeddings) or strictly before each query's own event time
        (``"event"``: earlier events of the batch do, the event itself and later ones never; a negative
        has its positive's time).  Time encodings use each query's own time."""
        count = batch.size
        # Every rank draws the whole batch's negatives from the shared stream, and keeps its own events'.
        if train and self.config.train_negatives == "seen":  # the training destinations up to the batch's end
            negatives = self.train_negatives.sample(count, rng, int(np.searchsorted(self.train_event_ids, batch[-1])) + 1)
        else:
            negatives = (self.train_negatives if train else self.negatives).sample(count, rng)
        if eval_negatives:  # from their own stream, so a pass's AP does not depend on whether it ranks
            negatives = np.concatenate([negatives, self.negatives.sample(count * eval_negatives, self.mrr_rng)])
        positions = self.local_positions(batch) if positions is None else positions
        local = torch.from_numpy(batch[positions]).to(self.device)
        negatives = negatives[(positions[None, :] + count * np.arange(1 + eval_negatives)[:, None]).ravel()]
        src, dst, t = self.src[local], self.dst[local], self.t[local]
        nodes = torch.cat([src, dst, torch.from_numpy(negatives).to(self.device)])
        times = torch.cat([t, t, t.repeat(1 + eval_negatives)])
        cutoff = times if self.config.neighbor_cutoff == "event" else \
            torch.full_like(times, float(self.events.t[batch[0]]))
        # The ranking negatives' neighbours ("uniform" draws) from their own stream as well.
        base = 3 * positions.size
        parts = [self._neighborhood(sampler, nodes[:base], cutoff[:base], self.sample_rng, event_map)]
        if eval_negatives:
            parts.append(self._neighborhood(sampler, nodes[base:], cutoff[base:], self.mrr_rng, event_map))
        neighborhood = parts[0] if len(parts) == 1 else Neighborhood(
            *(torch.cat([getattr(part, name) for part in parts]) for name in ("neighbors", "times", "event_ids", "mask")))
        needed = torch.cat([nodes, neighborhood.neighbors[neighborhood.mask]])
        self.shard.read(needed)
        view = self.model.memory.updated(needed)
        # The whole batch's dropout masks, drawn alike on every rank; this rank's rows of [src; dst; negatives].
        rows = (positions[None, :] + count * np.arange(3 + eval_negatives)[:, None]).ravel()
        dropout = self.model.dropout_masks(count * (3 + eval_negatives), self.config.num_neighbors,
                                           torch.from_numpy(rows).to(self.device))
        return self.model.embed(view, nodes, times, neighborhood, self.edge_features, dropout), view

    def _step(self, batch: np.ndarray, sampler, event_map, rng: np.random.Generator, *, train: bool,
              eval_negatives: int = 0, sync: bool = True) -> dict[str, Tensor]:
        """One global step: this rank's share of ``batch``; every rank calls it for every batch.
        Training, it accumulates gradients, and ``sync`` ends the accumulation with an optimizer step."""
        model, count = self.model, batch.size
        ranks = self.event_ranks(batch)
        positions = np.flatnonzero(ranks == self.shard.rank)
        n = positions.size
        z, view = self.embed_batch(batch, sampler, event_map, rng, eval_negatives, positions, train=train)
        z_src, z_dst, z_neg = z[:n], z[n:2 * n], z[2 * n:]
        # A sum over this rank's events divided by the global count: summed over ranks, the batch mean.
        loss, pos, neg = model.link_loss(z_src, z_dst, z_neg[:n], reduction="sum")
        loss = loss / count
        # The gradient sum runs while this step's memory writes are made (they do not need the new weights).
        step = self._start_step(loss if n else None, sync=sync) if train else None
        out = {"loss": loss.detach(), "pos": pos.detach(), "neg": neg.detach(),
               "positions": torch.from_numpy(positions)}
        if eval_negatives:
            others = model.predictor(z_src.repeat(eval_negatives, 1), z_neg[n:]).detach()
            out["mrr_neg"] = others.view(eval_negatives, n).t()
        ids = torch.from_numpy(batch)
        self.shard.write(StepWrites(self.shard.step, self.cpu_src[ids], self.cpu_dst[ids], self.cpu_t[ids],
                                    None if self.edge_features is None else self.edge_features[ids.to(self.device)],
                                    torch.from_numpy(ranks)), view)
        self.shard.end_step()
        if step is not None:
            step()
        return out

    def _start_step(self, loss: Tensor | None, *, sync: bool = True) -> Callable[[], None]:
        """Backpropagate this rank's ``loss`` (``None``: none from this rank), accumulating; with ``sync``,
        start summing the accumulated gradients over shards (averaged over memory groups and the
        ``sync_every`` batches); returns what finishes the optimizer step.  The sums start while the
        backward runs (:class:`GradientSum`)."""
        if sync and self.gradients is not None:
            self.gradients.arm()
        if loss is not None:
            (loss / (self.groups * self.config.sync_every)).backward()
        if not sync:
            return lambda: None
        reduced = self._reduce_gradients()

        def step() -> None:
            reduced()
            for optimizer in (self.optimizer, *self.sparse_optimizers):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        return step

    def _reduce_gradients(self) -> Callable[[], None]:
        """Start summing what the backward has not started yet of every parameter's gradient over the
        ranks; returns what waits for the sums and sets them."""
        return (lambda: None) if self.gradients is None else self.gradients.start_rest()

    def _batches(self, event_ids: np.ndarray) -> list[np.ndarray]:
        size = self.config.batch_size
        return [event_ids[i:i + size] for i in range(0, event_ids.size, size)]

    # ------------------------------------------------------------------ passes
    def train_epoch(self, epoch: int) -> float:
        """One pass over the training events (see the module docstring for where each memory group
        starts); the mean global batch loss."""
        self.model.train()
        group = self.rank if self.groups > 1 else 0
        # Dropout's generator (forked: the caller's is left as it was) and the negatives, seeded per epoch
        # alike on every rank of a group, so a resumed epoch draws what it would have.
        dropout = seeded(epoch_seed(self.config.seed, epoch, group), self.device)
        rng = np.random.default_rng((self.config.seed, epoch) if group == 0 else (self.config.seed, epoch, 0, group))
        self.sample_rng = np.random.default_rng((self.config.seed, epoch, self.rank))
        batches = self._batches(self.train_event_ids)
        if self.groups > 1 and self.config.parallelism == "memory":
            batches = self._enter_segment(batches, epoch)
        else:
            self.shard.reset()
            if self.groups > 1:  # epoch parallelism: rank r r steps behind; None joins a step idle
                batches = [None] * self.rank + batches + [None] * (self.groups - 1 - self.rank)
        losses = []
        event_map = self.train_event_ids  # the train graph numbers its events 0..len(train)-1
        for optimizer in (self.optimizer, *self.sparse_optimizers):
            optimizer.zero_grad(set_to_none=True)
        every = self.config.sync_every
        with dropout:
            for i, batch in enumerate(batches):
                interrupt.check()
                sync = (i + 1) % every == 0 or i == len(batches) - 1
                if batch is None:  # a short last segment, or a lagging rank's edge: only join the step
                    self._start_step(None, sync=sync)()
                    continue
                losses.append(self._step(batch, self.train_sampler, event_map, rng, train=True, sync=sync)["loss"])
        self.shard.refresh()  # every replica current before evaluation reads it
        # Sharded, a rank's losses sum over ranks to the batch means; memory groups' are batch means.
        total = self.comm.all_reduce(torch.tensor([float(sum(losses)), len(losses) / self.shard.world_size]))
        if self.groups > 1 and self.config.parallelism == "memory":
            self._own_memory = self.model.memory.state.state_dict()
            self._share_memory((self.groups - epoch) % self.groups)
        elif self.groups > 1:
            self._share_memory(0)
        return float(total[0] / total[1])

    def _enter_segment(self, batches: list[np.ndarray], epoch: int) -> list[np.ndarray | None]:
        """This memory group's batches of ``epoch`` (``None`` pads a short last segment), with its memory
        where the segment starts: reset at the stream's start, else carried on from its last epoch, or
        in epoch 1 replayed from the start."""
        length = -(-len(batches) // self.groups)
        segment = (self.rank + epoch - 1) % self.groups
        if segment == 0 or epoch == 1:
            self.shard.reset()
            self._replay(batches[:segment * length])
        else:
            self.model.memory.state.load_state_dict(self._own_memory)
        own = batches[segment * length:(segment + 1) * length]
        return own + [None] * (length - len(own))

    @torch.no_grad()
    def _replay(self, batches: list[np.ndarray]) -> None:
        """Stream ``batches`` through the memory alone, as training steps leave it (their endpoints'
        rows updated and persisted, their events stored as messages), without embeddings or gradients."""
        memory = self.model.memory
        for batch in batches:
            interrupt.check()
            ids = torch.from_numpy(batch).to(self.device)
            src, dst = self.src[ids], self.dst[ids]
            nodes = torch.unique(torch.cat([src, dst]))
            memory.persist(nodes, memory.updated(nodes))
            memory.store_messages(src, dst, self.t[ids], None if self.edge_features is None else self.edge_features[ids])

    def _share_memory(self, holder: int) -> None:
        """Every rank takes rank ``holder``'s memory state (the group that trained on the last segment)."""
        state = self.model.memory.state
        shared = {}
        for name, value in state.state_dict().items():  # gloo: CPU tensors, bool as bytes
            wire = self.comm.broadcast(value.cpu().to(torch.uint8) if value.dtype == torch.bool else value.cpu(), holder)
            shared[name] = wire.to(value.dtype)
        state.load_state_dict(shared)

    @torch.no_grad()
    def evaluate(self, event_ids: np.ndarray, inductive: np.ndarray, rng: np.random.Generator, *,
                 ranking: bool = True) -> dict[str, float]:
        """Stream ``event_ids`` (continuing the current memory); metrics overall and on ``inductive`` events.
        ``ranking=False`` skips MRR (and its ``eval_negatives`` extra embeddings per event): the AP is
        the same either way, the pass several times cheaper."""
        self.model.eval()
        eval_negatives = self.config.eval_negatives if ranking else 0
        self.shard.begin_pass()
        rows = []
        for batch in self._batches(event_ids):
            interrupt.check()
            out = self._step(batch, self.full_sampler, None, rng, train=False, eval_negatives=eval_negatives)
            ids = torch.from_numpy(batch)[out["positions"]].to(torch.float64).unsqueeze(1)
            ranked = [out["mrr_neg"].cpu().double()] if ranking else []
            rows.append(torch.cat([ids, out["pos"].cpu().double().unsqueeze(1), out["neg"].cpu().double().unsqueeze(1),
                                   *ranked], 1))
        self.shard.refresh()
        # Every rank scored its own events: gather them, in stream order.
        scored = self.shard.exchanger.all_gather_rows(torch.cat(rows))
        scored = scored[torch.argsort(scored[:, 0])]
        pos_all, neg_all, mrr_all = scored[:, 1].float(), scored[:, 2].float(), scored[:, 3:].float()
        ids = scored[:, 0].long().numpy()
        new = torch.from_numpy(inductive[ids])
        # The batch of each scored event (event_ids increase, as _batches cuts them).
        batch_of = torch.from_numpy(np.searchsorted(event_ids, ids) // self.config.batch_size)
        result = {}
        for suffix, keep in (("", torch.ones_like(new)), ("_inductive", new)):
            p, n = pos_all[keep], neg_all[keep]
            scores = torch.cat([p, n])
            labels = torch.cat([torch.ones_like(p), torch.zeros_like(n)])
            result[f"ap{suffix}"] = average_precision(scores, labels)
            result[f"ap_per_batch{suffix}"] = per_batch_average_precision(p, n, batch_of[keep])
            if ranking:
                result[f"mrr{suffix}"] = mean_reciprocal_rank(p, mrr_all[keep])
            result[f"events{suffix}"] = int(keep.sum())
        return result

    def _staleness(self) -> dict[str, float]:
        """Every rank's read counters since the last call, combined (a collective)."""
        stats = self.shard.take_stats()
        comm = self.shard.exchanger  # gloo: CPU tensors on any device
        total = comm.all_reduce(stats.to_tensor())
        top = comm.all_reduce(torch.tensor([stats.staleness_max]), op=torch.distributed.ReduceOp.MAX) \
            if self.world_size > 1 else torch.tensor([stats.staleness_max])
        combined = StalenessStats(reads=int(total[0]), remote_reads=int(total[1]), stale_reads=int(total[2]),
                                  staleness_sum=int(total[3]), fetched=int(total[4]), staleness_max=int(top[0]))
        return combined.as_dict()

    def _seed_pass(self, epoch: int) -> np.random.Generator:
        """The generators of epoch ``epoch``'s evaluation: negatives (returned), ranking negatives, neighbours."""
        # Memory groups evaluate the same memory alike; shards each sample their own share's neighbours.
        self.sample_rng = np.random.default_rng((self.config.seed, epoch, 2, self.rank if self.groups == 1 else 0))
        self.mrr_rng = np.random.default_rng((self.config.seed, epoch, 3))
        return np.random.default_rng((self.config.seed, epoch, 1))

    def _train_and_validate(self, epoch: int) -> dict:
        """Epoch ``epoch``'s training pass, then its validation pass (AP only): the epoch's record."""
        self.comm.stats.reset()
        self.grad_comm.stats.reset()
        start = time.perf_counter()
        loss = self.train_epoch(epoch)
        train_seconds = time.perf_counter() - start
        sent = sum(self.comm.all_gather_counts(self.comm.stats.bytes_sent))  # memory rows, every rank
        self._memory_after_training = self.shard.state_dict()
        val = self.evaluate(np.flatnonzero(self.split.val), self._inductive, self._seed_pass(epoch), ranking=False)
        return {"epoch": epoch, "loss": loss, "train_seconds": train_seconds,
                "train_events_per_second": self.train_event_ids.size / train_seconds,
                "eval_seconds": time.perf_counter() - start - train_seconds, "train_mib_sent": sent / 2**20,
                "train_grad_mib_reduced": self.grad_comm.stats.reduced_bytes / 2**20,
                **{f"val_{k}": v for k, v in val.items()}, **self._read_staleness()}

    def _read_staleness(self) -> dict:
        """The staleness of the reads since the last call, also added to the run's totals."""
        staleness, overall = self._staleness(), self._overall
        overall["staleness_max"] = max(overall["staleness_max"], staleness["staleness_max"])
        overall["staleness_sum"] += staleness["staleness_mean"] * staleness["reads"]
        for name in ("reads", "remote_reads", "fetched_rows"):
            overall[name] += staleness[name]
        return staleness

    def _log_epoch(self, record: dict, state: FitState) -> None:
        log.info("epoch %3d  loss %.4f  %.1fs  val AP %.4f (per batch %.4f, inductive %.4f)%s",
                 record["epoch"], record["loss"], record["train_seconds"], record["val_ap"],
                 record["val_ap_per_batch"], record["val_ap_inductive"],
                 f"  {self.groups} ranks, {self.config.parallelism} parallelism" if self.groups > 1
                 else "" if self.world_size == 1
                 else f"  staleness max {record['staleness_max']} mean {record['staleness_mean']:.3f} "
                      f"(K={self.config.staleness}, {record['remote_read_fraction']:.0%} of reads remote)")

    def fit(self) -> dict:
        """Train with early stopping on validation AP; returns the metrics of the best epoch.

        Each epoch streams the validation events for AP only.  At the end the best epoch's model and
        memory (as training left it) are restored and stream the validation then the test events once
        more, with MRR; that pass repeats the best epoch's validation pass exactly (same generators), so
        its validation AP is the one early stopping saw.  The memory is left where the test stream
        leaves it."""
        split, started = self.split, time.perf_counter()
        self._inductive = split.val_new_node | split.test_new_node
        self._overall = {"staleness_max": 0, "staleness_sum": 0.0, "reads": 0, "remote_reads": 0, "fetched_rows": 0}
        state = restore(self, self.checkpoint) if self.config.resume else FitState()
        state = fit(state, epochs=self.config.epochs, patience=self.config.patience, score_key="val_ap",
                    train_epoch=self._train_and_validate, log_epoch=self._log_epoch,
                    after_epoch=lambda state: save_epoch(self, self.checkpoint, state),
                    snapshot=lambda: (copy.deepcopy(self.model.state_dict()), self._memory_after_training))
        weights, memory = state.best_state
        self.model.load_state_dict(weights)
        self.shard.load_state_dict(memory)
        best = dict(state.best)
        rng = self._seed_pass(best["epoch"])
        val = self.evaluate(np.flatnonzero(split.val), self._inductive, rng)
        test = self.evaluate(np.flatnonzero(split.test), self._inductive, rng)
        self._read_staleness()
        best.update({f"val_{k}": v for k, v in val.items()}, **{f"test_{k}": v for k, v in test.items()})
        log.info("best epoch %d (neighbour cutoff %s): val AP %.4f (inductive %.4f), test AP %.4f "
                 "(per batch %.4f, inductive %.4f), test MRR %.4f", best["epoch"],
                 self.config.neighbor_cutoff, val["ap"], val["ap_inductive"], test["ap"],
                 test["ap_per_batch"], test["ap_inductive"], test["mrr"])
        overall = self._overall
        best.update(best_epoch=best["epoch"], epochs_run=len(state.history), seconds=time.perf_counter() - started,
                    history=state.history, staleness_max_run=overall["staleness_max"],
                    staleness_mean_run=overall["staleness_sum"] / max(overall["reads"], 1),
                    reads_run=overall["reads"], remote_reads_run=overall["remote_reads"],
                    fetched_rows_run=overall["fetched_rows"], parallelism=self.config.parallelism,
                    num_nodes=self.events.num_nodes, memory_rows_per_rank=self.comm.all_gather_counts(self.shard.rows),
                    peak_rss_mib_per_rank=[kib / 1024 for kib in self.comm.all_gather_counts(
                        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)])
        return best
