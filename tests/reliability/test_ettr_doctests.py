"""The examples in the ETTR modules' docstrings run and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "reliability.ettr",
    "reliability.ettr.model",
    "reliability.ettr.simulator",
    "reliability.ettr.tracker",
    "reliability.ettr.adaptive",
    "reliability.ettr.report",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
