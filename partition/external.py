"""Out-of-core: an edge list to an on-disk CSC with bounded memory (``python -m partition --out-of-core``).

The in-memory pipeline reads every edge (16 bytes each as int64 pairs), sorts one int64 key per
edge (two when symmetrising) and keeps the CSC: about 50 bytes per edge at its peak with KaMinPar.
Here the edges are never all in memory.  An external distribution sort in three passes:

1. **count**: read the edge file in chunks (``edges.npy`` memory-mapped, a text file through pandas'
   chunked reader), check every id, and count the in-edges of each block of :data:`BLOCK` destinations
   (reverse edges included when symmetrising);
2. **scatter**: cut the destinations into contiguous ranges of at most ``bucket_edges`` counted edges,
   read the file again, turn each chunk into sorted, de-duplicated dst-major keys ``dst * N + src`` and
   append each range's keys to its own file;
3. **sort**: one bucket at a time, read its keys, sort them, drop repeats, and append the sources to
   ``indices.bin``; the offsets fill an int64 [N + 1] array in memory.

The result is exactly :func:`gnnscale.data.dataset.csc_from_edges`' (the same keys, sorted and
de-duplicated, self loops dropped), so a partition folder written from it is the in-memory pipeline's
file for file.  Memory: O(N) for the offsets and block counts, one chunk of ``chunk_edges`` edges
(about 64 bytes each while it is keyed and sorted) and one bucket (about 10 bytes per key).  Disk: the
bucket files (8 bytes per key, removed as they are merged) and ``indices.bin`` (8 bytes per stored edge).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnnscale.data.dataset import (MAX_KEYED_NODES, GraphDataset, drop_repeats, keys_to_sources,
                                   sorted_edge_keys)
from gnnscale.data.loaders import check_edge_ids, require_file
from gnnscale.data.pages import release_map

log = logging.getLogger("partition")

BLOCK = 1024
"""Destinations counted together in the count pass: its array is N / BLOCK long."""

EdgeChunks = Callable[[], Iterator[tuple[int, np.ndarray, np.ndarray]]]
"""Called once per pass; yields ``(first row, src, dst)`` chunks of the edge file (int64)."""
Stage = Callable[[str], contextlib.AbstractContextManager]
"""``stage(name)``: a context that times and reports one pass (``StageMonitor.stage``)."""


def external_csc(chunks: EdgeChunks, num_nodes: int, folder: Path, *, symmetrize: bool, bucket_edges: int,
                 source: str, stage: Stage | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The CSC ``(indptr, indices)`` of the edges ``chunks`` yields, built on disk in ``folder``.

    Args:
        chunks: the edge file's chunks (:data:`EdgeChunks`); read twice.
        folder: an existing scratch folder; ``indices.bin`` is left there (the returned memmap reads it) and
            the bucket files are removed, also on failure.
        symmetrize: add every reverse edge.
        bucket_edges: the most keys one bucket is sized for (a single destination's in-edges may exceed it).
        source: the edge file's name, for errors.
        stage: wraps each pass (``count``, ``scatter``, ``sort``) to time it and report its memory.

    Returns:
        int64 [N + 1] offsets in memory and int64 [E] sources, a read-only memmap of ``folder/indices.bin``.

    Raises:
        DatasetError: an id is not an integer or lies outside ``[0, num_nodes)``; nothing is left in ``folder``.
    """
    if num_nodes > MAX_KEYED_NODES:
        raise ValueError(f"num_nodes={num_nodes:,} is too many for one int64 edge key (dst * num_nodes + src): at "
                         f"most {MAX_KEYED_NODES:,} nodes; relabel the ids compactly (0..n-1 over the nodes in use)")
    stage = stage or (lambda name: contextlib.nullcontext())
    with stage("count"):
        counts = _count_blocks(chunks, num_nodes, symmetrize, source)
    bounds = bucket_bounds(counts, num_nodes, bucket_edges)
    del counts
    paths = [folder / f"bucket-{b:05d}.bin" for b in range(bounds.shape[0] - 1)]
    try:
        with stage("scatter"):
            _scatter(chunks, num_nodes, bounds, paths, symmetrize)
        with stage("sort"):
            indptr = _merge(paths, bounds, num_nodes, folder / "indices.bin")
    except BaseException:
        (folder / "indices.bin").unlink(missing_ok=True)
        raise
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    num_edges = int(indptr[-1])
    indices = np.memmap(folder / "indices.bin", dtype=np.int64, mode="r", shape=(num_edges,)) if num_edges \
        else np.zeros(0, dtype=np.int64)
    return indptr, indices


def _count_blocks(chunks: EdgeChunks, num_nodes: int, symmetrize: bool, source: str) -> np.ndarray:
    """int64 [ceil(N / BLOCK)]: in-edges per block of destinations, loops and repeats included (an upper bound)."""
    counts = np.zeros(-(-num_nodes // BLOCK), dtype=np.int64)
    for row, src, dst in chunks():
        check_edge_ids(src, dst, num_nodes, source, first_row=row)
        counts += np.bincount(dst // BLOCK, minlength=counts.shape[0])
        if symmetrize:
            counts += np.bincount(src // BLOCK, minlength=counts.shape[0])
    return counts


def bucket_bounds(block_counts: np.ndarray, num_nodes: int, bucket_edges: int) -> np.ndarray:
    """int64 [B + 1] node ids cutting ``[0, N)`` into ranges of whole blocks, each holding at most ``bucket_edges``
    counted edges (or a single block, however many it holds)."""
    ends = np.cumsum(block_counts)
    cuts, start, total = [0], 0, 0
    while start < block_counts.shape[0]:
        # The last block whose running total stays within this bucket's allowance; at least one block.
        stop = max(start + 1, int(np.searchsorted(ends, total + bucket_edges, side="right")))
        total = int(ends[stop - 1])
        cuts.append(min(stop * BLOCK, num_nodes))
        start = stop
    return np.asarray(cuts, dtype=np.int64)


def _scatter(chunks: EdgeChunks, num_nodes: int, bounds: np.ndarray, paths: list[Path], symmetrize: bool) -> None:
    """Append each chunk's sorted, de-duplicated keys, loops dropped, to the bucket file of their destinations."""
    key_bounds = bounds * num_nodes
    files = [open(path, "wb") for path in paths]  # noqa: SIM115 - closed below, one per bucket
    try:
        for _, src, dst in chunks():
            keys = sorted_edge_keys(src, dst, num_nodes, symmetrize=symmetrize)
            del src, dst
            cuts = np.searchsorted(keys, key_bounds)
            for b, file in enumerate(files):
                if cuts[b + 1] > cuts[b]:
                    keys[cuts[b]:cuts[b + 1]].tofile(file)
    finally:
        for file in files:
            file.close()


def _merge(paths: list[Path], bounds: np.ndarray, num_nodes: int, out: Path) -> np.ndarray:
    """Sort each bucket, drop repeats, append its sources to ``out``; the int64 [N + 1] offsets."""
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    written = 0
    with open(out, "wb") as file:
        for b, path in enumerate(paths):
            lo, hi = int(bounds[b]), int(bounds[b + 1])
            keys = np.fromfile(path, dtype=np.int64)
            path.unlink()
            keys.sort()
            keys = drop_repeats(keys) if keys.size else keys
            offsets = np.searchsorted(keys, np.arange(lo, hi + 1, dtype=np.int64) * num_nodes)
            indptr[lo + 1:hi + 1] = written + offsets[1:]
            keys_to_sources(keys, offsets, lo, num_nodes).tofile(file)
            written += keys.shape[0]
            del keys
    return indptr


# ---------------------------------------------------------------------- memory plan
_MIB = 1 << 20
BASE_BYTES = 600 * _MIB
"""The command before any data: interpreter, numpy, pandas, torch (measured 0.55 GiB)."""
NODE_BYTES = 60
"""Bytes per node held beside the partitioner: offsets, weight columns, partition ids, id maps, labels, masks
(100M edges on 10M nodes: 0.53 GiB above the base before KaMinPar loads the graph)."""
KEY_BYTES = 10
"""Bytes per key of a bucket while it is sorted and de-duplicated."""
CHUNK_ROW_BYTES = 64
"""Bytes per edge row of a chunk while it is read, keyed (twice when symmetrising) and sorted."""
ENTRY_BYTES = {"kaminpar": 15, "kaminpar-terapart": 11, "metis": 110, "random": 0}
"""The partitioner's bytes per adjacency entry, its per-node arrays folded in (100M edges on 10M nodes into 8
parts: KaMinPar default 1.35 GiB, terapart 1.0 GiB; METIS about 10 GiB; docs/partitioning.md)."""
IN_MEMORY_ROW_BYTES = {"kaminpar": 55, "metis": 120, "random": 40}
"""Peak bytes of the whole in-memory command per row of an edge file that lists both directions (100M rows,
8 parts: KaMinPar 4.80 GiB, METIS 10.98 GiB); a file that lists each edge once needs up to twice as much."""


@dataclass(frozen=True)
class OutOfCorePlan:
    """Chunk sizes of the out-of-core passes, chosen from ``--memory-budget`` or the defaults."""

    chunk_edges: int = 1 << 23
    """Edge rows read and keyed at a time."""
    bucket_edges: int = 1 << 26
    """Keys one bucket is sized for."""


def plan_memory(budget_mib: float | None, num_nodes: int, entries: int, *, method: str, context: str,
                exact: bool = True) -> OutOfCorePlan:
    """Chunk sizes that keep the out-of-core command within ``budget_mib`` (None: the defaults), for a graph of
    ``entries`` adjacency entries: the exact count after the sort, or (``exact=False``) the edge file's rows
    before it, which repeats and self loops make an overestimate (6% at 1B synthetic edges) and reverses added
    to an undirected graph an underestimate; only the node arrays can refuse then, the rest is logged.

    Raises:
        ValueError: the budget is below what the node arrays and the partitioner need whatever the chunk
            sizes; the line names the estimate and what to change.
    """
    if budget_mib is None:
        return OutOfCorePlan()
    budget = int(budget_mib * _MIB)
    fixed = BASE_BYTES + num_nodes * NODE_BYTES
    need = fixed + entries * ENTRY_BYTES[_entry_key(method, context)]
    if need > budget and not exact and fixed <= budget:
        log.warning("%s edge rows would need about %s MiB, above --memory-budget %g MiB; the exact count after "
                    "the sort (without repeats and self loops) decides", f"{entries:,}", f"{need / _MIB:,.0f}",
                    budget_mib)
    elif need > budget:
        hint = ", or --kaminpar-context terapart (about three quarters of KaMinPar's memory)" \
            if method == "kaminpar" and not context.startswith("terapart") else \
            ", or --method kaminpar (about a seventh of METIS' memory)" if method == "metis" else ""
        raise ValueError(f"--memory-budget {budget_mib:g} MiB is too small to partition {num_nodes:,} nodes and "
                         f"{entries:,} adjacency entries with {method}: that needs about {need / _MIB:,.0f} MiB (the "
                         f"node arrays and the partitioner; docs/partitioning.md); raise it{hint}")
    spare = budget - fixed
    return OutOfCorePlan(chunk_edges=int(max(1 << 16, min(1 << 23, spare // 2 // CHUNK_ROW_BYTES))),
                         bucket_edges=int(max(1 << 16, spare // KEY_BYTES)))


def _entry_key(method: str, context: str) -> str:
    return "kaminpar-terapart" if method == "kaminpar" and context.startswith("terapart") else method


def in_memory_bytes(method: str, num_rows: int) -> int:
    """Estimated peak of the in-memory command for an edge file of ``num_rows`` rows listing both directions."""
    return BASE_BYTES + num_rows * IN_MEMORY_ROW_BYTES[method]


def edge_file_rows(folder: Path) -> tuple[int, int]:
    """``(num_nodes, edge rows)`` of an edge-list folder from its headers (a text file's rows estimated from its
    size at 12 bytes a line), without reading the data."""
    from gnnscale.data.edgelist import find_edge_file  # noqa: PLC0415 - pandas, only for an edge-list folder

    labels = np.load(require_file(folder / "labels.npy", "labels", "see gnnscale/data/edgelist.py for the folder "
                                  "layout"), mmap_mode="r", allow_pickle=False)
    path = find_edge_file(folder)
    if path.suffix == ".npy":
        return int(labels.shape[0]), int(np.load(path, mmap_mode="r", allow_pickle=False).shape[0])
    return int(labels.shape[0]), path.stat().st_size // 12


def load_out_of_core(data_dir: str | Path, scratch: str | Path, plan: OutOfCorePlan = OutOfCorePlan(), *,
                     seed: int = 0, stage: Stage | None = None) -> GraphDataset:
    """An edge-list folder (:mod:`gnnscale.data.edgelist`) whose CSC is built on disk in the existing folder
    ``scratch`` by :func:`external_csc`; features memory-mapped.  The dataset equals ``load_edgelist(data_dir)``'s;
    its ``indices`` read ``scratch/indices.bin``, which must outlive it (remove ``scratch`` after
    :func:`~partition.partition_graph`)."""
    scratch = Path(scratch)
    from gnnscale.data.edgelist import edge_chunks, load_edgelist  # noqa: PLC0415

    def build(path: Path, num_nodes: int, symmetrize: bool) -> tuple[np.ndarray, np.ndarray]:
        return external_csc(lambda: edge_chunks(path, plan.chunk_edges, mmap=True), num_nodes, scratch,
                            symmetrize=symmetrize, bucket_edges=plan.bucket_edges, source=str(path), stage=stage)

    dataset = load_edgelist(Path(data_dir), seed=seed, mmap_features=True, build_csc=build)
    release_map(dataset.indices)
    return dataset
