"""How long each command takes to refuse the inputs that used to fail only after work (issue 13).

    python scripts/bench_refusals.py                          # real datasets from ../shared/datasets
    python scripts/bench_refusals.py --data-root DIR --num-nodes 1000000

Each case is the command a user runs, at full size, with one thing wrong; most used to train
every epoch (or run METIS) before failing, or to crash with a traceback.  Built in a temporary
folder: a copy of Tolokers with an empty validation or test mask, ``--out`` an existing file
(node classification on Cora, TGN on Wikipedia, a ``--partitions`` run, ``python -m partition``
on the synthetic graph), ``--out`` where nothing can be created (``/proc``), a one-part folder of
the synthetic graph with each semantic corruption and its checksums recomputed, and a
one-event stream.  Each is timed from launch to exit, in a fresh process: it must exit
non-zero with exactly one ``error:`` line and no traceback on stderr (progress lines logged
before it are allowed: the commands run without ``--quiet``), within ``--limit`` seconds (10).

Cases whose dataset is missing under ``--data-root`` are skipped with the reason.  Results go
to ``--out`` as JSON; the exit status is 1 when a case misses the limit or is not refused.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from partition.format import sha256_file

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(ROOT / "scripts" / "train_node_classification.py")]
TEMPORAL = [sys.executable, str(ROOT / "scripts" / "train_temporal.py")]
PARTITION = [sys.executable, "-m", "partition"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=ROOT.parent / "shared" / "datasets",
                        help="folder holding cora/, tolokers/ and wikipedia/")
    parser.add_argument("--num-nodes", type=int, default=1_000_000, help="nodes of the synthetic graph")
    parser.add_argument("--limit", type=float, default=10.0, help="seconds a refusal may take")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_refusals.json")
    return parser


def rehash(parts: Path, rel: str) -> None:
    """Record ``rel``'s new size and sha256 in the manifest, as a tool that rewrote it would."""
    manifest = json.loads((parts / "manifest.json").read_text())
    path = parts / rel
    manifest["files"][rel].update(sha256=sha256_file(path), bytes=path.stat().st_size)
    (parts / "manifest.json").write_text(json.dumps(manifest, indent=1))


def corrupt(source: Path, target: Path, rel: str, edit) -> Path:
    """A copy of the partition folder ``source`` whose array ``rel`` went through ``edit``, checksums recomputed."""
    shutil.copytree(source, target)
    array = np.load(target / rel, mmap_mode="r+")
    edit(array)
    array.flush()
    del array
    rehash(target, rel)
    return target


def cases(work: Path, args: argparse.Namespace) -> list[tuple[str, list[str] | None, str]]:
    """(name, command or None, what it stands for or why it is skipped), building the inputs."""
    root = args.data_root
    out = work / "taken"
    out.write_text("a file where the output folder should go\n")
    found = []

    tolokers = root / "tolokers" / "tolokers.npz"
    if tolokers.is_file():
        for mask in ("val_masks", "test_masks"):
            data = dict(np.load(tolokers, allow_pickle=False))
            data[mask][:] = False
            folder = work / f"tolokers-no-{mask}"
            folder.mkdir()
            np.savez(folder / "tolokers.npz", **data)
            found.append((f"Tolokers, every {mask} empty", TRAIN + ["--dataset", "tolokers", "--data-dir",
                                                                     str(folder), "--out", str(work / "o1")], ""))
    else:
        found.append(("Tolokers, empty masks", None, f"{tolokers} not found"))

    cora = root / "cora"
    found.append(("--out a file: node classification on Cora", TRAIN + ["--dataset", "cora", "--data-dir", str(cora),
                                                                        "--out", str(out)], "")
                 if cora.is_dir() else ("--out a file: Cora", None, f"{cora} not found"))
    wikipedia = root / "wikipedia"
    found.append(("--out a file: TGN on Wikipedia", TEMPORAL + ["--dataset", "wikipedia", "--data-dir", str(wikipedia),
                                                                "--out", str(out)], "")
                 if wikipedia.is_dir() else ("--out a file: Wikipedia", None, f"{wikipedia} not found"))
    if cora.is_dir():
        found.append(("--out not creatable: Cora", TRAIN + ["--dataset", "cora", "--data-dir", str(cora),
                                                            "--out", "/proc/1/gnnscale-run"], ""))
    if wikipedia.is_dir():
        found.append(("--out not creatable: Wikipedia", TEMPORAL + ["--dataset", "wikipedia", "--data-dir",
                                                                    str(wikipedia), "--out", "/proc/1/gnnscale-run"], ""))
    synthetic = ["--dataset", "synthetic", "--num-nodes", str(args.num_nodes)]
    found.append((f"--out a file: partition {args.num_nodes:,} nodes", PARTITION + synthetic + [
        "--num-parts", "2", "--out", str(out / "parts")], ""))
    found.append((f"--out not creatable: partition {args.num_nodes:,} nodes", PARTITION + synthetic + [
        "--num-parts", "2", "--out", "/proc/1/gnnscale-parts"], ""))

    parts = work / "parts"
    print(f"partitioning {args.num_nodes:,} synthetic nodes into 1 part (input of the corrupted folders) ...",
          flush=True)
    subprocess.run(PARTITION + synthetic + ["--num-parts", "1", "--out", str(parts), "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    run = ["--epochs", "1", "--out"]
    found.append(("--out a file: --partitions run", TRAIN + ["--partitions", str(parts)] + run + [str(out)], ""))
    n = json.loads((parts / "manifest.json").read_text())["num_nodes"]
    edits = {
        "source id >= N": ("part0/indices.npy", lambda a: a.__setitem__(7, n)),
        "negative source id": ("part0/indices.npy", lambda a: a.__setitem__(7, -1)),
        "label out of range": ("part0/labels.npy", lambda a: a.__setitem__(3, 99)),
        "orig2new not a permutation": ("orig2new.npy", lambda a: a.__setitem__(slice(0, 2), a[0])),
    }
    for name, (rel, edit) in edits.items():
        folder = corrupt(parts, work / name.replace(" ", "-"), rel, edit)
        found.append((f"{args.num_nodes:,}-node folder, {name}, checksums recomputed",
                      TRAIN + ["--partitions", str(folder)] + run + [str(work / "o2")], ""))

    events = work / "one-event.csv"
    events.write_text("u,i,ts,label\n0,1,1.0,0\n")
    found.append(("a one-event stream", TEMPORAL + ["--dataset", "csv", "--data-dir", str(events), "--out",
                                                    str(work / "o3")], ""))
    return found


def time_refusal(command: list[str], limit: float) -> dict:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=max(limit * 6, 60))
    seconds = time.perf_counter() - start
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    refused = done.returncode != 0 and len(errors) == 1 and "Traceback" not in done.stderr
    return {"seconds": round(seconds, 2), "exit": done.returncode, "error": errors[-1] if errors else done.stderr,
            "ok": refused and seconds <= limit}


def main() -> None:
    args = build_parser().parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_refusals_") as tmp:
        for name, command, note in cases(Path(tmp), args):
            if command is None:
                print(f"skipped  {name}: {note}")
                results.append({"case": name, "skipped": note})
                continue
            result = {"case": name, **time_refusal(command, args.limit)}
            results.append(result)
            verdict = "ok" if result["ok"] else "FAILED"
            print(f"{verdict:6s} {result['seconds']:6.2f} s  exit {result['exit']}  {name}\n"
                  f"       {result['error'][:240].replace(tmp, '$TMP')}", flush=True)
    timed = [r for r in results if "seconds" in r]
    bad = [r["case"] for r in timed if not r["ok"]]
    print(f"{len(timed)} cases, slowest {max(r['seconds'] for r in timed):.2f} s (limit {args.limit:.0f} s); "
          + (f"FAILED: {', '.join(bad)}" if bad else "all refused with one line within the limit"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"limit_s": args.limit, "cases": results}, indent=1, allow_nan=False))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
