"""The examples in the docstrings of ucl's modules run and print what they say."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["ucp.ucl.bind", "ucp.ucl.check", "ucp.ucl.env", "ucp.ucl.expr", "ucp.ucl.flat", "ucp.ucl.names", "ucp.ucl.parser", "ucp.ucl.pattern",
           "ucp.ucl.simulate"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
