"""Seed shares by rank capacity (``--rank-capacity``): which seeds of every global step each rank trains.

Without it, rank ``r`` trains its own training nodes, cut into the same number of steps as every
other rank: each rank's share of a step is its partition's share of the training nodes.  With it,
:class:`SeedShares` re-deals every step by capacity (:mod:`gnnscale.distributed.capacity`): given
weights, or ``auto``: calibrated before the first epoch on :data:`MEASURED_STEPS` of each rank's own
steps run alone (no collective, so no peer's pace is in it), then re-balanced after every epoch from
that epoch's real steps: each rank's seeds over its busy seconds, i.e. its training time less the
gradient sum's exposed wait (from the backward's end to the sums' arrival), in which a faster rank waits for a
slower one.  Real steps include what the calibration cannot see (serving the peers' feature
requests, a step's fixed costs), and re-dealing by the last epoch's speeds drives the ranks' busy
times together even where a step's cost is not proportional to its seeds.  A step's
union of seeds is what it is without shares, so the gradient is unchanged; seeds trained away from
their owner need their label (every rank holds the labels of all training nodes) and their
features and neighbours from wherever they are (the replicated topology samples them locally).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from gnnscale.distributed.capacity import share_steps, shares_from_speed
from gnnscale.distributed.comm import Exchanger
from gnnscale.pipeline import epoch_order, split_batches

log = logging.getLogger("gnnscale.train")

MEASURED_STEPS = 3


class SeedShares:
    """Every rank's training nodes, and the shares by which each step's seeds are dealt.

    Args:
        exchanger: the ranks' channel (the training nodes and labels are all-gathered once).
        train_ids: int64, this rank's own training nodes (global ids).
        train_labels: their labels.
        counts: every rank's number of training nodes.
        num_nodes: nodes of the whole graph (the label table's size).
        capacity: ``"auto"`` or one share per rank (summing to 1).
        batch_size, steps, seed: the loader's settings (each rank's own seeds are cut as without shares).
    """

    def __init__(self, exchanger: Exchanger, train_ids: Tensor, train_labels: Tensor, counts: list[int],
                 num_nodes: int, capacity: str | list[float], *, batch_size: int, steps: int, seed: int) -> None:
        self.exchanger, self.rank = exchanger, exchanger.rank
        self.batch_size, self.steps, self.seed = batch_size, steps, seed
        self.own = list(exchanger.all_gather_rows(train_ids).split(counts))
        self.labels = torch.zeros((num_nodes, *train_labels.shape[1:]), dtype=train_labels.dtype)
        self.labels[torch.cat(self.own)] = exchanger.all_gather_rows(train_labels)
        self.auto = capacity == "auto"
        world = exchanger.world_size
        self.shares: list[float] = [1.0 / world] * world if self.auto else list(capacity)

    def seed_probability(self, steps: int) -> np.ndarray:
        """float64 [num_nodes]: each node's chance of being a seed of one of this rank's ``steps`` batches of an
        epoch: ``1 / steps`` for its own seeds, ``1 / (steps * world_size)`` for the other ranks' (only part of
        them come here, and only to a faster rank), so that a cache holding every candidate of the vip policy
        leaves no batch anything to fetch."""
        probability = np.zeros(self.labels.shape[0], dtype=np.float64)
        probability[torch.cat(self.own).numpy()] = 1.0 / (steps * self.exchanger.world_size)
        probability[self.own[self.rank].numpy()] = 1.0 / steps
        return probability

    def plan(self, epoch: int) -> list[Tensor]:
        """This rank's seeds of every step of ``epoch`` (the loader's ``plan``)."""
        own = [split_batches(epoch_order(ids, shuffle=True, seed=self.seed, epoch=epoch), self.batch_size, False,
                             self.steps) for ids in self.own]
        return share_steps(own, self.shares)[self.rank]

    def calibrate(self, run_step: Callable[[Tensor], None]) -> None:
        """``auto``: time :data:`MEASURED_STEPS` of this rank's own steps, ``run_step(seeds)`` (no collective
        in it), after one untimed, and set the first epoch's shares from every rank's seeds per second."""
        if not self.auto:
            return
        batches = split_batches(epoch_order(self.own[self.rank], shuffle=True, seed=self.seed + 1, epoch=0),
                                self.batch_size, False, self.steps)[:MEASURED_STEPS + 1]
        run_step(batches.pop())  # untimed: a first step pays one-off costs (allocations, lazy set-up)
        start = time.perf_counter()
        for seeds in batches:
            run_step(seeds)
        self._set_shares(sum(b.numel() for b in batches), time.perf_counter() - start, "before training")

    def rebalance(self, epoch: int, busy_seconds: float) -> None:
        """``auto``: the next epoch's shares from this rank's seeds of ``epoch`` over ``busy_seconds`` (its
        training time less the exposed gradient-sum wait), and every other rank's.  A collective."""
        if self.auto:
            self._set_shares(sum(b.numel() for b in self.plan(epoch)), busy_seconds, f"after epoch {epoch}")

    def _set_shares(self, seeds: int, seconds: float, when: str) -> None:
        measured = torch.zeros((self.exchanger.world_size, 2), dtype=torch.float64)
        measured[self.rank] = torch.tensor([seeds, seconds], dtype=torch.float64)
        self.exchanger.all_reduce(measured, op=dist.ReduceOp.SUM)
        self.shares = shares_from_speed(measured[:, 0].tolist(), measured[:, 1].tolist())
        log.info("rank capacity %s: seeds per busy second %s -> shares %s", when,
                 [round(n / t) if t > 0 else 0 for n, t in measured.tolist()], [round(x, 3) for x in self.shares])

    def record(self) -> dict[str, Any]:
        return {"shares": [round(s, 4) for s in self.shares]}

