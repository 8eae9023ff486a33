"""Lean loading: memory-mapped features handed back page by page, and the in-place CSC build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest

from gnnscale.data.dataset import DatasetError, check_features, csc_from_edges
from gnnscale.data.edgelist import load_edgelist
from gnnscale.data.pages import release_rows


def resident_mib(array: np.ndarray) -> float:
    """This process' RSS in MiB after touching every page of ``array``."""
    float(np.asarray(array, dtype=np.float64).sum())
    return psutil.Process().memory_info().rss / 2**20


def test_released_rows_leave_the_process_but_keep_their_values(tmp_path: Path) -> None:
    values = np.random.default_rng(0).random((100_000, 64), dtype=np.float32)  # 24 MiB
    np.save(tmp_path / "f.npy", values)
    mapped = np.ascontiguousarray(np.load(tmp_path / "f.npy", mmap_mode="r"), dtype=np.float32)  # a view of the map
    touched = resident_mib(mapped)
    release_rows(mapped, 0, 10**9)  # stop is clipped to the rows
    assert psutil.Process().memory_info().rss / 2**20 < touched - 16
    np.testing.assert_array_equal(mapped, values)  # read again from the page cache


def test_memory_that_is_not_a_read_only_file_map_is_never_dropped(tmp_path: Path) -> None:
    values = np.arange(40_000, dtype=np.float32).reshape(-1, 4)
    np.save(tmp_path / "f.npy", values)
    in_memory = values.copy()
    release_rows(in_memory, 0, 10_000)
    copy_on_write = np.load(tmp_path / "f.npy", mmap_mode="c")
    copy_on_write[:] = -1
    release_rows(copy_on_write, 0, 10_000)
    np.testing.assert_array_equal(in_memory, values)
    assert (copy_on_write == -1).all()


def test_chunked_feature_check_names_the_first_bad_row_and_edgelist_features_are_mapped(edgelist_dir: Path) -> None:
    features = np.zeros((300_000, 64), dtype=np.float32)  # several 64 MiB chunks
    features[250_001, 3] = np.nan
    with pytest.raises(DatasetError, match=r"non-finite value \(NaN or inf\) in row 250001;"):
        check_features(features, 300_000, "x")
    mapped = load_edgelist(edgelist_dir, mmap_features=True)
    assert not mapped.features.flags.writeable  # memory-mapped, read-only
    np.testing.assert_array_equal(mapped.features, np.load(edgelist_dir / "features.npy"))
    assert load_edgelist(edgelist_dir).features.flags.writeable  # by default in memory, as training wants


def test_csc_build_in_place_equals_the_obvious_one() -> None:
    rng = np.random.default_rng(1)
    for num_nodes, num_edges in ((1, 0), (7, 50), (300, 3_000_000)):  # the last repeats keys across chunks
        src, dst = rng.integers(0, num_nodes, num_edges), rng.integers(0, num_nodes, num_edges)
        for symmetrize in (False, True):
            keep = src != dst
            s, d = src[keep], dst[keep]
            if symmetrize:
                s, d = np.concatenate([s, d]), np.concatenate([d, s])
            keys = np.unique(d * num_nodes + s)
            indptr = np.searchsorted(keys, np.arange(num_nodes + 1) * num_nodes)
            got = csc_from_edges(src, dst, num_nodes, symmetrize=symmetrize)
            np.testing.assert_array_equal(got[0], indptr)
            np.testing.assert_array_equal(got[1], keys - np.repeat(np.arange(num_nodes) * num_nodes, np.diff(indptr)))
