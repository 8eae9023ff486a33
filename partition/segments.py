"""Vectorised helpers over CSR/CSC segments (a row's slice ``values[indptr[r]:indptr[r + 1]]``)."""

from __future__ import annotations

import numpy as np

CHUNK_EDGES = 1 << 23
"""Edges per vectorised step: bounds the temporaries of a step to a few hundred MiB."""


def gather_segments(indptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenate ``values[indptr[r]:indptr[r + 1]]`` for every ``r`` in ``rows``, vectorised.

    ``indptr`` is int64 [R + 1], ``values`` [M] of any dtype (may be a memmap), ``rows`` int [n] in any
    order, repeats allowed; the result holds the segments one after another, in ``rows`` order.
    """
    rows = np.asarray(rows, dtype=np.int64)
    starts = np.asarray(indptr[rows], dtype=np.int64)
    counts = np.asarray(indptr[rows + 1], dtype=np.int64) - starts
    ends = np.cumsum(counts)
    # Position of each output element: its segment's start, plus its rank within the segment.
    positions = np.repeat(starts - (ends - counts), counts)
    positions += np.arange(positions.shape[0], dtype=np.int64)
    return np.asarray(values[positions])


def node_chunks(indptr: np.ndarray, max_edges: int = CHUNK_EDGES) -> list[tuple[int, int]]:
    """Consecutive row ranges ``[lo, hi)`` of ``indptr`` (int64 [R + 1]) with about ``max_edges`` edges
    each (at least one row each)."""
    num_rows = indptr.shape[0] - 1
    marks = np.arange(max_edges, int(indptr[-1]), max_edges, dtype=np.int64)
    bounds = np.searchsorted(indptr, marks, side="right") - 1
    cuts = np.unique(np.concatenate([[0], bounds, [num_rows]]).astype(np.int64))
    return [(int(lo), int(hi)) for lo, hi in zip(cuts[:-1], cuts[1:])]
