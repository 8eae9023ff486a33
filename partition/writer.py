"""Write the partition folder: per-partition arrays streamed chunk by chunk, inside an atomic directory.

Memory: besides the dataset, the writer holds ``orig2new`` and ``new2orig`` (int64 [N] each)
and one chunk of about :data:`~partition.segments.CHUNK_EDGES` edges or 16 MiB of feature
rows at a time; the halo search adds a bool [N] mask when H > 1.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from gnnscale.data.dataset import GraphDataset
from partition.book import PartitionBook
from partition.format import MANIFEST, ArrayWriter, part_file
from partition.halo import expand_halo
from gnnscale.data.pages import release_map, release_rows
from partition.segments import gather_segments, node_chunks

_FEATURE_CHUNK_BYTES = 16 << 20


def write_partitions(dataset: GraphDataset, book: PartitionBook, new2orig: np.ndarray, writer: ArrayWriter, *,
                     halo_hops: int, split: int) -> list[dict]:
    """Queue every partition's arrays on ``writer``; return per-partition counts.

    Args:
        new2orig: int64 [N], the original id of each new global id.
        split: the split whose training nodes are counted (``num_train``).

    Returns:
        One dict per partition: ``part``, ``node_range``, ``num_nodes``, ``num_edges``,
        ``num_cut_edges`` (in-edges from other partitions), ``num_halo``, ``num_train``.
    """
    train = dataset.split(split)[0]

    def in_neighbors(new_ids: np.ndarray) -> np.ndarray:
        return book.orig2new[gather_segments(dataset.indptr, dataset.indices, new2orig[new_ids])]

    stats = []
    # Marks the current partition's one-hop halo; a scan of N bytes per partition is cheaper
    # than sorting the cut edges' sources, and the marks are cleared after each partition.
    marked = np.zeros(book.num_nodes, dtype=bool)
    for part in range(book.num_parts):
        start, end = book.node_range(part)
        owned = new2orig[start:end]
        degrees = dataset.indptr[owned + 1] - dataset.indptr[owned]
        indptr = np.zeros(owned.shape[0] + 1, dtype=np.int64)
        np.cumsum(degrees, out=indptr[1:])
        writer.write(part_file(part, "indptr"), indptr)

        edges = writer.open(part_file(part, "indices"), (int(indptr[-1]),), np.int64)
        num_cut = 0
        for lo, hi in node_chunks(indptr):
            sources = book.orig2new[gather_segments(dataset.indptr, dataset.indices, owned[lo:hi])]
            edges.append(sources)
            outside = sources[(sources < start) | (sources >= end)]
            num_cut += outside.shape[0]
            marked[outside] = True
        edges.close()
        first_hop = np.flatnonzero(marked).astype(np.int64)
        marked[first_hop] = False
        halo = expand_halo(first_hop, (start, end), halo_hops, book.num_nodes, in_neighbors) if halo_hops \
            else np.zeros(0, dtype=np.int64)
        release_map(dataset.indices)  # an out-of-core CSC: what this partition read goes back to the page cache
        writer.write(part_file(part, "halo_ids"), halo)
        writer.write(part_file(part, "orig_ids"), owned)
        _write_node_data(dataset, part, owned, writer)
        stats.append({"part": part, "node_range": [start, end], "num_nodes": end - start,
                      "num_edges": int(indptr[-1]), "num_cut_edges": int(num_cut), "num_halo": int(halo.shape[0]),
                      "num_train": int(np.count_nonzero(train[owned]))})
    return stats


def _write_node_data(dataset: GraphDataset, part: int, owned: np.ndarray, writer: ArrayWriter) -> None:
    """Partition ``part``'s rows of the features (streamed in chunks), labels, masks and edge features (in the
    order of its in-edges) of the original nodes ``owned``."""
    features = writer.open(part_file(part, "features"), (owned.shape[0], dataset.num_features),
                           dataset.features.dtype)
    rows = max(1, _FEATURE_CHUNK_BYTES // max(1, dataset.features.dtype.itemsize * dataset.num_features))
    for lo in range(0, owned.shape[0], rows):
        chunk = owned[lo:lo + rows]
        features.append(dataset.features[chunk])
        # Memory-mapped features (an edge-list folder's) go back to the page cache once copied: owned ids
        # ascend, so the pages between this chunk's first and last row are done with.
        release_rows(dataset.features, int(chunk[0]), int(chunk[-1]) + 1)
    features.close()
    writer.write(part_file(part, "labels"), dataset.labels[owned])
    if dataset.edge_features is not None:
        writer.write(part_file(part, "edge_features"), dataset.edge_features[segment_positions(dataset.indptr, owned)])
    for name in ("train_masks", "val_masks", "test_masks"):
        writer.write(part_file(part, name), getattr(dataset, name)[:, owned])


# ---------------------------------------------------------------------- atomic output
def check_output(out: Path, force: bool) -> None:
    """Refuse an existing ``out`` without ``force``, and anything but a partition folder even with it.

    Raises:
        FileExistsError: ``out`` exists and ``force`` is off, or it is not a partition folder.
    """
    if not out.exists() and not out.is_symlink():
        return
    if not force:
        raise FileExistsError(f"{out}: already exists; pass --force to replace it (the old folder is kept until "
                              f"the new one is complete), or choose another --out")
    if not out.is_dir() or out.is_symlink() or (any(out.iterdir()) and not (out / MANIFEST).is_file()):
        raise FileExistsError(f"{out}: exists and is not a partition folder (no {MANIFEST}); refusing to replace "
                              f"it even with --force: remove it yourself or choose another --out")


@contextmanager
def atomic_directory(out: Path, *, force: bool) -> Iterator[Path]:
    """Yield a temporary sibling ``OUT.tmp-<pid>`` to fill; rename it to ``out`` when the block succeeds.

    On any exception, ``KeyboardInterrupt`` included, the temporary folder (and any parent
    folder this call created) is removed and ``out`` is left as it was.  With ``force``, an
    existing ``out`` is replaced only after the new folder is complete: it is renamed aside,
    the new one renamed in, and only then is the old one deleted.
    """
    check_output(out, force)
    created = [parent for parent in reversed(out.parents) if not parent.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a killed run that had our pid
    tmp.mkdir()
    try:
        yield tmp
        check_output(out, force)  # someone may have created it meanwhile
        if out.exists():
            old = out.with_name(f"{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except BaseException:
                os.rename(old, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for parent in reversed(created):
            try:
                parent.rmdir()
            except OSError:
                break
        raise


def segment_positions(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions in a CSC's ``indices`` of every in-edge of ``rows``, row after row: int64 [sum of degrees]."""
    starts, counts = indptr[rows], indptr[rows + 1] - indptr[rows]
    first = np.cumsum(counts) - counts
    return np.repeat(starts - first, counts) + np.arange(int(counts.sum()), dtype=np.int64)
