"""Leaving a job so that the process always exits: the process groups really destroyed, then the tensors let go.

Why this is delicate (torch 2.2's gloo): a gloo worker thread can hold the last reference to a finished
collective's tensors for a moment after the caller saw it finish.  A tensor made in Python needs the GIL to
be freed; the destructor of a ``ProcessGroupGloo`` runs with the GIL held and joins its worker threads.  If
the destructor runs while a worker still holds such a tensor, each waits for the other: the process never
exits.  ``dist.destroy_process_group`` only drops torch's own registry of the groups; every other Python
reference (a trainer's ``Exchanger``, a DDP model, a gradient hook in a reference cycle) keeps the group
alive, and it is then destroyed whenever that reference goes -- at the latest while the interpreter
finalises, after :func:`gnnscale.distributed.comm.release_kept` has let go of the tensors.  That is how a
temporal run with static memory hung at exit after its result was written.

So :func:`destroy_groups` drops the registry, collects reference cycles while the tensors are still held
(:data:`gnnscale.distributed.comm._KEPT`), checks through weak references that no group survived, and only
then lets the tensors go.  A group that survives (a caller still holds a trainer) keeps the tensors held for
the rest of the process.  :func:`exit_deadline` bounds what no Python thread can: a process whose interpreter
is stuck on the GIL is ended by faulthandler's C-level timer, with every thread's stack on stderr.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import sys
import weakref

import torch.distributed as dist

from gnnscale.distributed.comm import release_kept

log = logging.getLogger("gnnscale.distributed")

EXIT_GRACE_SECONDS = 60.0
"""How long a process may take from leaving its job to its end (interpreter finalisation included) before
:func:`exit_deadline` ends it; leaving normally takes well under a second."""


def destroy_groups(groups: list[dist.ProcessGroup | None]) -> bool:
    """Destroy every process group of this process, and ``groups`` (emptied: the caller's references go too).

    Returns whether every group is gone; only then are the kept collective tensors released.
    """
    refs = [weakref.ref(group) for group in groups if group is not None]
    groups.clear()
    if not dist.is_initialized() and not refs:  # a world of one: nothing to destroy
        return True
    if dist.is_initialized():
        dist.destroy_process_group()
    # Groups held in reference cycles (a GradientSum's gradient hooks reach its Exchanger) go now, while
    # every collective's tensors are still held here: their worker threads need no GIL to be joined.
    gc.collect()
    alive = sum(ref() is not None for ref in refs)
    if alive:
        log.debug("%d process group(s) still referenced after destroy_process_group: their collectives' tensors "
                  "stay held until the process ends", alive)
        return False
    release_kept()
    return True


def exit_deadline(seconds: float = EXIT_GRACE_SECONDS) -> None:
    """End this process ``seconds`` from now, whatever it is doing, unless it has exited by then.

    faulthandler's timer is a C thread that needs no GIL, so it also ends a process whose main thread
    deadlocked on the GIL during interpreter finalisation (where no Python thread, the failure watchdog's
    included, can run).  It writes every thread's stack to stderr first and exits with status 1.  Calling it
    again re-arms it.
    """
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stderr__ or sys.stderr)


def cancel_exit_deadline() -> None:
    """Disarm :func:`exit_deadline` (a process that goes on working after leaving a job, e.g. a test)."""
    faulthandler.cancel_dump_traceback_later()
