"""An emulated cluster on one Linux host: K network namespaces as K machines behind rate-limited links.

Each "machine" is a network namespace joined to a bridge in the root namespace by a veth pair, with
an address of a private /24 that exists only on that bridge and in those namespaces (the bridge has
no address and nothing routes there).  Each namespace's own egress is shaped by a token bucket
(``tc qdisc add dev eth0 root tbf rate R burst B latency 50ms``): every byte a machine sends crosses a
link of rate R.  One ``torchrun`` agent runs per namespace (``--nnodes K --rdzv-backend c10d`` to
machine 0's address), pinned with ``taskset`` to that machine's own cores: real multi-node torchrun,
gloo over TCP between namespaces.  A "slow machine" runs under a CPU quota (a cgroup: half its cores'
time by default), or where no cgroup is writable, shares its cores with a busy process.  A machine
with a memory limit (``memory_mb``) runs in a memory cgroup (v2 ``memory.max`` where the v2 memory
controller is enabled, else v1 ``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``, so that
it cannot swap past its limit); a run whose processes the kernel kills there is reported as out of
memory (the group's ``oom_kill`` counter), and the harness stops the other machines as for any failure.

Namespaces, links and processes are removed on every exit path (an exception, Ctrl-C, SIGTERM);
leftovers of a harness killed with SIGKILL are removed by the next one (names carry the owner's pid).
Needs root, ``ip`` (iproute2), ``tc`` and ``taskset``: :func:`check_host` says which is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

RATE_PATTERN = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$", re.IGNORECASE)
RDZV_PORT = 29400
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup/unified")
CGROUP_MEMORY_V1 = Path("/sys/fs/cgroup/memory")
_UNITS = {None: 1, "k": 10**3, "m": 10**6, "g": 10**9}


class ClusterError(RuntimeError):
    """The host cannot make the emulated cluster (the message says what is missing)."""


def rate_bits(rate: str) -> int:
    """Bits per second of a tc rate such as ``10gbit``, ``1gbit``, ``100mbit``.

    Raises:
        ValueError: not of the form <number>[k|m|g]bit.
    """
    match = RATE_PATTERN.match(rate.strip())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"link rate {rate!r} is not a positive tc rate; write e.g. 10gbit, 1gbit or 100mbit")
    return int(float(match.group(1)) * _UNITS[match.group(2) and match.group(2).lower()])


def burst_bytes(rate: str) -> int:
    """The token bucket's depth: 64 KiB, or 1 ms of traffic at fast rates (a shallower bucket cannot
    refill fast enough between timer ticks to reach the rate)."""
    return max(64 * 1024, rate_bits(rate) // 8 // 1000)


def check_host() -> None:
    """Raise :class:`ClusterError` naming what this host lacks to make namespaces and links."""
    if sys.platform != "linux":
        raise ClusterError("the emulated cluster needs Linux network namespaces; run it on a Linux host")
    if os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root to create network namespaces and links; run it as root "
                           "(e.g. with sudo)")
    missing = [tool for tool in ("ip", "tc", "taskset") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"the emulated cluster needs {' and '.join(missing)} on PATH; install iproute2 "
                           f"(ip, tc) and util-linux (taskset)")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise ClusterError(f"'ip netns' does not work here ({probe.stderr.strip() or probe.returncode}); the "
                           f"emulated cluster needs network namespaces")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ClusterError(f"'ip {' '.join(args)}' failed: {done.stderr.strip()}")
    return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete namespaces and bridges left by harnesses that no longer run; returns their names."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = re.fullmatch(r"gnnscale-(\d+)-m\d+", name)
        if match and not _pid_alive(int(match.group(1))):
            _kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    # A deleted namespace lingers while its sockets drain (a peer's half-sent data, TIME_WAIT), and
    # with it the veth pair: the root ends are deleted by name.
    for match in re.finditer(r"^\d+: (gsc(\d+)(?:br|v\d+))[:@]", _ip("-o", "link", "show", check=False).stdout, re.M):
        if not _pid_alive(int(match.group(2))):
            _ip("link", "del", match.group(1), check=False)
            removed.append(match.group(1))
    for root in (CGROUP_V1, CGROUP_V2, CGROUP_MEMORY_V1, *filter(None, [_own_v1_memory_group()])):
        for group in root.glob("gnnscale-*-m*") if root.is_dir() else ():
            match = re.fullmatch(r"gnnscale-(\d+)-m\d+", group.name)
            if match and not _pid_alive(int(match.group(1))) and group.is_dir():
                _remove_group(group)
                removed.append(str(group))
    return removed


def _kill_namespace_processes(namespace: str) -> None:
    pids = _ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _free_subnet() -> str:
    """``10.213.X`` for the first X whose /24 no route of this host covers."""
    routes = _ip("-4", "route", "show", "table", "all", check=False).stdout
    for x in range(1, 255):
        if f"10.213.{x}." not in routes:
            return f"10.213.{x}"
    raise ClusterError("no free 10.213.X.0/24 subnet for the emulated cluster; remove stale namespaces with "
                       "'ip netns list' / 'ip netns del'")


@dataclass
class ClusterSpec:
    """What to emulate.

    Attributes:
        machines: K, the namespaces (each one torchrun agent).
        rate: every machine's egress rate, a tc rate (``10gbit``, ``1gbit``, ``100mbit``); ``None`` = unshaped.
        cores_per_machine: host cores pinned to each machine, machine i taking cores ``[i*c, (i+1)*c)``
            modulo the host's cores.  The machines together may not want more cores than the host has
            (:meth:`cores_wanted`): machines sharing a core would not run at the speed they emulate.  Only
            slow machines, each held to a share of its cores, share them.
        nproc_per_machine: ranks per machine (``--nproc-per-node``).
        slow_machines: machines made slow: a CPU quota of ``slow_factor`` of their cores (a cgroup), or
            where no cgroup CPU controller is writable, a busy process sharing their cores.
        slow_factor: the share of their cores slow machines get (0 < f < 1).
        memory_mb: a memory limit in MiB for every machine (one number) or per machine (a tuple of K, 0 =
            none); ``None`` = no limit.  Every process of a limited machine (its agent and ranks) is held
            to it by a memory cgroup, swap included.
    """

    machines: int = 2
    rate: str | None = "10gbit"
    cores_per_machine: int = 1
    nproc_per_machine: int = 1
    slow_machines: tuple[int, ...] = ()
    slow_factor: float = 0.5
    memory_mb: int | tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.slow_factor < 1:
            raise ValueError(f"slow factor {self.slow_factor} must be between 0 and 1, e.g. 0.5 for half speed")
        if self.machines < 1 or self.cores_per_machine < 1 or self.nproc_per_machine < 1:
            raise ValueError("machines, cores per machine and processes per machine must be >= 1")
        if self.rate is not None:
            rate_bits(self.rate)
        bad = [m for m in self.slow_machines if not 0 <= m < self.machines]
        if bad:
            raise ValueError(f"slow machine {bad[0]} does not exist: machines are 0..{self.machines - 1}")
        self._check_memory()
        host = os.cpu_count() or 1
        if self.cores_wanted() > host + 1e-9:
            fit = host // self.machines
            fix = f"use --cores-per-machine {fit} or fewer" if fit else f"use --machines {host} or fewer"
            slow = f" ({len(set(self.slow_machines))} slow at {self.slow_factor:g} of theirs)" if self.slow_machines \
                else ""
            raise ValueError(f"--cores-per-machine {self.cores_per_machine} x --machines {self.machines}{slow} wants "
                             f"{self.cores_wanted():g} cores, but this host has {host}: machines pinned to shared cores "
                             f"would not run at the speed they emulate; {fix}, or make machines slow "
                             f"(--slow-machines) to give each a share of a core")

    def _check_memory(self) -> None:
        limits = self.memory_mb
        if isinstance(limits, tuple) and len(limits) != self.machines:
            raise ValueError(f"{len(limits)} memory limit(s) for {self.machines} machines: give one MiB number for "
                             f"all, or one per machine (0 = no limit), e.g. --machine-memory-mb 1536")
        values = limits if isinstance(limits, tuple) else () if limits is None else (limits,)
        if any(v < 0 or (v == 0 and not isinstance(limits, tuple)) for v in values):
            raise ValueError(f"machine memory limit {limits} MiB must be positive (0 = no limit only in a per-machine "
                             f"list), e.g. --machine-memory-mb 1536")

    def memory_limit_mb(self, machine: int) -> int | None:
        """Machine ``machine``'s memory limit in MiB, ``None`` when it has none."""
        limit = self.memory_mb[machine] if isinstance(self.memory_mb, tuple) else self.memory_mb
        return limit or None

    def cores_wanted(self) -> float:
        """Host cores the machines are promised: ``cores_per_machine`` each, a slow machine's scaled by
        ``slow_factor`` (its CPU quota), so that e.g. 4 slow machines of half a core fit 2 cores."""
        slow = len(set(self.slow_machines))
        return self.cores_per_machine * (self.machines - slow + slow * self.slow_factor)

    def cores(self, machine: int) -> list[int]:
        total = os.cpu_count() or 1
        first = machine * self.cores_per_machine
        return sorted({(first + c) % total for c in range(self.cores_per_machine)})


@dataclass
class MachineRun:
    """One machine's torchrun agent: its exit code, seconds, log file, and whether the harness stopped it
    (after another machine failed, or past the timeout)."""

    machine: int
    returncode: int
    seconds: float
    log: Path
    stopped: bool = False
    memory_mb: int | None = None
    oom_kills: int = 0
    """Processes of this machine the kernel killed for going over ``memory_mb`` during this run."""
    peak_mb: float | None = None
    """The most memory this machine's processes held at once during this run (its memory group's peak: anonymous
    memory and the page cache charged to it), where it has a memory limit."""

    @property
    def out_of_memory(self) -> bool:
        return self.oom_kills > 0

    def describe_failure(self) -> str:
        """One line: the machine and how it ended (OUT OF MEMORY with its limit, or its exit code)."""
        if self.out_of_memory:
            return (f"machine {self.machine} OUT OF MEMORY: its processes went over its {self.memory_mb} MiB limit "
                    f"({self.oom_kills} killed by the kernel)")
        return f"machine {self.machine} exited {self.returncode}"


@dataclass
class EmulatedCluster:
    """Context manager: makes the namespaces and links on enter, removes everything on exit.

    ``run(command)`` launches ``torchrun ... command`` on every machine and waits for all of them.
    """

    spec: ClusterSpec
    log_dir: Path
    echo: IO[str] | None = None
    tag: str = field(init=False)
    subnet: str = field(init=False, default="")
    _processes: list[subprocess.Popen] = field(init=False, default_factory=list)
    _made: list[str] = field(init=False, default_factory=list)
    _groups: dict[int, Path] = field(init=False, default_factory=dict)
    """Slow machine -> the cgroup holding its processes to their CPU quota (none where not writable)."""
    _memory_groups: dict[int, Path] = field(init=False, default_factory=dict)
    """Machine with a memory limit -> the memory cgroup holding its processes to it."""

    def __post_init__(self) -> None:
        self.tag = str(os.getpid())

    # ------------------------------------------------------------------ topology
    def namespace(self, machine: int) -> str:
        return f"gnnscale-{self.tag}-m{machine}"

    def address(self, machine: int) -> str:
        return f"{self.subnet}.{machine + 2}"

    @property
    def bridge(self) -> str:
        return f"gsc{self.tag}br"

    def __enter__(self) -> EmulatedCluster:
        check_host()
        remove_stale()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            self._make_links()
            self._make_cpu_groups()
            self._make_memory_groups()
        except BaseException:
            self.close()
            raise
        return self

    def _make_links(self) -> None:
        self.subnet = _free_subnet()
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(self.bridge)
        _ip("link", "set", self.bridge, "up")
        for m in range(self.spec.machines):
            ns, veth = self.namespace(m), f"gsc{self.tag}v{m}"
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._made.append(veth)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(m)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if self.spec.rate is not None:
                shaped = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                                         self.spec.rate, "burst", str(burst_bytes(self.spec.rate)), "latency", "50ms"],
                                        capture_output=True, text=True)
                if shaped.returncode != 0:
                    raise ClusterError(f"tc could not shape {ns}'s link to {self.spec.rate}: {shaped.stderr.strip()}")

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every process, then delete namespaces (their veth ends go with them) and the bridge."""
        for process in self._processes:
            _stop_group(process)
        self._processes.clear()
        for name in reversed(self._made):
            if name.startswith("gnnscale-"):
                _kill_namespace_processes(name)
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        self._made.clear()
        for group in [*self._groups.values(), *self._memory_groups.values()]:
            _remove_group(group)
        self._groups.clear()
        self._memory_groups.clear()
        for sig, handler in getattr(self, "_previous", {}).items():
            signal.signal(sig, handler)
        self._previous = {}

    # ------------------------------------------------------------------ processes
    def in_machine(self, machine: int, command: Sequence[str]) -> list[str]:
        """``command`` run in machine ``machine``'s namespace, pinned to its cores."""
        cores = ",".join(map(str, self.spec.cores(machine)))
        pinned = ["taskset", "-c", cores, *command]
        group = self._memory_groups.get(machine)
        if group is not None:  # the machine's own processes see its memory limit, as in a container
            pinned = ["sh", "-c", f'{cgroup_mount_commands(group)} && exec "$@"', "sh", *pinned]
        return ["ip", "netns", "exec", self.namespace(machine), *pinned]

    def torchrun_command(self, machine: int, command: Sequence[str], run_id: str) -> list[str]:
        spec = self.spec
        return self.in_machine(machine, [
            sys.executable, "-m", "torch.distributed.run", f"--nnodes={spec.machines}",
            f"--nproc-per-node={spec.nproc_per_machine}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.address(0)}:{RDZV_PORT}", f"--rdzv-id={run_id}",
            f"--rdzv-conf=is_host={int(machine == 0)}", f"--local-addr={self.address(machine)}",
            "--max-restarts=0", *command])

    def machine_env(self) -> dict[str, str]:
        threads = str(self.spec.cores_per_machine)
        # gloo and tensorpipe pick the interface by name: eth0 is the shaped link in every namespace.
        return {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "TP_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": threads,
                "PYTHONUNBUFFERED": "1"}

    def run(self, command: Sequence[str], *, timeout: float, name: str = "run") -> list[MachineRun]:
        """Launch ``torchrun <rendezvous options> command`` on every machine and wait for all.

        A machine that fails stops the others (its peers would wait out their timeouts); past
        ``timeout`` seconds every machine is stopped and the run reported with exit code 124.
        """
        busy = [self._start(self.in_machine(m, [sys.executable, "-c", "while True: pass"]), None)
                for m in self.spec.slow_machines if m not in self._groups]
        run_id = f"{name}-{self.tag}-{time.monotonic_ns()}"
        logs = [self.log_dir / f"{name}-machine{m}.log" for m in range(self.spec.machines)]
        before = {m: oom_kills(group) for m, group in self._memory_groups.items()}
        for group in self._memory_groups.values():
            reset_memory_peak(group)
        start = time.perf_counter()
        agents = [self._start(self.torchrun_command(m, command, run_id), logs[m], prefix=f"[m{m}] ",
                              groups=[g for g in (self._groups.get(m), self._memory_groups.get(m)) if g is not None])
                  for m in range(self.spec.machines)]
        seconds, stopped = [0.0] * len(agents), set()
        codes = self._wait(agents, seconds, stopped, start, timeout)
        for process in busy + agents:
            _stop_group(process)
        killed = {m: oom_kills(group) - before[m] for m, group in self._memory_groups.items()}
        peaks = {m: memory_peak_mb(group) for m, group in self._memory_groups.items()}
        return [MachineRun(m, codes[m], seconds[m], logs[m], m in stopped, self.spec.memory_limit_mb(m),
                           killed.get(m, 0), peaks.get(m)) for m in range(len(agents))]

    def _wait(self, agents: list[subprocess.Popen], seconds: list[float], stopped: set[int], start: float,
              timeout: float) -> list[int]:
        codes: list[int | None] = [None] * len(agents)
        while any(c is None for c in codes):
            for m, process in enumerate(agents):
                if codes[m] is None and process.poll() is not None:
                    codes[m], seconds[m] = process.returncode, time.perf_counter() - start
            if any(c not in (None, 0) for c in codes) or time.perf_counter() - start > timeout:
                late = 124 if time.perf_counter() - start > timeout else -signal.SIGTERM
                for m, process in enumerate(agents):
                    if codes[m] is None:
                        _stop_group(process)
                        stopped.add(m)
                        codes[m], seconds[m] = late, time.perf_counter() - start
            time.sleep(0.05)
        return [int(c) for c in codes]

    def _make_cpu_groups(self) -> None:
        """A CPU-quota cgroup (v1 ``cpu`` controller, else v2 ``cpu.max``) per slow machine, where writable."""
        for m in self.spec.slow_machines:
            # 10 ms periods: a step of tens of ms sees the quota several times, not a 100 ms burst of full speed.
            period = 10_000
            quota = int(period * self.spec.cores_per_machine * self.spec.slow_factor)
            for root, write in ((CGROUP_V1, lambda g: _write_v1_quota(g, quota, period)),
                                (CGROUP_V2, lambda g: (g / "cpu.max").write_text(f"{quota} {period}"))):
                group = root / f"gnnscale-{self.tag}-m{m}"
                try:
                    group.mkdir()
                except OSError:
                    continue
                try:
                    write(group)
                except OSError:
                    group.rmdir()
                    continue
                self._groups[m] = group
                break

    def _make_memory_groups(self) -> None:
        """A memory cgroup per machine with a limit; a one-line ClusterError where none can be made."""
        for m in range(self.spec.machines):
            limit = self.spec.memory_limit_mb(m)
            if limit is not None:
                self._memory_groups[m] = make_memory_group(f"gnnscale-{self.tag}-m{m}", limit * 2**20)

    def _start(self, command: list[str], log: Path | None, prefix: str = "",
               groups: Sequence[Path] = ()) -> subprocess.Popen:
        if groups:  # joins the cgroups before exec, so every child it starts is in them too
            joins = " && ".join(f'echo $$ > "{group}/cgroup.procs"' for group in groups)
            command = ["sh", "-c", f'{joins} && exec "$@"', "sh", *command]
        out = subprocess.PIPE if log is not None else subprocess.DEVNULL
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.machine_env(),
                                   start_new_session=True, text=True)
        self._processes.append(process)
        if log is not None:
            threading.Thread(target=_copy_lines, args=(process.stdout, log, self.echo, prefix), daemon=True).start()
        return process


def _copy_lines(stream: IO[str], log: Path, echo: IO[str] | None, prefix: str) -> None:
    with open(log, "w") as handle:
        for line in stream:
            handle.write(line)
            handle.flush()
            if echo is not None:
                echo.write(prefix + line)
                echo.flush()


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the process's session, SIGKILL it after 5 s."""
    if process.poll() is None:
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(grace)
                break
            except subprocess.TimeoutExpired:
                continue
    try:  # the session may outlive its leader: stragglers of a finished agent
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _write_v1_quota(group: Path, quota: int, period: int) -> None:
    (group / "cpu.cfs_period_us").write_text(str(period))
    (group / "cpu.cfs_quota_us").write_text(str(quota))


def _v2_memory_enabled() -> bool:
    try:
        return "memory" in (CGROUP_V2 / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def _own_v1_memory_group() -> Path | None:
    """This process's own v1 memory cgroup (groups made inside it stay under its limits), if any."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and path.strip("/"):
            return CGROUP_MEMORY_V1 / path.strip("/")
    return None


def _write_memory_limit(group: Path, limit: int) -> None:
    if (group / "memory.max").exists():  # v2: the limit, and no swap beyond it
        (group / "memory.max").write_text(str(limit))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
        return
    (group / "memory.limit_in_bytes").write_text(str(limit))
    if (group / "memory.memsw.limit_in_bytes").exists():  # memory + swap: not a byte more than the limit
        (group / "memory.memsw.limit_in_bytes").write_text(str(limit))


def make_memory_group(name: str, limit: int) -> Path:
    """A memory cgroup ``name`` limited to ``limit`` bytes: v2 where its memory controller is enabled, else
    v1 (inside this process's own memory group, else at the root).

    Raises:
        ClusterError: no memory controller is writable here.
    """
    parents = [CGROUP_V2] if _v2_memory_enabled() else []
    parents += [p for p in (_own_v1_memory_group(), CGROUP_MEMORY_V1) if p is not None]
    for parent in parents:
        group = parent / name
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            _write_memory_limit(group, limit)
        except OSError:
            group.rmdir()
            continue
        return group
    raise ClusterError(f"no writable cgroup memory controller here (v2 memory.max in {CGROUP_V2}, v1 "
                       f"{CGROUP_MEMORY_V1}): machines cannot be given a memory limit; run as root on a host with "
                       f"the memory controller, or drop --machine-memory-mb")


def cgroup_mount_commands(group: Path) -> str:
    """Shell commands that mount ``group``'s cgroup hierarchy where the host has it, inside a machine's
    namespace: ``ip netns exec`` mounts a fresh /sys there, whose /sys/fs/cgroup is empty, so a rank could not
    read its machine's memory limit (:func:`gnnscale.memory.available_bytes` sizes ``--cache-mb auto`` by it).
    They affect that namespace's own mounts only."""
    v2 = group.is_relative_to(CGROUP_V2)
    point = CGROUP_V2 if v2 else CGROUP_MEMORY_V1
    kind = "-t cgroup2 cgroup2" if v2 else "-t cgroup -o memory cgroup"
    return f"mount -t tmpfs cgroup /sys/fs/cgroup && mkdir -p {point} && mount {kind} {point}"


def oom_kills(group: Path) -> int:
    """Processes the kernel has killed in ``group`` for going over its limit (v2 ``memory.events``, v1
    ``memory.oom_control``; v1 kernels without the count: 1 when the limit was hit, ``memory.failcnt``)."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (group / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    try:
        return int(int((group / "memory.failcnt").read_text()) > 0)
    except (OSError, ValueError):
        return 0


def reset_memory_peak(group: Path) -> None:
    """Start ``group``'s peak afresh (v1 ``memory.max_usage_in_bytes``; a v2 group's ``memory.peak`` counts from
    its creation, and each cluster makes its own)."""
    try:
        (group / "memory.max_usage_in_bytes").write_text("0")
    except OSError:
        pass


def memory_peak_mb(group: Path) -> float | None:
    """``group``'s peak memory in MiB (v2 ``memory.peak``, v1 ``memory.max_usage_in_bytes``), None where the
    kernel keeps none."""
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        try:
            return int((group / name).read_text()) / 2**20
        except (OSError, ValueError):
            continue
    return None


def _remove_group(group: Path) -> None:
    """Remove a cgroup once its processes are gone (they were stopped just before)."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
