"""DistDGL against gnnscale on the same emulated cluster: 2 machines of 1 core, one partition per machine.

    sudo python scripts/bench_distdgl_cluster.py                                # 1M nodes, 10 Gbit/s, 3 epochs
    sudo python scripts/bench_distdgl_cluster.py --num-nodes 100000 --rate 1gbit   # a quick look

One graph for both (``distdgl_baseline.generate_graph``: the community-structured synthetic graph,
100 features, 10 classes, 10% training nodes), partitioned in 2 by each side's own tool, timed apart:
``dgl.distributed.partition_graph`` (METIS) for DistDGL, ``python -m partition --dataset edgelist``
for gnnscale.  Both then run through ``scripts/bench/emulated.py``: two network namespaces
behind links shaped to ``--rate``, each pinned to one core of its own.

* **DistDGL**, DGL's multi-machine layout: on machine m, one server (``DGL_SERVER_ID=m``, serving
  partition m on ``<address of m>:--port``; ``ip_config`` lists both machines) and one trainer under
  ``torchrun --nnodes 2`` (the harness's c10d rendezvous at machine 0).  Server and trainer are
  ``distdgl_baseline.py``'s (its docstring says what they run: GraphSAGE 2 x 16, fanouts 10,25,
  batch 1000 per trainer, Adam 0.003, dropout 0.5, layer-wise evaluation after the last epoch).
  DistDGL names its shared-memory segments after the graph, not the partition, and expects one
  partition per host: two servers on one ``/dev/shm`` overwrite each other's segments (tried: the
  second server dies of SIGBUS before it listens).  So each
  machine's processes see a ``/dev/shm`` of their own, a folder of the host's bound over it in
  their mount namespace (``ip netns exec`` gives every command one; root may bind there), as
  separate hosts would have.
* **gnnscale**: ``train_node_classification.py`` with the same model and schedule
  (``bench_cluster.MODEL_ARGS``, batch 1000 per rank), its defaults otherwise, in a fresh harness.

Epoch time: median over the epochs after the first (all epochs when fewer than 3), each side's own
clock (DistDGL's: between two barriers of all trainers), then median over ``--repeats`` interleaved
passes (each run records the host's load average before it: the host is shared).  Reported: the
ratio gnnscale / DistDGL (target <= 0.5 with validation accuracy within 0.005), and the bytes each
run sent over the links (whole run: set-up, epochs and evaluation).  Writes JSON; the graph and
partitions are kept in ``--workdir`` under a folder named after the graph's settings and reused.
Needs root and ``ip netns`` (see ``scripts/emulated_cluster.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
import distdgl_baseline  # noqa: E402
from bench_cluster import MODEL_ARGS  # noqa: E402
from bench_distributed import steady  # noqa: E402
from bench.emulated import ClusterError, ClusterSpec, EmulatedCluster, check_host  # noqa: E402
from gnnscale.train.cli import strict_json  # noqa: E402

TARGET_RATIO = 0.5
ACCURACY_DELTA = 0.005
BATCH_SIZE = distdgl_baseline.BATCH_SIZE
SHM_PATTERN = re.compile(r"gnnscale-distdgl-(\d+)-m\d+")
ERROR_LINE = re.compile(r"Error|error:|Exception|Killed|Segmentation|Aborted")


class DistDGLFailure(RuntimeError):
    """DistDGL did not run through the harness; ``str()`` is one line naming why."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--feat-dim", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="seed of the graph and of both trainings")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="passes over both runs (interleaved); medians "
                        "are reported")
    parser.add_argument("--rate", default="10gbit", help="each machine's egress rate (tc tbf), e.g. 10gbit, 1gbit")
    parser.add_argument("--port", type=int, default=30050, help="the DistDGL servers' port (one per namespace)")
    parser.add_argument("--eval-mode", choices=distdgl_baseline.EVAL_MODES, default="layerwise",
                        help="DistDGL's evaluation (gnnscale's is layer-wise over all neighbours)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per phase")
    parser.add_argument("--echo", action="store_true", help="also print the machines' output, prefixed [mI]")
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "bench_distdgl_cluster",
                        help="graph, partitions, run folders and logs (kept)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_distdgl_cluster.json")
    return parser


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_logged(command: list[str], log_path: Path, timeout: float) -> float:
    """Run ``command`` (from the repository, one thread) with output to ``log_path``; seconds taken.

    Raises:
        RuntimeError: it failed or ran past ``timeout``; the message holds the end of its log.
    """
    start = time.perf_counter()
    with open(log_path, "w") as handle:
        try:
            done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{' '.join(command[:5])} ... ran past {timeout:.0f} s; log: {log_path}") from None
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:5])} ... exited {done.returncode}:\n{log_path.read_text()[-3000:]}")
    return time.perf_counter() - start


# ====================================================================== inputs
def prepare(args: argparse.Namespace) -> dict:
    """Generate the graph and both 2-way partitions, or reuse those a run with the same settings left.

    Returns:
        ``work`` (the folder), ``graph`` (generator facts), ``distdgl_part`` (DGL's partition folder),
        ``distdgl_meta`` (its meta.json), ``gnnscale_part`` (ours), and ``partition_seconds`` of each (those
        of the run that made them, kept in ``partition_seconds.json``).
    """
    work = args.workdir / f"n{args.num_nodes}-d{args.avg_degree:g}-f{args.feat_dim}-s{args.seed}"
    data, facts_path = work / "data", work / "data" / "graph.json"
    if not facts_path.is_file():
        shutil.rmtree(data, ignore_errors=True)
        log(f"generating the graph ({args.num_nodes:,} nodes) in {data}")
        distdgl_baseline.generate_graph(data, num_nodes=args.num_nodes, avg_degree=args.avg_degree,
                                        feat_dim=args.feat_dim, seed=args.seed, timeout=args.timeout)
    out = {"work": work, "graph": json.loads(facts_path.read_text()), "distdgl_part": work / "distdgl-parts-2",
           "gnnscale_part": work / "gnnscale-parts-2"}
    timings_path = work / "partition_seconds.json"
    timings = json.loads(timings_path.read_text()) if timings_path.is_file() else {}
    if not (out["distdgl_part"] / "meta.json").is_file():
        log("partitioning for DistDGL: dgl.distributed.partition_graph, 2 parts (METIS)")
        shutil.rmtree(out["distdgl_part"], ignore_errors=True)
        timings["distdgl"] = run_logged(
            [sys.executable, str(distdgl_baseline.SCRIPT), "--role", "partition", "--graph-bin",
             str(data / "graph.bin"), "--part-dir", str(out["distdgl_part"]), "--num-parts", "2"],
            work / "distdgl-partition.log", args.timeout)
    if not (out["gnnscale_part"] / "manifest.json").is_file():
        log("partitioning for gnnscale: python -m partition --dataset edgelist, 2 parts")
        timings["gnnscale"] = run_logged(
            [sys.executable, "-m", "partition", "--dataset", "edgelist", "--data-dir", str(data / "edgelist"),
             "--num-parts", "2", "--out", str(out["gnnscale_part"]), "--force", "--quiet"],
            work / "gnnscale-partition.log", args.timeout)
    timings_path.write_text(json.dumps(timings))
    out.update(partition_seconds=timings, distdgl_meta=json.loads((out["distdgl_part"] / "meta.json").read_text()))
    return out


# ====================================================================== DistDGL on the cluster
def shm_dir(machine: int) -> Path:
    """The host folder that machine ``machine`` of this run sees as its ``/dev/shm``."""
    return Path("/dev/shm") / f"gnnscale-distdgl-{os.getpid()}-m{machine}"


def remove_stale_shm() -> None:
    """Remove the /dev/shm folders of runs that no longer live (killed with SIGKILL: no finally ran)."""
    for path in Path("/dev/shm").glob("gnnscale-distdgl-*-m*"):
        match = SHM_PATTERN.fullmatch(path.name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            shutil.rmtree(path, ignore_errors=True)


def on_machine(cluster: EmulatedCluster, machine: int, command: list[str], env: dict[str, str]) -> list[str]:
    """``command`` in machine ``machine``'s namespace, on its cores, with ``env`` added and its own /dev/shm.

    ``ip netns exec`` runs every command in a mount namespace of its own (slave to the host's), so a
    bind mount made there is seen by that command and its children only; the machine's server and
    trainer bind the same host folder, so they share their segments as on one real host.
    """
    assignments = [f"{key}={value}" for key, value in env.items()]
    bind = 'mount --bind "$0" /dev/shm && exec "$@"'
    return cluster.in_machine(machine, ["env", *assignments, "sh", "-c", bind, str(shm_dir(machine)), *command])


def dgl_env(ip_config: Path, part_config: Path) -> dict[str, str]:
    """DistDGL's settings common to servers and trainers: 1 server per machine, 2 trainers in all."""
    return {"DGLBACKEND": "pytorch", "DGL_NUM_SERVER": "1", "DGL_NUM_CLIENT": "2", "DGL_IP_CONFIG": str(ip_config),
            "DGL_CONF_PATH": str(part_config), "DGL_GRAPH_FORMAT": "csc", "MKL_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def listening(pid: int, port: int) -> bool:
    """Whether a socket of ``pid``'s network namespace listens on ``port`` (its /proc/PID/net/tcp, no probe
    connection: a DistDGL server would count one as a client)."""
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port for f in map(str.split, lines) if len(f) > 3)


def error_line(logs: list[Path]) -> str:
    """The last line of ``logs`` that reads like an error, prefixed with its log's name; '' when none."""
    found = ""
    for path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        hits = [line.strip() for line in lines if ERROR_LINE.search(line)]
        found = f"{path.name}: {hits[-1][:300]}" if hits else found
    return found


def exit_code(code: int | None) -> str:
    """An exit code as a shell would read it: ``-7 (SIGBUS)`` for a process killed by a signal."""
    if code is not None and code < 0:
        return f"{code} ({signal.Signals(-code).name})"
    return str(code)


def failure(what: str, logs: list[Path]) -> DistDGLFailure:
    line = error_line(logs)
    return DistDGLFailure(f"{what}{'; ' + line if line else ''} (logs: {logs[0].parent})")


def start_servers(cluster: EmulatedCluster, env: dict[str, str], ip_config: Path, port: int, timeout: float,
                  logs: Path) -> list:
    """One DistDGL server per machine (server m serves partition m); returns once both listen.

    Raises:
        DistDGLFailure: a server exited, or did not listen within ``timeout``.
    """
    servers, server_logs = [], [logs / f"distdgl-server-m{m}.log" for m in range(cluster.spec.machines)]
    for m in range(cluster.spec.machines):
        command = [sys.executable, str(distdgl_baseline.SCRIPT), "--role", "server", "--ip-config", str(ip_config)]
        servers.append(cluster._start(on_machine(cluster, m, command, {**env, "DGL_ROLE": "server",
                                                                         "DGL_SERVER_ID": str(m)}),
                                      server_logs[m], prefix=f"[m{m} server] "))
    start = time.perf_counter()
    while not all(listening(s.pid, port) for s in servers):
        dead = [m for m, s in enumerate(servers) if s.poll() is not None]
        if dead:
            raise failure(f"the DistDGL server on machine {dead[0]} exited with "
                          f"{exit_code(servers[dead[0]].returncode)} before listening on "
                          f"{cluster.address(dead[0])}:{port}", server_logs)
        if time.perf_counter() - start > timeout:
            raise failure(f"the DistDGL servers did not listen on port {port} within {timeout:.0f} s", server_logs)
        time.sleep(0.2)
    log(f"distdgl: both servers listen after {time.perf_counter() - start:.1f} s")
    return servers


def start_trainers(cluster: EmulatedCluster, env: dict[str, str], config: Path, logs: Path) -> list:
    """One DistDGL trainer per machine, each under the harness's torchrun agent (``--nnodes 2``, c10d
    rendezvous at machine 0), wrapped by :func:`on_machine` to share its machine's /dev/shm."""
    env = {**env, "DGL_DIST_MODE": "distributed", "DGL_ROLE": "client", "DGL_NUM_SAMPLER": "0"}
    command = [str(distdgl_baseline.SCRIPT), "--role", "trainer", "--config", str(config)]
    agents, inside = [], len(cluster.in_machine(0, []))  # torchrun_command = in_machine(m, [torchrun ...])
    for m in range(cluster.spec.machines):
        torchrun = cluster.torchrun_command(m, command, f"distdgl-{os.getpid()}")[inside:]
        agents.append(cluster._start(on_machine(cluster, m, torchrun, env), logs / f"distdgl-trainer-m{m}.log",
                                     prefix=f"[m{m}] "))
    return agents


def wait_trainers(agents: list, servers: list, timeout: float, logs: list[Path]) -> None:
    """Wait for every torchrun agent to exit 0.

    Raises:
        DistDGLFailure: an agent exited non-zero, a server exited non-zero meanwhile, or past ``timeout``.
    """
    start = time.perf_counter()
    while any(a.poll() is None for a in agents):
        bad = [(f"the trainer (torchrun) on machine {m}", a.returncode) for m, a in enumerate(agents)
               if a.returncode not in (None, 0)]
        # A server exits 0 once trainer 0 asks it to at exit, possibly before the agents are done.
        bad += [(f"the DistDGL server on machine {m}", s.returncode) for m, s in enumerate(servers)
                if s.poll() not in (None, 0)]
        if bad:
            raise failure(f"{bad[0][0]} exited with {exit_code(bad[0][1])}", logs)
        if time.perf_counter() - start > timeout:
            raise failure(f"the DistDGL trainers did not finish within {timeout:.0f} s", logs)
        time.sleep(0.2)
    failed = [m for m, a in enumerate(agents) if a.returncode != 0]
    if failed:
        raise failure(f"the trainer (torchrun) on machine {failed[0]} exited with "
                      f"{exit_code(agents[failed[0]].returncode)}", logs)


def link_mib(cluster: EmulatedCluster) -> float:
    """MiB sent over the shaped links so far, all machines (each namespace's eth0 transmit counter)."""
    total = 0
    for m in range(cluster.spec.machines):
        done = subprocess.run(cluster.in_machine(m, ["cat", "/sys/class/net/eth0/statistics/tx_bytes"]),
                              capture_output=True, text=True)
        total += int(done.stdout.strip() or 0)
    return total / 2**20


def run_distdgl(inputs: dict, args: argparse.Namespace) -> dict:
    """DistDGL on 2 emulated machines, one server and one trainer each; rank 0's result.

    Raises:
        DistDGLFailure: it did not run; the message names why in one line.
    """
    run_dir, logs = inputs["work"] / "distdgl-run", args.workdir / "logs"
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path = run_dir / "result.json"
    result_path.unlink(missing_ok=True)
    spec = ClusterSpec(machines=2, rate=args.rate, cores_per_machine=1)
    remove_stale_shm()
    try:
        with EmulatedCluster(spec, logs, echo=sys.stdout if args.echo else None) as cluster:
            for m in range(spec.machines):
                shm_dir(m).mkdir()
            ip_config, part_config = run_dir / "ip_config.txt", inputs["distdgl_part"] / "graph.json"
            ip_config.write_text("".join(f"{cluster.address(m)} {args.port}\n" for m in range(spec.machines)))
            config = run_dir / "run_config.json"
            config.write_text(json.dumps({"part_config": str(part_config), "ip_config": str(ip_config),
                                          "epochs": args.epochs, "eval_mode": args.eval_mode, "seed": args.seed,
                                          "result": str(result_path), "meta": inputs["distdgl_meta"]}))
            env = dgl_env(ip_config, part_config)
            start = time.perf_counter()
            servers = start_servers(cluster, env, ip_config, args.port, args.timeout, logs)
            agents = start_trainers(cluster, env, config, logs)
            all_logs = [logs / f"distdgl-{who}-m{m}.log" for who in ("server", "trainer") for m in range(2)]
            wait_trainers(agents, servers, args.timeout, all_logs)
            seconds, sent = time.perf_counter() - start, link_mib(cluster)
    finally:
        for m in range(spec.machines):
            shutil.rmtree(shm_dir(m), ignore_errors=True)
    if not result_path.is_file():
        raise failure(f"the DistDGL trainers exited 0 but wrote no {result_path}", all_logs)
    result = json.loads(result_path.read_text())
    result.update(num_servers=2, num_machines=2, run_seconds=round(seconds, 2), link_mib_whole_run=round(sent, 1),
                  epoch_time=steady(result["epoch_seconds"]), ip_config=ip_config.read_text().split("\n")[:2])
    return result


# ====================================================================== gnnscale on the cluster
def run_gnnscale(inputs: dict, args: argparse.Namespace) -> dict:
    """gnnscale on 2 emulated machines (a fresh harness), one rank each; its metrics, summarised."""
    out = inputs["work"] / "gnnscale-run"
    command = [str(ROOT / "scripts" / "train_node_classification.py"), "--partitions",
               str(inputs["gnnscale_part"]), "--out", str(out), *MODEL_ARGS, "--batch-size", str(BATCH_SIZE),
               "--epochs", str(args.epochs), "--eval-every", str(args.epochs), "--seed", str(args.seed), "--quiet"]
    spec = ClusterSpec(machines=2, rate=args.rate, cores_per_machine=1)
    start = time.perf_counter()
    with EmulatedCluster(spec, args.workdir / "logs", echo=sys.stdout if args.echo else None) as cluster:
        runs = cluster.run(command, timeout=args.timeout, name="gnnscale")
        seconds, sent = time.perf_counter() - start, link_mib(cluster)
    failed = sorted((r for r in runs if r.returncode != 0), key=lambda r: (r.stopped, r.seconds))
    if failed:
        raise RuntimeError(f"gnnscale: machine {failed[0].machine} exited {failed[0].returncode}:\n"
                           f"{failed[0].log.read_text()[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    epochs = [h["epoch_seconds"] for h in metrics["history"]]
    return {"framework": "gnnscale", "epoch_seconds": epochs, "epoch_time": steady(epochs),
            "val_acc": metrics["val"], "test_acc": metrics["test"], "topology": metrics.get("topology"),
            "bytes_sent_per_epoch": steady([h.get("bytes_sent", 0) for h in metrics["history"]]),
            "run_seconds": round(seconds, 2), "link_mib_whole_run": round(sent, 1)}


# ====================================================================== report
def measure(inputs: dict, args: argparse.Namespace) -> tuple[dict, dict]:
    """DistDGL, then gnnscale, ``--repeats`` times; each side's row with the medians over repeats.

    Every run also records the host's 1-minute load average before it starts: the host is shared, and
    anything else running skews both sides' epochs.
    """
    runs: dict[str, list[dict]] = {"distdgl": [], "gnnscale": []}
    for repeat in range(args.repeats):
        for side, run in (("distdgl", run_distdgl), ("gnnscale", run_gnnscale)):
            load = os.getloadavg()[0]
            log(f"[{repeat + 1}/{args.repeats}] {side}: 2 machines at {args.rate} (host load {load:.2f})")
            runs[side].append({**run(inputs, args), "load_before": round(load, 2)})
            r = runs[side][-1]
            log(f"  epochs {[round(s, 2) for s in r['epoch_seconds']]} s, val {r['val_acc']:.4f}, "
                f"test {r['test_acc']:.4f}")
    return combine(runs["distdgl"]), combine(runs["gnnscale"])


def combine(repeats: list[dict]) -> dict:
    """One row from a side's repeats: the first's fields, medians of the figures, every repeat kept."""
    row = dict(repeats[0])
    for key in ("epoch_time", "val_acc", "test_acc", "link_mib_whole_run"):
        row[key] = statistics.median(r[key] for r in repeats)
    row["repeat_epoch_time"] = [r["epoch_time"] for r in repeats]
    row["repeats"] = repeats
    return row


def report(distdgl: dict, ours: dict, args: argparse.Namespace) -> tuple[str, str]:
    """The Markdown table and the verdict line."""
    lines = [f"| run (2 machines x 1 core, {args.rate}) | epoch s (median) | each repeat's epoch s | val acc | "
             "test acc | MiB over the links (whole run) |", "|---|---|---|---|---|---|"]
    for name, r in (("DistDGL, 1 server + 1 trainer per machine", distdgl), ("gnnscale, 1 rank per machine", ours)):
        lines.append(f"| {name} | {r['epoch_time']:.2f} | {', '.join(f'{s:.2f}' for s in r['repeat_epoch_time'])} | "
                     f"{r['val_acc']:.4f} | {r['test_acc']:.4f} | {r['link_mib_whole_run']:.1f} |")
    ratio, delta = ours["epoch_time"] / distdgl["epoch_time"], ours["val_acc"] - distdgl["val_acc"]
    met = ratio <= TARGET_RATIO and abs(delta) <= ACCURACY_DELTA
    verdict = (f"epoch-time ratio gnnscale / DistDGL: {ratio:.2f}, val delta {delta:+.4f} (target <= {TARGET_RATIO} "
               f"within {ACCURACY_DELTA}): {'met' if met else 'NOT met'}")
    return "\n".join(lines), verdict


def main() -> int:
    args = build_parser().parse_args()
    try:
        if args.epochs < 1 or args.repeats < 1 or args.num_nodes < 1000:
            raise ValueError(f"--epochs {args.epochs}, --repeats {args.repeats}, --num-nodes {args.num_nodes}: "
                             f"need at least 1 epoch, 1 repeat and 1000 nodes")
        check_host()
        ClusterSpec(rate=args.rate)
    except (ClusterError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    # Every child (partitioners, servers, trainers, through the harness's environment) imports gnnscale.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    inputs = prepare(args)
    try:
        distdgl, ours = measure(inputs, args)
    except DistDGLFailure as error:
        print(f"error: DistDGL cannot run on the emulated cluster: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; the emulated cluster and its /dev/shm folders were removed", file=sys.stderr)
        return 130
    text, verdict = report(distdgl, ours, args)
    print("\n" + text + "\n\n" + verdict)
    summary = {"results": [distdgl, ours], "ratio_epoch_time": ours["epoch_time"] / distdgl["epoch_time"],
               "val_delta": ours["val_acc"] - distdgl["val_acc"], "verdict": verdict,
               "targets": {"ratio": TARGET_RATIO, "accuracy_delta": ACCURACY_DELTA}, "rate": args.rate,
               "graph": inputs["graph"], "epochs": args.epochs, "repeats": args.repeats, "model": MODEL_ARGS,
               "batch_size_per_trainer": BATCH_SIZE, "partition_seconds": inputs["partition_seconds"],
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "command": " ".join(sys.argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(strict_json(summary))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
