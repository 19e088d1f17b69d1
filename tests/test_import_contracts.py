"""The layers are one-way: import-linter's contracts (pyproject.toml) hold and no import cycle exists.

docs/ARCHITECTURE.md has the table of who may import whom; these tests are what keeps it true.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
# Subpackages are one node each in the package-level graph; the core's modules are nodes of their own.
SUBPACKAGES = ("ucl", "stores", "formats", "replication", "reliability", "integrations", "tools")


def _graph():
    return grimp.build_graph("ucp", include_external_packages=False, cache_dir=None)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _node(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in SUBPACKAGES else module


def _describe(graph, cycles: list[list[str]], node=lambda m: m) -> str:
    lines = []
    for members in cycles:
        lines.append("cycle: " + ", ".join(members))
        inside = set(members)
        for imp in graph.find_matching_direct_imports(import_expression="ucp.** -> ucp.**"):
            a, b = node(imp["importer"]), node(imp["imported"])
            if a != b and a in inside and b in inside:
                lines.append(f"  {imp['importer']} -> {imp['imported']}")
    return "\n".join(lines)


def test_no_module_imports_itself_back():
    """No two modules of ucp import each other, directly or around a circle (imports inside functions count)."""
    graph = _graph()
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = _cycles(edges)
    assert not cycles, "import cycles between modules:\n" + _describe(graph, cycles)


def test_no_cycle_between_subpackages_and_core_modules():
    """With each subpackage (ucp.ucl, ucp.stores, ucp.formats, ...) as one node, the graph has no circle."""
    graph = _graph()
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        edges.setdefault(_node(module), set()).update(
            _node(m) for m in graph.find_modules_directly_imported_by(module) if _node(m) != _node(module))
    cycles = _cycles(edges)
    assert not cycles, "import cycles between packages:\n" + _describe(graph, cycles, _node)


def _lint_imports() -> list[str]:
    script = Path(sys.executable).with_name("lint-imports")
    if script.exists():
        return [str(script)]
    found = shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed: pip install '.[test]' (import-linter)")
    return [found]


def test_import_linter_contracts_hold():
    """`lint-imports` (import-linter, configured in pyproject.toml) keeps every contract."""
    result = subprocess.run(_lint_imports() + ["--no-cache"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


def test_the_public_api_is_stated_once():
    """`ucp.__all__` names every lazily imported name, each resolves, and no stray module name is exported."""
    import ucp

    assert set(ucp._LAZY) <= set(ucp.__all__)
    assert len(set(ucp.__all__)) == len(ucp.__all__)
    assert dir(ucp) == sorted(ucp.__all__)
    for name in ucp.__all__:
        assert getattr(ucp, name) is not None
    for leftover in ("pickle", "annotations", "errors", "geometry", "layout", "spec"):
        assert leftover not in ucp.__all__
    with pytest.raises(AttributeError, match="module 'ucp' has no attribute 'pickle'"):
        ucp.pickle  # noqa: B018 - the attribute access is the test


def test_the_language_loads_without_the_engine():
    """`import ucp.ucl` imports the bottom vocabulary only: no torch, no reader, writer or stores."""
    code = ("import sys, ucp.ucl; print(sorted(m for m in sys.modules if m == 'torch' or "
            "(m.startswith('ucp.') and not m.startswith('ucp.ucl'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == "['ucp.errors', 'ucp.geometry', 'ucp.layout', 'ucp.program_record', 'ucp.spec']"
