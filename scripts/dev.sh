#!/usr/bin/env bash
# One-command set-up and run.  Creates (or reuses) a virtual environment in the repository root,
# installs gnnscale into it, then runs what was asked:
#
#   scripts/dev.sh demo [train options]       partition the built-in synthetic graph in two and train on
#                                             2 ranks under torchrun; prints the test accuracy
#   scripts/dev.sh test [pytest options]      run the test suite
#   scripts/dev.sh test-dgl [pytest options]  run the tests that need dgl (marked `dgl`: the comparisons
#                                             with DGL, reading dgl files) in the DGL comparison environment
#
# demo and test use .venv/, today's stack: the first of Python 3.12, 3.13, 3.11 that runs (on PATH or
# installed by pyenv; PYTHON=/path/to/python chooses), torch as pinned in scripts/constraints-current.txt,
# no dgl.  test-dgl uses .venv-dgl/: Python 3.11 (DGL_PYTHON chooses), torch 2.2.1 + dgl 2.1.0 as pinned
# in scripts/constraints-dgl.txt (dgl 2.1.0, the newest dgl for cp311, imports only with torch <= 2.2.1).
#
# An environment is rebuilt from nothing when its interpreter changed, and updated with pip when
# pyproject.toml or its constraints changed (a stamp of hashes); otherwise the install is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "error: $*" >&2; exit 2; }
log() { echo "[dev.sh] $*" >&2; }

# The first interpreter of the given minor versions ("3.12" ...) that runs: on PATH, else pyenv's,
# newest patch first.  Each candidate is run, not just found: a pyenv shim on PATH exists for every
# version pyenv has but runs only the ones pyenv selects.
find_python() {
    local minor candidate pyenv_root
    pyenv_root=$(pyenv root 2>/dev/null || true)
    for minor in "$@"; do
        for candidate in "python$minor" $(ls -d "$pyenv_root/versions/$minor".*/bin/"python$minor" 2>/dev/null \
                                          | sort -rV); do
            if "$candidate" -c 'import sys' >/dev/null 2>&1; then
                echo "$candidate"
                return 0
            fi
        done
    done
    return 1
}

# check_python PYTHON NAME WORDS VERSION...: PYTHON (the value of the variable NAME) runs and is one of the
# VERSIONs ("3.12" ...); WORDS names them in the error.
check_python() {
    local python=$1 name=$2 words=$3 version
    shift 3
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
        || die "$name=$python does not run; set $name to a Python $words interpreter"
    [[ " $* " == *" $version "* ]] || die "$name=$python is Python $version; set $name to a Python $words interpreter"
}

# free_gb PATH: the space free on PATH's file system, in GB with one decimal.
free_gb() { df -Pk "$1" | awk 'NR == 2 {printf "%.1f", $4 / 1048576}'; }

# pip_install VENV ARGS...: VENV's pip install ARGS, tried up to 3 times.  An environment is about 3 GB of
# downloads (torch's CUDA build and its libraries) and 6 GB installed: one connection that breaks more often
# than pip resumes a download should not fail a set-up, and a full disk is named as the cause.
pip_install() {
    local venv=$1 attempt free
    shift
    for attempt in 1 2 3; do
        "$venv/bin/python" -m pip install "$@" && return 0
        free=$(free_gb "$venv")
        if awk -v free="$free" 'BEGIN { exit !(free < 3) }'; then
            die "pip could not install into $venv with $free GB free on its disk; an environment needs about" \
                "9 GB while it installs: free space and run again"
        fi
        if [ "$attempt" -lt 3 ]; then
            log "pip failed (attempt $attempt of 3, $free GB free); trying again in 10 s"
            sleep 10
        fi
    done
    die "pip could not install into $venv in 3 attempts (its errors are above); check the network and run again"
}

# ensure_venv VENV PYTHON CONSTRAINTS EXTRAS: VENV holds gnnscale[EXTRAS] installed by PYTHON under CONSTRAINTS.
ensure_venv() {
    local venv=$1 python=$2 constraints=$3 extras=$4 stamp identity content start note=""
    stamp=$venv/.gnnscale-install-stamp
    identity=$("$python" -VV | tr '\n' ' ')"[$extras]"
    content=$(sha256sum pyproject.toml "$constraints" | sha256sum | cut -d' ' -f1)
    if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$identity"$'\n'"$content" ]; then
        return 0
    fi
    start=$SECONDS
    if [ ! -x "$venv/bin/python" ] || [ "$(head -n 1 "$stamp" 2>/dev/null)" != "$identity" ]; then
        # Only a folder this script made is removed: it writes the stamp's first line before installing.
        if [ -e "$venv" ] && [ ! -e "$stamp" ]; then
            die "$venv exists but was not made by scripts/dev.sh; move it away and run again"
        fi
        if [ -e "$venv" ]; then
            log "replacing $venv: it was made with another interpreter or by an earlier scripts/dev.sh"
        fi
        log "creating $venv with $("$python" -V) ($python)"
        rm -rf "$venv"
        "$python" -m venv "$venv"
        echo "$identity" > "$stamp"
        pip_install "$venv" --quiet --upgrade pip
        note=" (torch is a CUDA build: about 3 GB of downloads, 6 GB installed, several minutes; $(free_gb "$venv") GB free)"
    fi
    log "installing gnnscale[$extras] into $venv, pinned by $constraints$note"
    # PIP_CONSTRAINT replaces any constraint file named in pip's own configuration (pip reads the
    # environment after its configuration files), so a machine-wide cap cannot change the pins.
    # setuptools warns on every editable install that folders named like the packages may shadow
    # them: here those folders are the packages being installed.
    PIP_CONSTRAINT="$constraints" PYTHONWARNINGS="ignore:Editable installation" \
        pip_install "$venv" --quiet -e ".[$extras]"
    printf '%s\n%s\n' "$identity" "$content" > "$stamp"
    log "$venv ready in $((SECONDS - start)) s: $("$venv/bin/python" -c 'import platform, torch
print(f"Python {platform.python_version()}, torch {torch.__version__}")')"
}

current_env() {
    local python
    if [ -n "${PYTHON:-}" ]; then
        python=$PYTHON
        check_python "$python" PYTHON "3.12, 3.13 or 3.11" 3.12 3.13 3.11
    else
        python=$(find_python 3.12 3.13 3.11) \
            || die "no Python 3.12, 3.13 or 3.11 found on PATH or in pyenv; set PYTHON=/path/to/python3.12"
    fi
    ensure_venv .venv "$python" scripts/constraints-current.txt test
}

dgl_env() {
    local python
    if [ -n "${DGL_PYTHON:-}" ]; then
        python=$DGL_PYTHON
        check_python "$python" DGL_PYTHON 3.11 3.11
    else
        python=$(find_python 3.11) || die "the DGL environment needs Python 3.11 (dgl 2.1.0 has cp311 wheels only);" \
                                          "set DGL_PYTHON=/path/to/python3.11"
    fi
    ensure_venv .venv-dgl "$python" scripts/constraints-dgl.txt test,dgl
    # Without a working dgl every selected test would skip and the run would pass having compared nothing.
    .venv-dgl/bin/python -c 'import dgl' 2>/dev/null \
        || die ".venv-dgl cannot import dgl; remove .venv-dgl and run scripts/dev.sh test-dgl again"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    demo)
        current_env
        # One torch thread per rank: two ranks share this machine's cores.
        export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
        .venv/bin/python -m partition --num-parts 2 --out runs/demo/partitions --force --quiet
        exec .venv/bin/torchrun --standalone --nproc_per_node=2 scripts/train_node_classification.py \
            --partitions runs/demo/partitions --out runs/demo "$@" ;;
    test)
        current_env
        exec .venv/bin/python -m pytest "$@" ;;
    test-dgl)
        dgl_env
        exec .venv-dgl/bin/python -m pytest -m "dgl and not slow" "$@" ;;
    *) echo "usage: scripts/dev.sh {demo|test|test-dgl} [options]" >&2; exit 2 ;;
esac
