"""Cost is bounded by the input: integers, parameter values, capture enumeration, digits in keys.

Each of these ran for minutes, ran out of memory or raised a raw Python error before.
"""

from __future__ import annotations

import time

import pytest

from ucp import ucl
from ucp.ucl.errors import UclError, UclSyntaxError
from ucp.ucl.parser import parse
from ucp.spec import LogicalTensor


def _squaring(levels: int) -> str:
    """A program whose parameters square each other: 3, 9, 81, ... (the issue's was 528 bytes)."""
    lines = ["ucl 1", "param a0 = 3"] + [f"param a{i + 1} = a{i} * a{i}" for i in range(levels)]
    return "\n".join(lines + [f"tensor w -> w\n  size dim 0 = a{levels} % 7 + 1\n"])


def test_parameters_that_square_each_other_are_refused_not_computed():
    source = _squaring(22)  # 3**(2**22) has two million digits: a second of bignum work before, per rank
    start = time.perf_counter()
    with pytest.raises(UclError) as info:
        ucl.spec_for_save(source, "tp=1", 0, {"w": ((4,), "float32")})
    assert str(info.value) == ("<ucl>:8: 'a5 * a5' leaves UCL's integer range (|value| <= 2**63 - 1): "
                               "1853020188851841 * 1853020188851841")
    assert time.perf_counter() - start < 5  # generous: it is microseconds; before, over a second per compile


def test_the_checker_reports_the_overflow_instead_of_running():
    report = ucl.check_program(_squaring(22), "tp=2", {"w": LogicalTensor("w", (4,), "float32")})
    assert [(f.kind, f.message) for f in report.findings] == [
        ("layout", "<ucl>:8: 'a5 * a5' leaves UCL's integer range (|value| <= 2**63 - 1): "
                   "1853020188851841 * 1853020188851841")]


@pytest.mark.parametrize("source, message", [
    ("ucl 1\nparam n = 99999999999999999999\n",
     "m.ucl:2:11: integer 99999999999999999999 is larger than UCL's maximum 2**63 - 1"),
    ("ucl 1\nparam xs = [1, 99999999999999999999]\n",
     "m.ucl:2:13: integer 99999999999999999999... is larger than UCL's maximum 2**63 - 1"),
    ("ucl 1\ntensor w -> w\n  split dim " + "9" * 5000 + " over tp\n",
     "m.ucl:3:13: expected a dimension number after 'split dim', found a 5000-digit number"),
    ("ucl " + "1" * 5000 + "\n", "m.ucl:1:5: expected a language version (1), found a 5000-digit number"),
    ("ucl 1\ntensor w -> w\n  split dim ² over tp\n",
     "m.ucl:3:13: expected a dimension number after 'split dim', found '²'"),
])
def test_integers_in_the_source_are_bounded(source, message):
    with pytest.raises(UclSyntaxError) as info:
        parse(source, filename="m.ucl")
    assert str(info.value).splitlines()[0] == message


@pytest.mark.parametrize("params, message", [
    ({"n": 2**70}, "<ucl>: parameter n = 11805916207174113034... is outside UCL's integer range (|value| <= 2**63 - 1)"),
    ({"n": 1.5}, "<ucl>: parameter n is float '1.5'; expected an integer, a word or a list of those"),
    ({"n": None}, "<ucl>: parameter n is NoneType 'None'; expected an integer, a word or a list of those"),
])
def test_parameter_values_are_checked_when_bound(params, message):
    with pytest.raises(UclError) as info:
        ucl.load_program("ucl 1\nparam n\ntensor w -> w\n", **params)
    assert str(info.value) == message


def test_a_word_where_a_number_belongs_is_a_ucl_error():
    prog = "ucl 1\nparam heads\ntensor w -> w\n  split dim 0 over tp\n  size dim 0 = heads * 2\n"
    with pytest.raises(UclError) as info:  # a raw TypeError before; "ab" * 2 would even have been "abab"
        ucl.spec_for_save(prog, "tp=1", 0, {"w": ((4,), "float32")}, params={"heads": "four"})
    assert str(info.value) == "<ucl>:5: 'heads * 2' needs integers on both sides of *, got 'four' and 2"
    with pytest.raises(UclError) as info:
        ucl.spec_for_save(prog.replace("heads * 2", "heads"), "tp=1", 0, {"w": ((4,), "float32")},
                          params={"heads": "four"})
    assert str(info.value) == "<ucl>:5: 'heads' is 'four', expected an integer"


def test_a_huge_capture_bound_is_refused_before_the_walk():
    prog = "ucl 1\nparam n\ntensor l.{i}.w -> l.{i}.w\n  where i < n\n"
    start = time.perf_counter()
    with pytest.raises(UclError) as info:  # MemoryError before (a list of 10**15 candidates)
        ucl.spec_for_load(prog, "tp=1", 0, {"l.0.w": LogicalTensor("l.0.w", (2,), "float32")}, params={"n": 10**15})
    assert str(info.value) == (
        "<ucl>:3: rule 'l.{i}.w' would try more than 262144 values of its captures (at {i}) on rank 0 of tp=1; "
        "bound them by the model's sizes with 'where NAME < EXPR' (and check the parameters, e.g. num_layers)")
    assert time.perf_counter() - start < 5


def test_nested_captures_share_one_budget():
    prog = "ucl 1\ntensor l.{i}.e.{j}.w -> l.{i}.e.{j}.w\n  where i < 1000 and j < 1000\n"
    with pytest.raises(UclError, match=r"would try more than 262144 values of its captures \(at \{j\}\)"):
        ucl.spec_for_load(prog, "tp=1", 0, {"l.0.e.0.w": LogicalTensor("l.0.e.0.w", (2,), "float32")})


def test_thousands_of_digits_in_keys_and_names_are_no_index():
    prog = "ucl 1\ntensor l.{i}.w -> l.{i}.w\n"
    huge = "l." + "9" * 5000 + ".w"
    with pytest.raises(UclError) as info:  # ValueError (int() of 5000 digits) before
        ucl.spec_for_save(prog, "tp=1", 0, {huge: ((2,), "float32")})
    assert str(info.value).startswith("<ucl>: no rule maps local tensor 'l.99999")
    fmap = ucl.spec_for_load(prog, "tp=1", 0, {huge: LogicalTensor(huge, (2,), "float32"),
                                               "l.1.w": LogicalTensor("l.1.w", (2,), "float32")})
    assert sorted(fmap.tensors) == ["l.1.w"]


def test_stage_layers_list_is_checked():
    prog = ("ucl 1\nparam num_layers = 4\nsetting stage_layers_list = []\n"
            "tensor l.{i}.w -> l.{stage_start(pp.rank) + i}.w\n  where i < stage_layers(pp.rank)\n")
    logical = {f"l.{i}.w": LogicalTensor(f"l.{i}.w", (2,), "float32") for i in range(4)}
    assert sorted(ucl.spec_for_load(prog, "pp=2", 1, logical, params={"stage_layers_list": [1, 3]}).tensors) == [
        "l.0.w", "l.1.w", "l.2.w"]
    with pytest.raises(UclError, match=r"stage_layers_list must hold layer counts >= 0, got \[1, 'x'\]"):
        ucl.spec_for_load(prog, "pp=2", 1, logical, params={"stage_layers_list": [1, "x"]})


PATHOLOGICAL = [
    # (source, first line of the error): each was a raw RecursionError/MemoryError, or a minute of work
    ("ucl 1\nparam x = " + "+".join(["1"] * 3000) + "\n",
     "m.ucl:2:11: expected an expression of at most 4096 characters, found 5999"),
    ("ucl 1\nparam x = " + "-" * 100 + "1\n", "m.ucl:2:11: expected an expression nested at most 64 deep"),
    ("ucl 1\n" + "".join(f"let l{i} = l{i - 1}\n" if i else "let l0 = 1\n" for i in range(40)),
     "m.ucl:34:11: let 'l32' is the end of a chain of more than 32 lets"),
    ("ucl 1\nlet a = b + 1\nlet b = c\nlet c = a\n", "m.ucl:2:9: let 'a' refers to itself (a -> b -> c -> a)"),
    ("ucl 1\n" + "#" * (1 << 20), "m.ucl:1:1: a program has at most 1048576 characters, this one 1048582"),
    ("ucl 1\n" + "tensor a{i} -> b.{i}\n" * 200 + "also o/{key} -> {name}/s\n" * 60,
     "m.ucl:261:1: the program expands to 12200 rules (200 tensor rules x 60 'also' lines), more than the 10000 a "
     "program may have"),
]


@pytest.mark.parametrize("source, message", PATHOLOGICAL,
                         ids=["long", "deep", "let chain", "let cycle", "huge", "alsos"])
def test_pathological_programs_are_syntax_errors_at_once(source, message):
    start = time.perf_counter()
    with pytest.raises(UclSyntaxError) as info:
        parse(source, filename="m.ucl")
    assert str(info.value).splitlines()[0] == message
    assert time.perf_counter() - start < 5
