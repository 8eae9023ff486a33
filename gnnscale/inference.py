"""Layer-wise full-neighbour inference for any model that follows a two-member protocol, on 1..N ranks.

A model opts in by having

* ``num_layers``: an int, and
* ``layer(index, block, h) -> Tensor``: layer ``index`` (with its activation and dropout) applied to one
  :class:`~gnnscale.batch.Block`, ``h`` holding a row per source node of the block and the result a row per
  destination node.

Layer ``l`` runs over every node before layer ``l + 1`` starts, each node seeing all its in-neighbours, so no
node's embedding depends on a sample; each rank computes its owned nodes and exchanges the halo's rows once
per layer.  The built-in :class:`gnnscale.nn.GNN` implements the protocol; ``output_width(index)``, where a
model has it, sizes the buffers ahead (otherwise the first block's output does).

:meth:`NodeOutputs.save` writes every rank's rows with their original ids and a manifest; :func:`read_outputs`
reads them back as one array in original id order.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from gnnscale.batch import Block
from gnnscale.budget import keeps_inference_blocks
from gnnscale.distributed.feature_store import DistTable
from gnnscale.distributed.gradsum import Replicated
from gnnscale.graph import Graph
from gnnscale.metrics import evaluate
from gnnscale.pipeline.allocator import trimmed_heap
from samplers.neighbor import SamplerConfig, make_block

OUTPUTS_FORMAT = "gnnscale-node-outputs"
OUTPUTS_VERSION = 1


class NodeOutputs:
    """One rank's rows of a per-node output (embeddings, logits): ``rows[i]`` belongs to global id
    ``graph.start + i``."""

    def __init__(self, graph: Graph, rows: Tensor) -> None:
        self.graph, self.rows = graph, rows

    def __getitem__(self, ids: Tensor) -> Tensor:
        """Rows of owned global ``ids``."""
        return self.rows.index_select(0, torch.as_tensor(ids, dtype=torch.int64) - self.graph.start)

    def score(self, ids: Tensor, labels: Tensor | None = None, metric: str | None = None) -> float:
        """``metric`` (default: the graph's) of the rows of owned ``ids`` against their labels (default: the
        graph's), over the ids of every rank; a collective, every rank returns the same value."""
        exchanger, ids = self.graph.world.exchanger, torch.as_tensor(ids, dtype=torch.int64)
        labels = self.graph.labels if labels is None else labels
        local = ids - self.graph.start
        metric = metric or self.graph.metric
        if metric == "accuracy":  # a sum: two numbers cross the wire, not every rank's rows
            hits = (self.rows.index_select(0, local).argmax(-1) == labels.index_select(0, local)).sum()
            counts = exchanger.all_reduce(torch.stack([hits, torch.tensor(local.numel())]).to(torch.int64))
            correct, total = counts.tolist()
            return correct / total if total else float("nan")
        # A ranking metric needs every score together.
        every_rows = exchanger.all_gather_rows(self.rows.index_select(0, local))
        every_labels = exchanger.all_gather_rows(labels.index_select(0, local))
        return evaluate(metric, every_rows, every_labels)

    def save(self, folder: str | Path) -> Path:
        """Write this rank's rows (``part-R.npy``, float32 [num_owned, ...]) and their original ids
        (``part-R.ids.npy``); rank 0 adds ``manifest.json``.  Each file appears complete or not at all.
        Every rank must call it (it ends with a barrier)."""
        folder, world = Path(folder), self.graph.world
        folder.mkdir(parents=True, exist_ok=True)
        rank = world.rank
        _save_npy(folder / f"part-{rank}.npy", self.rows.detach().cpu().numpy())
        _save_npy(folder / f"part-{rank}.ids.npy", self.graph.to_original(self.graph.owned_ids).numpy())
        if world.is_main:
            manifest = {"format": OUTPUTS_FORMAT, "version": OUTPUTS_VERSION, "num_parts": world.size,
                        "num_nodes": self.graph.num_nodes, "row_shape": list(self.rows.shape[1:]),
                        "dtype": str(self.rows.detach().cpu().numpy().dtype), "dataset": self.graph.name}
            tmp = folder / f".manifest.json.tmp-{os.getpid()}"
            tmp.write_text(json.dumps(manifest, indent=2) + "\n")
            os.replace(tmp, folder / "manifest.json")
        world.barrier()
        return folder


def _save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        np.save(handle, array, allow_pickle=False)
    os.replace(tmp, path)


def read_outputs(folder: str | Path) -> np.ndarray:
    """Every rank's rows of a :meth:`NodeOutputs.save` folder as one array, row ``v`` for original id ``v``.

    Raises:
        FileNotFoundError: the folder or one of its files is missing.
        ValueError: the folder is not a node-outputs folder, or its parts do not cover ``0..num_nodes - 1``.
    """
    folder = Path(folder)
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path} does not exist: pass a folder written by NodeOutputs.save "
                                f"(--save-predictions)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != OUTPUTS_FORMAT:
        raise ValueError(f"{manifest_path} is not a gnnscale node-outputs manifest (format "
                         f"{manifest.get('format')!r})")
    num_nodes = int(manifest["num_nodes"])
    out = np.zeros((num_nodes, *manifest["row_shape"]), dtype=manifest["dtype"])
    seen = np.zeros(num_nodes, dtype=bool)
    for part in range(int(manifest["num_parts"])):
        rows = np.load(folder / f"part-{part}.npy", allow_pickle=False)
        ids = np.load(folder / f"part-{part}.ids.npy", allow_pickle=False)
        if ids.shape[0] != rows.shape[0] or (ids.size and (ids.min() < 0 or ids.max() >= num_nodes)):
            raise ValueError(f"{folder}/part-{part}: {rows.shape[0]} rows for {ids.shape[0]} ids, ids must lie in "
                             f"[0, {num_nodes}); the folder is inconsistent: write it again")
        out[ids], seen[ids] = rows, True
    if not seen.all():
        raise ValueError(f"{folder}: original id {int(np.flatnonzero(~seen)[0])} has no row; the parts do not "
                         f"cover every node: write the folder again")
    return out


def _blocks(graph: Graph, batch_size: int, self_loops: bool, gcn_norm: bool,
            edge_features: bool) -> Iterable[tuple[Block, Tensor]]:
    """Full-neighbour blocks over the owned nodes, each with its source rows in ``cat(owned, halo)``: memoised on
    the graph where its memory budget has room for them all (:func:`gnnscale.budget.keeps_inference_blocks`),
    else built again a batch at a time whenever they are iterated."""
    build = functools.partial(_build_blocks, graph, batch_size, self_loops, gcn_norm, edge_features)
    if not keeps_inference_blocks(graph):
        return _Rebuilt(build)
    key = ("inference-blocks", batch_size, self_loops, gcn_norm, edge_features)
    if key not in graph._memo:
        graph._memo[key] = _Kept(build(), wide_ids=graph.num_nodes >= 2**31)
    return graph._memo[key]


class _Kept:
    """Blocks kept between layers and evaluations with their ids as int32, 12 bytes an in-edge against 24 (its
    source's position, global id and row): each block is widened back to int64 as it is used.  On one process of a
    1M-node, 15M-edge graph the int64 blocks were 339 MiB, more than its partition's structure.  :attr:`blocks`
    holds them narrowed (what the memory account counts)."""

    def __init__(self, blocks: Iterable[tuple[Block, Tensor]], *, wide_ids: bool) -> None:
        narrow = torch.int64 if wide_ids else torch.int32  # ids and rows past int32 stay as they are
        self.blocks = [(dataclasses.replace(block, indices=block.indices.to(torch.int32),
                                             src_ids=block.src_ids.to(narrow)), rows.to(narrow))
                        for block, rows in blocks]

    def __iter__(self) -> Iterator[tuple[Block, Tensor]]:
        for block, rows in self.blocks:
            yield dataclasses.replace(block, indices=block.indices.long(), src_ids=block.src_ids.long()), rows.long()


class _Rebuilt:
    """Blocks built anew on each iteration (one layer's pass), so that only one batch's are held."""

    def __init__(self, build: Callable[[], Iterator[tuple[Block, Tensor]]]) -> None:
        self._build = build

    def __iter__(self) -> Iterator[tuple[Block, Tensor]]:
        return self._build()


def _build_blocks(graph: Graph, batch_size: int, self_loops: bool, gcn_norm: bool,
                  edge_features: bool) -> Iterator[tuple[Block, Tensor]]:
    config = SamplerConfig(fanouts=[-1], self_loops=self_loops, gcn_norm=gcn_norm, edge_ids=edge_features)
    lookup = graph.degree_lookup() if config.gcn_norm else None
    halo_ids = graph.halo()[0]
    for chunk in graph.owned_ids.split(batch_size):
        src, counts, *edges = graph.structure.sample(chunk, -1, False, None, with_edges=edge_features)
        block = make_block(chunk, src, counts, config, lookup, *edges)
        if edge_features:  # every edge is an owned node's in-edge: its features are here
            graph.attach_edge_features([block], local=True)
        ids = block.src_ids
        is_owned = (ids >= graph.start) & (ids < graph.end)
        yield block, torch.where(is_owned, ids - graph.start, graph.num_owned + torch.searchsorted(halo_ids, ids))


@torch.no_grad()
def layerwise_inference(graph: Graph, model: nn.Module, *, batch_size: int = 8192, self_loops: bool = False,
                        gcn_norm: bool = False, edge_features: bool = False,
                        device: torch.device | str | None = None) -> NodeOutputs:
    """The model's output for every owned node, layer by layer over all neighbours (a collective).

    Args:
        graph: the graph handle.
        model: follows the module docstring's protocol (``num_layers``, ``layer``); a ``World.wrap`` or DDP wrapper
            is unwrapped.
        batch_size: destination nodes per block.
        self_loops, gcn_norm, edge_features: as the model was trained with (the loader's settings).
        device: where the layers run (default: the world's device); rows stay on the host.

    Raises:
        TypeError: the model does not follow the protocol.
    """
    module = model.module if isinstance(model, (Replicated, DistributedDataParallel)) else model
    if not isinstance(getattr(module, "num_layers", None), int) or not callable(getattr(module, "layer", None)):
        raise TypeError(f"{type(module).__name__} does not follow the layer-wise protocol: give it num_layers (int) "
                        f"and layer(index, block, h) (see gnnscale.inference)")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if edge_features and graph.edge_features is None:
        raise ValueError("edge_features=True needs a graph with edge features")
    device = torch.device(device) if device is not None else graph.world.device
    batch_size = batch_rows(graph, batch_size)
    was_training = module.training
    module.eval()
    try:
        with trimmed_heap():  # once in a while: it starts without the steps' kept memory and leaves none
            rows = _run_layers(graph, module, _blocks(graph, batch_size, self_loops, gcn_norm, edge_features), device)
    finally:
        module.train(was_training)
    return NodeOutputs(graph, rows)


BATCH_BYTES = 32 * 2**20
"""A block's first-layer input rows (its destinations and their in-neighbours, one feature row each) are kept near
this many bytes: 8192 nodes of 256 float32 features and in-degree 10 held about 100 MiB of rows, and as much again in
the layer's messages (on 4 ranks of a 1M-node graph, evaluation's peak per rank fell by 100 MiB at 2048)."""


def batch_rows(graph: Graph, batch_size: int) -> int:
    """Destinations per block: at most ``batch_size``, fewer where the first layer's rows of so many, at the
    graph's mean in-degree, would exceed :data:`BATCH_BYTES`.  The outputs do not depend on it."""
    table = graph.features
    row_bytes = math.prod(table.row_shape) * table.rows.element_size()
    per_node = row_bytes * (1 + graph.structure.indices.size / max(graph.num_owned, 1))
    return max(1, min(batch_size, int(BATCH_BYTES // max(per_node, 1))))


HALO_BYTES = 32 * 2**20
"""Evaluation holds at most about this many bytes of halo rows at once.  Where a layer's halo rows are more, the
blocks run in waves, each gathering only the halo rows its blocks read (a row read by two waves travels twice): at
layer 0 on 4 ranks of a 1M-node, 100-feature graph every halo row at once was 110 MiB a rank, more than the rank's
own feature rows, and the peak of the whole run."""


def _run_layers(graph: Graph, module: nn.Module, blocks: Iterable[tuple[Block, Tensor]],
                device: torch.device) -> Tensor:
    table, halo_ids = graph.features, graph.halo()[0]
    for layer in range(module.num_layers):
        width = module.output_width(layer) if hasattr(module, "output_width") else None
        out = None if width is None else torch.empty(graph.num_owned, width)
        for wave, halo in _waves(table, halo_ids, blocks):
            for block, rows in wave:
                h = module.layer(layer, block.to(device), _source_rows(table, halo, rows).to(device)).cpu()
                if out is None:
                    out = torch.empty((graph.num_owned, *h.shape[1:]), dtype=h.dtype)
                out[block.dst_ids - graph.start] = h
            del wave, halo  # before the next wave's rows arrive
        assert out is not None, "a rank without owned nodes needs the model's output_width"
        table = DistTable(out, graph.offsets, graph.world.exchanger, wire_dtype=graph.wire_dtype)
    return table.rows


def _waves(table: DistTable, halo_ids: Tensor, blocks: Iterable[tuple[Block, Tensor]]
           ) -> Iterator[tuple[Iterable[tuple[Block, Tensor]], Tensor | None]]:
    """The blocks in waves, each with the halo rows it reads (gathered: a collective, every rank gathering as
    many times), its blocks' rows renumbered into ``cat(owned, those rows)``.  One wave of every block and every
    halo row where they fit :data:`HALO_BYTES` (as the joined halo was gathered before)."""
    if table.world_size == 1:  # no halo
        yield blocks, None
        return
    row_bytes = math.prod(table.row_shape) * table.rows.element_size()
    cap = max(1, HALO_BYTES // max(row_bytes, 1))
    plan = _plan_waves(blocks, table.rows.shape[0], halo_ids.numel(), cap) if halo_ids.numel() > cap else None
    count = torch.tensor([1 if plan is None else len(plan)])
    count = int(table.exchanger.all_reduce(count, op=dist.ReduceOp.MAX)[0])
    with table.reusing_buffers():
        if plan is None:
            yield blocks, table.gather(halo_ids)
            for _ in range(count - 1):  # the peers' further waves
                table.gather(halo_ids[:0])
            return
        owned, remaining = table.rows.shape[0], iter(blocks)
        where = torch.empty(halo_ids.numel(), dtype=torch.int64)
        for index in range(count):
            size, needed = plan[index] if index < len(plan) else (0, halo_ids[:0])
            where[needed] = owned + torch.arange(needed.numel())
            wave = ((block, _renumber(rows, owned, where)) for block, rows in itertools.islice(remaining, size))
            yield wave, table.gather(halo_ids.index_select(0, needed))  # this frame holds no wave's rows


def _plan_waves(blocks: Iterable[tuple[Block, Tensor]], owned: int, num_halo: int, cap: int
                ) -> list[tuple[int, Tensor]]:
    """Consecutive blocks grouped while the halo rows they read (indices into the halo list) stay within ``cap``
    (a block that alone reads more is a wave of its own): ``(blocks in the wave, sorted halo indices)`` each."""
    plan: list[tuple[int, Tensor]] = []
    read = torch.zeros(num_halo, dtype=torch.bool)
    size = held = 0
    for _, rows in blocks:
        wanted = torch.unique(rows[rows >= owned] - owned)
        new = int((~read[wanted]).sum())
        if size and held + new > cap:
            plan.append((size, torch.nonzero(read).squeeze(1)))
            read.zero_()
            size = held = 0
            new = wanted.numel()
        read[wanted] = True
        size, held = size + 1, held + new
    if size:
        plan.append((size, torch.nonzero(read).squeeze(1)))
    return plan


def _renumber(rows: Tensor, owned: int, where: Tensor) -> Tensor:
    """Source rows into ``cat(owned, halo)`` renumbered to a wave's ``cat(owned, its halo rows)``."""
    halo = rows >= owned
    return torch.where(halo, where[torch.where(halo, rows - owned, 0)], rows)


def _source_rows(table: DistTable, halo: Tensor | None, rows: Tensor) -> Tensor:
    """Rows ``rows`` of ``cat(table's owned rows, halo)``, without making that table."""
    owned = table.rows.shape[0]
    if halo is None or not bool((rows >= owned).any()):
        return table.read_owned(rows)
    out = table.rows.new_empty((rows.numel(), *table.row_shape))
    mine = rows < owned
    at = torch.nonzero(mine).squeeze(1)
    out.index_copy_(0, at, table.read_owned(rows.index_select(0, at)))
    other = torch.nonzero(~mine).squeeze(1)
    out.index_copy_(0, other, halo.index_select(0, rows.index_select(0, other) - owned))
    return out
