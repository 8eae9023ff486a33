"""``LinkLoader``: seed edges in; positive and negative pairs with the blocks over their endpoints out.

::

    split = gs.split_edges(graph, num_val=0.05, num_test=0.1, seed=0)      # the same on every rank
    loader = gs.LinkLoader(graph, gs.rank_share(split.train_pos, graph), fanouts=[10, 10], batch_size=512,
                           held_out=split.held_out("train"))
    for epoch in range(10):
        loader.set_epoch(epoch)
        for batch in loader:               # batch.blocks, batch.x, batch.pos, batch.neg, batch.seeds
            h = model(batch.blocks, batch.x)
            loss = gs.nn.link_loss(decoder(h, batch.pos), decoder(h, batch.neg))

Behind the loop, as :class:`gnnscale.NodeLoader` does for nodes: every rank takes the same number of steps
(the rank with the most edges sets it); batch ``i`` of epoch ``e`` on rank ``r`` draws its negatives and its
neighbourhoods from ``(seed, e, i, r)``; a batch's seed edges and their reverses are left out of its
sampled neighbourhoods (``exclude``), and ``held_out`` edges (validation and test) out of every one.
Negatives are uniform or degree-weighted (:class:`samplers.link.NegativeSampler`) over the whole graph.
``batch.x`` is a view of a reused buffer: valid until the loop asks for the batch after next.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gnnscale.batch import Block, LinkMiniBatch, MiniBatch
from gnnscale.data.link_split import LinkSplit, random_link_split
from gnnscale.distributed.feature_store import DistTable, edge_source_counts
from gnnscale.graph import Graph
from gnnscale.pipeline import LoaderConfig, PrefetchLoader
from gnnscale.pipeline.loader import LoadedBatch
from gnnscale.sampling import CacheConfig, CachePlan, EpochPasses, agreed_steps, budgeted, fill_feature_cache
from samplers.distributed import DistNeighborSampler, LocalGraph, replicate_structure
from samplers.link import EXCLUDE_MODES, NEGATIVE_MODES, LinkSampler, NegativeSampler
from samplers.neighbor import SamplerConfig, drop_excluded, exclusion_keys

log = logging.getLogger("gnnscale.link")


@dataclass
class LinkBatch:
    """A link batch on the training device."""

    index: int
    batch: LinkMiniBatch
    x: Tensor
    """float [num_input, F] input rows of ``blocks[0]``."""

    @property
    def blocks(self) -> list[Block]:
        return self.batch.blocks

    @property
    def seeds(self) -> Tensor:
        """int64 [num_seeds] global ids of the pairs' endpoints: the rows of the model's output."""
        return self.batch.seeds

    @property
    def pos(self) -> Tensor:
        """int64 [2, P] positive pairs as rows of the model's output."""
        return self.batch.pos

    @property
    def neg(self) -> Tensor:
        """int64 [2, P * num_negatives] negative pairs, grouped by positive."""
        return self.batch.neg


def remove_edges(structure: LocalGraph, edges: Tensor, num_nodes: int, *, edge_ids: bool = False) -> LocalGraph:
    """``structure`` without the directed ``edges`` int64 [2, k] (global ``(src, dst)``; others' edges ignored);
    with ``edge_ids`` the kept edges keep their global ids (8 bytes per edge more), for edge features."""
    dst = torch.arange(structure.start, structure.start + structure.num_owned, dtype=torch.int64)
    ids = structure.global_edge_ids(torch.arange(structure.indices.size, dtype=torch.int64)) if edge_ids else None
    src, counts, kept_ids = drop_excluded(dst, torch.from_numpy(structure.indices), structure.degree,
                                          exclusion_keys(edges, num_nodes), num_nodes, ids)
    indptr = np.zeros(structure.num_owned + 1, dtype=np.int64)
    np.cumsum(counts.numpy(), out=indptr[1:])
    # The kept edges keep their global ids (edge features are looked up by them), no longer consecutive.
    return LocalGraph(indptr, src.numpy().copy(), start=structure.start,
                      edge_ids=None if kept_ids is None else kept_ids.numpy())


class LinkLoader(EpochPasses):
    """Mini-batches of seed ``edges`` with negatives, their endpoints' neighbourhoods and input rows.

    Args:
        graph: the graph handle.
        edges: int64 [2, E] this rank's seed edges ``(src, dst)`` in global ids (any endpoints; e.g.
            :func:`rank_share`).
        fanouts: neighbours per layer, input side first (``-1``: all).
        batch_size: seed edges per batch and rank.
        num_negatives: negative pairs per positive (0: none, e.g. to score given pairs).
        negative_sampling: ``"uniform"`` (``(u, v')``, ``v'`` uniform), ``"degree"`` (``P(v') ∝ degree(v')^0.75``,
            degrees of the message graph) or ``"global"`` (``(u', v')``, both uniform: PyG's example).
        exclude: ``"reverse"``: a batch's seed edges and their reverses are not sampled as its messages
            (DGL's ``exclude="reverse_id"``); ``"self"``: the seed edges only; ``"none"``.
        held_out: int64 [2, k] directed edges removed from message passing for good (validation and test
            edges, both directions: :meth:`LinkSplit.held_out`).
        shuffle, seed, self_loops, gcn_norm, replace, num_workers, prefetch, cache, device: as
            :class:`gnnscale.NodeLoader`'s.
        fill_cache: fill the graph's feature cache for this loader's batches; False leaves it as another
            loader filled it (an evaluation loader beside a training loader).
        edge_features: give every block the features of its edges (``block.edge_attr``), as
            :class:`gnnscale.NodeLoader` does; held-out edges keep their features' ids.

    Raises:
        ValueError: a bad argument, named in the message.
        TypeError: ``graph`` is not a :class:`gnnscale.Graph`.
    """

    def __init__(self, graph: Graph, edges: Tensor, *, fanouts: Sequence[int], batch_size: int = 1024,
                 num_negatives: int = 1, negative_sampling: str = "uniform", exclude: str = "reverse",
                 held_out: Tensor | None = None, shuffle: bool = True, seed: int = 0, self_loops: bool = False,
                 gcn_norm: bool = False, replace: bool = False, num_workers: int = 1, prefetch: int = 2,
                 cache: CacheConfig | None = None, device: torch.device | str | None = None,
                 fill_cache: bool = True, edge_features: bool = False) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a gnnscale.Graph, got {type(graph).__name__}")
        if edge_features and graph.edge_features is None:
            raise ValueError("edge_features=True needs a graph with edge features (a dataset with edge_features, "
                             "or Graph.from_arrays(..., edge_features=...))")
        self.graph, self.world = graph, graph.world
        self.edges = self._check_pairs(edges, "edges")
        held_out = None if held_out is None else self._check_pairs(held_out, "held_out")
        if isinstance(num_negatives, bool) or not isinstance(num_negatives, int) or num_negatives < 0:
            raise ValueError(f"num_negatives must be an int >= 0, got {num_negatives!r}")
        if negative_sampling not in NEGATIVE_MODES:
            raise ValueError(f"negative_sampling must be one of {', '.join(NEGATIVE_MODES)}, got {negative_sampling!r}")
        if exclude not in EXCLUDE_MODES:
            raise ValueError(f"exclude must be one of {', '.join(EXCLUDE_MODES)}, got {exclude!r}")
        config = SamplerConfig(fanouts=list(fanouts), self_loops=self_loops, gcn_norm=gcn_norm, replace=replace,
                               edge_ids=edge_features)
        probe = LoaderConfig(batch_size=batch_size, num_workers=num_workers, prefetch=prefetch, seed=seed)
        if self.world.size > 1 and num_workers > 1:
            raise ValueError(f"num_workers={num_workers} needs a world of one: with {self.world.size} ranks sampling "
                             f"and feature fetches are collectives made in batch order by one thread; use "
                             f"num_workers=1")
        self.device = torch.device(device) if device is not None else self.world.device
        sized = budgeted(graph, cache or CacheConfig(), batch_size=2 * batch_size, fanouts=list(fanouts),
                         num_workers=num_workers, prefetch=prefetch)
        cache, prefetch = sized.cache, sized.prefetch
        self.steps, _ = agreed_steps(graph, self.edges.shape[1], batch_size, what="seed edges")
        self.sampler = self._make_sampler(config, cache, held_out)
        negatives = None if num_negatives == 0 else NegativeSampler(
            graph.num_nodes, num_negatives, negative_sampling,  # type: ignore[arg-type]
            degrees=self._whole_degrees() if negative_sampling == "degree" else None)
        sample = self._sample_with_edge_features if edge_features else self.sampler.sample
        self.link_sampler = LinkSampler(sample, self.edges, negatives, exclude)  # type: ignore[arg-type]
        fill = "feature cache left as it was"
        if fill_cache:
            fill = fill_feature_cache(graph, self.sampler, cache, self._cache_plan(batch_size, num_negatives, seed))
        log.info("rank %d: %d seed edges, %d steps per epoch, %s", self.world.rank, self.edges.shape[1], self.steps,
                 fill)
        # A mapped table reads its rows sorted, with its hot cache: through the table, also in a world of one.
        table = graph.features.rows if self.world.size == 1 and not graph.features.mapped else graph.features
        self._loader = PrefetchLoader(self.link_sampler, torch.arange(self.edges.shape[1]), table, None, LoaderConfig(
            batch_size=batch_size, num_workers=num_workers, prefetch=prefetch, seed=seed, shuffle=shuffle,
            pin_memory=self.device.type == "cuda", num_batches=None if self.world.size == 1 else self.steps,
            rank=self.world.rank))

    def _cache_plan(self, batch_size: int, num_negatives: int, seed: int) -> CachePlan:
        """What the batches will ask for: the seed edges' endpoints once per epoch, and, through the negatives,
        any node (each with the chance a uniform draw picks it in one step)."""
        endpoints = torch.unique(self.edges.reshape(-1))
        probability = np.full(self.graph.num_nodes, min(1.0, batch_size * num_negatives / self.graph.num_nodes))
        probability[endpoints.numpy()] = np.maximum(probability[endpoints.numpy()], 1.0 / self.steps)
        return CachePlan(seeds=endpoints, steps=self.steps, batch_size=2 * batch_size, seed=seed,
                         seed_probability=probability)

    def _check_pairs(self, pairs: Tensor, name: str) -> Tensor:
        pairs = torch.as_tensor(pairs)
        if pairs.dim() != 2 or pairs.shape[0] != 2 or pairs.dtype.is_floating_point or pairs.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor [2, k] of (src, dst) global ids, got {pairs.dtype} "
                             f"of shape {list(pairs.shape)}")
        pairs = pairs.to(torch.int64)
        if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= self.graph.num_nodes):
            raise ValueError(f"{name} holds node ids outside [0, {self.graph.num_nodes}): pass global ids "
                             f"(graph.from_original maps dataset ids)")
        return pairs

    def _make_sampler(self, config: SamplerConfig, cache: CacheConfig, held_out: Tensor | None) -> DistNeighborSampler:
        graph = self.graph
        structure, replicated = graph.sampling_structure(cache.topology, cache.topology_budget_mb)
        if held_out is not None:
            structure = remove_edges(structure, held_out, graph.num_nodes, edge_ids=config.edge_ids)
        degrees = None
        if config.gcn_norm and not replicated:
            # The message graph's own degrees (held-out edges removed), the halo's cached as NodeLoader does.
            degrees = DistTable(structure.degree.to(torch.float32), graph.offsets, self.world.exchanger)
            degrees.fill_cache(edge_source_counts(structure.indices, graph.start, graph.end)[0])
        return DistNeighborSampler(structure, graph.offsets, self.world.exchanger, config, degrees,
                                   replicated=replicated)

    def _sample_with_edge_features(self, seeds: Tensor, **options) -> MiniBatch:
        batch = self.sampler.sample(seeds, **options)
        self.graph.attach_edge_features(batch.blocks)  # a collective, on the loader's one thread, in batch order
        return batch

    def _whole_degrees(self) -> Tensor:
        """int64 [num_nodes] in-degree of every node in the message graph (a collective on N ranks)."""
        if self.sampler.replicated or self.world.size == 1:
            return self.sampler.graph.degree
        return self.world.exchanger.all_gather_rows(self.sampler.graph.degree)

    def __iter__(self) -> Iterator[LinkBatch]:
        for loaded in self._loader:
            yield self._on_device(loaded)

    def _on_device(self, loaded: LoadedBatch) -> LinkBatch:
        batch = loaded.batch
        assert isinstance(batch, LinkMiniBatch) and loaded.x is not None
        if self.device.type == "cpu":
            return LinkBatch(index=loaded.index, batch=batch, x=loaded.x)
        # A plain copy: the host slot is reused two batches later, after this copy has been made.
        return LinkBatch(index=loaded.index, batch=batch.to(self.device), x=loaded.x.to(self.device))


# ---------------------------------------------------------------------- splits and evaluation on a Graph
def split_edges(graph: Graph, *, num_val: float = 0.05, num_test: float = 0.1, seed: int = 0) -> LinkSplit:
    """The random link split of :func:`gnnscale.data.link_split.random_link_split` over the whole graph, in
    global ids, the same on every rank and for any number of ranks (it is drawn over original ids).
    A collective on N ranks: every rank gathers the whole edge list (O(edges) memory per rank)."""
    if graph.world.size == 1:
        whole = graph.structure
    else:
        whole = replicate_structure(graph.structure, graph.world.exchanger)
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), whole.degree)
    src = torch.from_numpy(whole.indices)
    orig_src, orig_dst = graph.to_original(src).numpy(), graph.to_original(dst).numpy()
    split = random_link_split(orig_src, orig_dst, graph.num_nodes, num_val=num_val, num_test=num_test, seed=seed)
    to_global = lambda pairs: graph.from_original(torch.from_numpy(pairs)).numpy()  # noqa: E731
    return LinkSplit(num_nodes=split.num_nodes, train_pos=to_global(split.train_pos), val_pos=to_global(split.val_pos),
                     val_neg=to_global(split.val_neg), test_pos=to_global(split.test_pos),
                     test_neg=to_global(split.test_neg))


def rank_share(pairs: np.ndarray | Tensor, graph: Graph) -> Tensor:
    """int64 [2, k] the ``pairs`` (global ids) whose destination this rank owns: every pair on exactly one rank."""
    pairs = torch.as_tensor(np.asarray(pairs), dtype=torch.int64)
    mine = (pairs[1] >= graph.start) & (pairs[1] < graph.end)
    return pairs[:, mine]


@torch.no_grad()
def score_pairs(loader: LinkLoader, model: torch.nn.Module, decoder: torch.nn.Module) -> Tensor:
    """float [E] the decoder's logit of every seed edge of ``loader`` (``shuffle=False``, no negatives), in
    ``loader.edges`` order; ``model(blocks, x)`` gives one embedding row per seed."""
    scores = torch.empty(loader.edges.shape[1])
    positions = torch.arange(loader.edges.shape[1])
    done = 0
    for batch in loader:
        out = decoder(model(batch.blocks, batch.x), batch.pos).float().cpu()
        scores[positions[done:done + out.numel()]] = out
        done += out.numel()
    return scores


def gather_scores(graph: Graph, scores: Tensor) -> Tensor:
    """Every rank's ``scores`` float [k] concatenated in rank order (identity in a world of one)."""
    return graph.world.exchanger.all_gather_rows(scores.contiguous())
