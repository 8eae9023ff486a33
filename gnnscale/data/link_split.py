"""Random train/val/test split of an undirected graph's edges for link prediction.

The semantics of PyG's ``RandomLinkSplit(num_val, num_test, is_undirected=True,
add_negative_train_samples=False)``, which its link-prediction example uses with 5% / 10%:

* every undirected edge ``{u, v}`` is drawn once, into exactly one of train, val and test
  (``floor(num_val * E)`` and ``floor(num_test * E)`` of the ``E`` undirected edges);
* message passing (the graph a model reads) is the train edges at train and val time, and the
  train + val edges at test time, both directions of each;
* val and test get fixed negatives, as many as their positives, drawn once among the node pairs
  ``u != v`` that are no edge of the whole graph; training negatives are drawn per batch by the loader.

Positives are listed once each (``u < v``); message-passing graphs hold both directions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnscale.data.dataset import csc_from_edges


@dataclass(kw_only=True)
class LinkSplit:
    """The edges of one split; every array int64 [2, k] of ``(src, dst)`` global ids."""

    num_nodes: int
    train_pos: np.ndarray
    """Training positives, one direction each (``src < dst``)."""
    val_pos: np.ndarray
    val_neg: np.ndarray
    test_pos: np.ndarray
    test_neg: np.ndarray

    def message_edges(self, stage: str) -> np.ndarray:
        """int64 [2, k] the directed edges messages flow on at ``stage`` (``"train"``, ``"val"`` or ``"test"``):
        the train edges, plus the val edges at test time, in both directions."""
        if stage not in ("train", "val", "test"):
            raise ValueError(f"stage must be 'train', 'val' or 'test', got {stage!r}")
        once = self.train_pos if stage != "test" else np.concatenate([self.train_pos, self.val_pos], axis=1)
        return np.concatenate([once, once[::-1]], axis=1)

    def held_out(self, stage: str) -> np.ndarray:
        """int64 [2, k] the directed edges that do *not* pass messages at ``stage``: val and test edges at
        train and val time, test edges at test time, both directions of each."""
        self.message_edges(stage)  # checks the stage
        once = self.test_pos if stage == "test" else np.concatenate([self.val_pos, self.test_pos], axis=1)
        return np.concatenate([once, once[::-1]], axis=1)

    def message_graph(self, stage: str) -> tuple[np.ndarray, np.ndarray]:
        """The CSC ``(indptr, indices)`` of :meth:`message_edges` over all ``num_nodes`` nodes."""
        edges = self.message_edges(stage)
        return csc_from_edges(edges[0], edges[1], self.num_nodes)


def undirected_pairs(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """int64 [2, k] the distinct undirected edges ``{u, v}`` (``u < v``, self-loops dropped), sorted."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    low, high = np.minimum(src, dst), np.maximum(src, dst)
    keep = low != high
    span = int(high.max()) + 1 if high.size else 1
    keys = np.unique(low[keep] * span + high[keep])
    return np.stack([keys // span, keys % span])


def random_link_split(src: np.ndarray, dst: np.ndarray, num_nodes: int, *, num_val: float = 0.05,
                      num_test: float = 0.1, seed: int = 0) -> LinkSplit:
    """Split the undirected edges ``(src, dst)`` (int [E], either or both directions listed) at random.

    Args:
        num_val, num_test: fractions of the undirected edges held out (PyG's example: 0.05, 0.1).
        seed: the split and its negatives are a function of (edges, fractions, seed) alone.

    Raises:
        ValueError: a fraction is outside ``[0, 1)``, they leave no training edge, or the graph is too
            dense for the negatives to be drawn.
    """
    for name, value in (("num_val", num_val), ("num_test", num_test)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1), got {value}")
    pairs = undirected_pairs(src, dst)
    total = pairs.shape[1]
    n_val, n_test = int(num_val * total), int(num_test * total)
    if total - n_val - n_test < 1:
        raise ValueError(f"num_val={num_val} and num_test={num_test} leave no training edge of {total}; "
                         f"lower them")
    if pairs.size and pairs.max() >= num_nodes:
        raise ValueError(f"edges name node {int(pairs.max())} but num_nodes is {num_nodes}")
    rng = np.random.default_rng(seed)
    shuffled = pairs[:, rng.permutation(total)]
    negatives = sample_non_edges(pairs, num_nodes, n_val + n_test, rng)
    return LinkSplit(num_nodes=num_nodes, val_pos=shuffled[:, :n_val], test_pos=shuffled[:, n_val:n_val + n_test],
                     train_pos=shuffled[:, n_val + n_test:], val_neg=negatives[:, :n_val],
                     test_neg=negatives[:, n_val:])


def sample_non_edges(pairs: np.ndarray, num_nodes: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """int64 [2, count] distinct ordered pairs ``u != v`` such that ``{u, v}`` is none of the undirected ``pairs``."""
    population = num_nodes * (num_nodes - 1)
    if count > population - 2 * pairs.shape[1]:
        raise ValueError(f"cannot draw {count} negative pairs: the graph has too few non-edges")
    edge_keys = np.concatenate([pairs[0] * num_nodes + pairs[1], pairs[1] * num_nodes + pairs[0]])
    chosen = np.empty(0, dtype=np.int64)
    while chosen.size < count:
        # Draw in rounds with headroom: on a sparse graph nearly every draw is a non-edge.
        draw = rng.integers(0, num_nodes, (2, 2 * (count - chosen.size) + 16), dtype=np.int64)
        keys = draw[0] * num_nodes + draw[1]
        keys = keys[(draw[0] != draw[1]) & ~np.isin(keys, edge_keys)]
        # Keep first occurrences in draw order (np.unique sorts), so the result depends on the seed only.
        merged = np.concatenate([chosen, keys])
        _, first = np.unique(merged, return_index=True)
        chosen = merged[np.sort(first)]
    chosen = chosen[:count]
    return np.stack([chosen // num_nodes, chosen % num_nodes])
