"""``NodeLoader``: seed nodes in, mini-batches out, the same on 1..N ranks.

::

    loader = gs.NodeLoader(graph, graph.train_ids, fanouts=[15, 10], batch_size=1024)
    for epoch in range(10):
        loader.set_epoch(epoch)
        for batch in loader:              # batch.blocks, batch.x, batch.y, batch.seeds on loader.device
            ...

Behind the loop: every rank takes the same number of steps per epoch (the rank with the most seeds sets
it), samples its own seeds' neighbourhoods (over the replicated or partitioned structure, asking other
ranks for what it does not hold), gathers the input rows (owned, cached, or fetched from their owners) and
labels ahead of the training thread (:class:`gnnscale.pipeline.PrefetchLoader`), and moves them to the
device (:class:`gnnscale.pipeline.device.DeviceFeeder`).  Batch ``i`` of epoch ``e`` on rank ``r`` is sampled
from ``(seed, e, i, r)``, so the same seed gives the same batches whatever the number of worker threads.

``batch.x`` and ``batch.y`` are views of reused buffers: valid until the loop asks for the batch after next
(``.clone()`` them to keep them longer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from gnnscale.batch import MiniBatch
from gnnscale.distributed.capacity import parse_capacity
from gnnscale.graph import Graph
from gnnscale.pipeline import LoaderConfig, PrefetchLoader
from gnnscale.pipeline.device import DeviceBatch, DeviceFeeder
from gnnscale.sampling import (CacheConfig, CachePlan, EpochPasses, agreed_steps, budgeted, fill_feature_cache,
                               make_sampler)
from gnnscale.train.shares import SeedShares
from samplers.neighbor import SamplerConfig

log = logging.getLogger("gnnscale.loader")

Batch = DeviceBatch
"""What a :class:`NodeLoader` yields: ``seeds``, ``blocks``, ``x`` (input rows), ``y`` (the seeds' labels)."""


class NodeLoader(EpochPasses):
    """Mini-batches of ``seeds`` with their sampled neighbourhoods, input features and labels.

    Args:
        graph: the graph handle (:func:`gnnscale.open_graph` or :meth:`gnnscale.Graph.from_arrays`).
        seeds: int64 global ids owned by this rank (default: ``graph.train_ids``), or a bool mask over the
            owned nodes.
        fanouts: neighbours sampled per layer, input side first (``-1``: all); one entry per model layer.
        batch_size: seeds per batch and rank.
        shuffle: a new seeded order every epoch.
        seed: seeds the order and every batch's sampling.
        self_loops: add a ``v -> v`` edge to every destination (GAT, GCN).
        gcn_norm: attach Kipf & Welling weights from full-graph degrees (implies ``self_loops``).
        replace: sample neighbours with replacement.
        labels: [num_owned] per-node targets (default ``graph.labels``): ``batch.y`` is their seeds' rows.
        num_workers: loader threads sampling ahead (0: in the training thread); at most 1 on several ranks.
        prefetch: batches kept ready beyond those being prepared.
        cache: feature cache, wire dtype and topology settings (several ranks only).
        rank_capacity: ``"w0,w1,..."`` or ``"auto"``: deal each step's seeds among ranks by speed
            (:mod:`gnnscale.train.shares`); None: each rank trains its own seeds.
        device: where batches are delivered (default: the world's device).
        features_on_device: keep the whole feature table on a CUDA device and send only ids (world of one).
        edge_features: give every block the features of its edges (``block.edge_attr``; the graph must have
            them), for edge-aware layers such as ``GATConv(edge_dim=...)``.

    Raises:
        ValueError: a bad argument (named in the message), or seeds that are not this rank's.
    """

    def __init__(self, graph: Graph, seeds: Tensor | None = None, *, fanouts: Sequence[int], batch_size: int = 1024,
                 shuffle: bool = True, seed: int = 0, self_loops: bool = False, gcn_norm: bool = False,
                 replace: bool = False, labels: Tensor | None = None, num_workers: int = 1, prefetch: int = 2,
                 cache: CacheConfig | None = None, rank_capacity: str | None = None,
                 device: torch.device | str | None = None, features_on_device: bool = False,
                 edge_features: bool = False) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a gnnscale.Graph, got {type(graph).__name__}")
        self.graph, self.world = graph, graph.world
        if edge_features and graph.edge_features is None:
            raise ValueError("edge_features=True needs a graph with edge features (a dataset with edge_features, "
                             "or Graph.from_arrays(..., edge_features=...))")
        self.sampler_config = SamplerConfig(fanouts=list(fanouts), self_loops=self_loops, gcn_norm=gcn_norm,
                                            replace=replace, edge_ids=edge_features)
        self.seeds = self._check_seeds(graph.train_ids if seeds is None else seeds)
        self.labels = graph.labels if labels is None else self._check_labels(labels)
        self.device = torch.device(device) if device is not None else self.world.device
        self.features_on_device = self._check_on_device(features_on_device)
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        # LoaderConfig checks batch_size, num_workers, prefetch and seed, naming each.
        probe = LoaderConfig(batch_size=batch_size, num_workers=num_workers, prefetch=prefetch, seed=seed)
        sized = budgeted(graph, cache or CacheConfig(), batch_size=batch_size, fanouts=list(fanouts),
                         num_workers=num_workers, prefetch=prefetch)
        cache, probe.prefetch = sized.cache, sized.prefetch
        if self.world.size > 1 and num_workers > 1:
            raise ValueError(f"num_workers={num_workers} needs a world of one: with {self.world.size} ranks sampling "
                             f"and feature fetches are collectives made in batch order by one thread; use "
                             f"num_workers=1")
        cache = cache or CacheConfig()
        self.steps, self.step_sizes = agreed_steps(graph, self.seeds.numel(), batch_size)
        """Batches per epoch (every rank alike), and each step's seeds summed over ranks (float32 [steps])."""
        self.sampler = make_sampler(graph, self.sampler_config, cache,
                                    owned_seeds=parse_capacity(rank_capacity, self.world.size) is None)
        self.shares = self._seed_shares(rank_capacity)
        fill = fill_feature_cache(graph, self.sampler, cache, CachePlan(
            seeds=self.seeds, steps=self.steps, batch_size=batch_size, seed=seed,
            seed_probability=None if self.shares is None else self.shares.seed_probability(self.steps)))
        log.info("rank %d: %d seeds, %d steps per epoch, %s", self.world.rank, self.seeds.numel(), self.steps, fill)
        self._loader = self._make_loader(probe)
        self.feeder = DeviceFeeder(self.device, graph.features.rows.to(self.device) if self.features_on_device
                                   else None)

    # ------------------------------------------------------------------ checks
    def _check_seeds(self, seeds: Tensor) -> Tensor:
        graph = self.graph
        seeds = torch.as_tensor(seeds)
        if seeds.dtype == torch.bool:
            if seeds.shape != (graph.num_owned,):
                raise ValueError(f"a seeds mask must be bool [num_owned] = [{graph.num_owned}], got "
                                 f"{list(seeds.shape)}")
            return torch.nonzero(seeds).flatten() + graph.start
        if seeds.dtype.is_floating_point or seeds.dim() != 1:
            raise ValueError(f"seeds must be a 1-D tensor of int64 global ids (or a bool mask), got {seeds.dtype} "
                             f"of shape {list(seeds.shape)}")
        seeds = seeds.to(torch.int64)
        outside = (seeds < graph.start) | (seeds >= graph.end)
        if outside.any():
            raise ValueError(f"seed {int(seeds[outside][0])} is not owned by rank {self.world.rank} (nodes "
                             f"{graph.start}..{graph.end - 1}): each rank passes its own nodes, e.g. graph.train_ids")
        return seeds

    def _check_labels(self, labels: Tensor) -> Tensor:
        labels = torch.as_tensor(labels)
        if labels.dim() < 1 or labels.shape[0] != self.graph.num_owned:
            raise ValueError(f"labels must have one row per owned node ({self.graph.num_owned}), got shape "
                             f"{list(labels.shape)}")
        return labels

    def _check_on_device(self, wanted: bool) -> bool:
        if wanted and (self.device.type != "cuda" or self.world.size > 1):
            log.warning("features_on_device has no effect here (it needs a CUDA device and a world of one); "
                        "batches are gathered on the host")
            return False
        return wanted

    def _seed_shares(self, rank_capacity: str | None) -> SeedShares | None:
        capacity = parse_capacity(rank_capacity, self.world.size)
        if capacity is None or self.world.size == 1:
            return None
        if capacity == "auto" and not self.sampler.replicated:
            raise ValueError("rank_capacity='auto' times each rank's steps alone, which needs the replicated "
                             "topology (sampling without requests): raise topology_budget_mb, or give the weights, "
                             "e.g. rank_capacity='2,1'")
        counts = self.world.exchanger.all_gather_counts(self.seeds.numel())
        return SeedShares(self.world.exchanger, self.seeds, self.labels.index_select(0, self.seeds - self.graph.start),
                          counts, self.graph.num_nodes, capacity, batch_size=self.batch_size, steps=self.steps,
                          seed=self.seed)

    def _make_loader(self, probe: LoaderConfig) -> PrefetchLoader:
        graph = self.graph
        # A mapped table reads its rows sorted, with its hot cache: through the table, also in a world of one.
        table = graph.features.rows if self.world.size == 1 and not graph.features.mapped else graph.features
        # With seed shares a rank trains seeds of other partitions: labels of every seed, by global id.
        labels, first_id = (self.labels, graph.start) if self.shares is None else (self.shares.labels, 0)
        config = LoaderConfig(batch_size=probe.batch_size, num_workers=probe.num_workers, prefetch=probe.prefetch,
                              seed=probe.seed, shuffle=self.shuffle, pin_memory=self.device.type == "cuda",
                              gather_features=not self.features_on_device,
                              num_batches=None if self.world.size == 1 else self.steps, rank=self.world.rank)
        sample = self._sample_with_edge_features if self.sampler_config.edge_ids else self.sampler.sample
        return PrefetchLoader(sample, self.seeds, table, labels, config, first_id=first_id,
                              plan=None if self.shares is None else self.shares.plan)

    def _sample_with_edge_features(self, seeds: Tensor, *, rng: np.random.Generator) -> MiniBatch:
        batch = self.sampler.sample(seeds, rng=rng)
        self.graph.attach_edge_features(batch.blocks)  # a collective, on the loader's one thread, in batch order
        return batch

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Batch]:
        """One epoch; without :meth:`set_epoch`, each pass is the epoch after the previous one."""
        return self.feeder(self._loader)
