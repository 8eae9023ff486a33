"""The fit loop shared by every trainer: epochs, best-model keeping, patience, resumable state.

A trainer supplies one function that trains (and, when due, validates) one epoch and returns
its record, and one that snapshots the model; :func:`fit` keeps the epoch whose record scores
best under ``score_key``, stops after ``patience`` evaluations without a better score, and
hands its :class:`FitState` to ``after_epoch`` (a checkpoint) after every epoch.  A resumed
run passes the state it saved and continues as the uninterrupted run would have.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

log = logging.getLogger("gnnscale.train")


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The torch seed of ``rank`` in ``epoch``: independent streams, reproducible after a resume."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Inside, torch's global generators (the CPU's, and ``device``'s where it is a GPU) draw from ``seed``
    (dropout has no generator argument); on leaving, the caller's states are back, whatever happened."""
    gpus = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpus):
        torch.random.default_generator.manual_seed(seed)
        for index in gpus:  # only this device's: torch.manual_seed would reseed every GPU's, unrestored
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield


@dataclass(kw_only=True)
class FitState:
    """Where a fit stands; plain containers only, so it checkpoints with ``weights_only`` loading."""

    epoch: int = 0
    """The last finished epoch (0 before the first)."""
    best: dict[str, Any] = field(default_factory=dict)
    """The record of the best epoch so far (empty before the first evaluation)."""
    best_state: Any = None
    """The trainer's snapshot of the model at the best epoch."""
    since_best: int = 0
    """Evaluations since the best one."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Every epoch's record."""
    stopped: bool = False
    """Patience ran out."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit(state: FitState, *, epochs: int, patience: int, score_key: str, train_epoch: Callable[[int], dict],
        snapshot: Callable[[], Any], log_epoch: Callable[[dict, FitState], None],
        after_epoch: Callable[[FitState], None] | None = None) -> FitState:
    """Run epochs ``state.epoch + 1 .. epochs``; returns the final state.

    Args:
        train_epoch: ``epoch -> record``; the record holds ``score_key`` in epochs that were evaluated.
        snapshot: a copy of whatever must be restored for the best epoch (weights, memory).
        log_epoch: reports an epoch (its record and the state after it).
        after_epoch: called with the state after every epoch (e.g. to checkpoint it).
        patience: stop after this many evaluations without a better score; 0 never stops early.
    """
    for epoch in range(state.epoch + 1, epochs + 1):
        if state.stopped:
            break
        record = train_epoch(epoch)
        state.history.append(record)
        state.epoch = epoch
        if score_key in record:
            if not state.best or record[score_key] > state.best[score_key]:
                state.best, state.best_state, state.since_best = dict(record), snapshot(), 0
            else:
                state.since_best += 1
            state.stopped = bool(patience and state.since_best >= patience)
        log_epoch(record, state)
        if state.stopped:
            log.info("early stop: no better validation score in %d evaluations", patience)
        if after_epoch is not None:
            after_epoch(state)
    return state
