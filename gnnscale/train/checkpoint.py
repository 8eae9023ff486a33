"""Atomic training checkpoints that load with ``torch.load(weights_only=True)``.

A checkpoint holds plain containers of tensors and numbers only: model and optimizer state, the fit
loop's state (the epoch just finished, the best epoch with its weights, the patience count, the history)
and a fingerprint of the settings that must not change across a resume.  No RNG state: the trainer
reseeds from ``(seed, epoch, rank)`` at every epoch.  It is written to a sibling temporary file and
renamed into place, so a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gnnscale.options import OutputError, write_failure_reason

log = logging.getLogger("gnnscale.train")

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1
IMPLIED_FINGERPRINT = {"wire_dtype": "float32"}
"""Fingerprint fields added after checkpoints were first written, with the value that every checkpoint
lacking them was written with (so those still resume, and only with the same setting)."""


ON_CHECKPOINT_ERROR = ("stop", "warn")
"""``--on-checkpoint-error`` choices: stop the run (the last good checkpoint intact), or warn and train on."""


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` (plus the format version) to ``path`` atomically.

    Raises:
        OutputError: the folder cannot be written (full, read-only, immutable); one line naming it.  A
            previous checkpoint at ``path`` is left as it was.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"format_version": FORMAT_VERSION, **payload}, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # torch.save reports an unopenable file as a RuntimeError
        kept = f"the last checkpoint there ({path.name}) is intact" if path.exists() else "no checkpoint was kept"
        raise OutputError(f"cannot write a checkpoint in {path.parent} ({_reason(err, path.parent)}); {kept}; "
                          f"make the folder writable (or free space) and rerun with --resume") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _reason(error: BaseException, folder: Path) -> str:
    """The system's reason for ``error``; torch's "cannot be opened" names none, so ask the folder itself."""
    if not isinstance(error, OSError):
        try:
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as probe:
            error = probe
    return write_failure_reason(error)


class CheckpointWriter:
    """Writes a run's checkpoints to ``path`` under an ``on_error`` policy (:data:`ON_CHECKPOINT_ERROR`).

    ``stop`` raises the :class:`OutputError` of a failed write; ``warn`` logs it (once while the failures
    last, and once more when a write succeeds again) and lets the run go on.
    """

    def __init__(self, path: Path, on_error: str = "stop") -> None:
        if on_error not in ON_CHECKPOINT_ERROR:
            raise ValueError(f"--on-checkpoint-error must be one of {', '.join(ON_CHECKPOINT_ERROR)}, got "
                             f"{on_error!r}")
        self.path, self.on_error = path, on_error
        self.failing = False
        """The last write failed (``warn`` only)."""

    def write(self, payload: dict[str, Any]) -> bool:
        """Save ``payload``; whether it was written."""
        try:
            save_checkpoint(self.path, payload)
        except OutputError as err:
            if self.on_error == "stop":  # the node command's one line also names the policy that goes on
                err.args = (f"{err}, or pass --on-checkpoint-error warn to train on without checkpoints",)
                raise
            if not self.failing:
                log.warning("%s; training goes on (--on-checkpoint-error warn)", err)
            self.failing = True
            return False
        if self.failing:
            log.warning("checkpoint written to %s again", self.path)
        self.failing = False
        return True


def load_checkpoint(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` for a run with the same ``fingerprint``.

    Raises:
        ValueError: the file is not a readable checkpoint, is of another format version, or
            was written by a run whose fingerprint differs (the message names the first field).
    """
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: torch raises many kinds
        raise ValueError(f"{path} is not a readable gnnscale checkpoint ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); delete it or point --out elsewhere") from None
    if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
        version = payload.get("format_version") if isinstance(payload, dict) else None
        raise ValueError(f"{path} has checkpoint format {version!r}, this gnnscale reads {FORMAT_VERSION}; "
                         f"delete it or point --out elsewhere")
    saved = payload.get("fingerprint", {})
    for key, value in fingerprint.items():
        recorded = saved.get(key, IMPLIED_FINGERPRINT.get(key))
        if recorded != value:
            raise ValueError(f"{path} was written by a different run ({key} = {recorded!r}, this run has "
                             f"{value!r}); resume with the same settings, or use a fresh --out")
    return payload


def checkpoint_due(epoch: int, *, every: int, epochs: int, stopped: bool) -> bool:
    """Whether the epoch just finished is checkpointed: every ``every`` epochs (0 never), the last, an early stop."""
    return bool(every) and (epoch % every == 0 or epoch == epochs or stopped)


def restore_checkpoint(path: Path | None, fingerprint: dict[str, Any], rank: int, group: Any) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (None where there is none), read by rank 0 and broadcast over ``group``
    (None in a world of one): no shared file system is assumed.

    Raises:
        ValueError: on every rank, where rank 0 found an unreadable checkpoint or one of other settings.
    """
    payload: list[Any] = [None]
    if rank == 0 and path is not None and path.exists():
        try:
            payload[0] = load_checkpoint(path, fingerprint)
        except ValueError as err:  # every rank must learn it, or the others wait in the broadcast
            payload[0] = str(err)
    if group is not None:
        dist.broadcast_object_list(payload, src=0, group=group)
    if isinstance(payload[0], str):
        raise ValueError(payload[0])
    return payload[0]
