"""Stop every rank, naming the culprit, when one rank of a job dies or stops answering.

A gloo collective whose peer was killed (``kill -9``) fails fast on the survivors, but with a bare
``Connection reset by peer``; a peer that is stopped (SIGSTOP) or hung leaves them blocked until the
process group's timeout (30 minutes by default).  The :class:`Watchdog` bounds both: each rank bumps
a heartbeat counter in the rendezvous store every ``interval`` seconds and watches the others'
counters; a rank whose counter has not moved for ``timeout`` seconds, and that has not said it
finished cleanly, is reported by rank number and the watching process exits with
:data:`EXIT_PEER_FAILURE`.

Keys, below the caller's prefix (e.g. ``gnnscale/{restart_count}/watchdog``)::

    {prefix}/hb/{rank}   counter: +1 per heartbeat; +DONE_OFFSET on a clean finish, +FAILED_OFFSET on error

Counters rather than timestamps, so the clocks of different hosts never matter: staleness is
measured on the watcher's own monotonic clock.  Start the watchdog after the process group is
initialised (all ranks are up), so a slow starter is not taken for a dead one.
"""

from __future__ import annotations

import atexit
import datetime
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch.distributed as dist

EXIT_PEER_FAILURE = 3
"""Process exit status used when the watchdog has to stop a rank."""

DONE_OFFSET = 1 << 40
"""Added to a rank's heartbeat counter by :meth:`Watchdog.stop`: one read tells "alive" and "finished"."""
FAILED_OFFSET = 1 << 41
"""Added instead by :meth:`Watchdog.abort` (a rank leaving with an error): its peers stop at once, naming it."""

# Substrings of transport failures raised as a plain RuntimeError (gloo in torch 2.2 does not
# use DistBackendError): only these are worth waiting for a diagnosis.
_COMMUNICATION_MARKERS = ("gloo", "nccl", "connection", "timed out", "broken pipe", "socket", "peer")


class PeerFailure(RuntimeError):
    """A peer rank died or stopped answering (or the store did); the message names it."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = ranks
        """The silent ranks; empty when the store itself failed."""


def is_communication_error(error: BaseException) -> bool:
    """Whether ``error`` looks like a collective or store losing its peer (not a bug in the caller's code)."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(marker in text for marker in _COMMUNICATION_MARKERS)


@dataclass(kw_only=True)
class WatchdogConfig:
    """How fast a silent peer is declared failed."""

    timeout: float = 60.0
    """Seconds without a heartbeat (or without a store answer) before a peer (or the store) is failed."""
    interval: float = 1.0
    """Seconds between heartbeats; at most half of ``timeout`` so one late beat is never fatal."""
    exit_on_failure: bool = True
    """``os._exit(EXIT_PEER_FAILURE)`` on failure: the main thread may sit in a collective that cannot be interrupted."""

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"watchdog timeout={self.timeout} must be > 0 seconds (the default is 60)")
        if not 0 < self.interval <= self.timeout / 2:
            raise ValueError(f"watchdog interval={self.interval} must be > 0 and at most timeout/2 = "
                             f"{self.timeout / 2:g} s, so that one late heartbeat does not fail a peer")


@dataclass
class HeartbeatTracker:
    """Staleness bookkeeping for the peers' counters, on the watcher's monotonic clock (pure, no I/O)."""

    peers: list[int]
    """Ranks to watch (every rank but the watcher's own)."""
    timeout: float
    """Seconds without a counter change after which a peer is stale."""
    started: float
    """When watching began: the clock of a peer never heard from starts here."""
    _value: dict[int, int] = field(default_factory=dict)
    _changed: dict[int, float] = field(default_factory=dict)
    _done: set[int] = field(default_factory=set)
    _errored: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._value = {rank: 0 for rank in self.peers}
        self._changed = {rank: self.started for rank in self.peers}

    def observe(self, rank: int, counter: int, now: float) -> None:
        """Record ``rank``'s counter as read at ``now`` (take ``now`` after the read returned)."""
        if counter >= FAILED_OFFSET:
            self._errored.add(rank)
        elif counter >= DONE_OFFSET:
            self._done.add(rank)
        if counter != self._value[rank]:
            self._value[rank] = counter
            self._changed[rank] = now

    def stale(self, now: float) -> list[int]:
        """Peers unchanged for ``timeout`` s as of ``now`` and not done.  Pass the time a read round
        *started*: every read in the round came after it, so an unchanged value proves silence up to
        ``now`` even if this process was itself paused during the round."""
        return [rank for rank in self.peers
                if rank not in self._done and now - self._changed[rank] >= self.timeout]

    def errored(self) -> list[int]:
        """Peers that left with an error (:meth:`Watchdog.abort`)."""
        return sorted(self._errored)

    def silence(self, rank: int, now: float) -> float:
        """Seconds since ``rank``'s counter last changed (or since watching began)."""
        return now - self._changed[rank]

    def heard_from(self, rank: int) -> bool:
        """Whether ``rank`` has heartbeaten at all since watching began."""
        return self._value[rank] != 0

    def all_done(self) -> bool:
        """Every peer has finished cleanly: nobody is left to wait for."""
        return self._done.issuperset(self.peers)


def _store_address(store: dist.Store) -> str | None:
    """``host:port`` of the TCPStore under any PrefixStores, or None for other stores."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return f"{store.host}:{store.port}"
    return None


def _run_bounded(fn: Callable[[], object], seconds: float) -> bool:
    """Run ``fn`` on a daemon thread for at most ``seconds``; True if it finished (it may block forever)."""
    worker = threading.Thread(target=fn, daemon=True, name="gnnscale-watchdog-bounded")
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


class Watchdog:
    """Heartbeat into a store and fail (or exit) when a peer rank or the store goes silent.

    Use as ``with Watchdog.connect(host, port, rank=r, world_size=n, prefix=p) as wd:`` around the
    training loop; ``with wd.guard():`` around collectives turns a bare gloo error into a
    :class:`PeerFailure` naming the rank. Detection takes at most ``timeout`` plus about two
    ``interval``\\ s.
    """

    def __init__(self, store: dist.Store, *, rank: int, world_size: int, timeout: float = 60.0,
                 interval: float = 1.0, exit_on_failure: bool = True, prefix: str | None = None,
                 store_owner: str | None = None) -> None:
        """``store``: best a connection of the watchdog's own (see :meth:`connect`): a TCPStore client
        serialises its operations, so sharing it with the main thread lets a blocked ``get`` there delay
        the heartbeats. ``prefix`` wraps it in a PrefixStore. ``store_owner`` says who hosts the store,
        for the message when it goes away (e.g. "the torchrun agent on node 0")."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"watchdog rank={rank}, world_size={world_size}: need world_size >= 1 and "
                             f"0 <= rank < world_size")
        self.config = WatchdogConfig(timeout=timeout, interval=interval, exit_on_failure=exit_on_failure)
        self.rank = rank
        self.world_size = world_size
        # PrefixStore joins with "/" itself: "a/" would give keys "a//hb/0".
        self.store = dist.PrefixStore(prefix.rstrip("/"), store) if prefix else store
        self.store_address = _store_address(store)
        self.store_owner = store_owner
        self.failure: str | None = None  # the message once a failure was detected
        self.failed_ranks: tuple[int, ...] = ()
        self._lock = threading.Lock()
        self._failed = threading.Event()
        self._stopping = threading.Event()
        self._mark: int | None = None  # what the pulse thread adds to this rank's counter as it stops
        self._op_started: float | None = None  # monotonic start of the store op in flight
        self._num_diagnosing = 0  # main threads inside diagnose(): they report, so do not _exit under them
        self._tracker: HeartbeatTracker | None = None
        self._threads: list[threading.Thread] = []
        self._stopped = False

    @classmethod
    def connect(cls, host: str, port: int, *, rank: int, world_size: int, prefix: str, timeout: float = 60.0,
                interval: float = 1.0, exit_on_failure: bool = True, store_owner: str | None = None) -> "Watchdog":
        """A watchdog on its own client connection to the TCPStore at ``host:port``, keys below ``prefix``."""
        if not prefix:
            raise ValueError("Watchdog.connect needs a non-empty prefix, e.g. f'gnnscale/{restart_count}/watchdog': "
                             "torchrun restarts reuse the store, and stale counters would look alive")
        client = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout))
        return cls(client, rank=rank, world_size=world_size, timeout=timeout, interval=interval,
                   exit_on_failure=exit_on_failure, prefix=prefix, store_owner=store_owner)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Watchdog":
        """Start the daemon heartbeat and monitor threads; returns ``self``."""
        if self._threads or self._stopped:
            raise RuntimeError("Watchdog.start() called twice: a watchdog runs once; create a new one")
        self._tracker = HeartbeatTracker(peers=[r for r in range(self.world_size) if r != self.rank],
                                         timeout=self.config.timeout, started=time.monotonic())
        if self.config.exit_on_failure:  # where this process runs: a peer on the same host can end it (see below)
            self.store.set(f"pid/{self.rank}", f"{socket.gethostname()} {os.getpid()} {_start_time(os.getpid())}")
        self._threads = [threading.Thread(target=self._pulse, daemon=True, name="gnnscale-watchdog-pulse"),
                         threading.Thread(target=self._monitor, daemon=True, name="gnnscale-watchdog-monitor")]
        for thread in self._threads:
            thread.start()
        # A daemon thread still inside a store op when the interpreter finalises aborts the process
        # ("terminate called without an active exception"): quiesce first if the caller never stops us.
        atexit.register(self._halt, None)
        return self

    def stop(self) -> None:
        """Mark this rank as finished cleanly (peers never flag it) and stop the threads."""
        self._halt(DONE_OFFSET)

    def abort(self) -> None:
        """Mark this rank as leaving with an error (peers stop at once, naming it) and stop the threads."""
        self._halt(FAILED_OFFSET)

    def _halt(self, mark: int | None) -> None:
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self._halt)
        self._mark = mark
        self._stopping.set()
        if self._threads:
            # The pulse thread writes the done mark itself, so no two store ops ever overlap.
            pulse = self._threads[0]
            pulse.join(self.config.timeout)
            if pulse.is_alive():
                self._write(f"gnnscale: rank {self.rank}: the watchdog could not reach the store within "
                            f"{self.config.timeout:g} s while stopping; peers may report this rank as failed")
        elif mark is not None:
            _run_bounded(lambda: self.store.add(f"hb/{self.rank}", mark), self.config.timeout)

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        # A rank leaving with an exception has not finished cleanly: its peers stop at once, naming it.
        self._halt(DONE_OFFSET if exc_type is None else FAILED_OFFSET)

    # ------------------------------------------------------------------ main-thread API
    def check(self) -> None:
        """Raise :class:`PeerFailure` if a failure was detected (poll it from the main thread)."""
        if self.failure is not None:
            raise PeerFailure(self.failure, self.failed_ranks)

    def diagnose(self, wait: float | None = None) -> str | None:
        """After a collective raised: wait up to ``wait`` s (default timeout + 2 intervals) for a silent
        peer; the failure message naming it, or None if every peer kept answering."""
        if not self._threads:
            raise RuntimeError("Watchdog.diagnose() needs a started watchdog: call start() or use it as a context "
                               "manager first")
        wait = self.config.timeout + 2 * self.config.interval if wait is None else wait
        with self._lock:
            self._num_diagnosing += 1
        try:
            if not self._stopped:
                self._failed.wait(wait)
            return self.failure
        finally:
            with self._lock:
                self._num_diagnosing -= 1

    @contextmanager
    def guard(self, wait: float | None = None) -> Iterator["Watchdog"]:
        """Run a block; a communication RuntimeError in it becomes a :class:`PeerFailure` when a peer is
        identified.  Other errors, and communication errors with every peer still answering, propagate
        unchanged."""
        self.check()
        try:
            yield self
        except RuntimeError as error:
            if isinstance(error, PeerFailure) or not is_communication_error(error):
                raise
            message = self.diagnose(wait)
            if message is None:
                raise
            raise PeerFailure(message, self.failed_ranks) from error

    # ------------------------------------------------------------------ threads
    def _op(self, key: str, amount: int) -> int:
        """One store ``add``, timed so the monitor can tell a hung store (TCPStore ops ignore its timeout)."""
        with self._lock:
            self._op_started = time.monotonic()
        value = self.store.add(key, amount)
        with self._lock:
            self._op_started = None
        return value

    def _pulse(self) -> None:
        """Heartbeat, read the peers' counters (``add(key, 0)``: ``get`` blocks on missing keys), judge them."""
        tracker = self._tracker
        assert tracker is not None
        try:
            while not self._stopping.is_set():
                round_started = time.monotonic()
                self._op(f"hb/{self.rank}", 1)
                for rank in tracker.peers:
                    counter = self._op(f"hb/{rank}", 0)
                    with self._lock:
                        tracker.observe(rank, counter, time.monotonic())
                with self._lock:
                    stale, errored = tracker.stale(round_started), tracker.errored()
                if errored:
                    self._fail(self._errored_message(errored), tuple(errored))
                    return
                if stale:
                    message = self._peer_message(stale, tracker, round_started)
                    self._fail(message + self._end_local_peers(stale), tuple(stale))
                    return
                self._stopping.wait(self.config.interval)
            if self._mark is not None:
                self._op(f"hb/{self.rank}", self._mark)
        except Exception as error:  # any store error: the connection is gone for good (no reconnect)
            with self._lock:
                self._op_started = None
                nobody_left = tracker.all_done()
            if not self._stopping.is_set() and not nobody_left:
                self._fail(self._store_message(f"failed ({type(error).__name__}: {error})"), ())

    def _monitor(self) -> None:
        """Fail when one store op hangs for ``timeout`` s: a stopped store host never answers nor closes."""
        last_tick = time.monotonic()
        while not self._stopping.wait(self.config.interval):
            now = time.monotonic()
            paused = now - last_tick > self.config.timeout / 2  # this process itself was suspended: not their fault
            last_tick = now
            with self._lock:
                in_flight = None if self._op_started is None else now - self._op_started
            if in_flight is not None and in_flight >= self.config.timeout and not paused:
                self._fail(self._store_message(f"has not answered for {in_flight:.0f} s"), ())
                return
            if self._failed.is_set():
                return

    # ------------------------------------------------------------------ failure
    def _peer_message(self, stale: list[int], tracker: HeartbeatTracker, now: float) -> str:
        silence = max(tracker.silence(rank, now) for rank in stale)
        never = [rank for rank in stale if not tracker.heard_from(rank)]
        subject = (f"rank {stale[0]} of {self.world_size} has" if len(stale) == 1 else
                   f"ranks {', '.join(map(str, stale))} of {self.world_size} have")
        note = f" (never heard from: {', '.join(map(str, never))})" if never else ""
        return (f"gnnscale: {subject} not answered for {silence:.0f} s (killed, crashed or hung){note}; "
                f"stopping rank {self.rank}")

    def _end_local_peers(self, stale: list[int]) -> str:
        """SIGKILL the silent peers that run on this host; what to add to the failure message.

        A stopped rank (SIGSTOP, or a machine paused) cannot act on torchrun's SIGTERM, and torchrun waits 30 s
        before its SIGKILL: without this the job would end ``--failure-timeout`` + 30 s after the rank's last
        sign of life.  Only when this process is about to exit anyway (``exit_on_failure``), and only a process
        whose host, pid and start time match what the peer registered (never a reused pid)."""
        if not self.config.exit_on_failure:
            return ""
        ended = []
        for rank in stale:
            with suppress(Exception):  # the store or the process may be gone: torchrun's own cleanup remains
                if self._tracker is None or not self._tracker.heard_from(rank):  # a get would wait for its key
                    continue
                host, pid, started = self.store.get(f"pid/{rank}").decode().split(" ")
                if host == socket.gethostname() and started and _start_time(int(pid)) == started:
                    os.kill(int(pid), signal.SIGKILL)
                    ended.append(f"{rank} (pid {pid})")
        return f"; killed silent rank {', '.join(ended)} on this host, so the job ends now" if ended else ""

    def _errored_message(self, errored: list[int]) -> str:
        subject = f"rank {errored[0]}" if len(errored) == 1 else f"ranks {', '.join(map(str, errored))}"
        return (f"gnnscale: {subject} of {self.world_size} stopped with an error (its own line above says why); "
                f"stopping rank {self.rank}")

    def _store_message(self, what: str) -> str:
        where = f" at {self.store_address}" if self.store_address else ""
        owner = self.store_owner or "the process that created it (rank 0, or the torchrun agent of the master node)"
        return (f"gnnscale: the rendezvous store{where}, hosted by {owner}, {what}; that process probably died "
                f"or hangs; stopping rank {self.rank}")

    def _fail(self, message: str, ranks: tuple[int, ...]) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure, self.failed_ranks = message, ranks
            main_thread_reports = self._num_diagnosing > 0
        exits = self.config.exit_on_failure and not main_thread_reports
        if exits:  # otherwise the main thread raises PeerFailure with the message: one line, not two
            self._write(message)
        self._failed.set()
        if exits:
            # Flushing may block on a stream lock the stuck main thread holds: bound it.
            _run_bounded(lambda: [stream.flush() for stream in (sys.stdout, sys.stderr)], 1.0)
            os._exit(EXIT_PEER_FAILURE)

    @staticmethod
    def _write(message: str) -> None:
        # os.write: sys.stderr's lock may be held by the main thread, stuck mid-write.
        with suppress(OSError):
            os.write(2, (message + "\n").encode())


def _start_time(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, Linux), or "" where unknown: with the pid, an
    identity that a reused pid does not share."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""
