"""Read-only memory-mapped arrays that a pass over them hands back to the page cache as it goes.

A row-by-row pass over a memory-mapped array (checking features for NaNs, copying them into partition
files) makes every page it touches resident in this process: by its end the whole file counts in the
process' RSS, as if it had been read into memory.  :func:`release_rows` drops the pages of rows a pass
is done with from the process (``madvise(MADV_DONTNEED)``); the kernel keeps them in its page cache, so
reading them again costs no disk access, and for a read-only mapping of a file nothing can be lost.
Anything else -- an array in ordinary memory, a writable or copy-on-write map -- is left alone.
"""

from __future__ import annotations

import mmap

import numpy as np

ROW_CHUNK_BYTES = 64 << 20
"""Rows handled at a time by the chunked passes (:func:`row_chunks`): 64 MiB of them."""


def row_chunks(array: np.ndarray) -> range:
    """Start rows of chunks of about :data:`ROW_CHUNK_BYTES` each (at least one row) over ``array``'s rows."""
    row_bytes = max(1, array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64)))
    return range(0, array.shape[0], max(1, ROW_CHUNK_BYTES // row_bytes))


def _read_only_map(array: np.ndarray) -> mmap.mmap | None:
    """The ``mmap`` behind ``array`` when it views a read-only (``mode="r"``) memory map of a file, else None."""
    read_only, base = False, array
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap) and getattr(base, "mode", None) == "r":
            read_only = True
        base = base.base
    return base if read_only and isinstance(base, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED") else None


def release_rows(array: np.ndarray, start: int, stop: int) -> None:
    """Drop rows ``[start, stop)`` of a read-only file-mapped C-contiguous ``array`` from this process'
    resident memory (the whole pages inside them; ``stop`` is clipped to the rows); a no-op for any other array."""
    stop = min(stop, array.shape[0])
    mapped = _read_only_map(array)
    if mapped is None or not array.flags.c_contiguous or stop <= start:
        return
    row_bytes = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    origin = np.frombuffer(mapped, dtype=np.uint8).__array_interface__["data"][0]
    first = array.__array_interface__["data"][0] - origin + start * row_bytes
    last = first + (stop - start) * row_bytes
    page = mmap.PAGESIZE
    first, last = -(-first // page) * page, last // page * page  # whole pages only: neighbours stay mapped
    if last > first:
        mapped.madvise(mmap.MADV_DONTNEED, first, last - first)


def release_map(array: np.ndarray) -> None:
    """Drop every resident page of the read-only file map behind ``array`` from this process (the whole map,
    not only ``array``'s rows); a no-op for any other array, and for a map already closed."""
    mapped = _read_only_map(array) if isinstance(array, np.ndarray) else None
    if mapped is not None:
        try:
            mapped.madvise(mmap.MADV_DONTNEED)
        except (ValueError, OSError):  # a closed map: nothing resident to drop
            pass
