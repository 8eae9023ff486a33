"""``gnnscale.init()``: the job this process belongs to, for any number of ranks.

A plain ``python`` launch is a world of one (no process group, nothing to close); under ``torchrun`` every
rank joins the job's process groups with failure detection (:class:`gnnscale.distributed.watchdog.Watchdog`:
a rank that dies or stops answering for ``failure_timeout`` seconds stops its peers, naming it).  The same
script runs unchanged in both::

    with gs.init() as world:
        graph = gs.open_graph("parts/cora-2", world)
        model = world.wrap(MyModel(...))      # gradients averaged over the ranks where world.size > 1
        ...

Leaving the ``with`` block waits for every rank (a barrier), then leaves the job; an exception leaves at
once and tells the peers.  :meth:`World.close` does the same without a ``with``.  A world still open when the
interpreter exits is closed then (``atexit``): after a clean end as ``close`` would, after an uncaught
exception as an error, so a forgotten ``close`` neither hangs the peers nor prints a traceback at shutdown.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
from types import TracebackType

import torch
from torch import nn

from gnnscale.distributed.comm import Exchanger
from gnnscale.distributed.env import DistEnv, Runtime, read_env
from gnnscale.distributed.gradsum import Replicated
from gnnscale.distributed.job import joined_job


class World:
    """This process's place in the job: rank, size, device, and the channels between ranks.

    Made by :func:`init` (or :meth:`from_runtime` around a runtime the caller manages).
    """

    def __init__(self, runtime: Runtime, stack: contextlib.ExitStack | None = None) -> None:
        self.runtime = runtime
        self._stack = stack
        self.exchanger = Exchanger(runtime.sample_group, runtime.rank, runtime.world_size)
        """Collectives of sampling and feature traffic (a separate gloo group from the gradients')."""

    @classmethod
    def from_runtime(cls, runtime: Runtime) -> "World":
        """A world over a runtime whose lifetime the caller manages (``close`` leaves it open)."""
        return cls(runtime)

    @property
    def rank(self) -> int:
        return self.runtime.rank

    @property
    def size(self) -> int:
        """Number of ranks in the job (1 for a plain ``python`` launch)."""
        return self.runtime.world_size

    @property
    def device(self) -> torch.device:
        """This rank's training device."""
        return self.runtime.device

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs and writes job-wide files."""
        return self.rank == 0

    def wrap(self, module: nn.Module) -> nn.Module:
        """``module`` on this rank's device; where the world has more than one rank, in a
        :class:`~gnnscale.distributed.gradsum.Replicated`: rank 0's weights on every rank, and every backward
        leaves the gradients averaged over the ranks, their sums started while the backward runs --
        ``DistributedDataParallel``'s contract (``.module``, ``no_sync()``), without the 150 MiB a process of
        torch's compiler that DDP's constructor imports.  The module itself in a world of one, or where it has
        no parameter to train (a dot-product decoder: nothing to average)."""
        module = module.to(self.device)
        if self.runtime.group is None or not any(p.requires_grad for p in module.parameters()):
            return module
        return Replicated(module, Exchanger(self.runtime.group, self.rank, self.size))

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        self.runtime.barrier()

    def close(self) -> None:
        """Leave the job (a barrier first); a second call does nothing."""
        self.__exit__(None, None, None)

    def __enter__(self) -> "World":
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            atexit.unregister(self._close_at_exit)
            stack.__exit__(kind, error, trace)

    def _close_at_exit(self) -> None:
        """Leave a job the script never closed while the interpreter can still run the leaving code (left to
        the garbage collector, the job's generator would be closed during shutdown, half torn down).  After an
        uncaught exception (``sys.last_exc``, set when the traceback was printed) leave as after an error:
        at once, telling the peers, instead of waiting at the barrier for peers that may never come."""
        error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if error is None:
            self.close()
            return
        with contextlib.suppress(BaseException):  # already reported: the traceback is on stderr
            self.__exit__(type(error), error, error.__traceback__)

    def __repr__(self) -> str:
        return f"World(rank={self.rank}, size={self.size}, device={self.device})"


def init(device: str = "cpu", *, failure_timeout: float = 120.0, env: DistEnv | None = None) -> World:
    """Join the job torchrun started, or make a world of one for a plain launch.

    Args:
        device: ``cpu``, ``cuda`` (this rank's local GPU) or ``cuda:N``.
        failure_timeout: seconds after which a silent peer is reported and the job stops, instead of a hang.
        env: where this process sits in the job; read from torchrun's variables when None.

    Raises:
        ValueError: an unknown or unavailable device, a non-positive timeout, or a partial torchrun environment.
    """
    if not failure_timeout > 0:
        raise ValueError(f"failure_timeout must be > 0 seconds, got {failure_timeout}")
    env = read_env() if env is None else env
    stack = contextlib.ExitStack()
    runtime = stack.enter_context(joined_job(env, device, failure_timeout))
    world = World(runtime, stack)
    atexit.register(world._close_at_exit)
    return world
