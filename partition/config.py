"""What a partitioning run is asked to do: :class:`PartitionConfig`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Literal

METHODS = ("metis", "kaminpar", "random")
BALANCE_CONSTRAINTS = ("nodes", "train", "edges")
"""``nodes``: one unit per node; ``train``: one per training node (of split ``split``);
``edges``: a node's stored in-degree, i.e. the edges its partition stores."""


@dataclass(kw_only=True)
class PartitionConfig:
    """How to split a graph into ``num_parts`` partitions."""

    num_parts: int
    """Number of partitions K, in ``[1, num_nodes]`` (checked against the graph when it runs)."""
    method: Literal["metis", "kaminpar", "random"] = "metis"
    """``"metis"``: multi-constraint k-way METIS, minimising the edge cut.  ``"kaminpar"``: KaMinPar
    (the optional ``kaminpar`` package, ``gnnscale[kaminpar]``), minimising the edge cut with one
    combined node weight in far less memory, then the same rebalance pass.  ``"random"``: a seeded
    random assignment with exactly balanced node counts (train and edge counts balance only
    statistically); a baseline, and a fallback for graphs METIS cannot take."""
    balance: tuple[str, ...] = BALANCE_CONSTRAINTS
    """METIS balance constraints, one vertex-weight column each, a subset of
    :data:`BALANCE_CONSTRAINTS`.  Not used by ``"random"`` (which logs so)."""
    halo_hops: int = 1
    """H >= 0: each partition lists the non-owned nodes within H hops of its owned nodes,
    following in-edges (H = 1: the sources of its owned nodes' in-edges)."""
    seed: int = 0
    """Seed of METIS' randomised coarsening, or of the random assignment; >= 0."""
    split: int = 0
    """Which split's training mask the ``"train"`` constraint balances; >= 0."""
    ufactor: int = 30
    """METIS' load imbalance tolerance in thousandths: every constraint's largest part is
    at most ``1 + ufactor / 1000`` times its mean (30, METIS' k-way default, is 1.03);
    in [1, 1000]."""
    niter: int = 4
    """METIS refinement iterations per level (METIS' default: 10).  On the 1M-node benchmark
    graph 4 gives the same cut as 10, about 5% faster; >= 1."""
    rebalance: bool = True
    """Move nodes after METIS until every constraint is within ``1 + ufactor/1000`` of its mean
    (:mod:`partition.rebalance`); with ``part_weights``, within ``1 -/+ ufactor/1000`` of each partition's
    share.  Off keeps METIS' smaller cut and worse balance.  Not used by ``"random"``."""
    kaminpar_threads: int = 1
    """Threads KaMinPar uses (``"kaminpar"`` only); >= 1.  With one thread a seed gives one partition;
    with more, KaMinPar's result may differ from run to run."""
    kaminpar_context: str = "default"
    """KaMinPar's preset (``"kaminpar"`` only): ``default``, ``fast``, ``strong``, ``terapart`` (the graph
    compressed in memory: least memory), ... (all of ``kaminpar.context_names()``)."""
    part_weights: tuple[float, ...] | None = None
    """Relative size of each partition, one positive finite number per partition (e.g. ``(1, 2)``:
    partition 1 gets twice the nodes, training nodes and edges of partition 0, for a rank twice
    as fast), or a comma-separated string of them (``--part-weights``); stored normalised to sum 1.
    ``None``: equal shares.  Every balance constraint, and ``"random"``'s node counts, target
    these shares; the tolerance applies to each partition's own target.  Each partition's share of the
    training nodes (of nodes, where ``split`` has none) must reach at least one (:func:`check_minimum_shares`)."""
    weights_given: tuple[str, ...] | None = field(default=None, init=False, repr=False, compare=False)
    """``part_weights`` as the user wrote them, one string per partition (set from ``part_weights``): errors
    quote them and suggest a corrected list in the same units."""

    def __post_init__(self) -> None:
        if not isinstance(self.rebalance, bool):
            raise TypeError(f"PartitionConfig.rebalance must be a bool, got {self.rebalance!r}")
        for name in ("num_parts", "halo_hops", "seed", "split", "ufactor", "niter", "kaminpar_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"PartitionConfig.{name} must be an int, got {value!r} ({type(value).__name__})")
        if self.num_parts < 1:
            raise ValueError(f"num_parts must be >= 1, got {self.num_parts}; pass --num-parts 1 or more")
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; use one of {', '.join(METHODS)}")
        if isinstance(self.balance, str):
            self.balance = tuple(part.strip() for part in self.balance.split(",") if part.strip())
        self.balance = tuple(self.balance)
        unknown = [name for name in self.balance if name not in BALANCE_CONSTRAINTS]
        if unknown or not self.balance:
            raise ValueError(f"balance constraints {list(self.balance)} are invalid: expected a non-empty subset of "
                             f"{', '.join(BALANCE_CONSTRAINTS)}; e.g. --balance nodes,train,edges")
        if len(set(self.balance)) != len(self.balance):
            raise ValueError(f"balance constraints {list(self.balance)} repeat a name; list each at most once")
        if self.halo_hops < 0:
            raise ValueError(f"halo_hops must be >= 0, got {self.halo_hops}; 1 lists the direct in-neighbours")
        for name in ("seed", "split"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 1 <= self.ufactor <= 1000:
            raise ValueError(f"ufactor must be in [1, 1000] (thousandths of imbalance), got {self.ufactor}")
        if self.niter < 1:
            raise ValueError(f"niter must be >= 1, got {self.niter}")
        if self.kaminpar_threads < 1:
            raise ValueError(f"--kaminpar-threads must be >= 1, got {self.kaminpar_threads}")
        if self.method == "kaminpar":  # before a load that may take minutes: installed, and a known context
            from partition.kaminpar_parts import check_context  # noqa: PLC0415 - imports the optional package

            check_context(self.kaminpar_context)
        if self.part_weights is not None:
            text = weights_text(self.part_weights)  # once: a generator can be read only once
            self.part_weights = normalised_weights(text, self.num_parts)
            self.weights_given = tuple(item.strip() for item in text.split(","))


def weights_text(weights: str | Iterable[float]) -> str:
    """``weights`` as a comma-separated string (numbers as ``str`` writes them).

    Raises:
        TypeError: neither a string nor an iterable.
    """
    try:
        return weights if isinstance(weights, str) else ",".join(map(str, weights))
    except TypeError:
        raise TypeError(f"PartitionConfig.part_weights must be a comma-separated string or a sequence of numbers, "
                        f"got {weights!r} ({type(weights).__name__})") from None


def normalised_weights(weights: str | Iterable[float], num_parts: int) -> tuple[float, ...]:
    """``weights`` (``"1,2"`` or numbers) checked and scaled to sum 1.

    Raises:
        TypeError: neither a string nor an iterable.
        ValueError: not numbers, not ``num_parts`` of them, or one that is not positive and finite.
    """
    text = weights_text(weights)
    example = "e.g. --part-weights " + ",".join(["1"] * (num_parts - 1) + ["2"] if num_parts > 1 else ["1"])
    try:
        values = [float(item) for item in text.split(",")]
    except ValueError:
        raise ValueError(f"--part-weights {text!r} is not a comma-separated list of numbers; give one relative "
                         f"size per partition, {example}") from None
    if len(values) != num_parts:
        raise ValueError(f"--part-weights {text!r} gives {len(values)} weight(s) for --num-parts {num_parts}; give "
                         f"exactly one per partition, {example}")
    bad = [i for i, value in enumerate(values) if not (math.isfinite(value) and value > 0)]
    if bad:
        raise ValueError(f"--part-weights {text!r}: the weight of partition {bad[0]} is {values[bad[0]]}, but every "
                         f"weight must be a positive finite number (a rank's relative speed), {example}")
    largest = max(values)  # scaled first, so that weights near the float maximum do not overflow the sum
    total = math.fsum(value / largest for value in values)
    return tuple(value / largest / total for value in values)
