"""Halo nodes: the non-owned nodes within H hops of a partition's owned nodes, following in-edges.

A GNN layer at node ``v`` reads its in-neighbours, so an H-layer model on owned nodes reads
the H-hop in-neighbourhood: exactly the halo.  The same search serves the writer (over the
source CSC) and ``verify`` (over the partition files), through an ``in_neighbors`` function.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def expand_halo(first_hop: np.ndarray, owned: tuple[int, int], hops: int, num_nodes: int,
                in_neighbors: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The halo of the owned range ``(start, end)`` after ``hops`` >= 1 hops: int64 [h], sorted unique
    new global ids outside ``owned``.

    Args:
        first_hop: int64, sorted unique: the non-owned sources of the owned nodes' in-edges
            (the halo for one hop), in new global ids.
        num_nodes: N, for the visited mask (N bytes).
        in_neighbors: maps int64 new global ids to the new global ids of their in-neighbours
            (any order, repeats allowed).
    """
    assert hops >= 1
    if hops == 1:
        return first_hop
    visited = np.zeros(num_nodes, dtype=bool)
    visited[owned[0]:owned[1]] = True
    visited[first_hop] = True
    frontier = first_hop
    for _ in range(hops - 1):
        if frontier.size == 0:
            break
        reached = in_neighbors(frontier)
        frontier = np.unique(reached[~visited[reached]])
        visited[frontier] = True
    visited[owned[0]:owned[1]] = False
    return np.flatnonzero(visited).astype(np.int64)
