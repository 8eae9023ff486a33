"""The partition book: which partition owns a node, and the three id spaces, mapped both ways.

Id spaces: **original** ids (the source dataset's); **new global** ids, partition ``p`` owning
``[offsets[p], offsets[p + 1])`` (every stored edge and halo list uses these); **local** ids,
``new - offsets[p]``, the row of a node in its partition's arrays.

The book itself is small (``offsets``, int64 [K + 1]); ``orig2new`` (int64 [N]) and each
partition's ``orig_ids`` are memory-mapped, a partition's ``orig_ids`` opened only when an id
of it is translated.  Every method is vectorised: it takes an integer array (or scalar) and
returns an int64 array of the same shape.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


class PartitionBook:
    """Maps new global ids to partitions, local ids and original ids, and back."""

    def __init__(self, *, offsets: np.ndarray, orig2new: np.ndarray, orig_ids: Callable[[int], np.ndarray]) -> None:
        """
        Args:
            offsets: int64 [K + 1], non-decreasing from 0 to N: partition ``p`` owns ``[offsets[p], offsets[p + 1])``.
            orig2new: int64 [N], the new global id of each original id (may be a memmap).
            orig_ids: ``orig_ids(p)`` -> int64 [n_p], the original ids of partition ``p``'s
                owned nodes in local order; called at most once per partition, when needed.
        """
        self.offsets = np.asarray(offsets, dtype=np.int64)
        assert self.offsets.ndim == 1 and self.offsets[0] == 0 and np.all(np.diff(self.offsets) >= 0), self.offsets
        self.orig2new = orig2new
        self._open_orig_ids = orig_ids
        self._orig_ids: dict[int, np.ndarray] = {}

    @classmethod
    def from_parts(cls, parts: np.ndarray, num_parts: int) -> tuple[PartitionBook, np.ndarray]:
        """Relabel from ``parts`` (int [N], the partition of each original id): the book, and new2orig
        (int64 [N], the original id of each new global id), both in memory.

        Nodes keep their original relative order inside a partition (a stable sort by
        partition), so locality in the original ids survives the relabelling.
        """
        counts = np.bincount(parts, minlength=num_parts)
        assert counts.shape[0] == num_parts, (counts.shape, num_parts)
        offsets = np.zeros(num_parts + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        # A 16-bit key lets numpy's stable sort use radix sort: linear in N.
        key = parts.astype(np.int16) if num_parts <= np.iinfo(np.int16).max else parts
        new2orig = np.argsort(key, kind="stable").astype(np.int64, copy=False)
        orig2new = np.empty_like(new2orig)
        orig2new[new2orig] = np.arange(new2orig.shape[0], dtype=np.int64)
        return cls(offsets=offsets, orig2new=orig2new,
                   orig_ids=lambda p: new2orig[offsets[p]:offsets[p + 1]]), new2orig

    # ------------------------------------------------------------------ sizes
    @property
    def num_parts(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def num_nodes(self) -> int:
        return int(self.offsets[-1])

    def node_range(self, part: int) -> tuple[int, int]:
        """``(start, end)``: the new global ids partition ``part`` owns."""
        self._check_part(part)
        return int(self.offsets[part]), int(self.offsets[part + 1])

    def num_owned(self, part: int) -> int:
        start, end = self.node_range(part)
        return end - start

    # ------------------------------------------------------------------ id maps
    def partition_of(self, new_ids: np.ndarray | int) -> np.ndarray:
        """int64, same shape: the partition owning each new global id."""
        ids = self._check_ids(new_ids, self.num_nodes, "new global id")
        return np.searchsorted(self.offsets, ids, side="right").astype(np.int64) - 1

    def to_local(self, new_ids: np.ndarray | int, part: int | None = None) -> np.ndarray:
        """int64, same shape: local ids within the owning partition.

        Args:
            part: if given, every id must be owned by this partition (else ``ValueError``).
        """
        ids = self._check_ids(new_ids, self.num_nodes, "new global id")
        if part is None:
            return ids - self.offsets[self.partition_of(ids)]
        start, end = self.node_range(part)
        outside = (ids < start) | (ids >= end)
        if outside.any():
            bad = int(ids[outside].flat[0])
            raise ValueError(f"new global id {bad} is not owned by partition {part}, which owns [{start}, {end}); "
                             f"use partition_of() to find its owner")
        return ids - start

    def to_global(self, part: int | np.ndarray, local_ids: np.ndarray | int) -> np.ndarray:
        """int64: new global ids of ``local_ids`` in partition(s) ``part`` (scalar, or broadcast with the ids)."""
        parts = np.asarray(part)
        if not np.issubdtype(parts.dtype, np.integer) or np.any((parts < 0) | (parts >= self.num_parts)):
            raise ValueError(f"partition {part!r} out of range [0, {self.num_parts})")
        local = np.asarray(local_ids)
        if not np.issubdtype(local.dtype, np.integer):
            raise TypeError(f"local ids must be integers, got dtype {local.dtype}")
        sizes = self.offsets[parts + 1] - self.offsets[parts]
        bad = (local < 0) | (local >= sizes)
        if np.any(bad):
            raise ValueError(f"local id {int(np.broadcast_to(local, bad.shape)[bad].flat[0])} out of range for "
                             f"partition {part!r} (sizes {np.atleast_1d(sizes)[:4].tolist()})")
        return self.offsets[parts] + local.astype(np.int64)

    def to_original(self, new_ids: np.ndarray | int) -> np.ndarray:
        """int64, same shape: the original id of each new global id."""
        ids = self._check_ids(new_ids, self.num_nodes, "new global id")
        parts = self.partition_of(ids)
        out = np.empty(ids.shape, dtype=np.int64)
        for part in np.unique(parts):
            chosen = parts == part
            out[chosen] = self.orig_ids(int(part))[ids[chosen] - self.offsets[part]]
        return out

    def from_original(self, orig_ids: np.ndarray | int) -> np.ndarray:
        """int64, same shape: the new global id of each original id."""
        ids = self._check_ids(orig_ids, self.num_nodes, "original id")
        return np.asarray(self.orig2new[ids], dtype=np.int64)

    def orig_ids(self, part: int) -> np.ndarray:
        """int64 [n_p]: the original ids of partition ``part``'s owned nodes, in local order."""
        self._check_part(part)
        if part not in self._orig_ids:
            self._orig_ids[part] = self._open_orig_ids(part)
        return self._orig_ids[part]

    # ------------------------------------------------------------------ checks
    def _check_part(self, part: int) -> None:
        if isinstance(part, bool) or not isinstance(part, (int, np.integer)) or not 0 <= part < self.num_parts:
            raise ValueError(f"partition {part!r} out of range [0, {self.num_parts})")

    @staticmethod
    def _check_ids(ids: np.ndarray | int, limit: int, what: str) -> np.ndarray:
        array = np.asarray(ids)
        if array.size == 0:  # np.asarray([]) is float64; an empty request is fine
            return array.astype(np.int64)
        if not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"{what}s must be integers, got dtype {array.dtype}")
        array = array.astype(np.int64, copy=False)
        bad = (array < 0) | (array >= limit)
        if bad.any():
            raise ValueError(f"{what} {int(array[bad].flat[0])} is out of range [0, {limit})")
        return array

    def __repr__(self) -> str:
        return f"PartitionBook(num_parts={self.num_parts}, num_nodes={self.num_nodes:,})"
