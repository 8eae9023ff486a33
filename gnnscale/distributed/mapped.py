"""Features out of core: a feature table whose owned rows stay in their partition file's memory map.

When a rank's owned feature rows do not fit its memory budget (:mod:`gnnscale.budget`), the graph keeps them
where ``load_partition`` mapped them (``features.npy``, read-only) instead of copying them into memory.
Every read of owned rows -- a batch's input rows, the rows this rank serves to other ranks, evaluation's
rows -- goes through :meth:`MappedTable.read_owned`:

* rows of a small **hot cache** (the owned nodes with most in-edges: those a sample draws most often) are
  read from memory;
* the rest are read from the map **in ascending row order** (one forward sweep over the file, page-cache
  friendly), then put back in the caller's order.

The pages a read faults in are this process's resident memory until it drops them: after every
``release_mb`` MiB read they are released (``MADV_DONTNEED``), so the table's share of the RSS stays about
``release_mb`` whatever the table's size; the pages stay in the kernel's page cache, where the next read
finds them without touching the disk as long as the machine has memory to spare.
"""

from __future__ import annotations

import logging
import mmap
import threading
import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from gnnscale.batch import MiniBatch
from gnnscale.distributed.comm import Exchanger
from gnnscale.distributed.feature_store import DistTable
from gnnscale.memory import release_pages
from gnnscale.pipeline.native import gather_rows

log = logging.getLogger("gnnscale.distributed")

PAGE_BYTES = mmap.PAGESIZE


def mapped_tensor(array: np.ndarray) -> Tensor:
    """A tensor over the read-only memory map ``array`` (no copy; torch's warning about a non-writable array is
    silenced: nothing writes to it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


class MappedTable(DistTable):
    """A :class:`DistTable` whose owned rows are a read-only memory map.

    Args:
        mapped: [num_owned, ...] the owned rows, memory-mapped (``np.load(mmap_mode="r")``).
        offsets, exchanger, wire_dtype: as :class:`DistTable`.
        hot: int64 local ids in order of preference (e.g. by descending in-degree); the first ``hot_rows`` are
            copied into memory and read from there.
        hot_rows: rows of the hot cache (0: none).
        release_mb: MiB read from the map after which its pages leave this process's RSS.
    """

    def __init__(self, mapped: np.ndarray, offsets: Tensor, exchanger: Exchanger, *, wire_dtype: str = "float32",
                 hot: Tensor | None = None, hot_rows: int = 0, release_mb: float = 64.0) -> None:
        super().__init__(mapped_tensor(mapped), offsets, exchanger, wire_dtype=wire_dtype)
        self.mapped_rows = mapped
        self.mapped = True
        num_owned = self.rows.shape[0]
        hot_ids = torch.empty(0, dtype=torch.int64) if hot is None or hot_rows <= 0 else \
            torch.sort(torch.as_tensor(hot, dtype=torch.int64)[:hot_rows]).values
        self.hot_slot = torch.full((num_owned,), -1, dtype=torch.int32)
        self.hot_slot[hot_ids] = torch.arange(hot_ids.numel(), dtype=torch.int32)
        self.hot = self.rows.index_select(0, hot_ids)
        """The hot cache's rows, resident, in ascending local id order."""
        self.release_bytes = int(release_mb * 2**20)
        self._row_bytes = max(1, self.rows[:1].numel() * self.rows.element_size())
        self.hot_reads = 0
        self.mapped_reads = 0
        self._unreleased = 0
        self._lock = threading.Lock()
        release_pages(mapped)  # the hot cache's copy read them

    def read_owned(self, local: Tensor, out: Tensor | None = None) -> Tensor:
        """Owned rows by local id: hot ones from memory, the rest from the map in ascending order."""
        local = torch.as_tensor(local, dtype=torch.int64)
        if out is None:
            out = self.rows.new_empty((local.numel(), *self.row_shape))
        slot = self.hot_slot.index_select(0, local)
        is_hot = slot >= 0
        hot_pos = torch.nonzero(is_hot).squeeze(1)
        if hot_pos.numel():
            out.index_copy_(0, hot_pos, self.hot.index_select(0, slot.index_select(0, hot_pos).long()))
        cold_pos = torch.nonzero(~is_hot).squeeze(1)
        if cold_pos.numel():
            ids, order = torch.sort(local.index_select(0, cold_pos))
            rows = gather_rows(self.rows, ids, self.rows.new_empty((ids.numel(), *self.row_shape)))
            out.index_copy_(0, cold_pos.index_select(0, order), rows)
            # The pages these rows lie on (ids are sorted: neighbours share pages).
            pages = torch.unique_consecutive(ids * self._row_bytes // PAGE_BYTES).numel()
        self._after_read(hot_pos.numel(), cold_pos.numel(), pages if cold_pos.numel() else 0)
        return out

    def _after_read(self, hot: int, cold: int, pages: int) -> None:
        # A row read faults in its whole page: count pages (an upper bound: successive reads share pages).
        with self._lock:
            self.hot_reads += hot
            self.mapped_reads += cold
            self._unreleased += pages * max(PAGE_BYTES, self._row_bytes)
            release = self._unreleased >= self.release_bytes
            if release:
                self._unreleased = 0
        if release:
            release_pages(self.mapped_rows)

    def gather_batch(self, batch: MiniBatch, out: Callable[[int, Tensor], Tensor]) -> tuple[MiniBatch, Tensor]:
        """The input rows of ``batch`` in its own order; a world of one reads them here (sorted, hot cache
        first), several ranks as any table (:meth:`DistTable.gather_batch`, owned rows through
        :meth:`read_owned`)."""
        if self.world_size > 1:
            return super().gather_batch(batch, out)
        ids = batch.input_ids
        x = out(ids.numel(), self.rows)
        self.read_owned(ids - self.start, out=x)
        self.stats.local_rows += ids.numel()
        return batch, x

    def _where_map(self) -> Tensor | None:
        # The id map joins owned and cached rows in one resident table: that would copy the map into memory.
        return None

    @property
    def hot_bytes(self) -> int:
        return int(self.hot.numel() * self.hot.element_size())


def hot_order(degree: Tensor) -> Tensor:
    """Local ids by descending in-degree (ties: smaller id first): the hot cache's preference."""
    return torch.sort(-degree.to(torch.int64), stable=True).indices
