"""Fuzzing the language: any text parses or raises UclSyntaxError; any parsed program compiles or raises
a UcpError. Never another exception (a raw TypeError, RecursionError, ValueError) and never a hang."""

from __future__ import annotations

import os
from importlib import resources

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ucp import ucl
from ucp.ucl.errors import UclSyntaxError
from ucp.ucl.parser import parse
from ucp.errors import UcpError
from ucp.spec import LogicalTensor

PRESETS = [resources.files("ucp.ucl").joinpath("presets", f"{n}.ucl").read_text() for n in ucl.preset_names()]
TOKENS = ["ucl 1", "param", "setting", "let", "require", "else", "tensor", "flat", "also", "view", "->", "=", "{i}",
          "{v?}", "{s:states}", "{name*}", "{i + 1}", "split", "dim", "0", "1", "over", "tp", "dp", "pad", "to",
          "multiple", "of", "size", "shape", "[", "]", "[n, 2]", "fuse", "groups", "part", "weight", "where",
          "i < n", "replicate", "policy", "average", "virtual", "members", "order", "by", "partition", "each",
          "align", "scalar", "transpose", "rope", "heads", "n", "states", "pp.rank", "tp.size", "//", "%", "*",
          "(", ")", ",", "#", "\n", "  ", "99999999999999999999", "-", "min(", "stage_layers(", "\t", "é", "\x00"]
# A lean run in the suite; UCL_FUZZ_EXAMPLES=5000 for a long hunt.
EXAMPLES = int(os.environ.get("UCL_FUZZ_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _parse_or_syntax_error(source: str):
    try:
        return parse(source, filename="f.ucl")
    except UclSyntaxError:
        return None


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join))
def test_token_soup_parses_or_is_a_syntax_error(source):
    _parse_or_syntax_error("ucl 1\n" + source)


@SETTINGS
@given(st.sampled_from(PRESETS), st.data())
def test_mutated_presets_parse_or_are_syntax_errors(text, data):
    lines = text.splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["drop", "dup", "cut", "insert"]))
        if action == "drop":
            del lines[at]
        elif action == "dup":
            lines.insert(at, lines[at])
        elif action == "cut":
            lines[at] = lines[at][: data.draw(st.integers(0, len(lines[at])))]
        else:
            lines[at] += " " + data.draw(st.sampled_from(TOKENS))
        if not lines:
            break
    _parse_or_syntax_error("\n".join(lines))


SMALL = """ucl 1
param n = 2
param h = 4
setting states = [m]
let twice = i * 2
tensor a.{i}.w -> a.{i}.w
  where i < n
  split dim 0 over tp
  shape [h, h]
tensor b.{i}.w
  where i < n
  fuse dim 0
    part b.{i}.x shape [h, h]
    part b.{twice}.y shape [h, h]
  split dim 0 over tp
also opt/{s:states}/{key} -> {name}/{s}
"""


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "opt/m/a", "opt/m/b", "c"]), st.integers(0, 3),
                          st.lists(st.integers(0, 9), min_size=0, max_size=3)), max_size=6),
       st.sampled_from(["tp=1", "tp=2", "tp=3,dp=2"]),
       st.dictionaries(st.sampled_from(["n", "h", "states"]),
                       st.one_of(st.integers(-5, 10), st.just("x"), st.just(2**62), st.lists(st.just("m")))))
def test_compiling_random_local_states_raises_only_ucp_errors(entries, layout, params):
    local = {f"{base}.{i}.w": (tuple(shape), "float32") for base, i, shape in entries}
    try:
        ucl.spec_for_save(SMALL, layout, 0, local, params=params)
    except UcpError:
        pass
    logical = {f"a.{i}.w": LogicalTensor(f"a.{i}.w", tuple(shape), "float32") for _, i, shape in entries}
    try:
        ucl.spec_for_load(SMALL, layout, 0, logical, params=params)
    except UcpError:
        pass
