"""The compiled row-gather kernel against torch.index_select, and its fallbacks."""

from __future__ import annotations

import pytest
import torch

from gnnscale.pipeline import native
from gnnscale.pipeline.native import gather_rows, native_available


def test_the_kernel_builds_here():
    # This machine (and CI's) has a C compiler; a silent fallback would hide a broken build.
    assert native_available()


@pytest.mark.parametrize("dtype, shape", [(torch.float32, (5000, 100)), (torch.float16, (3000, 7)),
                                          (torch.int64, (4000,)), (torch.float64, (100, 3, 5))])
def test_gather_equals_index_select(dtype, shape):
    generator = torch.Generator().manual_seed(0)
    table = (torch.rand(shape, generator=generator) * 100).to(dtype)
    ids = torch.randint(0, shape[0], (2500,), generator=generator)
    out = torch.empty((ids.numel(),) + shape[1:], dtype=dtype)
    assert gather_rows(table, ids, out) is out
    assert torch.equal(out, torch.index_select(table, 0, ids))


def test_out_of_range_ids_raise_instead_of_reading_out_of_bounds():
    table = torch.rand(10, 4)
    out = torch.empty(2, 4)
    with pytest.raises(IndexError, match="row id 10 is out of range for a table of 10 rows"):
        gather_rows(table, torch.tensor([3, 10]), out)
    with pytest.raises(IndexError, match="row id -1 is out of range"):
        gather_rows(table, torch.tensor([-1, 2]), out)


def test_shapes_the_kernel_does_not_take_fall_back_to_index_select():
    table = torch.rand(50, 8).t()  # not contiguous
    ids = torch.tensor([1, 7, 7, 0])
    out = torch.empty(4, 50)
    assert torch.equal(gather_rows(table, ids, out), table[ids])
    assert gather_rows(torch.rand(5, 3), torch.empty(0, dtype=torch.int64), torch.empty(0, 3)).shape == (0, 3)


def test_without_a_compiler_it_falls_back(monkeypatch):
    monkeypatch.setattr(native, "_kernel", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    assert not native_available()
    table = torch.rand(20, 3)
    ids = torch.tensor([4, 2, 19])
    assert torch.equal(gather_rows(table, ids, torch.empty(3, 3)), table[ids])


def test_a_failing_build_falls_back(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_kernel", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_SOURCE", "this is not C")
    assert not native_available()
    assert not list((tmp_path / "gnnscale").glob("*.so"))
