"""The planted-community graph of :mod:`gnnscale.data.synthetic`, streamed to an edge-list folder.

``generate_synthetic`` holds every sampled pair, sorts them and drops repeats: about 40 bytes per
edge at its peak.  This writer never holds the edges: it keeps the node layout (communities, labels,
degree weights: about 40 bytes per *node*) and one chunk of pairs, and fills ``edges.npy`` (int32
[E, 2], an :func:`np.lib.format.open_memmap`) chunk by chunk, handing each chunk's pages back to the
page cache once written, so its peak memory is O(chunk + nodes), not O(edges).  ``features.npy``
(float32 [N, F]) is filled the same way; ``labels.npy`` and the three ``*_mask.npy`` follow.  The
folder is what :mod:`gnnscale.data.edgelist` reads (``--dataset edgelist``).

The model is the same (see :mod:`gnnscale.data.synthetic`): first endpoints drawn in proportion to
``theta``, the second inside the own community, another community of the same label, or anywhere.
Labels, features and masks are identical to ``generate_synthetic``'s for the same config.  The edges
differ in three ways:

* every one of the ``E / 2`` pairs is written in both directions, so the file has exactly ``E`` rows;
* pairs come in fixed blocks of :data:`PAIR_BLOCK`, each drawn from its own seed
  (``SeedSequence(seed, spawn_key=(4, block))``), so the file does not depend on ``--chunk-edges``;
* repeats are *not* removed (self-loops are: they are redrawn).  The same pair may be drawn twice,
  within a chunk or across chunks; the edge-list reader drops duplicates.  The duplicate rate depends on
  the average degree, the degree distribution and the community size, not on the graph size: measured
  (docs/partitioning.md) about 6% of the edges at average degree 10 and 7.5% at 20, with the defaults
  (communities of 1,000 nodes, power-law hubs up to 100x the mean degree, which meet each other often).

Example::

    python -m gnnscale.data.synthetic_stream --out /tmp/g100m --num-nodes 10000000 \\
        --num-edges 100000000 --feat-dim 16 --num-classes 10 --seed 0
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from gnnscale.data.synthetic import (SyntheticConfig, _kind_tables, _Layout, _pair_keys, _plant, _split_masks,
                                     fill_features)

PAIR_BLOCK = 1 << 18
"""Pairs drawn from one seed (both directions: twice as many edges); fixed, so chunking changes nothing."""
_EDGE_STREAM = 4  # spawn_key of the edge blocks' seeds: beside generate_synthetic's children 0..3
_MASK_NAMES = ("train_mask", "val_mask", "test_mask")


class StreamError(ValueError):
    """Bad input to the streamed generator; the message names the problem and the fix."""


def stream_config(num_nodes: int, num_edges: int, feat_dim: int, num_classes: int, seed: int,
                  chunk_edges: int = 1 << 23) -> SyntheticConfig:
    """The :class:`SyntheticConfig` for ``num_edges`` directed edges on ``num_nodes`` nodes (the model's
    defaults otherwise); raises :class:`StreamError` for sizes that make no sense."""
    for name, value, low in (("num_nodes", num_nodes, 2), ("num_edges", num_edges, 2), ("feat_dim", feat_dim, 1),
                             ("num_classes", num_classes, 2), ("chunk_edges", chunk_edges, 2), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise StreamError(f"{name}={value!r} is invalid: expected a whole number >= {low}")
    if num_edges % 2:
        raise StreamError(f"num_edges={num_edges} is odd: every pair is written in both directions; "
                          f"pass an even number, e.g. {num_edges + 1}")
    try:
        return SyntheticConfig(num_nodes=num_nodes, avg_degree=num_edges / num_nodes, feat_dim=feat_dim,
                               num_classes=num_classes, seed=seed, chunk_edges=chunk_edges)
    except (TypeError, ValueError) as err:
        raise StreamError(str(err).replace("SyntheticConfig.avg_degree", "num_edges / num_nodes")) from None


def bytes_needed(config: SyntheticConfig, num_edges: int) -> int:
    """Bytes the folder takes: edges (int32), features (float32), labels (int64), masks (bool), headers."""
    n = config.num_nodes
    return num_edges * 2 * 4 + n * config.feat_dim * 4 + n * 8 + 3 * n + 6 * 4096


def _release(array: np.memmap, start: int, stop: int) -> None:
    """Drop the whole pages of rows ``[start, stop)`` of a writable shared file map from this process' RSS.
    On a shared mapping the written data stays in the page cache and reaches the file; nothing is lost."""
    mm = array._mmap  # noqa: SLF001 -- numpy keeps the mmap here; no public handle exists
    if mm is None or not hasattr(mm, "madvise"):
        return
    row = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    base = array.offset % mmap.ALLOCATIONGRANULARITY  # where the data begins inside the map
    lo = -(-(base + start * row) // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (base + stop * row) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def block_pairs(config: SyntheticConfig, layout: _Layout, tables: tuple[np.ndarray, np.ndarray],
                block: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Exactly ``size`` pairs ``(lo, hi)`` (int64 node ids, ``lo < hi``) of edge block ``block``, from its own seed.

    First endpoints are ``theta``-weighted positions, drawn as sorted uniforms (normalised exponential
    spacings, O(size)), so the intra-community searches stay local.  Self-loops are redrawn."""
    rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(_EDGE_STREAM, block)))
    cum, n = layout.cum_weight, config.num_nodes
    keys: list[np.ndarray] = []
    missing = size
    while missing > 0:
        gaps = rng.standard_exponential(missing + 1)
        spots = np.cumsum(gaps)[:missing]
        spots *= cum[-1] / (spots[-1] + gaps[-1])
        first = np.searchsorted(cum, spots, side="right") - 1
        np.clip(first, 0, n - 1, out=first)
        keys.append(_pair_keys(config, layout, tables, first, rng.random(missing), rng.random(missing)))
        missing -= keys[-1].size
    lo, hi = np.divmod(np.concatenate(keys), np.int64(n))
    return lo, hi


class _Progress:
    """Progress lines on stderr: edges written, share and rate."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.start = total, enabled, time.perf_counter()
        self.edges_start = self.start  # reset when the edge pass begins: its rate leaves out the node stages

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[synthetic_stream {time.perf_counter() - self.start:7.1f}s] {message}", file=sys.stderr,
                  flush=True)

    def edges(self, done: int) -> None:
        rate = done / max(time.perf_counter() - self.edges_start, 1e-9)
        self(f"edges {done:,} / {self.total:,} ({100 * done / self.total:.1f}%), {rate / 1e6:.2f}M edges/s")


def _write_edges(path: Path, config: SyntheticConfig, layout: _Layout, num_edges: int, log: _Progress) -> None:
    """Fill ``edges.npy`` (int32 [num_edges, 2]) block by block, each pair as two rows ``lo hi`` / ``hi lo``."""
    edges = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(num_edges, 2))
    tables = _kind_tables(config, layout)
    log.edges_start = time.perf_counter()
    num_pairs = num_edges // 2
    blocks_per_chunk = max(1, config.chunk_edges // (2 * PAIR_BLOCK))
    for b0 in range(0, -(-num_pairs // PAIR_BLOCK), blocks_per_chunk):
        row0 = 2 * b0 * PAIR_BLOCK
        row = row0
        for b in range(b0, min(b0 + blocks_per_chunk, -(-num_pairs // PAIR_BLOCK))):
            lo, hi = block_pairs(config, layout, tables, b, min(PAIR_BLOCK, num_pairs - b * PAIR_BLOCK))
            rows = edges[row:row + 2 * lo.size]
            rows[0::2, 0], rows[0::2, 1], rows[1::2, 0], rows[1::2, 1] = lo, hi, hi, lo
            row += 2 * lo.size
        _release(edges, row0, row)
        log.edges(row)
    edges.flush()
    del edges


def _write_nodes(folder: Path, config: SyntheticConfig, layout: _Layout, log: _Progress) -> None:
    """``labels.npy``, ``features.npy`` (memory-mapped, block by block) and the three masks."""
    _, _, feature_seq, split_seq = np.random.SeedSequence(config.seed).spawn(4)
    np.save(folder / "labels.npy", layout.labels)
    features = np.lib.format.open_memmap(folder / "features.npy", mode="w+", dtype=np.float32,
                                         shape=(config.num_nodes, config.feat_dim))
    start = 0
    for stop in fill_features(config, layout.labels, feature_seq, features):
        if stop - start >= (64 << 20) // (4 * config.feat_dim) or stop == config.num_nodes:
            _release(features, start, stop)
            start = stop
    features.flush()
    del features
    log(f"wrote features [{config.num_nodes:,}, {config.feat_dim}]")
    for name, mask in zip(_MASK_NAMES, _split_masks(config, np.random.default_rng(split_seq))):
        np.save(folder / f"{name}.npy", mask)


def _check_out(out: Path, need: int) -> None:
    """Refuse a non-empty ``out`` and a disk without room for ``need`` bytes, before anything is written."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StreamError(f"--out {out} already exists and is not an empty folder; pass a new path or remove it")
    parent = out.parent if out.parent.exists() else None
    if parent is None:
        raise StreamError(f"--out {out}: its parent folder {out.parent} does not exist; create it first")
    free = shutil.disk_usage(parent).free
    if free < need:
        raise StreamError(f"--out {out}: the folder needs {need:,} bytes ({need / 2**30:.2f} GiB) but only "
                          f"{free:,} bytes ({free / 2**30:.2f} GiB) are free there; free space or pick another disk")


def write_stream(out: str | Path, config: SyntheticConfig, num_edges: int, progress: bool = False) -> Path:
    """Write the streamed graph (``num_edges`` directed edges) into the new folder ``out`` and return it.

    Everything is written into a hidden sibling folder first and renamed at the end: an error or an
    interrupt leaves no half-written ``out``.  Raises :class:`StreamError` for bad input."""
    out = Path(out)
    _check_out(out, bytes_needed(config, num_edges))
    log = _Progress(num_edges, progress)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    partial.mkdir()
    try:
        layout = _plant(config, np.random.default_rng(np.random.SeedSequence(config.seed).spawn(4)[0]))
        log(f"planted {config.num_communities:,} communities over {config.num_nodes:,} nodes")
        _write_nodes(partial, config, layout, log)
        _write_edges(partial / "edges.npy", config, layout, num_edges, log)
        meta = {"generator": "gnnscale.data.synthetic_stream", "num_edges": num_edges, "pair_block": PAIR_BLOCK,
                "config": asdict(config)}
        (partial / "synthetic.json").write_text(json.dumps(meta, indent=1) + "\n")
        if out.exists():
            out.rmdir()  # checked empty above
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log(f"done: {out}")
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gnnscale.data.synthetic_stream",
        description="Write a planted-community synthetic graph as an edge-list folder (edges.npy, features.npy, "
                    "labels.npy, masks) chunk by chunk, without holding the edges in memory. Duplicate edges "
                    "may occur; the edge-list reader drops them.")
    parser.add_argument("--out", required=True, help="new (or empty) folder to write")
    parser.add_argument("--num-nodes", type=int, required=True, help="number of nodes")
    parser.add_argument("--num-edges", type=int, required=True,
                        help="number of directed edges (rows of edges.npy; even: each pair in both directions)")
    parser.add_argument("--feat-dim", type=int, required=True, help="feature dimension")
    parser.add_argument("--num-classes", type=int, required=True, help="number of label classes")
    parser.add_argument("--seed", type=int, required=True, help="seed; equal arguments give identical folders")
    parser.add_argument("--chunk-edges", type=int, default=1 << 23,
                        help="edges per written chunk (memory: about 60 bytes each; the output does not depend "
                             "on it); default %(default)s")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = stream_config(args.num_nodes, args.num_edges, args.feat_dim, args.num_classes, args.seed,
                               args.chunk_edges)
        write_stream(args.out, config, args.num_edges, progress=not args.quiet)
    except StreamError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
