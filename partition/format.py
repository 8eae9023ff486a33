"""The on-disk contract: file names, ``manifest.json``, and checked reading and hashed writing of ``.npy`` arrays.

Every array is a plain ``.npy`` (format 1.0 header, C order) so that it opens with
``np.load(path, mmap_mode="r", allow_pickle=False)``.  ``manifest.json`` lists each file
with its size, dtype, shape and sha256; readers check the size, header and (optionally)
the hash against it before trusting a file.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

FORMAT_NAME = "gnnscale-partition"
FORMAT_VERSION = 1
"""Bumped whenever a reader of the previous version would misread the folder."""
MANIFEST = "manifest.json"
ORIG2NEW = "orig2new.npy"
PART_ARRAYS = ("indptr", "indices", "halo_ids", "orig_ids", "features", "labels",
               "train_masks", "val_masks", "test_masks")
"""The arrays of one partition, each in ``part<p>/<name>.npy``."""
OPTIONAL_PART_ARRAYS = ("edge_features",)
"""Arrays a partition has when its dataset does (``edge_features``: float [num_edges, D], row ``i`` the features
of in-edge ``i`` of ``indices``; listed under the manifest's ``edge_data``)."""
REQUIRED_KEYS = ("format", "format_version", "num_nodes", "num_edges", "num_parts", "node_ranges", "num_classes",
                 "metric", "num_splits", "halo_hops", "node_data", "parts", "files")
REPAIR = "re-create the folder with python -m partition ... --force"
_HASH_BLOCK = 8 << 20
# Bytes per write handed to the writer thread, and how many may wait: queued chunks hold <= ~128 MiB.
_WRITE_CHUNK = 16 << 20
_MAX_PENDING = 8


class PartitionError(ValueError):
    """A partition folder that is damaged, incomplete, inconsistent, not ours, or unlike its dataset;
    the message names the file (or the check) and the fix."""


def part_file(part: int, name: str) -> str:
    """Path of array ``name`` of partition ``part``, relative to the partition folder."""
    return f"part{part}/{name}.npy"


# ---------------------------------------------------------------------- reading
def read_manifest(root: Path) -> dict[str, Any]:
    """Parse and check ``root/manifest.json``.

    Raises:
        FileNotFoundError: the folder or its manifest does not exist.
        PartitionError: the manifest is unreadable, not ours, of a newer format, or lacks a key.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: partition folder not found; pass the --out folder of python -m partition")
    path = root / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: manifest not found; {root} is not a complete partition folder: {REPAIR}")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise PartitionError(f"{path}: not valid JSON ({err}); {REPAIR}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise PartitionError(f"{path}: format is {found!r}, expected {FORMAT_NAME!r}; "
                                   f"this is not a gnnscale partition folder")
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise PartitionError(f"{path}: format_version {version!r} is not a positive integer; {REPAIR}")
    if version > FORMAT_VERSION:
        raise PartitionError(f"{path}: format version {version} is newer than this gnnscale reads "
                                   f"(up to {FORMAT_VERSION}); upgrade gnnscale, or re-partition with this version")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise PartitionError(f"{path}: missing key {missing[0]!r}; {REPAIR}")
    return manifest


def check_file(root: Path, rel: str, record: dict[str, Any], *, checksum: bool) -> Path:
    """Check that file ``rel`` exists with the size (and, if ``checksum``, the sha256) the manifest records.

    Raises:
        FileNotFoundError: the file is missing.
        PartitionError: its size or hash differs from the manifest's.
    """
    path = root / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path}: partition file not found (manifest.json lists it); {REPAIR}")
    size = path.stat().st_size
    if size != record["bytes"]:
        raise PartitionError(f"{path}: {size} bytes, but manifest.json records {record['bytes']} "
                                   f"(truncated or replaced); {REPAIR}")
    if checksum:
        digest = sha256_file(path)
        if digest != record["sha256"]:
            raise PartitionError(f"{path}: sha256 {digest[:16]}... differs from manifest.json's "
                                       f"{str(record['sha256'])[:16]}... (the file was modified or corrupted); "
                                       f"{REPAIR}")
    return path


def open_array(root: Path, rel: str, record: dict[str, Any], *, checksum: bool = False) -> np.ndarray:
    """Memory-map file ``rel`` read-only after :func:`check_file`, and check its dtype and shape.

    Returns:
        A read-only ``np.memmap`` with the recorded dtype and shape.
    """
    path = check_file(root, rel, record, checksum=checksum)
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise PartitionError(f"{path}: not a readable .npy array ({err}); {REPAIR}") from None
    if str(array.dtype) != record["dtype"] or list(array.shape) != list(record["shape"]):
        raise PartitionError(f"{path}: holds {array.dtype} {list(array.shape)}, manifest.json records "
                                   f"{record['dtype']} {list(record['shape'])}; {REPAIR}")
    return array


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 8 MiB blocks (memory stays flat for any size)."""
    digest = hashlib.sha256()
    block = bytearray(_HASH_BLOCK)
    view = memoryview(block)
    with open(path, "rb", buffering=0) as handle:
        while size := handle.readinto(block):
            digest.update(view[:size])
    return digest.hexdigest()


# ---------------------------------------------------------------------- writing
def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The bytes ``np.save`` writes before the data of a C-order array of ``shape`` and ``dtype``."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                  "fortran_order": False, "shape": tuple(int(s) for s in shape)})
    return buffer.getvalue()


class ArrayWriter:
    """Writes ``.npy`` files under ``root`` on one background thread, hashing bytes as they are written.

    The caller gathers the next rows while the thread writes and hashes the previous ones
    (both release the GIL), so checksums cost no extra pass over the data.  Tasks run in
    submission order; at most ``_MAX_PENDING`` chunks wait, which bounds the memory they hold.
    :meth:`finish` returns ``{relative path: {"bytes", "sha256", "dtype", "shape"}}``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records: dict[str, dict[str, Any]] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="partition-writer")
        self._pending: deque[Future] = deque()
        self._open: set[_NpyStream] = set()

    def write(self, rel: str, array: np.ndarray) -> None:
        """Write a whole array as ``root/rel``."""
        stream = self.open(rel, array.shape, array.dtype)
        stream.append(array)
        stream.close()

    def open(self, rel: str, shape: tuple[int, ...], dtype: np.dtype) -> _NpyStream:
        """Start ``root/rel`` for an array of ``shape``; fill it with ``append`` (rows in order) and ``close``."""
        return _NpyStream(self, rel, shape, np.dtype(dtype))

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        while self._pending and (len(self._pending) >= _MAX_PENDING or self._pending[0].done()):
            self._pending.popleft().result()  # re-raises an error of the writer thread here
        self._pending.append(self._pool.submit(fn, *args))

    def finish(self) -> dict[str, dict[str, Any]]:
        """Wait for every write; raise the first error; return the file records."""
        while self._pending:
            self._pending.popleft().result()
        self._pool.shutdown(wait=True)
        assert not self._open, f"files never closed: {sorted(s.rel for s in self._open)}"
        return self.records

    def abort(self) -> None:
        """Drop queued writes, wait for the running one, close open files (the caller deletes them)."""
        for future in self._pending:
            future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for stream in list(self._open):
            stream.discard()


class _NpyStream:
    """One ``.npy`` file being written by an :class:`ArrayWriter`; the file is touched only on its thread."""

    def __init__(self, writer: ArrayWriter, rel: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.writer, self.rel, self.shape, self.dtype = writer, rel, tuple(int(s) for s in shape), dtype
        self.row_bytes = dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        self.expected = self.row_bytes * (self.shape[0] if self.shape else 1)
        self.written = 0
        self.digest = hashlib.sha256()
        self.handle: io.BufferedWriter | None = None
        writer._open.add(self)
        writer.submit(self._start, npy_header(self.shape, dtype))

    def append(self, rows: np.ndarray) -> None:
        """Queue ``rows`` (C-contiguous, this file's dtype and trailing shape) to be written next."""
        rows = np.ascontiguousarray(rows)
        assert rows.dtype == self.dtype and rows.shape[1:] == self.shape[1:], (rows.dtype, rows.shape, self.shape)
        flat = rows.reshape(-1).view(np.uint8)
        for start in range(0, flat.shape[0], _WRITE_CHUNK):
            self.writer.submit(self._write, flat[start:start + _WRITE_CHUNK])

    def close(self) -> None:
        self.writer.submit(self._finish)

    def discard(self) -> None:
        if self.handle is not None:
            self.handle.close()
        self.writer._open.discard(self)

    # -- on the writer thread
    def _start(self, header: bytes) -> None:
        path = self.writer.root / self.rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(path, "wb")
        self.handle.write(header)
        self.digest.update(header)
        self.header_bytes = len(header)

    def _write(self, data: np.ndarray) -> None:
        assert self.handle is not None
        self.handle.write(data)
        self.digest.update(data)
        self.written += data.shape[0]

    def _finish(self) -> None:
        assert self.handle is not None and self.written == self.expected, (self.rel, self.written, self.expected)
        self.handle.close()
        self.writer.records[self.rel] = {"bytes": self.header_bytes + self.written, "sha256": self.digest.hexdigest(),
                                         "dtype": str(self.dtype), "shape": list(self.shape)}
        self.writer._open.discard(self)
