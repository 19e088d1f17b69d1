"""A program's text is parsed once per process: every save and load of a run names the same program,
and parsing the megatron-gpt preset took most of a zero=1 rank's load (docs/BENCHMARKS.md, issue 21)."""

from __future__ import annotations

import pytest

from ucp import ucl
from ucp.ucl.errors import UclSyntaxError
from ucp.ucl.parser import parse

TEXT = "ucl 1\nparam heads = 8\ntensor w -> w\n  split dim 0 over tp\n"


def test_the_same_text_and_file_name_give_the_same_parsed_program():
    first = parse(TEXT, filename="cache-a.ucl")
    assert parse(TEXT, filename="cache-a.ucl") is first
    other = parse(TEXT, filename="cache-b.ucl")  # the name is in every error message: parsed apart
    assert other is not first and other.filename == "cache-b.ucl" and other == parse(TEXT, filename="cache-b.ucl")


def test_a_preset_loaded_twice_shares_its_parsed_program():
    a = ucl.load_program("megatron-gpt", num_layers=2, heads=4, kv_heads=2, vocab_size=64)
    b = ucl.load_program("megatron-gpt", num_layers=4, heads=8, kv_heads=2, vocab_size=128)
    assert a.program is b.program and a.params["heads"] == 4 and b.params["heads"] == 8


def test_a_syntax_error_is_raised_every_time_not_remembered_as_a_result():
    for _ in range(2):
        with pytest.raises(UclSyntaxError, match="cache-bad.ucl:1"):
            parse("ucl 1 2\n", filename="cache-bad.ucl")
