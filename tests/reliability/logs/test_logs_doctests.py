"""The ``>>>`` examples in the log-analysis modules run and hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["header", "masking", "detect", "discover", "inputs", "readers", "scan", "fitted", "stamps"]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    module = importlib.import_module(f"ucp.reliability.logs.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
