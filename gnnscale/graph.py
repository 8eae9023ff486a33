"""The graph handle: one type for an in-memory graph in a world of one and for this rank's share of a
partition folder under torchrun.

Every rank of a world of ``N`` owns the contiguous id range ``[start, end)`` of partition ``rank``
(:mod:`partition`); ids in the API are these *global* ids (``to_original`` / ``from_original`` map them to
and from the dataset's own).  A graph made in memory (:meth:`Graph.from_arrays`, :meth:`Graph.from_dataset`)
is the one partition of a world of one, with global ids equal to the original ones.

What a rank holds: its owned nodes' in-edges (:attr:`structure`), features (:attr:`features`, a
:class:`~gnnscale.distributed.feature_store.DistTable` that fetches other ranks' rows on request),
labels and split masks.  The whole graph structure, the degree table of GCN weights and evaluation's
full-neighbour blocks are built on first use and shared by every loader of the graph.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnscale.batch import Block
from gnnscale.data.dataset import GraphDataset, csc_from_edges
from gnnscale.distributed import wire
from gnnscale.distributed.feature_store import DistTable, edge_source_counts
from gnnscale.budget import check_budget, log_decisions, plan_graph
from gnnscale.distributed.mapped import MappedTable, hot_order
from gnnscale.memory import release_pages
from gnnscale.world import World, init
from partition.load import Partition, load_partition, whole_graph_partition
from samplers.distributed import HaloGraph, LocalGraph, fetch_halo, replicate_structure, structure_bytes

log = logging.getLogger("gnnscale.graph")


def resident(array: np.ndarray, dtype: type) -> np.ndarray:
    """``array`` in memory and writable: a copy of a (read-only) memory map, else the array itself.

    The map's pages that the copy read leave this process's RSS afterwards (:func:`gnnscale.memory.release_pages`):
    held beside the copy, they doubled what a rank holds for every partition array."""
    if isinstance(array, np.memmap) or not array.flags.writeable:
        copy = np.array(array, dtype=dtype)
        release_pages(array)
        return copy
    return np.ascontiguousarray(array, dtype=dtype)


class Graph:
    """This rank's share of a graph (the whole graph in a world of one).

    Args:
        part: the partition this rank owns (:func:`partition.load.load_partition`, or
            :func:`partition.load.whole_graph_partition` in a world of one).
        world: the job (:func:`gnnscale.init`); a world of one when None.
        split: which of the dataset's train/val/test splits :attr:`train_ids` etc. follow.
        wire_dtype: how feature rows sent to other ranks travel (:mod:`gnnscale.distributed.wire`).
        memory_budget: MiB this rank may hold above the interpreter (:mod:`gnnscale.budget`): owned feature rows
            that do not fit it stay memory-mapped; None: no budget, every partition array in memory.

    Raises:
        ValueError: ``split`` out of range, a partition that is not this rank's, an unknown ``wire_dtype``,
            a ``memory_budget`` below what the partition itself needs.
    """

    def __init__(self, part: Partition, world: World | None = None, *, split: int = 0,
                 wire_dtype: str = "float32", memory_budget: float | None = None) -> None:
        self.world = world if world is not None else init()
        if part.book.offsets.shape[0] - 1 != self.world.size or part.part != self.world.rank:
            raise ValueError(f"partition {part.part} of {part.book.offsets.shape[0] - 1} cannot be rank "
                             f"{self.world.rank}'s share in a world of {self.world.size}: open partition rank of a "
                             f"folder with world-size parts (gnnscale.open_graph does)")
        num_splits = part.train_masks.shape[0]
        if isinstance(split, bool) or not 0 <= split < num_splits:
            raise ValueError(f"split={split} is out of range: the dataset has {num_splits} split(s), "
                             f"0..{num_splits - 1}")
        self.part, self.split = part, split
        self.start, self.end = part.node_range
        self.offsets = torch.from_numpy(np.asarray(part.book.offsets, dtype=np.int64))
        # A world of one sends nothing: its rows stay exact whatever is asked.
        self.wire_dtype = wire.check_wire_dtype(wire_dtype) if self.world.size > 1 else "float32"
        budget = check_budget(memory_budget)
        self.budget = None if budget is None else plan_graph(part, budget, self.world.rank)
        """The decisions of ``memory_budget`` (:class:`gnnscale.budget.GraphBudget`), or None."""
        if self.budget is not None:
            log_decisions(self.world.rank, budget, self.budget.decisions)
        self.structure = LocalGraph(resident(part.indptr, np.int64), resident(part.indices, np.int64),
                                    start=self.start)
        """The owned nodes' in-edges (sources in global ids)."""
        self.features = self._feature_table(part)
        """Feature rows by global id; ``features.rows`` holds the owned ones (a memory map when
        ``features.mapped``)."""
        self.labels = torch.from_numpy(resident(part.labels, np.int64))
        """int64 [num_owned] (or [num_owned, num_labels] 0/1): the owned nodes' labels."""
        self.edge_features = self._edge_table(part)
        """Edge feature rows by global edge id (the owned nodes' in-edges are this rank's), or None."""
        self.train_ids, self.val_ids, self.test_ids = (self._owned(part.train_masks), self._owned(part.val_masks),
                                                       self._owned(part.test_masks))
        self._memo: dict[Any, Any] = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dataset(cls, dataset: GraphDataset, world: World | None = None, *, split: int = 0,
                     wire_dtype: str = "float32", memory_budget: float | None = None) -> "Graph":
        """This rank's share of any loader's dataset (:func:`gnnscale.data.loaders.load_dataset`).

        In a world of one, the whole graph.  On ``N`` ranks every rank holds the dataset: each partitions it
        with METIS into a private temporary folder (deleted with the graph), checks that every rank got the
        same partitions, and keeps its own.  That suits graphs that fit every machine (examples, tests); a
        graph that does not is partitioned once, offline (``python -m partition``), and opened with
        :func:`open_graph`."""
        world = world if world is not None else init()
        if world.size == 1:
            return cls(whole_graph_partition(dataset), world, split=split, wire_dtype=wire_dtype,
                       memory_budget=memory_budget)
        folder = Path(tempfile.mkdtemp(prefix="gnnscale-parts-"))
        try:
            part = _partition_here(dataset, folder, world, split)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        graph = cls(part, world, split=split, wire_dtype=wire_dtype, memory_budget=memory_budget)
        weakref.finalize(graph, shutil.rmtree, folder, True)
        return graph

    @classmethod
    def from_arrays(cls, src: Any, dst: Any, *, features: Any, labels: Any, train_mask: Any, val_mask: Any,
                    test_mask: Any, num_nodes: int | None = None, num_classes: int | None = None,
                    symmetrize: bool = False, metric: str = "accuracy", name: str = "arrays",
                    edge_features: Any = None, world: World | None = None) -> "Graph":
        """A world of one's graph from edge arrays (``src[i] -> dst[i]``), node features [N, F], integer labels
        [N] (or 0/1 [N, num_labels] with ``metric="multilabel_roc_auc"``) and boolean masks [N] (or
        [num_splits, N]).  ``symmetrize`` adds every reverse edge."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        features = np.asarray(features, dtype=np.float32)
        num_nodes = int(features.shape[0]) if num_nodes is None else int(num_nodes)
        if src.shape != dst.shape or src.ndim != 1:
            raise ValueError(f"src and dst must be 1-D arrays of equal length, got shapes {src.shape} and {dst.shape}")
        if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_nodes):
            raise ValueError(f"edge endpoints must be node ids in [0, {num_nodes}); relabel the nodes, or pass "
                             f"num_nodes")
        labels = np.asarray(labels)
        if edge_features is None:
            indptr, indices = csc_from_edges(src, dst, num_nodes, symmetrize=symmetrize)
        else:
            indptr, indices, edge_features = csc_with_edge_data(src, dst, num_nodes, np.asarray(edge_features),
                                                                symmetrize=symmetrize)
        dataset = GraphDataset(name=name, indptr=indptr, indices=indices, features=features, labels=labels,
                               edge_features=edge_features,
                               train_masks=train_mask, val_masks=val_mask, test_masks=test_mask, metric=metric,
                               num_classes=num_classes if num_classes is not None else labels.shape[1]
                               if metric == "multilabel_roc_auc" and labels.ndim == 2 else int(labels.max()) + 1)
        return cls.from_dataset(dataset, world)

    def _feature_table(self, part: Partition) -> DistTable:
        """The owned feature rows in memory, or left in their file (:class:`MappedTable`) when the budget says so."""
        if self.budget is not None and self.budget.features_mapped:
            mapped = part.features if part.features.dtype == np.float32 else None
            if mapped is None:
                raise ValueError(f"features stored as {part.features.dtype} cannot stay memory-mapped (float32 only): "
                                 f"raise memory_budget to hold them in memory, or store float32 features")
            return MappedTable(mapped, self.offsets, self.world.exchanger, wire_dtype=self.wire_dtype,
                               hot=hot_order(self.structure.degree), hot_rows=self.budget.hot_rows,
                               release_mb=self.budget.release_mb)
        return DistTable(torch.from_numpy(resident(part.features, np.float32)), self.offsets, self.world.exchanger,
                         wire_dtype=self.wire_dtype)

    def _edge_table(self, part: Partition) -> DistTable | None:
        """Partition ``p`` stores the in-edges of its nodes, so it owns the contiguous global edge ids that
        follow the edges of partitions ``0..p-1`` (the order the replicated structure concatenates them in)."""
        if part.edge_features is None:
            return None
        counts = [int(p["num_edges"]) for p in part.manifest["parts"]] if self.world.size > 1 else \
            [part.num_edges]
        offsets = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int64)
        self.structure.edge_start = int(offsets[self.world.rank])
        return DistTable(torch.from_numpy(resident(part.edge_features, np.float32)), offsets, self.world.exchanger,
                         wire_dtype=self.wire_dtype)

    def attach_edge_features(self, blocks: list[Block], *, local: bool = False) -> None:
        """Fill every block's ``edge_attr`` from its ``edge_ids`` (zeros for added self-loops).  A collective on
        several ranks, unless ``local``: every edge is an in-edge of an owned node (evaluation's blocks)."""
        table = self.edge_features
        assert table is not None
        for block in blocks:
            ids = block.edge_ids
            assert ids is not None, "sample with SamplerConfig(edge_ids=True) to attach edge features"
            real = ids >= 0
            rows = table.rows.new_zeros((ids.numel(), *table.row_shape))
            wanted = ids[real]
            rows[real] = table.rows.index_select(0, wanted - table.start) if local else table.gather(wanted)
            block.edge_attr = rows

    def _owned(self, masks: np.ndarray) -> Tensor:
        return torch.from_numpy(np.flatnonzero(np.asarray(masks[self.split]))) + self.start

    # ------------------------------------------------------------------ facts
    @property
    def num_nodes(self) -> int:
        """Nodes of the whole graph (every rank's)."""
        return int(self.offsets[-1])

    @property
    def num_owned(self) -> int:
        """Nodes this rank owns."""
        return self.end - self.start

    @property
    def owned_ids(self) -> Tensor:
        """int64 [num_owned]: this rank's global ids, ``start .. end - 1``."""
        return torch.arange(self.start, self.end, dtype=torch.int64)

    @property
    def feature_dim(self) -> int:
        return int(self.features.row_shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.part.num_classes)

    @property
    def metric(self) -> str:
        """The dataset's evaluation metric, ``accuracy`` or ``roc_auc``."""
        return self.part.metric

    @property
    def name(self) -> str:
        return (self.part.manifest.get("dataset") or {}).get("name") or "graph"

    def to_original(self, ids: Tensor) -> Tensor:
        """Original (dataset) ids of global ``ids`` (any rank's)."""
        ids = torch.as_tensor(ids, dtype=torch.int64)
        out = torch.empty_like(ids)
        owner = torch.searchsorted(self.offsets, ids, right=True) - 1
        for part in torch.unique(owner).tolist():
            where = owner == part
            orig = self.part.orig_ids if part == self.part.part else self.part.book.orig_ids(part)
            out[where] = torch.from_numpy(np.asarray(orig[(ids[where] - int(self.offsets[part])).numpy()]))
        return out

    def from_original(self, ids: Tensor) -> Tensor:
        """Global ids of original (dataset) ``ids``."""
        ids = np.asarray(torch.as_tensor(ids, dtype=torch.int64))
        return torch.from_numpy(np.asarray(self.part.book.orig2new[ids], dtype=np.int64))

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, rank {self.world.rank}/{self.world.size}: nodes {self.start}..{self.end - 1} "
                f"of {self.num_nodes}, {self.structure.indices.size} in-edges, {self.feature_dim} features)")

    # ------------------------------------------------------------------ shared, built on first use
    def halo(self) -> tuple[Tensor, Tensor]:
        """``(ids, counts)``: every non-owned source of an owned node's in-edge (sorted), with its edge count."""
        if "halo" not in self._memo:
            self._memo["halo"] = edge_source_counts(self.structure.indices, self.start, self.end)
        return self._memo["halo"]

    def sampling_structure(self, topology: str = "auto", budget_mb: float = 1024.0) -> tuple[LocalGraph, bool]:
        """The structure samplers draw from, and whether it is the whole graph (``replicated``): the whole
        structure where ``topology`` asks for it and it fits ``budget_mb`` per rank (every rank decides alike:
        the sizes are global), else the owned in-edges (``partitioned``).  A collective when world size > 1.

        Raises:
            ValueError: ``topology="replicated"`` and the structure exceeds ``budget_mb``.
        """
        if self.world.size == 1 or topology == "partitioned":
            return self.structure, False
        if "replicated" in self._memo:
            return self._memo["replicated"], True
        exchanger = self.world.exchanger
        size = structure_bytes(self.num_nodes, sum(exchanger.all_gather_counts(self.structure.indices.size)))
        if size > budget_mb * 2**20:
            if topology == "replicated":
                raise ValueError(f"topology='replicated' needs {size / 2**20:.1f} MiB per rank for the whole graph "
                                 f"structure, over topology_budget_mb={budget_mb:g}; raise the budget or use "
                                 f"topology='partitioned'")
            log.info("rank %d: the whole graph structure (%.1f MiB) exceeds the topology budget %g MiB: topology "
                     "partitioned, sampling asks owners for remote neighbours", self.world.rank, size / 2**20,
                     budget_mb)
            return self.structure, False
        log.info("rank %d: whole graph structure %.1f MiB of the %g MiB budget: topology replicated, sampling "
                 "sends no requests", self.world.rank, size / 2**20, budget_mb)
        self._memo["replicated"] = replicate_structure(self.structure, exchanger)
        return self._memo["replicated"], True

    def halo_structure(self, *, with_edges: bool = False, budget_mb: float = 1024.0) -> HaloGraph | None:
        """The owned in-edges joined with a copy of the halo's (:func:`samplers.distributed.fetch_halo`), so
        that a partitioned sampler draws owned and halo nodes without a request; None in a world of one, or
        (on every rank) when some rank's copy would exceed ``budget_mb``.  A collective on first use (and
        again when edge ids are first asked for)."""
        if self.world.size == 1:
            return None
        held = self._memo.get("halo_structure", False)
        if held is False or (held is not None and with_edges and not held.has_edge_ids):
            held = fetch_halo(self.structure, self.halo()[0], self.offsets, self.world.exchanger,
                              with_edges=with_edges, budget_bytes=budget_mb * 2**20)
            if held is None:
                log.info("rank %d: a copy of the halo's in-edges exceeds the topology budget %g MiB on some rank: "
                         "every hop beyond the owned nodes asks their owners", self.world.rank, budget_mb)
            else:
                log.info("rank %d: halo in-edges copied (%d nodes, %d edges, %.1f MiB): hops within the halo "
                         "send no request", self.world.rank, held.halo_ids.numel(), held.halo_indices.size,
                         held.nbytes / 2**20)
            self._memo["halo_structure"] = held
        return held

    def degree_table(self) -> DistTable:
        """Full-graph in-degrees (float32) by global id, with the halo's cached: GCN weights of any node."""
        if "degrees" not in self._memo:
            table = DistTable(self.structure.degree.to(torch.float32), self.offsets, self.world.exchanger)
            table.fill_cache(self.halo()[0])
            self._memo["degrees"] = table
        return self._memo["degrees"]

    def degree_lookup(self):
        """``lookup(ids) -> float32 degrees`` for any ids, from the replicated structure when one is held."""
        if "replicated" in self._memo or self.world.size == 1:
            whole = self._memo.get("replicated", self.structure)
            return lambda ids: whole.degree.index_select(0, ids).to(torch.float32)
        return self.degree_table().lookup


def csc_with_edge_data(src: np.ndarray, dst: np.ndarray, num_nodes: int, data: np.ndarray, *,
                       symmetrize: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSC ``(indptr, indices, data)`` of COO edges carrying rows of ``data`` [num_edges, D]: self-loops dropped,
    repeated edges kept (each has its own row), a reverse edge (``symmetrize``) with its edge's row.

    Raises:
        ValueError: ``data`` does not have one row per edge.
    """
    if data.ndim != 2 or data.shape[0] != src.shape[0]:
        raise ValueError(f"edge_features must be [num_edges, D] = [{src.shape[0]}, D], got {list(data.shape)}")
    keep = src != dst
    src, dst, data = src[keep], dst[keep], data[keep]
    if symmetrize:
        src, dst, data = np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([data, data])
    order = np.lexsort((src, dst))
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return indptr, src[order], data[order]


def _partition_here(dataset: GraphDataset, folder: Path, world: World, split: int) -> Partition:
    """Partition ``dataset`` into ``world.size`` parts under ``folder`` and open this rank's, after checking that
    every rank computed the same assignment (METIS is deterministic for equal input and seed)."""
    from partition import PartitionConfig, partition_graph

    quiet = logging.getLogger("partition")
    level, quiet.level = quiet.level, logging.WARNING
    try:
        partition_graph(dataset, folder / "parts", PartitionConfig(num_parts=world.size, split=split))
    finally:
        quiet.setLevel(level)
    part = load_partition(folder / "parts", world.rank)
    digest = hashlib.sha256(np.ascontiguousarray(part.book.orig2new).tobytes()).digest()
    mine = torch.tensor(list(digest[:8]), dtype=torch.int64)
    every = world.exchanger.all_gather_rows(mine.unsqueeze(0))
    if not bool((every == mine).all()):
        raise ValueError("the ranks partitioned the dataset differently (their datasets differ?): give every rank "
                         "the same dataset, or partition it once with python -m partition and use open_graph")
    return part


def open_graph(path: str | Path, world: World | None = None, *, split: int = 0, wire_dtype: str = "float32",
               verify_checksums: bool = False, memory_budget: float | None = None) -> Graph:
    """This rank's share of the partition folder ``path`` (``python -m partition --num-parts N``), which must
    hold one partition per rank of ``world`` (a world of one when None); ``memory_budget`` as :class:`Graph`'s.

    Raises:
        FileNotFoundError: no partition folder at ``path``.
        ValueError: the folder's partition count differs from the world size; a bad ``split``.
        PartitionError: the folder is corrupt or inconsistent.
    """
    from partition.format import read_manifest

    world = world if world is not None else init()
    num_parts = read_manifest(Path(path))["num_parts"]
    if num_parts != world.size:
        raise ValueError(f"{path} holds {num_parts} partition(s) but this job has {world.size} rank(s): launch "
                         f"torchrun with {num_parts} processes in all (--nnodes x --nproc_per_node), or re-partition "
                         f"with --num-parts {world.size}")
    return Graph(load_partition(path, world.rank, verify_checksums=verify_checksums), world, split=split,
                 wire_dtype=wire_dtype, memory_budget=memory_budget)
