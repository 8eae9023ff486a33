"""``joined_job``: join a torchrun job with failure detection, and leave it in order, around a block."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from gnnscale.distributed.env import DistEnv, Runtime, init_runtime
from gnnscale.distributed.shutdown import EXIT_GRACE_SECONDS, cancel_exit_deadline, exit_deadline
from gnnscale.distributed.watchdog import Watchdog
from gnnscale.options import JobOptionError, report_error

log = logging.getLogger("gnnscale.distributed")


ERROR_LINGER_SECONDS = 2.0
"""How long a rank hosting the store waits, after an error, for its peers to read its mark and leave: leaving at
once would take the store down under them, and each would report that instead of the rank that failed."""


@contextlib.contextmanager
def joined_job(env: DistEnv, device: str, failure_timeout: float) -> Iterator[Runtime]:
    """The job's :class:`Runtime`, with a :class:`Watchdog` guarding the block.

    A peer that dies or hangs for ``failure_timeout`` seconds raises ``PeerFailure`` in the block
    instead of a hang.  A block that finishes waits for every rank (a barrier) before the job is
    left; after a failure the job is left at once (peers may never come).  Leaving destroys the
    process groups for real (:func:`gnnscale.distributed.shutdown.destroy_groups`) while the watchdog
    still runs, under a deadline no GIL deadlock can outlast: objects that hold a group (a trainer)
    must be gone when the block ends, so return plain results from it.
    """
    runtime = init_runtime(env, device, timeout=failure_timeout)
    watchdog, finished, agreed = None, False, False
    try:
        if runtime.store is not None:
            owner = "the torchrun agent of the first node" if env.agent_store else "rank 0"
            watchdog = Watchdog.connect(env.master_addr, env.master_port, rank=env.rank, world_size=env.world_size,
                                        prefix=f"gnnscale/{env.restart_count}/watchdog/", timeout=failure_timeout,
                                        store_owner=owner).start()
        try:
            with watchdog.guard() if watchdog is not None else contextlib.nullcontext():
                yield runtime
                runtime.barrier()
        except BaseException as error:
            agreed = isinstance(error, JobOptionError)  # every rank refuses alike: none failed, none to report
            # The line now: once this rank is marked failed its peers stop, and torchrun may end it any moment.
            report_error(error)
            raise
        finished = True
    finally:
        _leave(runtime, watchdog, finished, agreed, failure_timeout)


def _leave(runtime: Runtime, watchdog: Watchdog | None, finished: bool, agreed: bool, failure_timeout: float) -> None:
    """Destroy the groups (the watchdog alive meanwhile), then say how this rank left, then leave the store."""
    if runtime.store is not None:
        exit_deadline(failure_timeout + EXIT_GRACE_SECONDS)
    try:
        # After an error the traceback still holds the block's objects: their groups go with it, later.
        # Debug, not a warning: with torch 2.15 a DistributedDataParallel, even one built and deleted at once,
        # keeps the default group referenced from C++ after destroy_process_group (no Python referrer is left),
        # so every multi-rank training run would warn about what the user can neither see nor change.
        if not runtime.leave_groups() and finished:
            log.debug("rank %d: a process group is still referenced after the job was left; its collectives' "
                      "tensors stay held until the process ends", runtime.rank)
    finally:
        if watchdog is not None:  # a rank leaving with an error says so: its peers stop at once, naming it
            watchdog.stop() if finished or agreed else watchdog.abort()
        runtime.close(timeout=30.0 if finished else ERROR_LINGER_SECONDS)
        if finished:  # the process goes on (results to write); after an error, it is on its way out: stay armed
            cancel_exit_deadline()
