"""Progress and quality: time and memory per stage, and the quality table printed at the end."""

from __future__ import annotations

import resource
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import psutil

_GIB = 2**30
# The per-partition share columns of the report, where --part-weights was given: ``quality["shares"]`` key -> title.
_SHARE_COLUMNS = {"requested": "requested share", "nodes": "node share", "train": "train share",
                  "edges": "edge share"}


def _high_water_bytes() -> int:
    """The process' peak RSS so far (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class StageMonitor:
    """Times named stages and records each one's peak RSS; logs one line per finished stage.

    A stage's peak is exact when the stage raised the process' high-water mark (then it is
    that mark).  Otherwise it is the largest RSS seen by a sampler thread polling every
    ``interval`` seconds, which may miss a short spike, and which does not run while a C
    extension holds the GIL (pymetis does) -- but such a stage stayed below an earlier peak.
    """

    def __init__(self, log: Callable[[str], None] | None = None, interval: float = 0.05) -> None:
        self.log = log
        self.interval = interval
        self.records: dict[str, dict[str, float]] = {}
        self._process = psutil.Process()
        self._open: list[str] = []  # the stages running now, outermost first: a stage inside another is its part

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start_rss, start_peak = self._process.memory_info().rss, _high_water_bytes()
        sampled = [start_rss]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(self.interval):
                sampled[0] = max(sampled[0], self._process.memory_info().rss)

        sampler = threading.Thread(target=sample, name=f"rss-{name}", daemon=True)
        sampler.start()
        start = time.perf_counter()
        within = self._open[-1] if self._open else None
        self._open.append(name)
        try:
            yield
        finally:
            self._open.pop()
            seconds = time.perf_counter() - start
            done.set()
            sampler.join()
            end_rss, end_peak = self._process.memory_info().rss, _high_water_bytes()
            peak = end_peak if end_peak > start_peak else max(sampled[0], end_rss)
            self.records[name] = {"seconds": round(seconds, 3), "peak_rss_gib": round(peak / _GIB, 3),
                                  "rss_end_gib": round(end_rss / _GIB, 3), **({"within": within} if within else {})}
        if self.log is not None:
            self.log(f"{('  ' if within else '') + name:<9} {seconds:7.1f} s   peak RSS {peak / _GIB:6.2f} GiB   "
                     f"RSS after {end_rss / _GIB:6.2f} GiB")

    def summary(self) -> dict[str, Any]:
        """The stage records plus ``total_seconds`` and ``peak_rss_gib`` (the process' high-water mark)."""
        return {"stages": dict(self.records),
                "total_seconds": round(sum(r["seconds"] for r in self.records.values() if "within" not in r), 3),
                "peak_rss_gib": round(_high_water_bytes() / _GIB, 3)}


def quality_figures(parts: list[dict], num_edges: int, constrained: list[str], metis_cut: int | None, *,
                    shares: Sequence[float] | None = None) -> dict:
    """Edge cut, balance per constraint, halo sizes and replication factor from per-partition counts.

    ``balance`` is max/mean over partitions of owned nodes, training nodes and stored
    in-edges -- all three, whether or not METIS was asked to balance them (``constrained``).
    Given ``shares`` (each partition's requested share, summing to 1) it is the largest
    achieved/requested share instead, and ``shares`` records both per partition.
    """
    def max_over_mean(key: str) -> float:
        if shares is not None:
            return round(max(value / share for value, share in zip(achieved(key), shares)), 4)
        values = [p[key] for p in parts]
        mean = sum(values) / len(values)
        return round(max(values) / mean, 4) if mean else 1.0

    def achieved(key: str) -> list[float]:
        values = [p[key] for p in parts]
        return [value / sum(values) if sum(values) else share for value, share in zip(values, shares)]

    num_nodes = sum(p["num_nodes"] for p in parts)
    num_cut = sum(p["num_cut_edges"] for p in parts)
    num_halo = sum(p["num_halo"] for p in parts)
    figures = {
        "edge_cut_fraction": round(num_cut / num_edges, 6) if num_edges else 0.0,
        "num_cut_edges": num_cut,
        "balance": {"nodes": max_over_mean("num_nodes"), "train": max_over_mean("num_train"),
                    "edges": max_over_mean("num_edges")},
        "balance_constrained": list(constrained),
        "halo_nodes": [p["num_halo"] for p in parts],
        "replication_factor": round((num_nodes + num_halo) / num_nodes, 4),
    }
    if metis_cut is not None:
        figures["metis_cut_undirected_edges"] = metis_cut
    if shares is not None:
        figures["shares"] = {"requested": [round(share, 4) for share in shares],
                             **{name: [round(value, 4) for value in achieved(f"num_{name}")]
                                for name in ("nodes", "train", "edges")}}
    return figures


def format_report(manifest: dict) -> str:
    """The quality and stage tables of a manifest, as printed by the command line."""
    quality, parts = manifest["quality"], manifest["parts"]
    shares = quality.get("shares")  # only where --part-weights was given
    lines = [f"{'part':>4}  {'nodes':>12}  {'in-edges':>13}  {'cut in-edges':>13}  {'train':>10}  {'halo':>11}"
             + "".join(f"  {title}" for title in _SHARE_COLUMNS.values() if shares)]
    for p in parts:
        lines.append(f"{p['part']:>4}  {p['num_nodes']:>12,}  {p['num_edges']:>13,}  {p['num_cut_edges']:>13,}  "
                     f"{p['num_train']:>10,}  {p['num_halo']:>11,}"
                     + "".join(f"  {shares[key][p['part']]:>{len(title)}.4f}"
                               for key, title in _SHARE_COLUMNS.items() if shares))
    constrained = set(quality["balance_constrained"])
    balance = "  ".join(f"{name} {value:.3f}{'*' if name in constrained else ''}"
                        for name, value in quality["balance"].items())
    lines += [
        f"edge cut: {quality['edge_cut_fraction']:.2%} of {manifest['num_edges']:,} stored edges "
        f"({quality['num_cut_edges']:,} cross partitions)",
        f"balance max/{'requested share' if shares else 'mean'}: {balance}"
        + ("   (* = --balance constraint)" if constrained else ""),
        f"halo (H={manifest['halo_hops']}): replication factor (owned + halo) / owned = "
        f"{quality['replication_factor']:.3f}",
    ]
    stages = manifest.get("stages", {})
    if stages.get("stages"):
        lines.append(f"{'stage':<9}  {'seconds':>8}  {'peak RSS GiB':>12}")
        for name, record in stages["stages"].items():  # a stage's parts come before it, indented
            name = f"  {name}" if "within" in record else name
            lines.append(f"{name:<9}  {record['seconds']:>8.2f}  {record['peak_rss_gib']:>12.2f}")
        lines.append(f"{'total':<9}  {stages['total_seconds']:>8.2f}  {stages['peak_rss_gib']:>12.2f}")
    return "\n".join(lines)
