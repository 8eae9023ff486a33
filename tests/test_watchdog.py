"""The peer-failure watchdog: staleness bookkeeping, then real processes killed, stopped and finishing."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as dist

from gnnscale.distributed.watchdog import (DONE_OFFSET, EXIT_PEER_FAILURE, FAILED_OFFSET, HeartbeatTracker,
                                           PeerFailure, Watchdog, WatchdogConfig, is_communication_error)

TIMEOUT = 3.0
INTERVAL = 0.2
# Wall time a survivor may take after the fault: detection (timeout + ~2 intervals) plus process exit,
# with room for a loaded 2-core machine. A hang without the watchdog would last 60 s or 30 min.
EXIT_DEADLINE = TIMEOUT + 7.0
STARTUP_DEADLINE = 60.0  # generous: the forkserver imports torch once, on a shared 2-core machine
PREFIX = "test/watchdog"


def _redirect_output(log_dir: Path, name: str) -> None:
    """Point fds 1 and 2 at files: os._exit and fatal errors bypass anything Python-level."""
    for fd, suffix in ((1, "out"), (2, "err")):
        os.dup2(os.open(log_dir / f"{name}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)


def _rank_main(args: dict, log_dir: Path) -> None:
    """A rank: rendezvous (so nobody watches a peer still starting up), start the watchdog, then act per mode.

    Modes: "sleep" (main thread busy elsewhere), "allreduce" (main thread in gloo collectives under guard()),
    "run:S" (work S seconds polling check(), then stop()).
    """
    _redirect_output(log_dir, f"rank{args['rank']}")
    rank, world_size = args["rank"], args["world_size"]
    store = client_store(args["port"])
    store.add("ready", 1)
    while store.add("ready", 0) < world_size:
        time.sleep(0.05)
    if args["mode"] == "allreduce":
        dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world_size)
    watchdog = Watchdog.connect("127.0.0.1", args["port"], rank=rank, world_size=world_size, prefix=PREFIX,
                                timeout=TIMEOUT, interval=INTERVAL, store_owner=args["owner"]).start()
    store.add("watching", 1)
    end = time.monotonic() + 60
    if args["mode"] == "sleep":
        time.sleep(60)
    elif args["mode"] == "allreduce":
        value = torch.ones(4)
        try:
            while time.monotonic() < end:
                with watchdog.guard():
                    dist.all_reduce(value)
        except PeerFailure as failure:  # what a training script does with it
            print(f"raised PeerFailure: {failure}; cause: {failure.__cause__}", file=sys.stderr, flush=True)
            sys.exit(EXIT_PEER_FAILURE)
    else:
        end = time.monotonic() + float(args["mode"].split(":")[1])
        while time.monotonic() < end:
            watchdog.check()
            time.sleep(0.05)
        watchdog.stop()
        print("finished", flush=True)


def _store_host_main(port: int, log_dir: Path) -> None:
    """Host the store, like a torchrun agent, and nothing else."""
    _redirect_output(log_dir, "store")
    _store = master_store(port)
    time.sleep(120)


# Children fork from a server that imported torch once: spawning a fresh interpreter per rank costs
# 2-3 s of torch import each on this 2-core machine, most of this file's run time.
CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "torch.distributed", "gnnscale.distributed.watchdog"])


@dataclass
class Child:
    """A child process with its output in files."""

    process: multiprocessing.process.BaseProcess
    log_dir: Path
    name: str

    def finish(self, deadline: float = EXIT_DEADLINE) -> tuple[int, str, str]:
        """Exit status, stdout and stderr; fails if the child still runs after ``deadline`` s."""
        self.process.join(deadline)
        assert self.process.exitcode is not None, f"{self.name} still running after {deadline} s: {self.err()}"
        return self.process.exitcode, (self.log_dir / f"{self.name}.out").read_text(), self.err()

    def err(self) -> str:
        path = self.log_dir / f"{self.name}.err"
        return path.read_text() if path.exists() else ""

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def master_store(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=30))


def client_store(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[Child]]:
    """Children started by a test; every one is resumed and killed afterwards, whatever happened."""
    started: list[Child] = []
    yield started
    for child in started:
        if child.process.is_alive():
            child.signal(signal.SIGCONT)  # a stopped process only dies of SIGKILL once resumed
            child.process.kill()
        child.process.join(10)
        assert child.process.exitcode is not None, f"could not end {child.name} (pid {child.process.pid})"


def start_store_host(children: list[Child], port: int, log_dir: Path) -> Child:
    process = CONTEXT.Process(target=_store_host_main, args=(port, log_dir), daemon=True)
    process.start()
    children.append(Child(process, log_dir, "store"))
    return children[-1]


def launch_ranks(children: list[Child], port: int, modes: list[str], log_dir: Path,
                 owner: str = "the test's store") -> list[Child]:
    """One child per mode (its index is its rank); returns once every watchdog is running."""
    ranks = []
    for rank, mode in enumerate(modes):
        args = {"port": port, "rank": rank, "world_size": len(modes), "mode": mode, "owner": owner}
        process = CONTEXT.Process(target=_rank_main, args=(args, log_dir), daemon=True)
        process.start()
        ranks.append(Child(process, log_dir, f"rank{rank}"))
        children.append(ranks[-1])
    probe = client_store(port)
    deadline = time.monotonic() + STARTUP_DEADLINE
    while probe.add("watching", 0) < len(modes):
        crashed = [(child.name, child.process.exitcode, child.err()) for child in ranks
                   if child.process.exitcode is not None]
        assert not crashed, f"a rank exited before its watchdog started: {crashed}"
        assert time.monotonic() < deadline, f"ranks did not start within {STARTUP_DEADLINE} s"
        time.sleep(0.05)
    return ranks


# ---------------------------------------------------------------------- pure bookkeeping
def test_tracker_flags_only_silent_unfinished_peers() -> None:
    tracker = HeartbeatTracker(peers=[1, 2, 3], timeout=5.0, started=100.0)
    tracker.observe(1, 1, now=101.0)
    tracker.observe(2, 1, now=101.0)
    tracker.observe(2, 1 + DONE_OFFSET, now=102.0)  # rank 2 finished cleanly
    assert tracker.stale(104.9) == []
    # Rank 3 never heartbeated: its clock started with the watcher's.
    assert tracker.stale(105.0) == [3]
    assert not tracker.heard_from(3) and tracker.heard_from(1)
    tracker.observe(1, 2, now=105.5)
    assert tracker.stale(110.0) == [3]
    assert tracker.stale(110.5) == [1, 3]
    assert tracker.silence(1, 110.5) == pytest.approx(5.0)
    assert not tracker.all_done()
    tracker.observe(1, 2 + DONE_OFFSET, now=111.0)
    tracker.observe(3, DONE_OFFSET, now=111.0)  # finished without ever beating: still not a failure
    assert tracker.stale(200.0) == [] and tracker.all_done()


def test_config_and_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="timeout=0 must be > 0"):
        WatchdogConfig(timeout=0)
    with pytest.raises(ValueError, match="interval=2 must be > 0 and at most timeout/2 = 1.5"):
        WatchdogConfig(timeout=3, interval=2)
    store = dist.HashStore()
    with pytest.raises(ValueError, match="rank=2, world_size=2"):
        Watchdog(store, rank=2, world_size=2)
    with pytest.raises(ValueError, match="needs a non-empty prefix"):
        Watchdog.connect("127.0.0.1", 1, rank=0, world_size=1, prefix="")
    watchdog = Watchdog(store, rank=0, world_size=1, exit_on_failure=False)
    with pytest.raises(RuntimeError, match="needs a started watchdog"):
        watchdog.diagnose()
    with watchdog:
        with pytest.raises(RuntimeError, match="called twice"):
            watchdog.start()


def test_communication_errors_are_recognised() -> None:
    assert is_communication_error(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:525] Read error "
                                               "[127.0.0.1]:46788: Connection reset by peer"))
    assert is_communication_error(dist.DistBackendError("anything"))
    assert not is_communication_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


# ---------------------------------------------------------------------- in-process: guard / diagnose
def test_guard_names_the_silent_rank_and_keeps_the_gloo_error_as_cause() -> None:
    port = free_port()
    store = master_store(port)
    watchdog = Watchdog.connect("127.0.0.1", port, rank=0, world_size=2, prefix=PREFIX, timeout=1.0,
                                interval=0.1, exit_on_failure=False)
    gloo_error = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer")
    with watchdog:  # rank 1 never heartbeats
        with pytest.raises(PeerFailure, match=r"rank 1 of 2 has not answered .* stopping rank 0") as caught:
            with watchdog.guard():
                raise gloo_error
        assert caught.value.__cause__ is gloo_error and caught.value.ranks == (1,)
        assert "never heard from: 1" in watchdog.failure
        with pytest.raises(PeerFailure, match="rank 1 of 2"):
            watchdog.check()
        with pytest.raises(PeerFailure, match="rank 1 of 2"):  # a known failure stops the next block at once
            with watchdog.guard():
                pytest.fail("guard() ran a block after a failure was detected")


def test_guard_reraises_when_every_peer_answers() -> None:
    port = free_port()
    _store = master_store(port)
    kwargs = dict(world_size=2, prefix=PREFIX, timeout=1.0, interval=0.1, exit_on_failure=False)
    with Watchdog.connect("127.0.0.1", port, rank=1, **kwargs), \
            Watchdog.connect("127.0.0.1", port, rank=0, **kwargs) as watchdog:
        started = time.monotonic()
        with pytest.raises(ValueError, match="not a communication error"):
            with watchdog.guard():
                raise ValueError("not a communication error")
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            with watchdog.guard():
                raise RuntimeError("shapes cannot be multiplied")
        assert time.monotonic() - started < 0.5, "errors that are not communication errors must not wait"
        with pytest.raises(RuntimeError, match="Connection closed by peer") as caught:
            with watchdog.guard(wait=1.5):  # longer than the timeout: rank 1 had every chance to be flagged
                raise RuntimeError("Connection closed by peer")
        assert not isinstance(caught.value, PeerFailure)
        assert watchdog.failure is None


def test_only_a_clean_exit_marks_the_rank_done_and_an_error_marks_it_failed() -> None:
    port = free_port()
    store = master_store(port)
    kwargs = dict(world_size=1, timeout=1.0, interval=0.1)
    with pytest.raises(KeyError):
        with Watchdog.connect("127.0.0.1", port, rank=0, prefix="failing", **kwargs):
            time.sleep(0.3)  # let it heartbeat
            raise KeyError("boom")
    assert store.add("failing/hb/0", 0) > FAILED_OFFSET
    with Watchdog.connect("127.0.0.1", port, rank=0, prefix="clean/", **kwargs):
        time.sleep(0.3)
    assert store.add("clean/hb/0", 0) > DONE_OFFSET


def test_a_rank_leaving_with_an_error_stops_its_peers_at_once_naming_it() -> None:
    port = free_port()
    _store = master_store(port)
    kwargs = dict(world_size=2, timeout=30.0, interval=0.1, exit_on_failure=False, prefix="abort")
    with Watchdog.connect("127.0.0.1", port, rank=0, **kwargs) as peer:
        failing = Watchdog.connect("127.0.0.1", port, rank=1, **kwargs).start()
        time.sleep(0.3)
        started = time.monotonic()
        failing.abort()  # what joined_job does when its block raises
        assert peer.diagnose(wait=5.0) == ("gnnscale: rank 1 of 2 stopped with an error (its own line above says "
                                           "why); stopping rank 0")
        assert time.monotonic() - started < 2.0, "an aborted peer is named at once, not after the 30 s timeout"
        assert peer.failed_ranks == (1,)


# ---------------------------------------------------------------------- real processes
@pytest.mark.parametrize("mode", ["sleep", "allreduce"])
def test_killed_rank_is_named_by_the_survivor(children: list[Child], tmp_path: Path, mode: str) -> None:
    port = free_port()
    _store = master_store(port)
    survivor, victim = launch_ranks(children, port, [mode, mode], tmp_path)
    victim.signal(signal.SIGKILL)
    status, _, err = survivor.finish()
    assert status == EXIT_PEER_FAILURE, err
    assert "gnnscale: rank 1 of 2 has not answered" in err and "stopping rank 0" in err, err
    if mode == "allreduce":  # gloo raised at once; guard() waited for the diagnosis and raised it in the main thread
        assert re.search(r"raised PeerFailure: gnnscale: rank 1 of 2 .*; cause: .*Connection (reset|closed) by peer",
                         err), err


def test_stopped_rank_is_named_while_the_others_block_in_gloo(children: list[Child], tmp_path: Path) -> None:
    port = free_port()
    _store = master_store(port)
    ranks = launch_ranks(children, port, ["allreduce"] * 3, tmp_path)
    # No error reaches gloo: without the watchdog this hangs 30 min. Whichever survivor detects it first
    # exits, which may break the other's collective first: that one then reports through guard().
    ranks[1].signal(signal.SIGSTOP)
    for rank in (0, 2):
        status, _, err = ranks[rank].finish()
        assert status == EXIT_PEER_FAILURE, err
        assert "rank 1 of 3 has not answered" in err and f"stopping rank {rank}" in err, err


def test_finished_rank_is_never_flagged(children: list[Child], tmp_path: Path) -> None:
    port = free_port()
    _store = master_store(port)
    # Without the done mark rank 0 would flag rank 1 about TIMEOUT after it stopped, before its own end.
    long_runner, finisher = launch_ranks(children, port, [f"run:{TIMEOUT + 1}", "run:0.2"], tmp_path)
    for child in (finisher, long_runner):
        status, out, err = child.finish(deadline=EXIT_DEADLINE + TIMEOUT)
        assert status == 0 and "gnnscale:" not in err, err
        assert out.strip() == "finished"


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_store_host_failure_is_reported(children: list[Child], tmp_path: Path, fault: str) -> None:
    port = free_port()
    host = start_store_host(children, port, tmp_path)
    ranks = launch_ranks(children, port, ["sleep", "sleep"], tmp_path, owner="the agent of node 0")
    # A killed host resets the connections; a stopped one keeps them open and never answers.
    host.signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    symptom = "failed" if fault == "kill" else "has not answered for"
    for rank, child in enumerate(ranks):
        status, _, err = child.finish()
        assert status == EXIT_PEER_FAILURE, err
        assert (f"rendezvous store at 127.0.0.1:{port}, hosted by the agent of node 0, {symptom}" in err
                and f"stopping rank {rank}" in err), err
