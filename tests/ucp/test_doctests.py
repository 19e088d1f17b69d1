"""Every docstring example in ucp/ runs and shows what it says (docs that cannot rot)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ucp

# Run elsewhere: replication's examples read the repository's test data (tests/replication/
# test_place_doctests.py runs them from the repository root), ETTR's in tests/reliability.
ELSEWHERE = ("ucp.replication", "ucp.reliability.ettr")
MODULES = sorted(m.name for m in pkgutil.walk_packages(ucp.__path__, prefix="ucp.")
                 if not m.name.endswith(".__main__") and not m.name.startswith(ELSEWHERE))


def test_every_module_is_collected():
    assert {"ucp.api", "ucp.geometry", "ucp.manifest", "ucp.formats.base", "ucp.ucl.parser",
            "ucp.reliability.logs.envelope", "ucp.tools.bench.megatron_state"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write relative paths write here
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see the output above)"
