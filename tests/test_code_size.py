"""The package keeps its functions short (issues 27 and 31: "no function over 60 lines")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gnnscale", "partition", "samplers")
MAX_LINES = 60


def long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (N lines)`` for every function or method under ``root`` longer than ``limit`` lines
    (decorators excluded, docstring included)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_package_function_is_over_60_lines() -> None:
    offenders = [f"{package}/{f}" for package in PACKAGES for f in long_functions(ROOT / package, MAX_LINES)]
    assert not offenders, "split these functions: " + "; ".join(offenders)


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def short():\n    return 1\n\n\ndef too_long():\n{body}\n")
    assert long_functions(tmp_path, MAX_LINES) == [f"long.py:5 too_long ({MAX_LINES + 1} lines)"]
