#!/usr/bin/env bash
# One-command set-up and run.  Creates (or reuses) .venv in the repository root,
# installs gnnscale with the full test stack (torch 2.2.1 + dgl 2.1.0, pinned in
# scripts/constraints-full.txt), then runs what was asked:
#
#   scripts/dev.sh demo [train options]   partition the built-in synthetic graph in two and train on
#                                         2 ranks under torchrun; prints the test accuracy
#   scripts/dev.sh test [pytest options]  run the test suite
#
# The install is skipped when .venv already matches pyproject.toml and the constraints (a hash stamp).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "error: gnnscale needs Python 3.11 (dgl 2.1.0 wheels exist for cp311 only); set PYTHON=/path/to/python3.11" >&2
    exit 2
fi

constraints=scripts/constraints-full.txt
stamp=.venv/.gnnscale-install-stamp
want=$(sha256sum pyproject.toml "$constraints" | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[dev.sh] installing gnnscale and its pinned dependencies into .venv (first time: ~2.5 GB, a few minutes)"
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -c "$constraints" -e ".[test,dgl]"
    echo "$want" > "$stamp"
fi

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    demo)
        # One torch thread per rank: two ranks share this machine's cores.
        export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
        .venv/bin/python -m partition --num-parts 2 --out runs/demo/partitions --force --quiet
        exec .venv/bin/torchrun --standalone --nproc_per_node=2 scripts/train_node_classification.py \
            --partitions runs/demo/partitions --out runs/demo "$@" ;;
    test) exec .venv/bin/python -m pytest "$@" ;;
    *) echo "usage: scripts/dev.sh {demo|test} [options]" >&2; exit 2 ;;
esac
