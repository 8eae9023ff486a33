"""``load_partition``: what rank ``r`` of the distributed runtime opens -- its own partition, memory-mapped."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gnnscale.data.dataset import GraphDataset
from gnnscale.data.pages import release_map
from partition.book import PartitionBook
from partition.format import (OPTIONAL_PART_ARRAYS, ORIG2NEW, PART_ARRAYS, PartitionError, open_array, part_file,
                              read_manifest)


@dataclass(kw_only=True, frozen=True)
class Partition:
    """One partition's arrays (read-only memmaps) and the book of the whole graph: ``n`` owned nodes
    with new global ids ``[start, end)`` (``node_range``); local id ``i`` is global id ``start + i``."""

    part: int
    """This partition's id, in ``[0, num_parts)``."""
    book: PartitionBook
    """Id maps of the whole graph."""
    indptr: np.ndarray
    """int64 [n + 1]: CSC offsets over owned local destination ids."""
    indices: np.ndarray
    """int64 [num_edges]: the source of every in-edge of an owned node, in new global ids."""
    halo_ids: np.ndarray
    """int64 [num_halo]: sorted new global ids of the non-owned nodes within ``halo_hops`` in-hops."""
    orig_ids: np.ndarray
    """int64 [n]: the original id of each owned node."""
    features: np.ndarray
    """[n, F] (dtype as the source, float32 for gnnscale datasets): owned nodes' features."""
    labels: np.ndarray
    """int64 [n]."""
    train_masks: np.ndarray
    """bool [num_splits, n]."""
    val_masks: np.ndarray
    """bool [num_splits, n]."""
    test_masks: np.ndarray
    """bool [num_splits, n]."""
    edge_features: np.ndarray | None = None
    """float [num_edges, D]: the features of in-edge ``i`` of ``indices`` (None when the dataset has none)."""
    num_classes: int
    """Number of label classes of the whole dataset."""
    metric: str
    """``"accuracy"`` or ``"roc_auc"``."""
    manifest: dict[str, Any] = field(repr=False)
    """The parsed ``manifest.json``."""

    @property
    def node_range(self) -> tuple[int, int]:
        return self.book.node_range(self.part)

    @property
    def num_nodes(self) -> int:
        """Owned nodes."""
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def num_halo(self) -> int:
        return int(self.halo_ids.shape[0])


def load_partition(root: str | Path, rank: int, *, verify_checksums: bool = False, check: bool = True) -> Partition:
    """Open partition ``rank`` of the folder ``root``: its arrays memory-mapped.

    Checks the manifest (format, version, id ranges) and, for ``orig2new.npy`` and this
    partition's files, existence, size, ``.npy`` header, dtype and shape; with ``check`` (the
    default) also every invariant whose breach would crash or silently corrupt training
    (:func:`check_partition`, one pass over this rank's files); with ``verify_checksums`` also
    their sha256 (``python -m partition verify`` checks every file and every partition).

    Raises:
        FileNotFoundError: the folder, its manifest or one of the files is missing.
        PartitionError: a file is truncated, corrupted (with ``verify_checksums``), or
            inconsistent with the manifest; the manifest is of a newer format version.
        ValueError: ``rank`` is not a partition of this folder.
    """
    root = Path(root)
    manifest = read_manifest(root)
    num_parts = manifest["num_parts"]
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < num_parts:
        raise ValueError(f"rank {rank!r} has no partition: {root} holds {num_parts} partition(s), 0..{num_parts - 1}; "
                         f"launch {num_parts} processes, or re-partition with --num-parts equal to the world size")
    book = open_book(root, manifest, checksums=verify_checksums)
    arrays = open_part_arrays(root, manifest, int(rank), checksums=verify_checksums)
    if check:
        check_partition(root, manifest, int(rank), arrays, book.orig2new)
        for array in (*arrays.values(), book.orig2new):  # read once: the pages need not stay in this RSS
            release_map(array)
    return Partition(part=int(rank), book=book, num_classes=manifest["num_classes"], metric=manifest["metric"],
                     manifest=manifest, **arrays)


def open_book(root: Path, manifest: dict, *, checksums: bool) -> PartitionBook:
    """The book of a partition folder: ``node_ranges`` checked to tile ``[0, N)``, ``orig2new`` memory-mapped."""
    num_nodes, num_parts = manifest["num_nodes"], manifest["num_parts"]
    offsets = node_offsets(manifest)
    orig2new = open_array(root, ORIG2NEW, _record(manifest, ORIG2NEW, "int64", [num_nodes]), checksum=checksums)

    def orig_ids(part: int) -> np.ndarray:
        rel = part_file(part, "orig_ids")
        return open_array(root, rel, _record(manifest, rel, "int64", [int(offsets[part + 1] - offsets[part])]),
                          checksum=checksums)

    assert offsets.shape[0] == num_parts + 1
    return PartitionBook(offsets=offsets, orig2new=orig2new, orig_ids=orig_ids)


def node_offsets(manifest: dict) -> np.ndarray:
    """int64 [K + 1] from ``node_ranges``, after checking that the ranges tile ``[0, num_nodes)`` in order."""
    ranges, num_parts, num_nodes = manifest["node_ranges"], manifest["num_parts"], manifest["num_nodes"]
    if not isinstance(ranges, list) or len(ranges) != num_parts:
        raise PartitionError(f"manifest.json: node_ranges must list {num_parts} [start, end) pairs, got "
                             f"{len(ranges) if isinstance(ranges, list) else ranges!r}")
    offsets = [0]
    for part, pair in enumerate(ranges):
        if not (isinstance(pair, list) and len(pair) == 2 and pair[0] == offsets[-1] and pair[1] >= pair[0]):
            raise PartitionError(f"manifest.json: node_ranges[{part}] = {pair!r} does not continue the tiling of "
                                 f"[0, {num_nodes}) at {offsets[-1]}: partition id ranges must be contiguous and "
                                 f"in order")
        offsets.append(pair[1])
    if offsets[-1] != num_nodes:
        raise PartitionError(f"manifest.json: node_ranges end at {offsets[-1]}, but num_nodes is {num_nodes}: "
                             f"the ranges do not tile [0, {num_nodes})")
    return np.asarray(offsets, dtype=np.int64)


def expected_shapes(manifest: dict, part: int) -> dict[str, tuple[str, list[int]]]:
    """``{array name: (dtype, shape)}`` of partition ``part``'s files, derived from the manifest's counts."""
    try:
        start, end = manifest["node_ranges"][part]
        n = end - start
        info = manifest["parts"][part]
        data = manifest["node_data"]
        num_splits = manifest["num_splits"]
        return {"indptr": ("int64", [n + 1]), "indices": ("int64", [info["num_edges"]]),
                "halo_ids": ("int64", [info["num_halo"]]), "orig_ids": ("int64", [n]),
                "features": (data["features"]["dtype"], [n, data["features"]["shape"][1]]),
                "labels": (data["labels"]["dtype"], [n, *data["labels"]["shape"][1:]]),
                **{name: ("bool", [num_splits, n]) for name in ("train_masks", "val_masks", "test_masks")},
                **({"edge_features": (manifest["edge_data"]["features"]["dtype"],
                                      [info["num_edges"], manifest["edge_data"]["features"]["shape"][1]])}
                   if "edge_data" in manifest else {})}
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise PartitionError(f"manifest.json: the entries of partition {part} are malformed ({err!r}); re-create "
                             f"the folder with python -m partition ... --force") from None


def open_part_arrays(root: Path, manifest: dict, part: int, *, checksums: bool) -> dict[str, np.ndarray]:
    """Every array of partition ``part`` (read-only memmaps), each checked against the manifest."""
    shapes = expected_shapes(manifest, part)
    arrays = {}
    for name in [*PART_ARRAYS, *(name for name in OPTIONAL_PART_ARRAYS if name in shapes)]:
        rel = part_file(part, name)
        dtype, shape = shapes[name]
        arrays[name] = open_array(root, rel, _record(manifest, rel, dtype, shape), checksum=checksums)
    return arrays


def check_partition(root: Path, manifest: dict, part: int, arrays: dict[str, np.ndarray],
                    orig2new: np.ndarray) -> None:
    """Check partition ``part``'s arrays against each other and the manifest, in one pass over them.

    CSC offsets rise from 0 to the edge count; source, halo and original ids lie in ``[0, N)``;
    labels in ``[0, num_classes)``; ``orig2new`` maps the owned original ids onto the partition's
    range in order.  A folder can pass its checksums and still break these (written by a bug, an
    external tool or a hand edit); training would then crash deep inside or quietly learn garbage.

    Raises:
        PartitionError: the first broken invariant, naming the file, the position and the fix.
    """
    num_nodes, num_classes = manifest["num_nodes"], manifest["num_classes"]
    start = int(manifest["node_ranges"][part][0])

    def refuse(name: str, position: int, problem: str) -> None:
        raise PartitionError(f"{root / part_file(part, name)}: position {position} {problem}; the folder is "
                             f"inconsistent even where its checksums match: re-create it with python -m partition "
                             f"... --force (python -m partition verify {root} checks the whole folder)")

    indptr = np.asarray(arrays["indptr"])
    falls = indptr[1:] < indptr[:-1]
    if indptr[0] != 0 or falls.any() or indptr[-1] != arrays["indices"].shape[0]:
        steps = np.flatnonzero(falls)
        position = 0 if indptr[0] != 0 else int(steps[0]) + 1 if steps.size else indptr.shape[0] - 1
        refuse("indptr", position, f"holds {int(indptr[position])}: CSC offsets must rise from 0 to "
                                   f"{arrays['indices'].shape[0]} (the stored in-edges) without decreasing")
    for name, high in (("indices", num_nodes), ("halo_ids", num_nodes), ("orig_ids", num_nodes),
                       ("labels", num_classes)):
        position = first_outside(arrays[name], 0, high)
        if position is not None:
            refuse(name, position, f"holds {arrays[name][position]}, outside [0, {high})")
    orig = arrays["orig_ids"]
    for lo in range(0, orig.shape[0], _CHECK_CHUNK):
        mapped = np.asarray(orig2new[np.asarray(orig[lo:lo + _CHECK_CHUNK])])
        wrong = np.flatnonzero(mapped != np.arange(start + lo, start + lo + mapped.shape[0]))
        if wrong.size:
            at = lo + int(wrong[0])
            refuse("orig_ids", at, f"is original node {int(orig[at])}, which {ORIG2NEW} maps to {int(mapped[wrong[0]])}"
                                   f" instead of {start + at}: the two id maps do not invert each other")


_CHECK_CHUNK = 1 << 22
"""Elements per chunk of the checks: bounds their memory for any partition size."""


def first_outside(array: np.ndarray, low: int, high: int) -> int | None:
    """Position of the first element of ``array`` outside ``[low, high)``, or None; reads it in chunks."""
    for lo in range(0, array.shape[0], _CHECK_CHUNK):
        chunk = np.ascontiguousarray(array[lo:lo + _CHECK_CHUNK])
        if low == 0 and chunk.dtype.kind == "i":  # one pass: as unsigned, a negative id is above any high
            outside = chunk.size and chunk.view(f"u{chunk.itemsize}").max() >= high
        else:
            outside = chunk.size and (chunk.min() < low or chunk.max() >= high)
        if outside:
            return lo + int(np.flatnonzero((chunk < low) | (chunk >= high))[0])
    return None


def _record(manifest: dict, rel: str, dtype: str, shape: list[int]) -> dict:
    """The manifest's record of file ``rel``, after checking it describes the expected array."""
    record = manifest["files"].get(rel)
    if record is None:
        raise PartitionError(f"manifest.json does not list {rel}; the folder is incomplete: re-create it with "
                             f"python -m partition ... --force")
    if record.get("dtype") != dtype or list(record.get("shape", [])) != list(shape):
        raise PartitionError(f"manifest.json: {rel} is recorded as {record.get('dtype')} {record.get('shape')}, "
                             f"but the partition's counts imply {dtype} {shape}; the manifest is inconsistent")
    return record


def whole_graph_partition(dataset: GraphDataset) -> Partition:
    """The one-part partition of ``dataset``, in memory: what a world of one trains on.

    Identity ids, as ``python -m partition --num-parts 1`` writes them (a stable relabelling of
    one part keeps every id), so a plain run and a run on a 1-part folder see the same graph.
    """
    n = dataset.num_nodes
    ids = np.arange(n, dtype=np.int64)
    book = PartitionBook(offsets=np.array([0, n], dtype=np.int64), orig2new=ids, orig_ids=lambda part: ids)
    return Partition(part=0, book=book, indptr=dataset.indptr, indices=dataset.indices,
                     halo_ids=np.empty(0, dtype=np.int64), orig_ids=ids, features=dataset.features,
                     labels=dataset.labels, edge_features=dataset.edge_features,
                     train_masks=dataset.train_masks, val_masks=dataset.val_masks,
                     test_masks=dataset.test_masks, num_classes=dataset.num_classes, metric=dataset.metric,
                     manifest={"dataset": {"name": dataset.name}})
