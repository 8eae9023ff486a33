"""The one place that reads torchrun's environment, and the process groups built from it.

``python scripts/x.py`` and ``torchrun ... scripts/x.py`` run the same code: without
torchrun's variables the run is a world of one, and no process group is created.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gnnscale.distributed.shutdown import destroy_groups

log = logging.getLogger("gnnscale.distributed")

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(kw_only=True, frozen=True)
class DistEnv:
    """Where this process sits in the job, as torchrun describes it."""

    rank: int = 0
    """Global rank, in ``[0, world_size)``."""
    world_size: int = 1
    """Number of processes in the job."""
    local_rank: int = 0
    """Rank among the processes of this host (selects the GPU)."""
    local_world_size: int = 1
    """Processes on this host (the CPU cores are shared among them)."""
    master_addr: str = "127.0.0.1"
    """Host of the rendezvous store."""
    master_port: int = 0
    """Port of the rendezvous store."""
    restart_count: int = 0
    """How often torchrun has restarted the job (``--max-restarts``); namespaces store keys."""
    agent_store: bool = False
    """The torchrun agent, not rank 0, hosts the store (so it outlives any rank)."""

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, writes metrics and checkpoints."""
        return self.rank == 0


def read_env(environ: dict[str, str] | None = None) -> DistEnv:
    """Read torchrun's variables once; a plain ``python`` launch is a world of one.

    Raises:
        ValueError: the variables are partial or inconsistent (e.g. ``RANK`` set but not ``WORLD_SIZE``).
    """
    environ = os.environ if environ is None else environ
    if "RANK" not in environ and "WORLD_SIZE" not in environ:
        return DistEnv()
    missing = [name for name in TORCHRUN_VARIABLES if name not in environ]
    if missing:
        raise ValueError(f"torchrun environment is incomplete: {', '.join(missing)} not set; launch with torchrun "
                         f"(or set all of {', '.join(TORCHRUN_VARIABLES)})")
    try:
        values = {name: int(environ[name]) for name in TORCHRUN_VARIABLES if name != "MASTER_ADDR"}
    except ValueError as err:
        raise ValueError(f"torchrun environment has a non-integer value ({err}); launch with torchrun") from None
    env = DistEnv(rank=values["RANK"], world_size=values["WORLD_SIZE"], local_rank=values["LOCAL_RANK"],
                  local_world_size=values["LOCAL_WORLD_SIZE"], master_addr=environ["MASTER_ADDR"],
                  master_port=values["MASTER_PORT"],
                  restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
                  agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true")
    if not 0 <= env.rank < env.world_size or not 0 <= env.local_rank < env.local_world_size:
        raise ValueError(f"RANK={env.rank} / LOCAL_RANK={env.local_rank} out of range for WORLD_SIZE="
                         f"{env.world_size} / LOCAL_WORLD_SIZE={env.local_world_size}")
    return env


@dataclass
class Runtime:
    """The process groups of one run.

    ``group`` carries gradients (DDP: NCCL on CUDA, gloo on CPU); ``sample_group`` is a separate gloo
    group for sampling and feature traffic, so the prefetching thread's collectives never interleave with
    the trainer's.  ``store`` is a prefixed view of the rendezvous store, namespaced by torchrun's
    restart count.  Every member is ``None`` in a world of one.
    """

    env: DistEnv
    device: torch.device
    group: dist.ProcessGroup | None = None
    sample_group: dist.ProcessGroup | None = None
    store: dist.Store | None = None

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    def barrier(self) -> None:
        if self.sample_group is not None:
            dist.barrier(group=self.sample_group)

    def leave_groups(self) -> bool:
        """Destroy the process groups (see :func:`gnnscale.distributed.shutdown.destroy_groups`); whether none
        survived (a caller still holding a trainer keeps its groups alive)."""
        groups = [self.group, self.sample_group]
        self.group = self.sample_group = None
        return destroy_groups(groups)

    def close(self, timeout: float = 30.0) -> None:
        """Leave the job.  A rank that hosts the store waits (up to ``timeout``; briefly after a failure,
        when peers may never come) for the others to leave first: its exit takes the store down,
        and a peer still tearing down would hang on it, or report the store instead of the failure."""
        self.leave_groups()
        store, self.store = self.store, None
        if store is None:
            return
        try:
            left = store.add("closed", 1)
            if self.rank == 0 and not self.env.agent_store:
                deadline = time.monotonic() + timeout
                while left < self.world_size and time.monotonic() < deadline and timeout > 0:
                    time.sleep(0.05)
                    left = store.add("closed", 0)
        except RuntimeError:  # the store is gone already: nobody is left to wait for
            pass


def select_device(requested: str, env: DistEnv) -> torch.device:
    """``cpu``, or the CUDA device of this local rank (``cuda`` means ``cuda:<local_rank>``)."""
    if requested == "cpu":
        return torch.device("cpu")
    if not requested.startswith("cuda"):
        raise ValueError(f"device {requested!r} is not supported; use cpu or cuda")
    if not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} requested but torch sees no CUDA device; use --device cpu")
    if requested == "cuda":
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device(requested)


def cores_per_rank(env: DistEnv) -> int:
    """This rank's share of the cores it may run on (its affinity mask, e.g. ``taskset``), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // env.local_world_size)


def share_cores(env: DistEnv) -> None:
    """Give each rank of this host its share of the cores (unless ``OMP_NUM_THREADS`` says otherwise):
    torch's default, every core per process, oversubscribes a host running several ranks."""
    if env.is_distributed and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(cores_per_rank(env))


def init_runtime(env: DistEnv, device: str = "cpu", *, timeout: float = 60.0) -> Runtime:
    """Join the job: the rendezvous store, the gradient group and the sampling group.

    Args:
        timeout: seconds a collective may wait for a peer before it fails; the watchdog
            names the silent rank within about the same time.
    """
    dev = select_device(device, env)
    if not env.is_distributed:
        return Runtime(env=env, device=dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    # Under torchrun the agent hosts the store (rank 0 is a client); launched by hand, rank 0 hosts it.
    is_master = env.rank == 0 and not env.agent_store
    wait = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master, timeout=wait,
                          wait_for_workers=False)
    # A restarted job meets the agent's store again: keys of the previous attempt must not be read.
    prefixed = dist.PrefixStore(f"gnnscale/{env.restart_count}/", store)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("pg/", prefixed), rank=env.rank,
                            world_size=env.world_size, timeout=wait)
    sample_group = dist.new_group(backend="gloo", timeout=wait)
    log.info("rank %d/%d joined (%s, %d threads per rank, store %s:%d)", env.rank, env.world_size, backend,
             torch.get_num_threads(), env.master_addr, env.master_port)
    return Runtime(env=env, device=dev, group=dist.group.WORLD, sample_group=sample_group, store=prefixed)
