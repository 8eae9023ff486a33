"""Run a function on N gloo ranks of one machine, and partition datasets into test folders.

``run_ranks(fn, world_size, *args)`` spawns one process per rank with torchrun's
variables set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), so the code under test reads its place in the job
through :func:`gnnscale.distributed.env.read_env` exactly as under torchrun.  Each rank
runs ``fn(rank, *args)`` and its return value comes back through a pickle file.  A rank
that raises fails the call with the rank's traceback and exit code; a rank that never
returns (a collective waiting for a peer that is gone) fails it after ``timeout`` seconds.
Either way every child is killed before the call returns: no rank outlives its test.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the spawned ranks import this module: keep it free of torch and dgl
    from gnnscale.data.dataset import GraphDataset

# After the first rank fails, the others get this long to finish on their own (they usually
# sit in a collective waiting for the dead rank, and gloo's own timeout is far longer).
FAILURE_GRACE_SECONDS = 3.0
POLL_SECONDS = 0.05
# A rank still running at the deadline is asked for its threads' stacks (SIGUSR1) before it is killed.
STACK_DUMP_SECONDS = 2.0


class RankFailure(RuntimeError):
    """A rank raised, exited without a result, or did not finish in time."""


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, result: str) -> None:
    """Body of a spawned rank: set torchrun's variables, run ``fn``, pickle its outcome to ``result``."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Where a hung rank was stuck is the first thing its failure report needs.
    stacks = open(f"{result}.stacks", "w")  # noqa: SIM115 -- open until the process ends
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    try:
        outcome: tuple[str, Any] = ("ok", fn(rank, *args))
    except BaseException:  # reported to the parent, which raises it with the rank's number
        outcome = ("error", traceback.format_exc())
    # Written then renamed: the parent never reads half a pickle from a rank killed while writing.
    tmp = f"{result}.tmp"
    try:
        with open(tmp, "wb") as handle:
            pickle.dump(outcome, handle)
    except Exception:  # an unpicklable return value is a failure of the rank, not of the harness
        with open(tmp, "wb") as handle:
            pickle.dump(("error", traceback.format_exc()), handle)
        outcome = ("error", "")
    os.replace(tmp, result)
    if outcome[0] != "ok":
        # Skip interpreter teardown: a process group with a dead peer can block in its destructor.
        os._exit(1)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 180.0) -> list[Any]:
    """Run ``fn(rank, *args)`` on ``world_size`` spawned processes; their return values in rank order.

    Args:
        fn: a module-level function of an importable module (spawned children import it by name).
        world_size: number of ranks.
        args: picklable arguments passed to every rank after its rank.
        timeout: seconds the whole job may take, start-up (importing torch) included.

    Raises:
        RankFailure: a rank raised (its traceback is in the message), exited without a result
            (its exit code is), or the job did not finish within ``timeout`` (the ranks still
            running are named).  All children are dead when it is raised.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gnnscale-ranks-") as tmp:
        results = [str(Path(tmp) / f"rank{rank}.pkl") for rank in range(world_size)]
        procs: list[BaseProcess] = []
        try:
            for rank in range(world_size):
                proc = ctx.Process(target=_rank_main, args=(fn, rank, world_size, port, args, results[rank]),
                                   name=f"rank{rank}", daemon=True)
                proc.start()
                procs.append(proc)
            killed, timed_out = _wait(procs, time.monotonic() + timeout)
            outcomes = [_read(path) for path in results]
            stacks = [_read_text(f"{path}.stacks") for path in results]
            errors = _describe_failures(procs, outcomes, stacks, killed, timed_out, timeout)
            if errors:
                raise RankFailure(f"{len(errors)} of {world_size} rank(s) of {fn.__qualname__} failed:\n"
                                  + "\n".join(errors))
            return [outcome[1] for outcome in outcomes]  # type: ignore[index]
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                proc.join(timeout=10.0)


def _wait(procs: list[BaseProcess], deadline: float) -> tuple[set[int], bool]:
    """Wait until every rank exited, or one failed (plus a grace period), or ``deadline``.

    Returns:
        The ranks killed because they were still running, and whether ``deadline`` was the reason.
    """
    give_up, timed_out = deadline, True
    while time.monotonic() < give_up:
        codes = [proc.exitcode for proc in procs]
        if all(code is not None for code in codes):
            return set(), False
        if any(code not in (None, 0) for code in codes) and give_up == deadline:
            give_up, timed_out = min(deadline, time.monotonic() + FAILURE_GRACE_SECONDS), False
        time.sleep(POLL_SECONDS)
    killed = {rank for rank, proc in enumerate(procs) if proc.is_alive()}
    for rank in killed:
        if procs[rank].pid is not None:
            os.kill(procs[rank].pid, signal.SIGUSR1)
    if killed:
        time.sleep(STACK_DUMP_SECONDS)
    for rank in killed:
        procs[rank].kill()
    for proc in procs:
        proc.join(timeout=10.0)
    return killed, timed_out and bool(killed)


def _read(path: str) -> tuple[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as handle:
        return pickle.load(handle)


def _read_text(path: str) -> str:
    return Path(path).read_text() if os.path.exists(path) else ""


def _describe_failures(procs: list[BaseProcess], outcomes: list[tuple[str, Any] | None], stacks: list[str],
                       killed: set[int], timed_out: bool, timeout: float) -> list[str]:
    """One paragraph per failed rank: its traceback, its exit code, or that it hung (with its stacks)."""
    lines = []
    for rank, (proc, outcome) in enumerate(zip(procs, outcomes)):
        if outcome is not None and outcome[0] == "ok" and rank not in killed:
            continue
        if outcome is not None and outcome[0] == "error":
            lines.append(f"--- rank {rank} raised (exit code {proc.exitcode}):\n{outcome[1]}")
            continue
        if rank in killed:
            returned = " after returning its result (stuck at exit)" if outcome is not None else ""
            why = f"did not finish within {timeout:g} s (a hang?)" if timed_out else \
                f"was still running {FAILURE_GRACE_SECONDS:g} s after another rank failed"
            lines.append(f"--- rank {rank} {why}{returned}: killed; its threads were at:\n"
                         f"{stacks[rank] or '(no stack dump)'}")
        else:
            lines.append(f"--- rank {rank} exited with code {proc.exitcode} without a result")
    return lines


# ---------------------------------------------------------------------- planted faults
# Targets for the harness's own tests: cheap to import, so a spawn costs only the interpreter.
def return_rank_or_fail(rank: int, failing_rank: int) -> int:
    """Return ``rank``; ``failing_rank`` raises instead."""
    if rank == failing_rank:
        raise ValueError(f"planted failure on rank {rank}")
    return rank


def return_rank_or_hang(rank: int, hanging_rank: int) -> int:
    """Return ``rank``; ``hanging_rank`` sleeps far past any test's timeout instead."""
    if rank == hanging_rank:
        time.sleep(3600)
    return rank


# ---------------------------------------------------------------------- partition folders
def partition_dataset(dataset: GraphDataset, out: Path, num_parts: int, *, method: str = "metis",
                      seed: int = 0) -> Path:
    """Write ``dataset`` as a ``num_parts`` partition folder ``out`` (through the library API); returns ``out``."""
    from partition import PartitionConfig, partition_graph

    partition_graph(dataset, out, PartitionConfig(num_parts=num_parts, method=method, seed=seed))
    return out
