"""The core (gnnscale, samplers, partition and the entry-point scripts) runs where dgl cannot be imported.

dgl is the optional ``[dgl]`` extra.  Each check runs in a subprocess whose ``sitecustomize``
puts a finder first on ``sys.meta_path`` that refuses ``dgl`` and every ``dgl.*`` module, so
these tests mean the same with or without dgl installed; the hook is inherited by any process
the command starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import read_strict_json

REPO = Path(__file__).resolve().parents[1]

SITECUSTOMIZE = '''
import importlib.abc
import sys


class BlockDGL(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "dgl" or name.startswith("dgl."):
            raise ImportError(f"{name} is blocked: this process must run without dgl")
        return None


sys.meta_path.insert(0, BlockDGL())
'''

IMPORT_ALL = '''
import importlib, json, pkgutil, sys
failures = {}
for top in ("gnnscale", "samplers", "partition"):
    package = importlib.import_module(top)
    names = [info.name for info in pkgutil.walk_packages(package.__path__, prefix=top + ".")]
    for name in names:
        if name.rsplit(".", 1)[-1] == "__main__":  # importing it would run the command
            continue
        try:
            importlib.import_module(name)
        except BaseException as error:
            failures[name] = f"{type(error).__name__}: {error}"
print(json.dumps({"failures": failures, "dgl_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "dgl"
                                                             and sys.modules[m] is not None)}))
'''


@pytest.fixture
def no_dgl_env(tmp_path: Path) -> dict[str, str]:
    """Environment whose Python processes cannot import dgl (see the module docstring)."""
    hook = tmp_path / "no_dgl_hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(hook)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["OMP_NUM_THREADS"] = "1"
    return env


def run(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc


def test_the_hook_blocks_dgl(no_dgl_env):
    for module in ("dgl", "dgl.nn"):
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], env=no_dgl_env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode != 0 and "ImportError: dgl is blocked" in proc.stderr  # dgl.nn imports dgl first


def test_every_module_imports_without_dgl(no_dgl_env):
    report = json.loads(run(["-c", IMPORT_ALL], no_dgl_env).stdout.strip().splitlines()[-1])
    assert report["failures"] == {}
    assert report["dgl_loaded"] == []


def test_node_classification_trains_without_dgl(no_dgl_env, tmp_path):
    out = tmp_path / "run"
    run(["scripts/train_node_classification.py", "--dataset", "synthetic", "--num-nodes", "2000",
         "--feat-dim", "8", "--num-classes", "4", "--hidden", "8", "--num-layers", "2", "--fanouts", "5,5",
         "--batch-size", "256", "--epochs", "1", "--num-workers", "0", "--out", str(out), "--quiet"], no_dgl_env)
    metrics = read_strict_json(out / "metrics.json")
    assert metrics["epochs_run"] == 1 and 0.0 <= metrics["test"] <= 1.0


def test_partition_cli_without_dgl(no_dgl_env, tmp_path):
    out = tmp_path / "parts"
    run(["-m", "partition", "--num-parts", "2", "--num-nodes", "2000", "--feat-dim", "4", "--out", str(out),
         "--quiet"], no_dgl_env)
    assert read_strict_json(out / "manifest.json")["num_parts"] == 2


def test_temporal_training_without_dgl(no_dgl_env, tmp_path):
    rng = np.random.default_rng(0)
    num_events, num_nodes = 600, 40
    path = tmp_path / "events.npz"
    np.savez(path, src=rng.integers(0, num_nodes // 2, num_events),
             dst=rng.integers(num_nodes // 2, num_nodes, num_events),
             t=np.sort(rng.integers(0, 5000, num_events)).astype(np.float64))
    out = tmp_path / "run"
    run(["scripts/train_temporal.py", "--dataset", "npz", "--data-dir", str(path), "--memory-dim", "8",
         "--time-dim", "8", "--embedding-dim", "8", "--heads", "2", "--batch-size", "50", "--num-neighbors", "5",
         "--epochs", "1", "--out", str(out), "--quiet"], no_dgl_env)
    assert (out / "metrics.json").is_file()


def test_a_dgl_file_without_dgl_is_a_one_line_error(no_dgl_env, tmp_path):
    (tmp_path / "g.bin").write_bytes(b"a graph")
    proc = subprocess.run([sys.executable, "scripts/train_node_classification.py", "--dataset", "dgl",
                           "--data-dir", str(tmp_path / "g.bin"), "--out", str(tmp_path / "run")],
                          cwd=REPO, env=no_dgl_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "g.bin: dgl: " in lines[0] and "pip install 'gnnscale[dgl]'" in lines[0]


UNMARKED_MODULE = '''
from conftest import import_dgl_or_skip
dgl = import_dgl_or_skip()
def test_never_collected():
    pass
'''

ITEMS = '''
import pytest
from conftest import import_dgl_or_skip
def test_unmarked():
    import_dgl_or_skip()
@pytest.mark.dgl
def test_marked():
    import_dgl_or_skip()
'''


def test_a_test_that_needs_dgl_must_be_marked(no_dgl_env, tmp_path):
    """scripts/dev.sh test-dgl selects ``-m dgl``: an unmarked test needing dgl fails instead of skipping unseen."""
    (tmp_path / "test_unmarked_module.py").write_text(UNMARKED_MODULE)
    (tmp_path / "test_items.py").write_text(ITEMS)
    no_dgl_env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), no_dgl_env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-rfEs", "-p", "no:cacheprovider",
                           "--continue-on-collection-errors", "--rootdir", str(tmp_path), "-c", os.devnull, "-o",
                           "markers=dgl: needs dgl", str(tmp_path)],
                          cwd=tmp_path, env=no_dgl_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 1 skipped" in proc.stdout and "1 error" in proc.stdout, proc.stdout[-3000:]
    not_marked = "skips where dgl is absent but is not marked dgl"
    assert "FAILED test_items.py::test_unmarked" in proc.stdout
    assert f"test_items.py::test_unmarked {not_marked}" in proc.stdout
    assert f"RuntimeError: test_unmarked_module: {not_marked}" in proc.stdout
    assert "SKIPPED" in proc.stdout and "needs dgl, the optional [dgl] extra" in proc.stdout
