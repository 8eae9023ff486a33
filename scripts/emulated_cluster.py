"""Run a torchrun job on an emulated cluster: K network namespaces behind rate-limited links, on this host.

    sudo python scripts/emulated_cluster.py --machines 2 --rate 1gbit -- \\
        scripts/train_node_classification.py --partitions parts/synthetic-2 --epochs 3
    sudo python scripts/emulated_cluster.py --cleanup      # remove leftovers of a harness killed with -9

Each machine is a network namespace with its own address on a private /24, joined to a bridge by a
veth pair whose egress is shaped to ``--rate`` (tc tbf); one torchrun agent per machine
(``--nnodes K``, c10d rendezvous at machine 0), pinned to ``--cores-per-machine`` cores of its own.
Everything after ``--`` is torchrun's script and its arguments.  Output lines are prefixed
``[mI]`` and kept in ``--log-dir``.  ``--machine-memory-mb`` holds each machine's processes to a
memory limit (a cgroup); a machine that goes over it is reported as OUT OF MEMORY.  Exit code: 0 when
every machine exits 0, else the first failure's (an out-of-memory machine's first; 124 past
``--timeout``).  Details: docs/distributed.md, "Emulated cluster".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench.emulated import ClusterError, ClusterSpec, EmulatedCluster, rate_bits, remove_stale  # noqa: E402


def machine_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of machine numbers, e.g. 1")


def memory_limits(text: str) -> int | tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory limit in MiB, one for all machines or one per "
                                         f"machine (0 = none), e.g. 1536 or 1536,1536,0")
    return values[0] if len(values) == 1 else values


def link_rate(text: str) -> str | None:
    if text.lower() == "none":
        return None
    try:
        rate_bits(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error))
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--machines", type=int, default=2, help="network namespaces, one torchrun agent each")
    parser.add_argument("--rate", type=link_rate, default="10gbit", help="each machine's egress rate (tc tbf), "
                        "e.g. 10gbit, 1gbit, 100mbit; none = unshaped")
    parser.add_argument("--cores-per-machine", type=int, default=1, help="host cores pinned to each machine")
    parser.add_argument("--nproc-per-machine", type=int, default=1, help="ranks per machine")
    parser.add_argument("--slow-machines", type=machine_list, default=(), help="machines made slow, e.g. 1: a "
                        "CPU quota of --slow-factor of their cores (a cgroup), or a busy process sharing them")
    parser.add_argument("--slow-factor", type=float, default=0.5, help="share of their cores slow machines get")
    parser.add_argument("--machine-memory-mb", type=memory_limits, default=None, help="memory limit in MiB of "
                        "each machine's processes (a cgroup, swap included): one for all, or one per machine, "
                        "0 = none; a machine over it is reported OUT OF MEMORY")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before every machine is stopped")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "runs" / "emulated_cluster")
    parser.add_argument("--cleanup", action="store_true", help="only remove namespaces and bridges of harnesses "
                        "that no longer run")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS...: what torchrun runs")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if args.cleanup:
            removed = remove_stale()
            print(f"removed {len(removed)} leftover(s){': ' + ', '.join(removed) if removed else ''}")
            return 0
        if not command:
            parser.error("give the command after --, e.g. -- scripts/train_node_classification.py --partitions DIR")
        spec = ClusterSpec(machines=args.machines, rate=args.rate, cores_per_machine=args.cores_per_machine,
                           nproc_per_machine=args.nproc_per_machine, slow_machines=args.slow_machines,
                           slow_factor=args.slow_factor, memory_mb=args.machine_memory_mb)
        with EmulatedCluster(spec, args.log_dir, echo=sys.stdout) as cluster:
            start = time.perf_counter()
            runs = cluster.run(command, timeout=args.timeout)
    except (ClusterError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; the emulated cluster was removed", file=sys.stderr)
        return 130
    # The machine that ran out of memory, else the one that failed first by itself, not those the harness
    # then stopped.
    failed = sorted((r for r in runs if r.returncode != 0 or r.out_of_memory),
                    key=lambda r: (not r.out_of_memory, r.stopped, r.seconds))
    verdict = "all exited 0" if not failed else failed[0].describe_failure()
    hint = "; give it more memory with --machine-memory-mb" if failed and failed[0].out_of_memory else ""
    peaks = [f"m{r.machine} {r.peak_mb:,.0f}" for r in runs if r.peak_mb is not None]
    if peaks:
        print(f"peak memory per machine (MiB, limit {'/'.join(str(r.memory_mb or 'none') for r in runs)}): "
              + ", ".join(peaks), file=sys.stderr if failed else sys.stdout)
    print(f"{spec.machines} machine(s) at {spec.rate or 'unshaped'}: {verdict} in {time.perf_counter() - start:.1f} s; "
          f"logs in {args.log_dir}{hint}", file=sys.stderr if failed else sys.stdout)
    code = (failed[0].returncode or 137) if failed else 0
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell says


if __name__ == "__main__":
    sys.exit(main())
