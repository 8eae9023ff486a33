"""DistDGL baseline for the distributed-training benchmark: one host, 1 server, N trainers (default 2).

    python scripts/distdgl_baseline.py --num-nodes 100000 --epochs 2          # generate a graph, run, print JSON
    python scripts/distdgl_baseline.py --graph-bin DIR/graph.bin --epochs 2   # an existing dgl.save_graphs file

From another script (``scripts/bench_distributed.py``)::

    from distdgl_baseline import run_distdgl        # scripts/ is on sys.path when a script there runs
    result = run_distdgl(graph_bin, workdir, epochs=3, timeout=1800)

What runs -- DistDGL in its only one-host layout, the recipe of DGL's
``examples/distributed/graphsage/node_classification.py`` on our synthetic graph:

1. **Partition** (a child process of its own, timed apart, never counted in epoch time):
   ``dgl.load_graphs`` then ``dgl.distributed.partition_graph(g, "graph", 1, out,
   part_method=..., balance_ntypes=train_mask, balance_edges=True)``.  With one part DGL
   skips METIS altogether (``part_method`` has no effect; it only relabels nothing and writes
   the one partition), so this phase is mostly I/O.
2. **Server**: ``python distdgl_baseline.py --role server`` with ``DGL_ROLE=server
   DGL_SERVER_ID=0 DGL_NUM_SERVER=1 DGL_NUM_CLIENT=<trainers> DGL_IP_CONFIG DGL_CONF_PATH
   DGL_GRAPH_FORMAT=csc``; ``dgl.distributed.initialize`` loads the partition, puts it in
   shared memory and serves until trainer 0 sends the shut-down request at exit.
3. **Trainers**: ``python -m torch.distributed.run --standalone --nproc_per_node=<trainers>
   distdgl_baseline.py --role trainer`` with ``DGL_DIST_MODE=distributed DGL_ROLE=client
   DGL_NUM_SAMPLER=0`` and the same variables.  Each trainer: ``dgl.distributed.initialize``,
   ``torch.distributed.init_process_group("gloo")``, ``DistGraph("graph")``,
   ``node_split(train_mask)`` (force_even: each trainer gets a random half of the training
   nodes), ``DistNodeDataLoader`` over ``NeighborSampler([10, 25])`` (DGL's order: fanout 10
   at the input-side layer, 25 at the output-side layer), batch 1000, shuffled; the model is
   2 x ``dgl.nn.SAGEConv(..., "mean")`` (feat_dim -> 16 -> num_classes) with ReLU + dropout
   0.5 between, wrapped in ``DistributedDataParallel``; Adam lr 0.003 (the example's default).

**Epoch time**: every trainer passes a ``torch.distributed`` barrier, starts the clock, runs
its whole share of the training nodes, passes a second barrier and stops the clock; rank 0's
figure is reported, so an epoch is the time until the *slowest* trainer is done.

**Accuracy** (after the last epoch, not timed as epoch time), ``eval_mode``:

* ``"layerwise"`` (default): DGL's example evaluation -- layer-wise inference over *all*
  neighbours (``NeighborSampler([-1])`` one layer at a time, every node once per layer,
  results in a ``DistTensor``), the same kind our side reports; val and test nodes are split
  between trainers and correct counts summed with ``all_reduce``.  Deterministic.
* ``"sampled"``: the training sampler (fanouts 10,25) over each trainer's share of val and test
  nodes, counts summed with ``all_reduce``.  Noisier, and slower here because the test set
  holds 80% of the nodes.

**Threads**: the server and every trainer run with ``OMP_NUM_THREADS=1`` (and
``torch.set_num_threads(1)``): one host with few cores, N+1 processes.

**Memory**: every trainer reports its own peak RSS; the server's comes from ``wait4``; and a
monitor thread samples the *sum of PSS* over the server's and torchrun's process trees
every second (PSS splits the shared-memory graph between the processes that map it, so the
sum does not count it twice, which summing RSS would).

DistDGL quirks handled here:

* ``dgl.save_graphs`` stores bool masks as uint8; they are cast back to bool before
  partitioning (``balance_ntypes`` is a mask), as ``bench_partition.py`` does.
* the server never exits by itself if a trainer dies (it waits for the shut-down request), so
  both are started in their own sessions and killed, with all their descendants (torchrun puts
  each worker in a process group of its own), in ``finally``: SIGTERM, then SIGKILL; each
  child also asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), so a
  SIGKILLed driver leaves no server holding shared memory.
* a client that starts before the server listens retries only every 3 s; the driver waits
  until the server's port is in LISTEN state (read from ``/proc/net/tcp``, no probe
  connection, which the server would count as a client) before starting the trainers.
* the port comes from ``ip_config`` ("127.0.0.1 PORT"); ``port=0`` picks a free one.
* a killed server leaves its shared-memory segments in ``/dev/shm`` (a clean shut-down
  unlinks them); those named like DGL's, owned by us and mapped by no live process are
  removed before and after each run.  The KVStore's segment names (``node~_N~feat-kvdata-``)
  do not include the graph name, so two DistDGL runs cannot share one host at a time.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from gnnscale.train.cli import strict_json

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()

GRAPH_NAME = "graph"
FANOUTS = (10, 25)  # DGL's order: fanouts[0] for the input-side layer, fanouts[-1] for the output-side layer
HIDDEN = 16
DROPOUT = 0.5
LR = 0.003
BATCH_SIZE = 1000
EVAL_BATCH_SIZE = 10_000  # dst nodes per layer-wise batch: ~100k input nodes x 100 floats, bounded memory
EVAL_MODES = ("layerwise", "sampled")
MONITOR_INTERVAL = 1.0
KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


# ====================================================================== process helpers
def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; a no-op elsewhere).

    Used as ``preexec_fn`` for the server and torchrun, and called by each trainer for
    itself, so that a driver killed by SIGKILL still takes the whole tree down with it.
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    """A TCP port that was free a moment ago (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_listening(port: int) -> bool:
    """Whether some socket listens on ``port`` (IPv4 or IPv6), read from /proc without connecting."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def _tree_pids(roots: set[int]) -> list[int]:
    """Pids of the live processes in ``roots`` and all their descendants (by parent pid, from /proc).

    By descent rather than by process group: torchrun puts each worker in a process group of its own.
    """
    children: dict[int, list[int]] = {}
    alive: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces): state ppid ...
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":  # a zombie holds no memory and cannot be killed; its parent reaps it
            alive.add(int(entry.name))
            children.setdefault(int(ppid), []).append(int(entry.name))
    found, stack = [], [pid for pid in roots if pid in alive]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class _PssMonitor(threading.Thread):
    """Samples the summed PSS of some process trees every ``MONITOR_INTERVAL`` seconds; keeps the peak."""

    def __init__(self) -> None:
        super().__init__(name="distdgl-pss-monitor", daemon=True)
        self.roots: set[int] = set()
        self.peak = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(MONITOR_INTERVAL):
            roots = set(self.roots)
            if roots:
                self.peak = max(self.peak, sum(_pss_bytes(pid) for pid in _tree_pids(roots)))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def _kill_tree(proc: subprocess.Popen | None) -> None:
    """SIGTERM ``proc``'s process group and descendants, then SIGKILL whatever is left; reap ``proc``.

    ``proc`` leads its own group (``start_new_session``); its descendants are found by parent
    pid as well, because torchrun puts its workers in groups of their own.  SIGTERM first,
    so torchrun can stop its workers and the server can exit, then SIGKILL after a grace time.
    """
    if proc is None:
        return
    tree = set(_tree_pids({proc.pid}))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        tree |= set(_tree_pids(tree))  # children forked since the last look
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in tree:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + KILL_GRACE
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader once it has exited, so it does not linger as a zombie
            if not _tree_pids(tree):
                break
            time.sleep(0.1)
        if not _tree_pids(tree):
            break
    try:
        proc.wait(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:
        pass


def _reap(proc: subprocess.Popen) -> resource.struct_rusage | None:
    """If ``proc`` has exited: reap it (setting ``returncode``) and return its rusage; else None.

    ``Popen.poll`` would reap it too but drop the rusage, which holds its peak RSS.
    """
    if proc.returncode is not None:
        return None
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if not pid:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    """Our environment plus ``extra``, one OpenMP/MKL thread per process, DGL on PyTorch, the repo importable."""
    env = dict(os.environ)
    env.update(DGLBACKEND="pytorch", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    env.update(extra)
    return env


def _run_timed(command: list[str], log_path: Path, timeout: float, env: dict[str, str]) -> dict[str, float]:
    """Run ``command`` to completion in its own process group: wall seconds and peak RSS (``wait4``).

    Raises:
        RuntimeError: on a non-zero exit or after ``timeout`` seconds (the group is killed), with the log's tail.
    """
    proc = None
    try:
        with open(log_path, "w") as log:
            start = time.perf_counter()
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True, preexec_fn=_die_with_parent)
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() - start > timeout:
                    raise RuntimeError(f"{' '.join(command)} timed out after {timeout:.0f} s; "
                                       f"the end of its output:\n{_tail(log_path)}")
                time.sleep(0.1)
            seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}; the end of its output:\n"
                               f"{_tail(log_path)}")
        return {"seconds": round(seconds, 3), "peak_rss_gib": round(usage.ru_maxrss * 1024 / 2**30, 3)}
    finally:
        if proc is not None and proc.returncode is None:
            _kill_tree(proc)


# ====================================================================== driver (parent side)
def generate_graph(data_dir: Path, *, num_nodes: int = 1_000_000, avg_degree: float = 10.0, feat_dim: int = 100,
                   seed: int = 0, timeout: float = 3600.0) -> tuple[Path, dict]:
    """Generate the synthetic graph in a child process (``bench_partition.py``'s generator).

    Writes under ``data_dir`` (which must not exist yet or be empty): ``graph.bin`` (a
    ``dgl.save_graphs`` file with ndata feat, label, train_mask, val_mask, test_mask),
    ``edgelist/`` (our framework's format) and ``graph.json`` (facts).

    Returns:
        The path of ``graph.bin``, and the facts plus ``generate_seconds`` / ``generate_peak_rss_gib``.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(SCRIPT.parent / "bench_partition.py"), "--child", "generate",
               "--data", str(data_dir), "--num-nodes", str(num_nodes), "--avg-degree", str(avg_degree),
               "--feat-dim", str(feat_dim), "--seed", str(seed)]
    timing = _run_timed(command, data_dir / "generate.log", timeout, _child_env({}))
    facts = json.loads((data_dir / "graph.json").read_text())
    facts.update(generate_seconds=timing["seconds"], generate_peak_rss_gib=timing["peak_rss_gib"])
    return data_dir / "graph.bin", facts


def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _is_dgl_shm(name: str) -> bool:
    """Whether a /dev/shm name is one DistDGL gives its segments for our graph name.

    The graph's own segments start with the graph name; the KVStore's (node/edge data,
    DistTensors) are ``node~<ntype>~<name>-kvdata-`` / ``edge~...``, whatever the graph.
    """
    return name.startswith((GRAPH_NAME, "node~", "edge~"))


def _remove_leaked_shm() -> list[str]:
    """Remove DistDGL's /dev/shm segments that are ours and that no live process maps.

    DGL unlinks them when the server exits cleanly; a killed server (or a driver killed by
    SIGKILL, whose finally never ran) leaves them behind, holding memory.  A segment still
    mapped by some process -- another DistDGL run on this host -- is left alone, as is
    anything not owned by this user or not named like DGL's.
    """
    candidates = {name for name in _shm_names() if _is_dgl_shm(name)}
    if not candidates:
        return []
    mapped: set[str] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                for line in Path(entry.path, "maps").read_text().splitlines():
                    if "/dev/shm/" in line:
                        mapped.add(line.rsplit("/dev/shm/", 1)[1].split(" ")[0])
            except OSError:
                continue
    removed = []
    for name in sorted(candidates - mapped):
        path = Path("/dev/shm", name)
        try:
            if path.stat().st_uid == os.getuid() and path.is_file():
                path.unlink()
                removed.append(name)
        except OSError:
            continue
    return removed


def run_distdgl(graph_bin: Path, workdir: Path, *, epochs: int, num_trainers: int = 2, port: int = 0,
                timeout: float, log: Callable[[str], Any] = print, eval_mode: str = "layerwise",
                seed: int = 0, part_method: str = "metis") -> dict:
    """Partition ``graph_bin``, start 1 DistDGL server and ``num_trainers`` trainers, train; the result.

    Args:
        graph_bin: a ``dgl.save_graphs`` file with one homogeneous graph holding ndata ``feat``
            (float32), ``label`` (int64) and ``train_mask`` / ``val_mask`` / ``test_mask``.
        workdir: a folder for the partition, ip_config, logs and the result; created if missing,
            left in place (the caller owns it).  Logs: ``partition.log``, ``server.log``, ``trainers.log``.
        epochs: training epochs (each over all training nodes, split between the trainers).
        num_trainers: trainer processes (torchrun ``--nproc_per_node``); also ``DGL_NUM_CLIENT``.
        port: the server's TCP port; 0 picks a free one.
        timeout: seconds allowed for the partition child, and again for server + trainers.
        log: called with one-line progress messages.
        eval_mode: ``"layerwise"`` (full-neighbour, DGL's example) or ``"sampled"`` (fanouts 10,25).
        seed: torch seed of the trainers (model init, shuffling, dropout).
        part_method: passed to ``partition_graph``; with one part DGL ignores it.

    Returns:
        Rank 0's result: ``epoch_seconds`` (list), ``val_acc``, ``test_acc``, ``num_trainers``,
        ``losses``, ``eval_mode``, ``eval_seconds``, ``setup_seconds``, per-trainer peak RSS, ...;
        plus ``partition_seconds``, ``partition_peak_rss_gib``, ``server_peak_rss_gib``,
        ``peak_pss_total_gib`` (sum over server and trainers, sampled), ``train_phase_seconds``
        (server start to trainers' exit), ``port``.

    Raises:
        RuntimeError: a child failed or timed out; the message holds the end of its log.
    """
    if eval_mode not in EVAL_MODES:
        raise ValueError(f"eval_mode={eval_mode!r}: expected one of {EVAL_MODES}")
    if epochs < 1 or num_trainers < 1:
        raise ValueError(f"epochs={epochs}, num_trainers={num_trainers}: both must be >= 1")
    graph_bin, workdir = Path(graph_bin).resolve(), Path(workdir).resolve()
    if not graph_bin.is_file():
        raise FileNotFoundError(f"graph_bin {graph_bin} does not exist; generate it first (generate_graph)")
    workdir.mkdir(parents=True, exist_ok=True)
    part_dir = workdir / "partition"
    if part_dir.exists():
        shutil.rmtree(part_dir)
    result_path = workdir / "result.json"
    result_path.unlink(missing_ok=True)

    # 1. Partition, in a child of its own: its time and memory are its own, never epoch time.
    log(f"distdgl: partitioning {graph_bin} (1 part) ...")
    timing = _run_timed([sys.executable, str(SCRIPT), "--role", "partition", "--graph-bin", str(graph_bin),
                         "--part-dir", str(part_dir), "--part-method", part_method],
                        workdir / "partition.log", timeout, _child_env({}))
    meta = json.loads((part_dir / "meta.json").read_text())
    log(f"distdgl: partitioned in {timing['seconds']:.1f} s (peak RSS {timing['peak_rss_gib']:.2f} GiB)")

    port = port or free_port()
    ip_config = workdir / "ip_config.txt"
    ip_config.write_text(f"127.0.0.1 {port}\n")
    part_config = part_dir / f"{GRAPH_NAME}.json"
    config = {"part_config": str(part_config), "ip_config": str(ip_config), "epochs": epochs,
              "eval_mode": eval_mode, "seed": seed, "result": str(result_path), "meta": meta}
    config_path = workdir / "run_config.json"
    config_path.write_text(json.dumps(config, indent=2, allow_nan=False))
    dgl_env = {"DGL_NUM_SERVER": "1", "DGL_NUM_CLIENT": str(num_trainers), "DGL_IP_CONFIG": str(ip_config),
               "DGL_CONF_PATH": str(part_config), "DGL_GRAPH_FORMAT": "csc"}

    stale = _remove_leaked_shm()  # from a run whose driver was SIGKILLed: DGL would reuse the names
    if stale:
        log(f"distdgl: removed {len(stale)} stale /dev/shm segments of an earlier run: {stale[:5]}")
    server = trainers = None
    server_usage = None
    monitor = _PssMonitor()
    server_log, trainer_log = workdir / "server.log", workdir / "trainers.log"
    start = time.perf_counter()

    def failure(what: str) -> RuntimeError:
        return RuntimeError(f"distdgl: {what}.\n--- end of {server_log} ---\n{_tail(server_log)}\n"
                            f"--- end of {trainer_log} ---\n{_tail(trainer_log)}")

    try:
        monitor.start()
        # 2. The server, first: the trainers connect to it in dgl.distributed.initialize.
        with open(server_log, "w") as out:
            server = subprocess.Popen(
                [sys.executable, str(SCRIPT), "--role", "server", "--ip-config", str(ip_config)],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, preexec_fn=_die_with_parent,
                env=_child_env({**dgl_env, "DGL_ROLE": "server", "DGL_SERVER_ID": "0"}))
        monitor.roots.add(server.pid)
        log(f"distdgl: server pid {server.pid} on 127.0.0.1:{port}; waiting for it to listen ...")
        while not _port_listening(port):
            if _reap(server) is not None:
                raise failure(f"the server exited with {server.returncode} before listening")
            if time.perf_counter() - start > timeout:
                raise failure(f"the server did not listen on port {port} within {timeout:.0f} s")
            time.sleep(0.2)
        log(f"distdgl: server listening after {time.perf_counter() - start:.1f} s; starting {num_trainers} trainers")

        # 3. The trainers under torchrun (python -m torch.distributed.run: no PATH lookup).
        with open(trainer_log, "w") as out:
            trainers = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={num_trainers}",
                 str(SCRIPT), "--role", "trainer", "--config", str(config_path)],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, preexec_fn=_die_with_parent,
                env=_child_env({**dgl_env, "DGL_DIST_MODE": "distributed", "DGL_ROLE": "client",
                                "DGL_NUM_SAMPLER": "0"}))
        monitor.roots.add(trainers.pid)
        while trainers.poll() is None:
            # The server exits 0 as soon as trainer 0 sends the shut-down request at its exit,
            # which can be before torchrun itself is done: only a non-zero exit is a failure.
            server_usage = server_usage or _reap(server)
            if server_usage is not None and server.returncode != 0:
                raise failure(f"the server exited with {server.returncode} while the trainers ran")
            if time.perf_counter() - start > timeout:
                raise failure(f"server + trainers did not finish within {timeout:.0f} s")
            time.sleep(0.2)
        if trainers.returncode != 0:
            raise failure(f"the trainers (torchrun) exited with {trainers.returncode}")
        train_phase = time.perf_counter() - start
        # Trainer 0 sent the shut-down request at exit; the server should be on its way out.
        deadline = time.monotonic() + 30
        while server_usage is None and time.monotonic() < deadline:
            server_usage = _reap(server)
            time.sleep(0.1)
        if server_usage is None:
            log("distdgl: warning: the server did not exit within 30 s of the trainers; killing it")
        if not result_path.is_file():
            raise failure(f"the trainers exited 0 but wrote no {result_path}")
        result = json.loads(result_path.read_text())
    finally:
        _kill_tree(trainers)
        _kill_tree(server)
        monitor.stop()
        leaked = _remove_leaked_shm()
        if leaked:
            log(f"distdgl: removed {len(leaked)} leaked /dev/shm segments: {leaked[:5]}")

    result.update(partition_seconds=timing["seconds"], partition_peak_rss_gib=timing["peak_rss_gib"],
                  server_peak_rss_gib=round(server_usage.ru_maxrss * 1024 / 2**30, 3) if server_usage else None,
                  peak_pss_total_gib=round(monitor.peak / 2**30, 3), train_phase_seconds=round(train_phase, 2),
                  port=port, workdir=str(workdir))
    log(f"distdgl: epochs {[round(s, 2) for s in result['epoch_seconds']]} s, val {result['val_acc']:.4f}, "
        f"test {result['test_acc']:.4f}, peak PSS total {result['peak_pss_total_gib']:.2f} GiB")
    return result


# ====================================================================== children
def partition_child(args: argparse.Namespace) -> None:
    """Child: ``partition_graph`` with ``--num-parts`` parts (one by default: the one-host layout); writes
    ``meta.json`` (sizes, classes) next to the partition."""
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import dgl
    import torch

    (graph,), _ = dgl.load_graphs(str(args.graph_bin))
    missing = {"feat", "label", "train_mask", "val_mask", "test_mask"} - set(graph.ndata)
    if missing:
        raise SystemExit(f"{args.graph_bin} lacks ndata {sorted(missing)}: DistDGL serves only what was "
                         f"partitioned, so add them before partitioning")
    for name in ("train_mask", "val_mask", "test_mask"):
        graph.ndata[name] = graph.ndata[name].bool()  # save_graphs stores bool as uint8
    labels = graph.ndata["label"]
    meta = {"num_nodes": graph.num_nodes(), "num_edges": graph.num_edges(),
            "feat_dim": int(graph.ndata["feat"].shape[1]), "num_classes": int(labels.max()) + 1,
            **{f"num_{name}": int(graph.ndata[f"{name}_mask"].sum()) for name in ("train", "val", "test")}}
    start = time.perf_counter()
    dgl.distributed.partition_graph(graph, GRAPH_NAME, args.num_parts, str(args.part_dir),
                                    part_method=args.part_method, balance_ntypes=graph.ndata["train_mask"],
                                    balance_edges=True)
    meta["partition_graph_seconds"] = round(time.perf_counter() - start, 3)
    meta["versions"] = {"dgl": dgl.__version__, "torch": torch.__version__}
    (args.part_dir / "meta.json").write_text(json.dumps(meta, indent=2, allow_nan=False))


def server_child(args: argparse.Namespace) -> None:
    """Child: the DistDGL server; ``initialize`` serves until the trainers shut it down, then exits."""
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import dgl
    import torch

    torch.set_num_threads(1)
    dgl.distributed.initialize(str(args.ip_config))  # DGL_ROLE=server: never returns


def _sage(in_dim: int, hidden: int, num_classes: int):
    """2-layer GraphSAGE-mean as DGL's DistSAGE (and our side): in -> hidden -> classes, ReLU + dropout between."""
    import dgl
    import torch.nn.functional as F
    from torch import nn

    class DistSAGE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([dgl.nn.SAGEConv(in_dim, hidden, "mean"),
                                         dgl.nn.SAGEConv(hidden, num_classes, "mean")])
            self.dropout = nn.Dropout(DROPOUT)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    return DistSAGE()


def _layerwise_logits(model, g):
    """Logits of every node (a DistTensor), layer by layer over all neighbours, as DGL's example infers.

    The nodes are split between trainers; each layer's output is a named DistTensor on the
    server, so the next layer can read any node's hidden state; a barrier ends each layer.
    """
    import dgl
    import torch
    import torch.nn.functional as F

    nodes = dgl.distributed.node_split(torch.ones(g.num_nodes(), dtype=torch.bool), g.get_partition_book(),
                                       force_even=True)
    sampler = dgl.dataloading.NeighborSampler([-1])
    x = g.ndata["feat"]
    for i, layer in enumerate(model.layers):
        last = i == len(model.layers) - 1
        y = dgl.distributed.DistTensor((g.num_nodes(), layer._out_feats), torch.float32,
                                       "h_last" if last else f"h{i}", persistent=True)
        loader = dgl.dataloading.DistNodeDataLoader(g, nodes, sampler, batch_size=EVAL_BATCH_SIZE, shuffle=False,
                                                    drop_last=False)
        for input_nodes, output_nodes, blocks in loader:
            h = layer(blocks[0], x[input_nodes])
            y[output_nodes] = h if last else F.relu(h)  # eval mode: dropout is the identity
        x = y
        g.barrier()
    return x


def trainer_child(args: argparse.Namespace) -> None:
    """Child (one per torchrun rank): DistDGL GraphSAGE training; rank 0 writes the result JSON."""
    _die_with_parent()
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import dgl
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    config = json.loads(Path(args.config).read_text())
    meta = config["meta"]
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    dgl.distributed.initialize(config["ip_config"])  # before init_process_group, as DGL requires
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(config["seed"] * 1000 + rank)  # shuffling and dropout differ per rank
    g = dgl.distributed.DistGraph(GRAPH_NAME, part_config=config["part_config"])
    pb = g.get_partition_book()
    train_nid = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    val_nid = dgl.distributed.node_split(g.ndata["val_mask"], pb, force_even=True)
    test_nid = dgl.distributed.node_split(g.ndata["test_mask"], pb, force_even=True)

    torch.manual_seed(config["seed"])  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.parallel.DistributedDataParallel(_sage(meta["feat_dim"], HIDDEN, meta["num_classes"]))
    torch.manual_seed(config["seed"] * 1000 + rank)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    sampler = dgl.dataloading.NeighborSampler(list(FANOUTS))
    loader = dgl.dataloading.DistNodeDataLoader(g, train_nid, sampler, batch_size=BATCH_SIZE, shuffle=True,
                                                drop_last=False)
    feat, label = g.ndata["feat"], g.ndata["label"]
    setup_seconds = time.perf_counter() - t0
    print(f"rank {rank}/{world}: {len(train_nid)} train, {len(val_nid)} val, {len(test_nid)} test nodes; "
          f"set up in {setup_seconds:.1f} s", flush=True)

    epoch_seconds, losses, num_batches = [], [], []
    for epoch in range(config["epochs"]):
        model.train()
        dist.barrier()  # start together, so the epoch is the slowest trainer's full pass
        start = time.perf_counter()
        total, count, steps = 0.0, 0, 0
        with model.join():  # tolerate unequal batch counts between ranks
            for input_nodes, seeds, blocks in loader:
                x = feat[input_nodes]
                y = label[seeds].long()
                loss = F.cross_entropy(model(blocks, x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item() * len(seeds)
                count += len(seeds)
                steps += 1
        dist.barrier()
        epoch_seconds.append(time.perf_counter() - start)
        losses.append(total / max(count, 1))
        num_batches.append(steps)
        print(f"rank {rank}: epoch {epoch} {epoch_seconds[-1]:.2f} s, {steps} batches, loss {losses[-1]:.4f}",
              flush=True)

    # Evaluation: correct counts over each trainer's share of val/test nodes, summed over trainers.
    dist.barrier()
    start = time.perf_counter()
    module = model.module
    module.eval()
    counts = torch.zeros(4, dtype=torch.float64)  # val correct, val total, test correct, test total
    with torch.no_grad():
        if config["eval_mode"] == "layerwise":
            logits = _layerwise_logits(module, g)
            for j, nids in enumerate((val_nid, test_nid)):
                for chunk in torch.split(nids, 100_000):
                    counts[2 * j] += (logits[chunk].argmax(1) == label[chunk]).sum().item()
                counts[2 * j + 1] += len(nids)
        else:
            for j, nids in enumerate((val_nid, test_nid)):
                eval_loader = dgl.dataloading.DistNodeDataLoader(g, nids, sampler, batch_size=EVAL_BATCH_SIZE,
                                                                 shuffle=False, drop_last=False)
                for input_nodes, seeds, blocks in eval_loader:
                    pred = module(blocks, feat[input_nodes]).argmax(1)
                    counts[2 * j] += (pred == label[seeds]).sum().item()
                    counts[2 * j + 1] += len(seeds)
    dist.all_reduce(counts)
    eval_seconds = time.perf_counter() - start

    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # Linux reports KiB
    everyone: list = [None] * world
    dist.all_gather_object(everyone, {"rank": rank, "num_train": len(train_nid), "peak_rss_gib": round(peak_rss, 3)})
    if rank == 0:
        result = {"framework": "distdgl", "epoch_seconds": [round(s, 3) for s in epoch_seconds],
                  "val_acc": counts[0].item() / max(counts[1].item(), 1),
                  "test_acc": counts[2].item() / max(counts[3].item(), 1),
                  "num_val": int(counts[1].item()), "num_test": int(counts[3].item()),
                  "num_trainers": world, "num_servers": 1, "losses": losses, "num_batches_rank0": num_batches,
                  "eval_mode": config["eval_mode"], "eval_seconds": round(eval_seconds, 3),
                  "setup_seconds": round(setup_seconds, 3), "trainers": everyone,
                  "trainer_peak_rss_gib": [t["peak_rss_gib"] for t in everyone],
                  "settings": {"fanouts": list(FANOUTS), "fanout_order": "input-side layer first (DGL)",
                               "batch_size": BATCH_SIZE, "hidden": HIDDEN, "dropout": DROPOUT, "lr": LR,
                               "optimizer": "Adam", "layers": 2, "aggregator": "mean", "threads_per_process": 1,
                               "eval_batch_size": EVAL_BATCH_SIZE, "seed": config["seed"]},
                  "graph": meta}
        tmp = Path(config["result"] + ".tmp")
        tmp.write_text(strict_json(result))
        tmp.replace(config["result"])  # atomic: the driver never reads half a file
    dist.barrier()
    dist.destroy_process_group()
    # dgl.distributed's atexit hook (exit_client) runs now: a client barrier, then rank 0 shuts the server down.


# ====================================================================== command line
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--graph-bin", type=Path, help="an existing dgl.save_graphs file (else one is generated)")
    parser.add_argument("--num-nodes", type=int, default=1_000_000, help="generated graph: nodes")
    parser.add_argument("--avg-degree", type=float, default=10.0, help="generated graph: average degree")
    parser.add_argument("--feat-dim", type=int, default=100, help="generated graph: feature dimension")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated graph and of the trainers")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--num-trainers", type=int, default=2)
    parser.add_argument("--port", type=int, default=0, help="server port; 0 picks a free one")
    parser.add_argument("--eval-mode", choices=EVAL_MODES, default="layerwise")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per phase (generate, "
                        "partition, server + trainers)")
    parser.add_argument("--workdir", type=Path, help="where the graph, partition and logs go (default: a "
                        "temporary folder, removed at the end)")
    parser.add_argument("--out", type=Path, help="also write the result JSON here")
    # Internal: this script re-runs itself as the partitioner, the server and the trainers.
    parser.add_argument("--role", choices=("partition", "server", "trainer"), help=argparse.SUPPRESS)
    parser.add_argument("--part-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--part-method", default="metis", help=argparse.SUPPRESS)
    parser.add_argument("--num-parts", type=int, default=1, help=argparse.SUPPRESS)  # one per machine
    parser.add_argument("--ip-config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--local-rank", "--local_rank", type=int, help=argparse.SUPPRESS)  # older torchrun
    return parser


def _standalone(args: argparse.Namespace, work: Path) -> dict:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    graph_bin, facts = args.graph_bin, None
    if graph_bin is None:
        log(f"generating {args.num_nodes:,} nodes, degree {args.avg_degree}, {args.feat_dim} features ...")
        graph_bin, facts = generate_graph(work / "data", num_nodes=args.num_nodes, avg_degree=args.avg_degree,
                                          feat_dim=args.feat_dim, seed=args.seed, timeout=args.timeout)
        log(f"generated in {facts['generate_seconds']:.1f} s: {facts['num_edges']:,} directed edges")
    result = run_distdgl(graph_bin, work / "distdgl", epochs=args.epochs, num_trainers=args.num_trainers,
                         port=args.port, timeout=args.timeout, log=log, eval_mode=args.eval_mode, seed=args.seed)
    if facts is not None:
        result["generation"] = facts
    return result


def main() -> None:
    args = build_parser().parse_args()
    if args.role == "partition":
        return partition_child(args)
    if args.role == "server":
        return server_child(args)
    if args.role == "trainer":
        return trainer_child(args)
    # SIGTERM -> SystemExit, so the driver's finally blocks kill the server and trainers.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = _standalone(args, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="distdgl_") as tmp:
            result = _standalone(args, Path(tmp))
    text = strict_json(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
