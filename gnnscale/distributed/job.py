"""``joined_job``: join a torchrun job with failure detection, and leave it in order, around a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gnnscale.distributed.env import DistEnv, Runtime, init_runtime
from gnnscale.distributed.watchdog import Watchdog


@contextlib.contextmanager
def joined_job(env: DistEnv, device: str, failure_timeout: float) -> Iterator[Runtime]:
    """The job's :class:`Runtime`, with a :class:`Watchdog` guarding the block.

    A peer that dies or hangs for ``failure_timeout`` seconds raises ``PeerFailure`` in the block
    instead of a hang.  A block that finishes waits for every rank (a barrier) before the job is
    left; after a failure the job is left at once (peers may never come).
    """
    runtime = init_runtime(env, device, timeout=failure_timeout)
    watchdog, finished = None, False
    try:
        if runtime.store is not None:
            owner = "the torchrun agent of the first node" if env.agent_store else "rank 0"
            watchdog = Watchdog.connect(env.master_addr, env.master_port, rank=env.rank, world_size=env.world_size,
                                        prefix=f"gnnscale/{env.restart_count}/watchdog/", timeout=failure_timeout,
                                        store_owner=owner).start()
        with watchdog.guard() if watchdog is not None else contextlib.nullcontext():
            yield runtime
            runtime.barrier()
        finished = True
    finally:
        if watchdog is not None:  # a rank leaving with an error says so: its peers stop at once, naming it
            watchdog.stop() if finished else watchdog.abort()
        runtime.close(timeout=30.0 if finished else 0.0)
