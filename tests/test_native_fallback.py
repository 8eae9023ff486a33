"""When the gather kernel cannot be built, the fallback is a logged WARNING (once), never silent."""

from __future__ import annotations

import logging

import pytest
import torch

from gnnscale.pipeline import native


@pytest.fixture
def fresh_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Forget the kernel this process built, and build into an empty cache."""
    monkeypatch.setattr(native, "_kernel", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def fallback_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "gnnscale.pipeline" and record.levelno == logging.WARNING]


def test_no_compiler_warns_once_with_the_reason_and_the_cost(fresh_kernel, monkeypatch, caplog):
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="gnnscale.pipeline"):
        assert not native.native_available()
        table, ids = torch.rand(20, 3), torch.tensor([4, 2, 19])
        assert torch.equal(native.gather_rows(table, ids, torch.empty(3, 3)), table[ids])
        assert not native.native_available()
    (message,) = fallback_warnings(caplog)  # once per process, not once per batch
    assert "no C compiler" in message and "torch.index_select" in message and "less gather bandwidth" in message


def test_a_failing_build_warns_with_the_compiler_error(fresh_kernel, monkeypatch, caplog):
    monkeypatch.setattr(native, "_SOURCE", "this is not C")
    with caplog.at_level(logging.WARNING, logger="gnnscale.pipeline"):
        assert not native.native_available()
    (message,) = fallback_warnings(caplog)
    assert "failed: " in message and "error" in message and "torch.index_select" in message
    assert "\n" not in message  # the compiler's multi-line output is folded into one line


def test_an_unloadable_library_warns(fresh_kernel, monkeypatch, caplog):
    def refuse(path: str) -> None:
        raise OSError(f"{path}: cannot open shared object file")
    monkeypatch.setattr(native.ctypes, "CDLL", refuse)
    with caplog.at_level(logging.WARNING, logger="gnnscale.pipeline"):
        assert not native.native_available()
    (message,) = fallback_warnings(caplog)
    assert "cannot open shared object file" in message and "torch.index_select" in message


def test_a_working_build_does_not_warn(fresh_kernel, caplog):
    with caplog.at_level(logging.WARNING, logger="gnnscale.pipeline"):
        assert native.native_available()
    assert fallback_warnings(caplog) == []
