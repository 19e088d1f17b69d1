"""The examples in the ETTR modules' docstrings run and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "ucp.reliability.ettr",
    "ucp.reliability.ettr.model",
    "ucp.reliability.ettr.simulator",
    "ucp.reliability.ettr.tracker",
    "ucp.reliability.ettr.adaptive",
    "ucp.reliability.ettr.report",
    "ucp.reliability.ettr.measured",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
