"""What a rank holds: a memory account per structure, beside the process's resident and peak memory.

:func:`account` walks the objects of a run (the graph handle, its loaders, the model and optimizer) and adds
up the bytes of every tensor and array it finds, per structure:

* ``partition``: the owned nodes' in-edges, labels, split ids (and edge features);
* ``halo_and_id_maps``: the halo list, the id maps of the partition book, the feature store's id map;
* ``features``: the owned feature rows (resident, or memory-mapped: :mod:`gnnscale.distributed.mapped`);
* ``feature_cache``: cached remote rows and their ids (and a mapped table's hot cache);
* ``sampler``: a replicated whole-graph structure, degree tables, what the samplers keep;
* ``pipeline``: the loaders' reused buffer slots;
* ``evaluation``: layer-wise inference's full-neighbour blocks;
* ``communication``: tensors of finished collectives held for gloo (:func:`gnnscale.distributed.comm.keep`);
* ``optimizer``: parameters, gradients and optimizer state.

Each byte is counted once (views of one buffer are merged; the first structure that names a buffer gets it).
Bytes that lie in a file mapping (``np.load(mmap_mode="r")``) are reported apart as ``mapped``: they count
in the process's RSS only while their pages are resident, and the kernel may drop them under pressure.
``rss`` and ``peak_rss`` (VmHWM) come from ``/proc/self/status``; ``heap_in_use`` and ``heap_free`` from glibc's
``mallinfo2``.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnscale.data.pages import release_map
from gnnscale.pipeline.allocator import heap_bytes

STRUCTURES = ("partition", "halo_and_id_maps", "features", "feature_cache", "sampler", "pipeline", "evaluation",
              "communication", "optimizer")
"""The structures of an account, in the order they claim shared buffers."""

MIB = 2**20


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_bytes() -> int:
    """The process's peak resident memory (VmHWM), in bytes; ``ru_maxrss`` where /proc is missing."""
    kib = _status_kib("VmHWM")
    if kib is None:
        import resource

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * 1024


def rss_bytes() -> int:
    """The process's resident memory now (VmRSS), in bytes (0 where /proc is missing)."""
    return (_status_kib("VmRSS") or 0) * 1024


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def available_bytes() -> int:
    """Memory this process may still take: the system's available memory, or less where a memory cgroup
    (a container's limit, an emulated machine's) leaves less: its limit minus its usage that cannot be
    reclaimed (usage less inactive page cache), over the process's group and every group above it."""
    import psutil

    available = psutil.virtual_memory().available
    for _, (limit, usage, stat) in _memory_groups():
        if limit is not None:
            available = min(available, max(0, limit - usage + _inactive_file(stat)))
    return available


def memory_limit_bytes() -> int | None:
    """The tightest memory cgroup limit over this process's group and those above it; None where none is set
    (or none can be read)."""
    limits = [limit for _, (limit, _, _) in _memory_groups() if limit is not None]
    return min(limits) if limits else None


def _memory_groups() -> Iterator[tuple[Path, tuple[int | None, int, str]]]:
    """``(group, (limit, usage, memory.stat))`` of this process's memory cgroup and its ancestors (v2, or v1's
    memory controller); nothing where /proc/self/cgroup or the files cannot be read."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            root, files = CGROUP_ROOT, ("memory.max", "memory.current")
            root = root / "unified" if not (root / "cgroup.controllers").exists() else root
        elif "memory" in controllers.split(","):
            root, files = CGROUP_ROOT / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        group = root / path.lstrip("/")
        while True:
            values = _read_group(group, files)
            if values is not None:
                yield group, values
            if group == root or root not in group.parents:
                break
            group = group.parent


def _read_group(group: Path, files: tuple[str, str]) -> tuple[int | None, int, str] | None:
    try:
        limit_text, usage = (group / files[0]).read_text().strip(), int((group / files[1]).read_text())
        stat = (group / "memory.stat").read_text()
    except (OSError, ValueError):
        return None
    limit = None if limit_text == "max" or int(limit_text) >= 2**62 else int(limit_text)
    return limit, usage, stat


def _inactive_file(stat: str) -> int:
    """Reclaimable page cache of a group's ``memory.stat`` (v1 ``total_inactive_file``, v2 ``inactive_file``)."""
    values = dict(line.split(" ", 1) for line in stat.splitlines() if " " in line)
    return int(values.get("total_inactive_file", values.get("inactive_file", 0)))


def release_pages(array: Any) -> None:
    """Drop this process's resident pages of a read-only memory-mapped ``array`` (``MADV_DONTNEED``): they stay
    in the page cache, leave the RSS, and come back on the next read.  A no-op for anything else (a writable or
    copy-on-write map would lose its changes)."""
    release_map(array)


def _file_mappings() -> list[tuple[int, int]]:
    """Sorted ``(start, end)`` address ranges of this process's file-backed mappings."""
    ranges = []
    try:
        with open("/proc/self/maps") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 6 and parts[4] != "0" and parts[5].startswith("/"):
                    low, high = parts[0].split("-")
                    ranges.append((int(low, 16), int(high, 16)))
    except OSError:
        return []
    return sorted(ranges)


class _Ledger:
    """Address intervals already counted, and which of them are file mappings."""

    def __init__(self) -> None:
        self.claimed: list[tuple[int, int]] = []
        self.mappings = _file_mappings()
        self._starts = [low for low, _ in self.mappings]

    def is_mapped(self, address: int) -> bool:
        i = bisect.bisect_right(self._starts, address) - 1
        return i >= 0 and address < self.mappings[i][1]

    def claim(self, low: int, high: int) -> int:
        """Bytes of ``[low, high)`` not counted before (and mark them counted)."""
        new, cursor = 0, low
        for a, b in sorted(self.claimed):
            if b <= cursor or a >= high:
                continue
            new += max(0, a - cursor)
            cursor = max(cursor, b)
        new += max(0, high - cursor)
        if new:
            self.claimed.append((low, high))
        return new


def _extent(obj: Tensor | np.ndarray) -> tuple[int, int] | None:
    """``(address, bytes)`` of the memory ``obj`` spans (its storage for non-contiguous tensors)."""
    if isinstance(obj, Tensor):
        if obj.device.type != "cpu" or obj.is_sparse:
            return None
        if obj.is_contiguous():
            return obj.data_ptr(), obj.numel() * obj.element_size()
        storage = obj.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    if obj.flags.c_contiguous or obj.flags.f_contiguous:
        return obj.ctypes.data, obj.nbytes
    base = obj
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base.ctypes.data, base.nbytes


def _arrays(obj: Any, depth: int = 4, seen: set[int] | None = None) -> Iterator[Tensor | np.ndarray]:
    """Every tensor and array reachable from ``obj`` through attributes, fields and containers (``depth``
    levels deep; modules give their parameters and buffers)."""
    seen = set() if seen is None else seen
    if obj is None or id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    if isinstance(obj, (Tensor, np.ndarray)):
        yield obj
        return
    if isinstance(obj, torch.nn.Module):
        yield from (t for t in obj.state_dict(keep_vars=True).values() if isinstance(t, Tensor))
        return
    if isinstance(obj, (str, bytes, int, float, bool, type)) or callable(obj) and not hasattr(obj, "__dict__"):
        return
    if isinstance(obj, dict):
        children: Iterable[Any] = obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)) or type(obj).__name__ == "deque":
        children = list(obj)
    elif dataclasses.is_dataclass(obj):
        children = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    else:
        children = list(getattr(obj, "__dict__", {}).values())
    for child in children:
        yield from _arrays(child, depth - 1, seen)


@dataclass
class MemoryAccount:
    """One rank's bytes per structure (``resident``: in anonymous memory; ``mapped``: in file mappings) and the
    process's resident and peak memory, all in bytes."""

    rank: int = 0
    resident: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STRUCTURES, 0))
    mapped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STRUCTURES, 0))
    rss: int = 0
    peak_rss: int = 0
    rss_file: int = 0
    """The part of ``rss`` in file pages (libraries, mapped partition files): shared, and evictable."""
    heap_in_use: int = 0
    heap_free: int = 0
    """What ``malloc`` has handed out, and what it holds free (:func:`gnnscale.pipeline.allocator.heap_bytes`; 0
    where the C library does not say): the free part is most of what ``rss`` holds beyond ``accounted``."""

    @property
    def total_resident(self) -> int:
        return sum(self.resident.values())

    def add(self, structure: str, objects: Iterable[Any], ledger: _Ledger) -> None:
        assert structure in STRUCTURES, structure
        for array in _arrays(list(objects)):
            extent = _extent(array)
            if extent is None or extent[1] == 0:
                continue
            address, size = extent
            new = ledger.claim(address, address + size)
            target = self.mapped if ledger.is_mapped(address) else self.resident
            target[structure] += new

    def as_dict(self) -> dict[str, Any]:
        """MiB, rounded to 0.1, for metrics.json."""
        return {"rank": self.rank, "resident_mib": {k: round(v / MIB, 1) for k, v in self.resident.items()},
                "mapped_mib": {k: round(v / MIB, 1) for k, v in self.mapped.items() if v},
                "accounted_mib": round(self.total_resident / MIB, 1), "rss_mib": round(self.rss / MIB, 1),
                "rss_file_mib": round(self.rss_file / MIB, 1), "peak_rss_mib": round(self.peak_rss / MIB, 1),
                "heap_in_use_mib": round(self.heap_in_use / MIB, 1), "heap_free_mib": round(self.heap_free / MIB, 1)}

    def line(self) -> str:
        """One log line: the structures that hold anything, then RSS and peak."""
        held = ", ".join(f"{k} {v / MIB:.1f}" for k, v in self.resident.items() if v >= MIB // 10)
        mapped = ", ".join(f"{k} {v / MIB:.1f}" for k, v in self.mapped.items() if v)
        return (f"rank {self.rank} memory (MiB): {held or 'nothing'}; accounted {self.total_resident / MIB:.1f}"
                + (f"; mapped: {mapped}" if mapped else "")
                + f"; rss {self.rss / MIB:.1f} ({self.rss_file / MIB:.1f} in files), peak {self.peak_rss / MIB:.1f}"
                + (f"; heap free {self.heap_free / MIB:.1f}" if self.heap_in_use else ""))

    def to_tensor(self) -> Tensor:
        return torch.tensor([self.rank, *self.resident.values(), *self.mapped.values(), self.rss, self.rss_file,
                             self.peak_rss, self.heap_in_use, self.heap_free],
                            dtype=torch.float64)

    @classmethod
    def from_tensor(cls, values: Tensor) -> "MemoryAccount":
        n = len(STRUCTURES)
        ints = [int(v) for v in values.tolist()]
        rss, rss_file, peak_rss, heap_in_use, heap_free = ints[1 + 2 * n:]
        return cls(rank=ints[0], resident=dict(zip(STRUCTURES, ints[1:1 + n])),
                   mapped=dict(zip(STRUCTURES, ints[1 + n:1 + 2 * n])), rss=rss, rss_file=rss_file,
                   peak_rss=peak_rss, heap_in_use=heap_in_use, heap_free=heap_free)


def account(graph: Any, *, loaders: Iterable[Any] = (), model: torch.nn.Module | None = None,
            optimizer: torch.optim.Optimizer | None = None) -> MemoryAccount:
    """This rank's account of ``graph`` (a :class:`gnnscale.Graph`), its ``loaders`` (node or link loaders)
    and the ``model`` and ``optimizer`` that train on it.  Not a collective."""
    from gnnscale.distributed import comm

    ledger, result = _Ledger(), MemoryAccount(rank=graph.world.rank)
    features, memo, part = graph.features, graph._memo, graph.part
    loaders = list(loaders)
    result.add("features", [features.rows, getattr(features, "mapped_rows", None)], ledger)
    result.add("feature_cache", [features.cache_ids, features.cache_rows, getattr(features, "hot", None)], ledger)
    result.add("partition", [graph.structure.indptr, graph.structure.indices, graph.structure.degree, graph.labels,
                             graph.train_ids, graph.val_ids, graph.test_ids, graph.edge_features], ledger)
    result.add("halo_and_id_maps", [memo.get("halo"), getattr(features, "_where", None), graph.offsets,
                                    part.book.orig2new, part.orig_ids, part.halo_ids], ledger)
    # What is left of the partition's own arrays: memory maps (or in-memory arrays of a world of one).
    result.add("partition", [part.indptr, part.indices, part.features, part.labels, part.train_masks,
                             part.val_masks, part.test_masks, part.edge_features], ledger)
    result.add("sampler", [memo.get("replicated"), memo.get("halo_structure"), memo.get("degrees"),
                           *(getattr(loader, "sampler", None) for loader in loaders)], ledger)
    result.add("pipeline", [getattr(getattr(loader, "_loader", None), "_slots", None) for loader in loaders], ledger)
    result.add("evaluation", [getattr(v, "blocks", v) for k, v in memo.items()  # kept blocks (gnnscale.inference)
                              if isinstance(k, tuple) and k[0] == "inference-blocks"], ledger)
    result.add("communication", [list(comm._KEPT)], ledger)
    if model is not None:
        params = list(model.parameters())
        result.add("optimizer", [params, [p.grad for p in params if p.grad is not None]], ledger)
    if optimizer is not None:
        result.add("optimizer", [optimizer.state], ledger)
    result.rss, result.peak_rss = rss_bytes(), peak_rss_bytes()
    result.rss_file = (_status_kib("RssFile") or 0) * 1024
    result.heap_in_use, result.heap_free = heap_bytes() or (0, 0)
    return result


def gather_accounts(exchanger: Any, mine: MemoryAccount) -> list[MemoryAccount]:
    """Every rank's account, in rank order (a collective on several ranks)."""
    rows = exchanger.all_gather_rows(mine.to_tensor().unsqueeze(0))
    return [MemoryAccount.from_tensor(row) for row in rows]


def accounts_record(accounts: list[MemoryAccount]) -> dict[str, Any]:
    """What metrics.json's ``memory`` holds for one moment: every rank's account and the summed peak RSS."""
    return {"ranks": [a.as_dict() for a in accounts],
            "peak_rss_mib_sum": round(sum(a.peak_rss for a in accounts) / MIB, 1),
            "peak_rss_mib_max": round(max(a.peak_rss for a in accounts) / MIB, 1)}


def report(graph: Any, moment: str, *, loaders: Iterable[Any] = (), model: torch.nn.Module | None = None,
           optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Every rank's account at ``moment`` (``start``, ``end``), logged by the main rank one line per rank, as
    metrics.json's record.  A collective on several ranks."""
    import logging

    mine = account(graph, loaders=loaders, model=model, optimizer=optimizer)
    every = gather_accounts(graph.world.exchanger, mine)
    if graph.world.is_main:
        log = logging.getLogger("gnnscale.memory")
        for entry in every:
            log.info("%s: %s", moment, entry.line())
    return accounts_record(every)
