"""scripts/dev.sh refuses what it cannot use with one line on stderr and exit status 2, before installing anything.

The successful paths (creating .venv/ and .venv-dgl/, several GB of downloads) are what CI runs
(.ci/run); here the refusals, and how a failing pip is retried, each in a copy of the script's tree
with a stand-in interpreter and pip, so that no real environment is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What dev.sh runs besides an interpreter; the tests' PATH holds these and nothing else.
TOOLS = ("bash", "dirname", "ls", "sort", "cat", "head", "cut", "sha256sum", "tr", "rm", "touch", "printf",
         "df", "awk", "mkdir", "ln")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of dev.sh with the files it hashes, and a bin/ folder of the tools it needs (no python, no pyenv)."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for name in ("scripts/dev.sh", "scripts/constraints-current.txt", "scripts/constraints-dgl.txt", "pyproject.toml"):
        shutil.copy2(REPO / name, root / name)
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    return root


def dev(tree: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {"PATH": str(tree.parent / "bin"), "HOME": str(tree.parent), **env}
    return subprocess.run(["bash", str(tree / "scripts" / "dev.sh"), *args], env=environment, capture_output=True,
                          text=True, timeout=60, executable=shutil.which("bash"))


def fake_python(folder: Path, version: str) -> Path:
    """An executable that answers dev.sh's version question as Python ``version`` would."""
    path = folder / f"python{version}"
    path.write_text(f'#!/bin/sh\necho "{version}"\n')
    path.chmod(0o755)
    return path


def assert_refused(proc: subprocess.CompletedProcess, line: str, tree: Path) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [line]
    assert not (tree / ".venv").exists() and not (tree / ".venv-dgl").exists()


def test_unknown_command_prints_the_usage(tree: Path) -> None:
    for args in ((), ("frobnicate",)):
        proc = dev(tree, *args)
        assert proc.returncode == 2 and proc.stderr == "usage: scripts/dev.sh {demo|test|test-dgl} [options]\n"


def test_no_interpreter_found(tree: Path) -> None:
    assert_refused(dev(tree, "test"), "error: no Python 3.12, 3.13 or 3.11 found on PATH or in pyenv; "
                                      "set PYTHON=/path/to/python3.12", tree)
    assert_refused(dev(tree, "test-dgl"), "error: the DGL environment needs Python 3.11 (dgl 2.1.0 has cp311 "
                                          "wheels only); set DGL_PYTHON=/path/to/python3.11", tree)


def test_an_interpreter_that_does_not_run(tree: Path) -> None:
    missing = str(tree / "no-such-python")
    assert_refused(dev(tree, "demo", PYTHON=missing),
                   f"error: PYTHON={missing} does not run; set PYTHON to a Python 3.12, 3.13 or 3.11 interpreter", tree)


def test_an_interpreter_of_another_version(tree: Path) -> None:
    old = fake_python(tree.parent, "3.10")
    assert_refused(dev(tree, "test", PYTHON=str(old)),
                   f"error: PYTHON={old} is Python 3.10; set PYTHON to a Python 3.12, 3.13 or 3.11 interpreter", tree)
    new = fake_python(tree.parent, "3.12")
    assert_refused(dev(tree, "test-dgl", DGL_PYTHON=str(new)),
                   f"error: DGL_PYTHON={new} is Python 3.12; set DGL_PYTHON to a Python 3.11 interpreter", tree)


def test_a_venv_it_did_not_make_is_left_alone(tree: Path) -> None:
    (tree / ".venv" / "bin").mkdir(parents=True)
    (tree / ".venv" / "mine.txt").write_text("a user's own environment")
    proc = dev(tree, "test", PYTHON=sys.executable)  # the interpreter running this test: a version dev.sh takes
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["error: .venv exists but was not made by scripts/dev.sh; "
                                        "move it away and run again"]
    assert (tree / ".venv" / "mine.txt").read_text() == "a user's own environment"


def interpreter_whose_pip_fails(folder: Path, failures: int) -> Path:
    """A Python 3.12 stand-in whose ``-m venv DIR`` makes a venv whose pip fails ``failures`` times, then works.

    The venv's python counts pip's runs in ``pip-runs`` beside it and answers anything else with success.
    """
    venv_python = folder / "venv-python"
    venv_python.write_text(f"""#!/bin/sh
if [ "$1 $2 $3" = "-m pip install" ]; then
    runs=$(cat "{folder}/pip-runs" 2>/dev/null || echo 0)
    runs=$((runs + 1))
    echo "$runs" > "{folder}/pip-runs"
    [ "$runs" -gt {failures} ] || {{ echo "ERROR: connection interrupted" >&2; exit 1; }}
fi
echo "Python 3.12.0, torch stand-in"
""")
    python = folder / "python3.12"
    python.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin" && ln -s "{venv_python}" "$3/bin/python"
    exit 0
fi
[ "$1" = "-c" ] && echo "3.12" || echo "Python 3.12.0"
""")
    for path in (venv_python, python):
        path.chmod(0o755)
    return python


def with_free_disk(tree: Path, gigabytes: float) -> None:
    """Replace the tests' df by one that reports ``gigabytes`` free."""
    df = tree.parent / "bin" / "df"
    df.unlink()
    df.write_text(f"#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted'\n"
                  f"echo 'disk 100000000 0 {int(gigabytes * 1048576)} 0% /'\n")
    df.chmod(0o755)
    sleep = tree.parent / "bin" / "sleep"  # the 10 s pause between attempts, skipped
    sleep.write_text("#!/bin/sh\n")
    sleep.chmod(0o755)


def test_a_failing_pip_is_tried_three_times(tree: Path) -> None:
    with_free_disk(tree, 50)
    python = interpreter_whose_pip_fails(tree.parent, failures=1)  # the pip upgrade fails once: taken again
    proc = dev(tree, "test", "--version", PYTHON=str(python))
    assert proc.returncode == 0, proc.stderr
    assert "[dev.sh] pip failed (attempt 1 of 3, 50.0 GB free); trying again in 10 s" in proc.stderr.splitlines()
    assert (tree.parent / "pip-runs").read_text() == "3\n"  # upgrade twice, then the install
    assert (tree / ".venv" / ".gnnscale-install-stamp").read_text().count("\n") == 2  # the install was recorded

    python = interpreter_whose_pip_fails(tree.parent, failures=99)
    (tree.parent / "pip-runs").unlink()
    (tree / "pyproject.toml").write_text((tree / "pyproject.toml").read_text() + "\n")  # an update is due
    proc = dev(tree, "test", "--version", PYTHON=str(python))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == ("error: pip could not install into .venv in 3 attempts (its errors are "
                                            "above); check the network and run again")
    assert (tree.parent / "pip-runs").read_text() == "3\n"


def test_a_full_disk_is_named_and_not_retried(tree: Path) -> None:
    with_free_disk(tree, 1.5)
    python = interpreter_whose_pip_fails(tree.parent, failures=99)
    proc = dev(tree, "test", "--version", PYTHON=str(python))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == ("error: pip could not install into .venv with 1.5 GB free on its disk; "
                                            "an environment needs about 9 GB while it installs: free space and run "
                                            "again")
    assert (tree.parent / "pip-runs").read_text() == "1\n"
