"""Lint and types are checked, not hoped for: ruff and mypy pass with the settings in pyproject.toml.

Both run from the repository root with the tools installed next to the interpreter that runs the
tests (``pip install -e '.[test]'`` brings them). mypy keeps its cache in ``.mypy_cache`` (git
ignores it): a first run follows torch's and numpy's types (a minute or more of CPU); later runs
check only what changed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str, timeout: float) -> None:
    exe = BIN / tool
    if not exe.exists():
        pytest.fail(f"{tool} is not installed in {BIN}: pip install -e '.[test]'")
    done = subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"`{tool} {' '.join(args)}` failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"


def test_ruff_check_passes():
    _run("ruff", "check", "ucp", "tests", timeout=120)


# ucl and the core, as formatted by `ruff format` (the packages above them keep their own layout for now).
FORMATTED = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "ucp").glob("*.py"))] + [
    "ucp/ucl", "ucp/stores", "ucp/formats"]


def test_ucl_and_the_core_are_formatted():
    _run("ruff", "format", "--check", *FORMATTED, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mypy_passes_on_ucl_and_the_core():
    # The files to check and the per-module settings are in [tool.mypy].
    _run("mypy", "--cache-dir", str(ROOT / ".mypy_cache"), timeout=880)
