"""``verify``: check a partition folder, alone or against its source dataset; stop at the first problem.

The checks, in order (docs/partitioning.md): the manifest; every file listed, present, of its recorded
size and sha256; the id ranges tile ``[0, N)`` and none is empty; each ``.npy`` header; each partition's invariants as
``load_partition`` checks them (CSC offsets, id and label ranges, ``orig2new`` and ``orig_ids`` inverting
each other); the edge count and the H-hop halos recomputed from the partitions' own edges; where the
manifest records ``part_weights``, the achieved shares counted in the arrays (reported, not judged); with a
dataset, the same in-edges (as multisets, in original ids), features, labels and masks.  Each failure
raises :class:`PartitionError` naming the file and the problem.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np

from gnnscale.data.dataset import GraphDataset
from gnnscale.data.pages import release_map
from partition.format import (MANIFEST, ORIG2NEW, PART_ARRAYS, REPAIR, PartitionError, check_file, part_file,
                              read_manifest)
from partition.halo import expand_halo
from partition.load import check_partition, node_offsets, open_book, open_part_arrays
from partition.segments import gather_segments, node_chunks

_ROW_CHUNK_BYTES = 64 << 20


def _check_files(root: Path, manifest: dict, checksums: bool) -> int:
    """Every file a folder of its parts holds is listed, present and of the recorded size (and sha256); how many."""
    num_parts = manifest["num_parts"]
    arrays = [*PART_ARRAYS, *(["edge_features"] if "edge_data" in manifest else [])]
    needed = [ORIG2NEW] + [part_file(p, name) for p in range(num_parts) for name in arrays]
    for rel in needed:
        if rel not in manifest["files"]:
            raise PartitionError(f"{root / 'manifest.json'}: does not list {rel}, which a folder of {num_parts} "
                                 f"partition(s) holds; {REPAIR}")
        check_file(root, rel, manifest["files"][rel], checksum=checksums)
    return len(needed)


def verify(root: str | Path, dataset: GraphDataset | None = None, *, checksums: bool = True,
           log: Callable[[str], None] | None = None) -> dict:
    """Check the partition folder ``root``; raise at the first problem.

    Args:
        root: the folder written by ``python -m partition``.
        dataset: the source dataset to compare edges, features, labels and masks with.
        checksums: also hash every file (reads all of them once).
        log: called with one line per passed group of checks.

    Returns:
        A summary: ``num_parts``, ``num_nodes``, ``num_edges``, ``checksums``, ``dataset`` and ``checks``.

    Raises:
        FileNotFoundError: the folder, its manifest or a file is missing.
        PartitionError: any other failed check.
    """
    root = Path(root)
    say = log or (lambda line: None)
    checks: list[str] = []

    def passed(line: str) -> None:
        checks.append(line)
        say(line)

    manifest = read_manifest(root)
    num_parts, num_nodes = manifest["num_parts"], manifest["num_nodes"]
    needed = _check_files(root, manifest, checksums)
    passed(f"files: {needed} present with the recorded sizes" + (" and sha256" if checksums else ""))

    offsets = node_offsets(manifest)
    _check_none_empty(root, manifest, offsets)
    passed(f"id ranges: {num_parts} contiguous non-empty ranges tile [0, {num_nodes})")
    book = open_book(root, manifest, checksums=False)
    parts = [open_part_arrays(root, manifest, p, checksums=False) for p in range(num_parts)]
    passed("arrays: every .npy header matches the manifest's dtype and shape")

    for p in range(num_parts):
        check_partition(root, manifest, p, parts[p], book.orig2new)
        _release(parts[p])  # read once: a folder larger than memory is checked a part at a time
    # orig2new is a function, so ranks whose orig_ids it maps onto their disjoint ranges own distinct nodes.
    new2orig = np.concatenate([np.asarray(arrays["orig_ids"]) for arrays in parts])
    passed("ownership: every original node is owned exactly once; orig2new and orig_ids invert each other")

    _check_structure(manifest, parts, offsets)
    passed(f"structure: CSC offsets, source ids, edge count {manifest['num_edges']:,}, labels and "
           f"{manifest['halo_hops']}-hop halos are consistent")
    shares = _check_shares(root, manifest, parts, offsets, passed)

    if dataset is not None:
        _compare_with_dataset(manifest, parts, offsets, new2orig, dataset)
        passed(f"dataset {dataset.name}: every edge stored exactly once as an owned in-edge; features, labels "
               f"and masks equal")
    return {"num_parts": num_parts, "num_nodes": num_nodes, "num_edges": manifest["num_edges"], "shares": shares,
            "checksums": checksums, "dataset": None if dataset is None else dataset.name, "checks": checks}


def _release(arrays: dict) -> None:
    """Hand a part's memory-mapped pages back to the page cache (they leave this process's RSS)."""
    for array in arrays.values():
        release_map(array)


def _check_none_empty(root: Path, manifest: dict, offsets: np.ndarray) -> None:
    """Refuse a partition of no nodes (``offsets``: int64 [K + 1]): ``partition`` refuses to write one, but
    folders written before it did, or by other tools, can hold one."""
    empty = np.flatnonzero(np.diff(offsets) == 0).tolist()
    if empty:
        raise PartitionError(f"{root / MANIFEST}: partition(s) {empty} own no nodes (node_ranges "
                             f"{[manifest['node_ranges'][p] for p in empty]}), so their ranks would have nothing to "
                             f"train on; re-partition with fewer --num-parts or larger --part-weights for them")


def format_shares(shares: dict[str, list[float]]) -> str:
    """``requested 0.333/0.667, nodes 0.334/0.666, ...``: requested and achieved shares, one list per name."""
    return ", ".join(f"{name} " + "/".join(f"{share:.3f}" for share in values) for name, values in shares.items())


def _check_shares(root: Path, manifest: dict, parts: list[dict], offsets: np.ndarray,
                  passed: Callable[[str], None]) -> dict[str, list[float]] | None:
    """The requested shares (``partitioning.part_weights``, an optional field) and the achieved shares of owned
    nodes, training nodes and stored in-edges, counted in the arrays; None for a folder of equal shares."""
    partitioning = manifest.get("partitioning") or {}
    requested, split = partitioning.get("part_weights"), partitioning.get("split", 0)
    if requested is None:
        return None
    num_parts = manifest["num_parts"]
    if not (isinstance(requested, list) and len(requested) == num_parts
            and all(type(w) in (int, float) and math.isfinite(w) and w > 0 for w in requested)
            and abs(math.fsum(requested) - 1) < 1e-6):
        raise PartitionError(f"{root / MANIFEST}: partitioning.part_weights {requested!r} is not a list of "
                             f"{num_parts} positive shares summing to 1; {REPAIR}")
    if type(split) is not int or not 0 <= split < manifest["num_splits"]:
        raise PartitionError(f"{root / MANIFEST}: partitioning.split {split!r} is not one of the "
                             f"{manifest['num_splits']} split(s) in the folder; {REPAIR}")
    counts = {"nodes": np.diff(offsets), "train": [int(np.count_nonzero(a["train_masks"][split])) for a in parts],
              "edges": [a["indices"].shape[0] for a in parts]}
    shares = {"requested": [float(w) for w in requested]}
    for name, values in counts.items():
        total = sum(int(v) for v in values)
        shares[name] = [int(v) / total if total else float(w) for v, w in zip(values, requested)]
    passed(f"shares: {format_shares(shares)} (requested, then achieved: owned nodes, training nodes of split "
           f"{split}, stored in-edges)")
    return shares


def _check_structure(manifest: dict, parts: list[dict], offsets: np.ndarray) -> None:
    num_nodes, hops = manifest["num_nodes"], manifest["halo_hops"]

    def in_neighbors(new_ids: np.ndarray) -> np.ndarray:
        owners = np.searchsorted(offsets, new_ids, side="right") - 1
        found = [gather_segments(parts[q]["indptr"], parts[q]["indices"], new_ids[owners == q] - offsets[q])
                 for q in np.unique(owners)]
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    total = 0
    for p, arrays in enumerate(parts):
        start, end = int(offsets[p]), int(offsets[p + 1])
        indptr, indices = np.asarray(arrays["indptr"]), arrays["indices"]
        outside = []
        for lo, hi in node_chunks(indptr):
            sources = np.asarray(indices[indptr[lo]:indptr[hi]])
            outside.append(np.unique(sources[(sources < start) | (sources >= end)]))
        total += indices.shape[0]
        halo = np.asarray(arrays["halo_ids"])
        first_hop = np.unique(np.concatenate(outside)) if outside else np.zeros(0, dtype=np.int64)
        expected = np.zeros(0, dtype=np.int64) if hops == 0 else \
            expand_halo(first_hop, (start, end), hops, num_nodes, in_neighbors)
        if not np.array_equal(halo, expected):
            raise PartitionError(f"{part_file(p, 'halo_ids')}: holds {halo.shape[0]} ids, but the {hops}-hop "
                                 f"in-neighbourhood of the owned nodes outside them has {expected.shape[0]} "
                                 f"(sorted, unique, new global ids expected)")
        _release(arrays)
    if total != manifest["num_edges"]:
        raise PartitionError(f"the partitions store {total:,} in-edges in all, manifest.json says "
                             f"{manifest['num_edges']:,}")


def _compare_with_dataset(manifest: dict, parts: list[dict], offsets: np.ndarray, new2orig: np.ndarray,
                          dataset: GraphDataset) -> None:
    facts = {"num_nodes": dataset.num_nodes, "num_edges": dataset.num_edges, "num_classes": dataset.num_classes,
             "num_splits": dataset.num_splits}
    for key, value in facts.items():
        if manifest[key] != value:
            raise PartitionError(f"dataset {dataset.name} has {key}={value}, the partition folder "
                                 f"{manifest[key]}: it was made from another dataset")
    if list(manifest["node_data"]["features"]["shape"]) != list(dataset.features.shape):
        raise PartitionError(f"dataset {dataset.name} has features {list(dataset.features.shape)}, the partition "
                             f"folder {manifest['node_data']['features']['shape']}")
    num_nodes = dataset.num_nodes
    degrees = dataset.in_degrees()
    row_bytes = max(1, dataset.features.dtype.itemsize * dataset.num_features)
    for p, arrays in enumerate(parts):
        orig = np.asarray(arrays["orig_ids"])
        indptr, indices = np.asarray(arrays["indptr"]), arrays["indices"]
        stored_degrees = np.diff(indptr)
        if not np.array_equal(stored_degrees, degrees[orig]):
            local = int(np.flatnonzero(stored_degrees != degrees[orig])[0])
            raise PartitionError(f"{part_file(p, 'indptr')}: original node {int(orig[local])} has "
                                 f"{int(stored_degrees[local])} stored in-edges, the dataset "
                                 f"{int(degrees[orig[local]])}")
        for lo, hi in node_chunks(indptr):
            stored = new2orig[np.asarray(indices[indptr[lo]:indptr[hi]])]
            expected = gather_segments(dataset.indptr, dataset.indices, orig[lo:hi])
            if np.array_equal(stored, expected):
                continue  # same order as the source: the common case, no sort needed
            # Otherwise compare per destination as multisets: sort by (local destination, source).
            rows = np.repeat(np.arange(hi - lo, dtype=np.int64), stored_degrees[lo:hi]) * num_nodes
            stored_keys, expected_keys = np.sort(rows + stored), np.sort(rows + expected)
            if not np.array_equal(stored_keys, expected_keys):
                local = lo + int((stored_keys[stored_keys != expected_keys][0]) // num_nodes)
                raise PartitionError(f"{part_file(p, 'indices')}: the in-edges of original node {int(orig[local])} "
                                     f"differ from the dataset's")
        chunk = max(1, _ROW_CHUNK_BYTES // row_bytes)
        for lo in range(0, orig.shape[0], chunk):
            if not np.array_equal(arrays["features"][lo:lo + chunk], dataset.features[orig[lo:lo + chunk]]):
                raise PartitionError(f"{part_file(p, 'features')}: rows {lo}..{min(lo + chunk, orig.shape[0]) - 1} "
                                     f"differ from the dataset's features of their original nodes")
        for name in ("labels", "train_masks", "val_masks", "test_masks"):
            expected_rows = dataset.labels[orig] if name == "labels" else getattr(dataset, name)[:, orig]
            if not np.array_equal(arrays[name], expected_rows):
                raise PartitionError(f"{part_file(p, name)}: differs from the dataset's {name.rstrip('s')} of "
                                     f"the owned nodes")
