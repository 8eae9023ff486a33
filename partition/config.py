"""What a partitioning run is asked to do: :class:`PartitionConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

METHODS = ("metis", "random")
BALANCE_CONSTRAINTS = ("nodes", "train", "edges")
"""``nodes``: one unit per node; ``train``: one per training node (of split ``split``);
``edges``: a node's stored in-degree, i.e. the edges its partition stores."""


@dataclass(kw_only=True)
class PartitionConfig:
    """How to split a graph into ``num_parts`` partitions."""

    num_parts: int
    """Number of partitions K, in ``[1, num_nodes]`` (checked against the graph when it runs)."""
    method: Literal["metis", "random"] = "metis"
    """``"metis"``: multi-constraint k-way METIS, minimising the edge cut.  ``"random"``: a seeded
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
    (:mod:`partition.rebalance`); off keeps METIS' smaller cut and worse balance.  Not used by ``"random"``."""

    def __post_init__(self) -> None:
        if not isinstance(self.rebalance, bool):
            raise TypeError(f"PartitionConfig.rebalance must be a bool, got {self.rebalance!r}")
        for name in ("num_parts", "halo_hops", "seed", "split", "ufactor", "niter"):
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
