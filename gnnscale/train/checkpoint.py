"""Atomic training checkpoints that load with ``torch.load(weights_only=True)``.

A checkpoint holds plain containers of tensors and numbers only: model and optimizer state, the fit
loop's state (the epoch just finished, the best epoch with its weights, the patience count, the history)
and a fingerprint of the settings that must not change across a resume.  No RNG state: the trainer
reseeds from ``(seed, epoch, rank)`` at every epoch.  It is written to a sibling temporary file and
renamed into place, so a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1
IMPLIED_FINGERPRINT = {"wire_dtype": "float32"}
"""Fingerprint fields added after checkpoints were first written, with the value that every checkpoint
lacking them was written with (so those still resume, and only with the same setting)."""


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` (plus the format version) to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        torch.save({"format_version": FORMAT_VERSION, **payload}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
