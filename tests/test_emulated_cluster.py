"""The emulated cluster: rates, refusals, and real runs of two namespaces behind shaped links.

The real runs need root and ``ip netns`` (they skip with the reason elsewhere): two torchrun
agents in two namespaces all-reduce over a 100 Mbit/s link, and the time it takes shows the
shaping; a failing machine stops its peer; Ctrl-C removes every namespace and process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "emulated_cluster.py"
sys.path.insert(0, str(ROOT / "scripts"))  # the harness is benchmark code, outside the installed package
from bench import emulated  # noqa: E402
from bench.emulated import ClusterError, ClusterSpec, burst_bytes, check_host, rate_bits  # noqa: E402


def host_problem() -> str | None:
    try:
        check_host()
    except ClusterError as error:
        return str(error)
    return None


needs_netns = pytest.mark.skipif(host_problem() is not None, reason=f"no emulated cluster here: {host_problem()}")

# Rank 0 sends MIB MiB to rank 1 twice (a warm-up, then timed), then exits with the code in argv.
TRANSFER = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank, mib = dist.get_rank(), int(sys.argv[1])
    from gnnscale.memory import memory_limit_bytes
    print(f"rank {rank} sees a limit of {memory_limit_bytes()} bytes", flush=True)
    x = torch.zeros(mib * 2**18)
    for timed in (False, True):
        dist.barrier()
        start = time.perf_counter()
        dist.send(x, 1) if rank == 0 else dist.recv(x, 0)
        dist.barrier()
    print(f"rank {rank} addr {os.environ['MASTER_ADDR']} seconds {time.perf_counter() - start:.3f}", flush=True)
    code = int(sys.argv[2]) if rank == 1 and len(sys.argv) > 2 else 0
    if code:
        sys.exit(code)
    if rank == 0 and len(sys.argv) > 2:
        time.sleep(300)  # the failing peer must stop this one
    dist.destroy_process_group()
""")


def our_namespaces(pid: int) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(f"gnnscale-{pid}-")]


def our_links(pid: int) -> list[str]:
    listing = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line.split()[1] for line in listing.splitlines() if f" gsc{pid}" in line]


def harness(tmp_path: Path, *args: str) -> subprocess.Popen:
    script = tmp_path / "transfer.py"
    script.write_text(TRANSFER)
    return subprocess.Popen([sys.executable, str(SCRIPT), "--log-dir", str(tmp_path / "logs"), "--rate", "100mbit",
                             "--timeout", "120", "--", str(script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def test_rates_and_bursts():
    assert rate_bits("10gbit") == 10**10 and rate_bits("100mbit") == 10**8 and rate_bits("2.5Gbit") == 25 * 10**8
    assert burst_bytes("100mbit") == 64 * 1024  # the 64 KiB on slow links
    assert burst_bytes("10gbit") == 1_250_000  # 1 ms of traffic on fast ones
    for bad in ("fast", "10 gbit", "0mbit", "10gb"):
        with pytest.raises(ValueError, match="not a positive tc rate"):
            rate_bits(bad)


def test_spec_checks_machines_and_pins_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    spec = ClusterSpec(machines=2, cores_per_machine=2)
    assert spec.cores(0) == [0, 1] and spec.cores(1) == [2, 3]
    assert ClusterSpec(machines=3).cores(2) == [2]
    with pytest.raises(ValueError, match="slow machine 2 does not exist"):
        ClusterSpec(machines=2, slow_machines=(2,))


def test_spec_refuses_more_cores_than_the_host_has(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(ValueError, match=r"^--cores-per-machine 8 x --machines 2 wants 16 cores, but this host has 2: "
                                         r"machines pinned to shared cores would not run at the speed they emulate; "
                                         r"use --cores-per-machine 1 or fewer"):
        ClusterSpec(machines=2, cores_per_machine=8)
    with pytest.raises(ValueError, match=r"^--cores-per-machine 1 x --machines 4 \(2 slow at 0.5 of theirs\) wants 3 "
                                         r"cores, but this host has 2: .*; use --machines 2 or fewer"):
        ClusterSpec(machines=4, slow_machines=(0, 1))
    # What bench_cluster's rank-count runs take: 4 machines held to half a core each fill 2 cores.
    assert ClusterSpec(machines=4, slow_machines=(0, 1, 2, 3)).cores_wanted() == 2
    assert ClusterSpec(machines=2).cores_wanted() == 2


def test_cli_refuses_more_cores_than_the_host_has_before_any_namespace(tmp_path):
    """Without ip on PATH, and for a user who is not root, check_host would refuse first: the core count is
    checked before the host, so before anything is made."""
    host = os.cpu_count()
    done = subprocess.run([sys.executable, str(SCRIPT), "--machines", "1", "--cores-per-machine", str(host + 1),
                           "--log-dir", str(tmp_path / "logs"), "--", "x.py"], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(tmp_path)}, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"error: --cores-per-machine {host + 1} x --machines 1 wants {host + 1} cores, but "
                               f"this host has {host}: "), lines[0]
    assert not (tmp_path / "logs").exists() and done.stdout == ""


def test_refuses_without_root_in_one_line(monkeypatch):
    monkeypatch.setattr(emulated.os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        check_host()


def test_cli_refuses_a_host_without_ip_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--", "x.py"], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(tmp_path)}, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the emulated cluster needs"), done.stderr


def test_cli_refuses_a_bad_rate(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--rate", "fast", "--", "x.py"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "not a positive tc rate" in done.stderr


@needs_netns
def test_two_machines_transfer_at_the_shaped_rate_and_leave_nothing(tmp_path):
    mib = 4
    process = harness(tmp_path, str(mib))
    out, err = process.communicate(timeout=180)
    assert process.returncode == 0, err + out
    times = [float(line.split()[-1]) for line in out.splitlines() if " seconds " in line]
    assert len(times) == 2, out
    # 4 MiB at 100 Mbit/s take 0.34 s; unshaped veth moves them in a few ms.
    assert min(times) >= 0.8 * mib * 2**20 * 8 / 1e8, out
    assert "addr 10.213." in out, out  # rendezvous and gloo ran over the namespaces' own addresses
    assert not our_namespaces(process.pid) and not our_links(process.pid)


@needs_netns
def test_a_failing_machine_stops_the_other(tmp_path):
    start = time.perf_counter()
    process = harness(tmp_path, "1", "3")
    out, err = process.communicate(timeout=180)
    # torchrun's agent exits 1 whatever its worker's code (3 here, in the agent's log).
    assert process.returncode == 1, err + out
    assert "machine 1 exited 1" in err and "exitcode  : 3" in out
    assert time.perf_counter() - start < 120  # rank 0 sleeps 300 s unless stopped
    assert not our_namespaces(process.pid) and not our_links(process.pid)


@needs_netns
def test_ctrl_c_removes_namespaces_links_and_processes(tmp_path):
    process = harness(tmp_path, "400")  # 400 MiB at 100 Mbit/s: still running when interrupted
    deadline = time.monotonic() + 60
    while len(our_namespaces(process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(our_namespaces(process.pid)) == 2
    time.sleep(3)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == "error: interrupted; the emulated cluster was removed"
    assert not our_namespaces(process.pid) and not our_links(process.pid)
    survivors = subprocess.run(["pgrep", "-f", str(tmp_path / "transfer.py")], capture_output=True, text=True)
    assert survivors.stdout.strip() == ""


SPIN = textwrap.dedent("""
    import time, torch.distributed as dist
    dist.init_process_group("gloo")
    start, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - start < 2:
        pass
    print(f"rank {dist.get_rank()} cpu share {(time.process_time() - cpu) / (time.perf_counter() - start):.2f}",
          flush=True)
    # The cpu cgroup (v1) this rank runs in (its quota files are not visible from the namespace's /sys).
    group = next((line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup")
                  if line.split(":")[1] in ("cpu", "cpu,cpuacct")), "none")
    print(f"rank {dist.get_rank()} cgroup {group}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")


@needs_netns
def test_a_slow_machine_gets_half_a_core(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text(SPIN)
    done = subprocess.run([sys.executable, str(SCRIPT), "--log-dir", str(tmp_path / "logs"), "--slow-machines", "1",
                           "--timeout", "120", "--", str(script)], capture_output=True, text=True, cwd=ROOT,
                          timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout
    shares = {int(line.split()[2]): float(line.split()[-1]) for line in done.stdout.splitlines() if "cpu share" in line}
    groups = {int(line.split()[2]): line.split()[-1] for line in done.stdout.splitlines() if " cgroup " in line}
    if emulated.CGROUP_V1.is_dir() and os.access(emulated.CGROUP_V1, os.W_OK):  # the quota's cgroup, machine 1 only
        assert groups[0] == "/" and groups[1].startswith("/gnnscale-") and groups[1].endswith("-m1"), done.stdout
    # Capped at about half its core (load elsewhere can only lower it).
    assert shares[1] < 0.6, done.stdout
    leftovers = [p for root in (emulated.CGROUP_V1, emulated.CGROUP_V2) if root.is_dir()
                 for p in root.glob("gnnscale-*")]
    assert not leftovers


@pytest.mark.skipif(not (emulated.CGROUP_V1.is_dir() and os.access(emulated.CGROUP_V1, os.W_OK)),
                    reason="no writable cgroup v1 cpu controller here")
def test_a_slow_machines_cgroup_holds_half_its_cores_in_10_ms_periods(tmp_path):
    cluster = emulated.EmulatedCluster(ClusterSpec(machines=2, slow_machines=(1,)), tmp_path)
    try:
        cluster._make_cpu_groups()
        group = cluster._groups[1]
        assert 0 not in cluster._groups
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "5000"
        assert (group / "cpu.cfs_period_us").read_text().strip() == "10000"
    finally:
        cluster.close()
    assert not group.exists()


# Rank 1 holds MIB MiB (touched, MiB by MiB), then both ranks train a linear model for 50 all-reduced steps.
ALLOCATE_AND_TRAIN = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank, mib = dist.get_rank(), int(sys.argv[1])
    from gnnscale.memory import memory_limit_bytes
    print(f"rank {rank} sees a limit of {memory_limit_bytes()} bytes", flush=True)
    held = [torch.ones(2**18) for _ in range(mib)] if rank == 1 else []
    print(f"rank {rank} holds {len(held)} MiB", flush=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, 16)
    for step in range(50):
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
    print(f"rank {rank} final loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()
""")


def memory_group_problem() -> str | None:
    if host_problem() is not None:
        return host_problem()
    try:
        emulated._remove_group(emulated.make_memory_group(f"gnnscale-{os.getpid()}-probe", 2**30))
    except ClusterError as error:
        return str(error)
    return None


needs_memory_groups = pytest.mark.skipif(memory_group_problem() is not None,
                                         reason=f"no memory-limited machines here: {memory_group_problem()}")


def memory_groups_left() -> list[Path]:
    roots = (emulated.CGROUP_V2, emulated.CGROUP_MEMORY_V1, emulated._own_v1_memory_group())
    return [p for root in roots if root is not None and root.is_dir() for p in root.glob("gnnscale-*")]


def limited_run(tmp_path: Path, limits: str, mib: int) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "allocate.py"
    script.write_text(ALLOCATE_AND_TRAIN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(SCRIPT), "--log-dir", str(tmp_path / "logs"), "--rate", "none",
                           "--machine-memory-mb", limits, "--timeout", "120", "--", str(script), str(mib)],
                          capture_output=True, text=True, cwd=ROOT, timeout=180)
    return done, time.perf_counter() - start


def test_spec_checks_memory_limits():
    assert ClusterSpec(machines=2, memory_mb=1536).memory_limit_mb(1) == 1536
    assert [ClusterSpec(machines=2, memory_mb=(0, 800)).memory_limit_mb(m) for m in (0, 1)] == [None, 800]
    assert ClusterSpec(machines=2).memory_limit_mb(0) is None
    with pytest.raises(ValueError, match="^3 memory limit\\(s\\) for 2 machines: give one MiB number for all"):
        ClusterSpec(machines=2, memory_mb=(1, 2, 3))
    for bad in (0, -5, (100, -1)):
        with pytest.raises(ValueError, match="must be positive"):
            ClusterSpec(machines=2, memory_mb=bad)


def test_no_memory_controller_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setattr(emulated, "CGROUP_V2", tmp_path / "v2")
    monkeypatch.setattr(emulated, "CGROUP_MEMORY_V1", tmp_path / "v1")
    monkeypatch.setattr(emulated, "_own_v1_memory_group", lambda: None)
    with pytest.raises(ClusterError, match="^no writable cgroup memory controller here .* drop --machine-memory-mb$"):
        emulated.make_memory_group("gnnscale-1-m0", 2**30)


def test_oom_kills_are_read_from_v1_and_v2_counters(tmp_path):
    v1, v2, old = tmp_path / "v1", tmp_path / "v2", tmp_path / "old"
    for group in (v1, v2, old):
        group.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n")
    (old / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    (old / "memory.failcnt").write_text("7\n")
    assert [emulated.oom_kills(g) for g in (v1, v2, old, tmp_path / "gone")] == [3, 2, 1, 0]


@needs_memory_groups
def test_a_memory_group_holds_the_limit_swap_included_and_goes_on_close(tmp_path):
    cluster = emulated.EmulatedCluster(ClusterSpec(machines=2, memory_mb=(0, 700)), tmp_path)
    try:
        cluster._make_memory_groups()
        group = cluster._memory_groups[1]
        assert 0 not in cluster._memory_groups
        for name in ("memory.max", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            if (group / name).exists():
                assert int((group / name).read_text()) == 700 * 2**20, name
    finally:
        cluster.close()
    assert not group.exists()


@needs_memory_groups
def test_a_machine_over_its_memory_limit_is_reported_out_of_memory_promptly(tmp_path):
    done, seconds = limited_run(tmp_path, "0,1200", 2000)
    assert done.returncode != 0, done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert "machine 1 OUT OF MEMORY: its processes went over its 1200 MiB limit (" in last, last
    assert "killed by the kernel)" in last, last
    assert "rank 1 holds" not in done.stdout and "rank 0 final loss" not in done.stdout  # rank 0 waited, was stopped
    assert seconds < 60, f"the out-of-memory run took {seconds:.1f} s to end"
    assert not memory_groups_left()


@needs_memory_groups
def test_machines_with_a_generous_memory_limit_train_normally(tmp_path):
    done, _ = limited_run(tmp_path, "1200", 200)  # the same limit as the run above
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 1 holds 200 MiB" in done.stdout
    peak = next(line for line in done.stdout.splitlines() if line.startswith("peak memory per machine"))
    assert peak.startswith("peak memory per machine (MiB, limit 1200/1200): m0 ") and " m1 " in peak, peak
    # Inside its namespace (a fresh /sys) each machine's rank reads its own limit, as in a container.
    for rank in (0, 1):
        assert f"rank {rank} sees a limit of {1200 * 2**20} bytes" in done.stdout, done.stdout
    losses = {line.split()[-1] for line in done.stdout.splitlines() if "final loss" in line}
    assert len(losses) == 1 and float(losses.pop()) < 0.01, done.stdout
    assert not memory_groups_left()


@needs_memory_groups
def test_memory_groups_of_a_killed_harness_are_removed_by_the_next(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    group = emulated.make_memory_group(f"gnnscale-{dead.pid}-m0", 2**30)
    try:
        assert str(group) in emulated.remove_stale()
    finally:
        emulated._remove_group(group)
    assert not group.exists()


@pytest.mark.slow
@needs_memory_groups
def test_bench_memory_limited_runs_end_to_end(tmp_path):
    """The benchmark's four runs on a small graph (every machine has room: no verdict on out of memory here);
    the 4 limited machines train, and the table and JSON come out."""
    out = tmp_path / "limited.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_memory_limited.py"), "--num-nodes", "20000",
                           "--feat-dim", "16", "--epochs", "1", "--machine-memory-mb", "1500", "--timeout", "300",
                           "--workdir", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    assert list(runs) == ["one, enough memory", "one, limited, sized as the host", "one, limited", "four, limited"]
    assert runs["four, limited"]["outcome"] == "trained" and len(runs["four, limited"]["peak_mb"]) == 4
    assert all(0 < p <= 1500 for p in runs["four, limited"]["peak_mb"])
    assert "| four, limited | 4 x 1,500 | trained |" in out.with_suffix(".md").read_text()
