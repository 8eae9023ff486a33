"""Keep freed memory in the process instead of returning it to the kernel after every batch.

A mini-batch step allocates and frees tensors of tens to hundreds of MiB (sampled ids,
gathered features, activations, gradients).  glibc's ``malloc`` serves such sizes with fresh
``mmap`` regions and unmaps them on ``free``, so every step page-faults its working set in
again: on the 1M-node synthetic graph (GraphSAGE 3x256, fanouts 15,10,5, batch 1024),
``python scripts/train_node_classification.py --dataset synthetic --num-nodes 1000000
--epochs 2`` took 18.1 s per epoch with freed memory kept and 27.6 s with
``--no-keep-freed-memory``; DGL's standard pipeline went from 51.7 s to 27.7 s per epoch the
same way (``scripts/bench_single_process.py``).  PyTorch's CPU tensors and numpy arrays both come from
``malloc``, so one ``mallopt`` call fixes both.  The cost is that the process's resident
size stays at its high-water mark instead of shrinking between steps.

The same effect is available to any program through glibc's environment variables
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) or by preloading jemalloc/tcmalloc; this module
applies it from inside: the training commands call it in ``main()`` unless ``--no-keep-freed-memory``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("gnnscale.pipeline")

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

_applied: bool | None = None

KEEP_MIN_LIMIT_BYTES = 8 * 2**30
"""A memory cgroup limit below this many bytes per rank of the machine is small: without ``--memory-budget`` the
training command then takes a budget from it (:func:`gnnscale.train.cli.budget_from_limit`), and so returns
freed memory to the system, as under any budget (on 4 emulated machines of 1800 MiB, a 1M-node graph of 256
features was killed at start with freed memory kept and the cache sized by the host's memory:
``scripts/bench_memory_limited.py``)."""


def _libc(name: str, argtypes: list, restype: type) -> Any:
    """The C library's function ``name`` with its types set, or None where it has none (musl, macOS, old glibc)."""
    path = ctypes.util.find_library("c")
    try:
        function = getattr(ctypes.CDLL(path), name) if path else None
    except (OSError, AttributeError):
        return None
    if function is not None:
        function.argtypes, function.restype = argtypes, restype
    return function


def _mallopt():
    """glibc's ``mallopt``, or None."""
    return _libc("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)


def keep_freed_memory(mmap_threshold: int = 1 << 30, trim_threshold: int = 4 << 30) -> bool:
    """Ask glibc to serve allocations below ``mmap_threshold`` bytes from its heap and to keep up
    to ``trim_threshold`` bytes of freed heap; idempotent.  Returns whether it applied (False on a
    C library without ``mallopt``, e.g. musl or macOS, where nothing changes)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    mallopt = _mallopt()
    if mallopt is None:
        log.debug("mallopt is not available; freed memory is returned to the system as usual")
        return False
    # mallopt takes an int: 1 GiB and 4 GiB do not fit the trim threshold, so it is clamped.
    trim = min(trim_threshold, 2**31 - 1)
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, min(mmap_threshold, 2**31 - 1))) and bool(mallopt(_M_TRIM_THRESHOLD, trim))
    return _applied


def _trim() -> None:
    """glibc's ``malloc_trim(0)``: the free pages of every heap, also between live blocks, back to the system."""
    trim = _libc("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
    if trim is not None:
        trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_bytes() -> tuple[int, int] | None:
    """``(in use, free)``: the bytes glibc's ``malloc`` has handed out (its own mappings included) and the bytes it
    holds free in its heaps (resident unless trimmed), from ``mallinfo2``; None without it (glibc < 2.33, musl,
    macOS).  What a process holds beyond its live arrays is mostly the second."""
    info = _libc("mallinfo2", [], _MallInfo2)
    if info is None:
        return None
    stats = info()
    return stats.uordblks + stats.hblkhd, stats.fordblks


@contextlib.contextmanager
def trimmed_heap() -> Iterator[None]:
    """Give the heap's free pages back to the system before and after the block, where :func:`keep_freed_memory`
    applied (elsewhere glibc returns them by itself): for work done once in a while, such as evaluation, which
    would otherwise start on the training steps' kept memory and leave its own behind as holes in the heap.

    Measured on 4 ranks of a 3M-node graph (docs/memory.md): a rank's RSS after evaluation 1,450 -> 1,273 MiB,
    its peak (during evaluation) 1,448-1,459 -> 1,435-1,452, evaluation 20.4 -> 20.3 s.  Mapping evaluation's
    allocations above 1 MiB on their own as well lowered the peak to 1,384-1,397 but took evaluation to 30.4 s
    (every block's buffers faulted in afresh): left out."""
    if not _applied:
        yield
        return
    _trim()
    try:
        yield
    finally:
        _trim()


ARENAS = 2
"""glibc heaps (arenas) a training process may have: :func:`limit_arenas`'s default."""


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Let glibc make at most ``arenas`` heaps, shared by the process's threads; call it before threads allocate.
    Returns whether it applied.

    By default every thread that allocates gets a heap of its own (up to 8 per core), and memory freed in a
    heap stays there for that heap's threads: a rank's loader thread, its gloo threads and the main thread
    each held their own freed memory.  Measured side by side on the 3M-node graph, 4 partitioned ranks at one
    process's global batch (``scripts/bench_rank_memory.py``'s ``four-global``, 2 runs each): 1,651-1,691 MiB a
    rank with 2 heaps against 1,728-1,781 with glibc's default, at the same epoch time within its spread; no
    change at 1M nodes, nor for one process (docs/memory.md)."""
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, arenas))
