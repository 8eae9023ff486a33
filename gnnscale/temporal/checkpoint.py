"""Checkpoints of a temporal run: what a resumed :class:`TemporalLinkTrainer` needs to continue exactly.

After every ``checkpoint_every``-th epoch (and the last) the run folder gets::

    out/
      checkpoint.pt                       rank 0, the commit point: model, optimizers, the best epoch's
                                          weights, and rank 0's own share (below)
      checkpoint-rank1-epoch3.pt          rank 1's share of the same epoch (several ranks only)
      ...

A rank's *share* is what only that rank holds: the fit loop's state as it saw it (epoch, best record,
patience count, history) and its read counts (in memory groups a rank's own), its node-memory table
(memory, last-update times, mailbox: the pending message, its time and flag), with what it knows of
the other ranks' writes and, for a bounded table, which nodes it holds and when each was last read
(:meth:`ShardedMemory.state_dict`); its global step count; the table as the best epoch's training
left it (the final evaluation starts from it); and, with memory parallelism, the memory its group
carries into its next segment.  Each rank writes its own share (no rank holds every rank's table,
and no shared file system is assumed), atomically, under a name that carries the epoch; once every
rank has written, rank 0 replaces ``checkpoint.pt``, and only then do the ranks delete their older
shares.  A run killed at any point therefore leaves a ``checkpoint.pt`` whose epoch every rank has a
share of.  A resumed rank reads its share from its own disk, so a job resumes on the same hosts with
the same ranks.

No generator state is saved: every generator (negatives, neighbour draws, dropout) is seeded from
``(seed, epoch, rank)`` at the start of each epoch and pass, so epoch ``e + 1`` of a resumed run draws
what the uninterrupted run draws.  Files load with ``torch.load(weights_only=True)``
(:func:`gnnscale.train.checkpoint.load_checkpoint`), and a resume with other settings is refused,
naming the first that differs.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.distributed as dist

from gnnscale.distributed.comm import Exchanger
from gnnscale.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from gnnscale.train.fit import FitState

if TYPE_CHECKING:  # train.py imports this module
    from gnnscale.temporal.memory import MemoryConfig
    from gnnscale.temporal.tgn import TGNConfig
    from gnnscale.temporal.train import TemporalLinkTrainer, TemporalTrainConfig

log = logging.getLogger("gnnscale.temporal")

UNFINGERPRINTED = ("epochs", "patience", "device", "checkpoint_every", "resume")
"""Settings a resumed run may change: how long it runs, where, and how often it checkpoints."""


def run_fingerprint(events, split, config: TemporalTrainConfig, memory_config: MemoryConfig, tgn_config: TGNConfig,
                    owner: np.ndarray | None, world_size: int) -> dict[str, Any]:
    """What must not change across a resume: the stream, the split, the model, every training setting
    but :data:`UNFINGERPRINTED`, the world size and the owner of every node (a CRC of ``owner``)."""
    settings = {k: v for k, v in asdict(config).items() if k not in UNFINGERPRINTED}
    owners = 0 if owner is None else zlib.crc32(np.ascontiguousarray(owner, dtype=np.int64).tobytes())
    return {"stream": f"{events.name}: {events.num_nodes} nodes, {events.num_events} events",
            "split": [int(split.train.sum()), int(split.val.sum()), int(split.test.sum())],
            "memory": repr(memory_config), "tgn": repr(tgn_config), "world_size": world_size, "owner": owners,
            **settings}


class TemporalCheckpoint:
    """Writes and reads the checkpoints of one run folder (see the module docstring).

    Args:
        out: the run folder, or ``None`` for no checkpoints.
        config: the run's ``TemporalTrainConfig``: ``checkpoint_every`` epochs (and after the last,
            or an early stop; 0 never), ``epochs``, ``resume``.
        fingerprint: :func:`run_fingerprint` of the run.
        comm: collectives over every rank (gloo); a world of one has ``group`` ``None``.

    Raises:
        ValueError: ``config.resume`` without an ``out`` folder.
    """

    def __init__(self, out: Path | None, config: TemporalTrainConfig, *, fingerprint: dict[str, Any],
                 comm: Exchanger) -> None:
        if config.resume and out is None:
            raise ValueError("resume=True needs the out folder that holds the checkpoint; pass out=")
        self.out = None if out is None else Path(out)
        self.every, self.epochs = config.checkpoint_every, config.epochs
        self.fingerprint, self.comm = fingerprint, comm

    @property
    def path(self) -> Path | None:
        return None if self.out is None else self.out / CHECKPOINT_NAME

    def share_path(self, rank: int, epoch: int) -> Path:
        assert self.out is not None
        return self.out / f"checkpoint-rank{rank}-epoch{epoch}.pt"

    def due(self, state: FitState) -> bool:
        return self.out is not None and self.every > 0 and (
            state.epoch % self.every == 0 or state.epoch == self.epochs or state.stopped)

    def save(self, state: FitState, run: dict[str, Any], share: dict[str, Any]) -> None:
        """Checkpoint epoch ``state.epoch``: ``run`` (the same on every rank; rank 0 writes it) and this
        rank's ``share``.  A write that fails on any rank raises ``OSError`` on every rank.  A collective."""
        rank, epoch = self.comm.rank, state.epoch
        # Each rank's own: in memory groups a record's read counts are the rank's.
        share = {**share, "fit": {f.name: getattr(state, f.name) for f in fields(state) if f.name != "best_state"}}
        self._agree(self._write(self.share_path(rank, epoch), {"epoch": epoch, "share": share})
                    if rank > 0 else None, OSError)
        self._agree(self._write(self.path, {"epoch": epoch, **run, "share": share}) if rank == 0 else None, OSError)
        if rank > 0 and self.out is not None:  # the commit is made: older shares can go
            for old in self.out.glob(f"checkpoint-rank{rank}-epoch*.pt"):
                if old.name != self.share_path(rank, epoch).name:
                    old.unlink(missing_ok=True)

    def _write(self, path: Path, payload: dict[str, Any]) -> str | None:
        try:
            save_checkpoint(path, {**payload, "fingerprint": self.fingerprint})
        except OSError as err:
            return f"writing the checkpoint {path} failed ({err.strerror or err}); free space or choose another out"
        return None

    def load(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The run folder's checkpoint: ``(run, share)`` with ``share["fit"]`` this rank's :class:`FitState`
        fields (but ``best_state``), or ``None`` where there is none (a fresh start).  A collective.

        Raises:
            ValueError: on every rank, where any rank's file is unreadable, missing or of another run.
        """
        rank, path = self.comm.rank, self.path
        found: list[Any] = [None]
        if rank == 0 and path is not None and path.exists():
            try:
                found[0] = load_checkpoint(path, self.fingerprint)
            except ValueError as err:  # every rank must learn it, or the others wait in the broadcast
                found[0] = str(err)
        if self.comm.group is not None:
            dist.broadcast_object_list(found, src=dist.get_global_rank(self.comm.group, 0), group=self.comm.group)
        if isinstance(found[0], str):
            raise ValueError(found[0])
        if found[0] is None:
            return None
        run, error = found[0], None
        share = run.pop("share") if rank == 0 else None
        if rank > 0:
            share, error = self._read_share(run["epoch"])
        self._agree(error, ValueError)
        return run, share

    def _read_share(self, epoch: int) -> tuple[dict[str, Any] | None, str | None]:
        path = self.share_path(self.comm.rank, epoch)
        if not path.exists():
            return None, (f"{path} is missing: the checkpoint of epoch {epoch} needs every rank's share; "
                          f"resume on the same hosts with the same ranks, or use a fresh out folder")
        try:
            payload = load_checkpoint(path, self.fingerprint)
        except ValueError as err:
            return None, str(err)
        if payload.get("epoch") != epoch:
            return None, f"{path} holds epoch {payload.get('epoch')!r}, not {epoch}; use a fresh out folder"
        return payload["share"], None

    def _agree(self, error: str | None, kind: type[Exception]) -> None:
        """Raise ``kind`` on every rank if any rank has an ``error`` (the first rank's, named)."""
        errors = [error]
        if self.comm.group is not None:
            errors = [None] * self.comm.world_size
            dist.all_gather_object(errors, error, group=self.comm.group)
        for rank, message in enumerate(errors):
            if message is not None:
                raise kind(message if len(errors) == 1 else f"rank {rank}: {message}")


def save_epoch(trainer: TemporalLinkTrainer, checkpoint: TemporalCheckpoint, state: FitState) -> None:
    """Checkpoint ``trainer`` after ``state.epoch`` when due (see :class:`TemporalCheckpoint`)."""
    if not checkpoint.due(state):
        return
    weights, memory = state.best_state if state.best_state is not None else (None, None)
    run = {"model": trainer.model.state_dict(),
           "optimizers": [o.state_dict() for o in (trainer.optimizer, *trainer.sparse_optimizers)],
           "best_weights": weights}
    # The live tables, not copies: written at once, and a copy would double a large table's memory.
    share = {"memory": trainer.shard.state_dict(copy=False), "step": trainer.shard.step, "best_memory": memory,
             "overall": dict(trainer._overall),
             "own_memory": getattr(trainer, "_own_memory", None)}
    checkpoint.save(state, run, share)


def restore(trainer: TemporalLinkTrainer, checkpoint: TemporalCheckpoint) -> FitState:
    """``trainer`` as the checkpoint left it, and the fit loop's state; a fresh state where there is none."""
    found = checkpoint.load()
    if found is None:
        log.info("no checkpoint in %s: starting from epoch 1", checkpoint.out)
        return FitState()
    run, share = found
    trainer.model.load_state_dict(run["model"])
    for optimizer, saved in zip((trainer.optimizer, *trainer.sparse_optimizers), run["optimizers"], strict=True):
        optimizer.load_state_dict(saved)
    trainer._overall.update(share["overall"])
    trainer.shard.load_state_dict(share["memory"])
    trainer.shard.step = share["step"]
    if share["own_memory"] is not None:
        trainer._own_memory = share["own_memory"]
    state = FitState(**share["fit"])
    if run["best_weights"] is not None:
        state.best_state = (run["best_weights"], share["best_memory"])
    log.info("resumed from epoch %d of %s (best val AP %.4f at epoch %d)", state.epoch, checkpoint.path,
             state.best.get("val_ap", float("nan")), state.best.get("epoch", 0))
    return state
