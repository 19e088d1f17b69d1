"""The UCL parser: what parses, and the exact text of every kind of syntax error."""

from __future__ import annotations

import pytest

import ucl
from ucl.errors import UclSyntaxError
from ucl.parser import parse
from ucp.errors import UcpError


def test_a_small_program_parses_into_rules():
    prog = parse(
        "ucl 1\n"
        "param heads = 8\n"
        "param states = [exp_avg, exp_avg_sq]\n"
        "let stage = v * pp.size + pp.rank\n"
        "tensor model{v?}/layers.{i}.qkv   # fused\n"
        "  where v < vpp.size and i < 2\n"
        "  fuse dim 0 groups heads // 2\n"
        "    part layers.{i + stage}.q weight 2\n"
        "    part layers.{i + stage}.k\n"
        "  split dim 0 over tp, cp\n"
        "  replicate over dp policy average\n"
        "flat optim/{s:states}/flat -> {name}/{s}\n"
        "  members model/*, !*.bias\n"
        "  partition each over dp pad to multiple of 4\n"
        "  align 2\n",
        filename="m.ucl",
    )
    assert prog.params["states"] == ("exp_avg", "exp_avg_sq")
    rule, flat = prog.rules
    assert [c.kind for c in rule.local.captures] == ["optint", "int"]
    assert rule.splits[0].groups == ("tp", "cp")
    assert [p.logical.text for p in rule.fuse.parts] == ["layers.{i + stage}.q", "layers.{i + stage}.k"]
    assert rule.policy == "average" and rule.replicate_over == ("dp",)
    assert flat.members == ("model/*", "!*.bias") and flat.each and flat.logical == "{name}/{s}"


def test_also_makes_one_rule_per_tensor_rule():
    prog = parse("ucl 1\ntensor a -> A\n  split dim 0 over tp\nalso opt/{key} -> {name}/m\n")
    derived = [r for r in prog.rules if r.derived]
    assert [(r.local.text, r.logical.text, r.splits[0].groups) for r in derived] == [("opt/a", "A/m", ("tp",))]


ERRORS = [
    # (source, exact message)
    ("tensor a -> b\n",
     "m.ucl:1:1: expected 'ucl 1' as the first statement\n    tensor a -> b\n    ^"),
    ("ucl 2\n",
     "m.ucl:1:5: expected language version 1, found 2\n    ucl 2\n        ^"),
    ("ucl 1\ntensor a -> b\n  split dim x over tp\n",
     "m.ucl:3:13: expected a dimension number after 'split dim', found 'x'\n      split dim x over tp\n                ^"),
    ("ucl 1\ntensor a -> b\n  split dim 0 by tp\n",
     "m.ucl:3:15: expected 'over' after 'split dim 0', found 'by'\n      split dim 0 by tp\n                  ^"),
    ("ucl 1\ntensor a -> b\n  split dim 0 over mp\n",
     "m.ucl:3:20: expected a group (tp, cp, dp, pp, ep, edp) after 'split dim 0 over', found 'mp'\n"
     "      split dim 0 over mp\n                       ^"),
    ("ucl 1\ntensor a -> b\n  replicate policy vote\n",
     "m.ucl:3:20: expected a policy (check-equal, take-first, average), found 'vote'\n"
     "      replicate policy vote\n                       ^"),
    ("ucl 1\ntensor a.{i -> b\n",
     "m.ucl:2:10: expected '}' to close '{'\n    tensor a.{i -> b\n             ^"),
    ("ucl 1\ntensor a.{i+1} -> b\n",
     "m.ucl:2:11: expected a capture like {i}, {v?}, {s:states} or {name*}, found {i+1}\n"
     "    tensor a.{i+1} -> b\n              ^"),
    ("ucl 1\ntensor a.{i} -> b.{i / 2}\n",
     "m.ucl:2:20: expected one of + - * // % (use // for integer division)\n"
     "    tensor a.{i} -> b.{i / 2}\n                       ^"),
    ("ucl 1\ntensor a -> b.{open(i)}\n",
     "m.ucl:2:16: expected a call of one of min, max, ceil_div, stage_start, stage_layers, len\n"
     "    tensor a -> b.{open(i)}\n                   ^"),
    ("ucl 1\nsplit dim 0 over tp\n",
     "m.ucl:2:1: expected a statement (ucl, param, setting, let, require, tensor, flat, also, view), found 'split'\n"
     "    split dim 0 over tp\n    ^"),
    ("ucl 1\ntensor a\n",
     "m.ucl:2:9: expected '-> LOGICAL' after the local pattern (or 'fuse' with 'part' lines)\n    tensor a\n            ^"),
    ("ucl 1\ntensor a -> b\n  part c\n",
     "m.ucl:3:3: expected 'fuse dim D' before 'part'\n      part c\n      ^"),
    ("ucl 1\nflat f\n  split dim 0 over tp\n",
     "m.ucl:3:3: expected a flat clause (members, order, partition, align, where, replicate) or a statement, found 'split'\n"
     "      split dim 0 over tp\n      ^"),
    ("ucl 1\ntensor a -> b\n  pad dim 0 to multiple 128\n",
     "m.ucl:3:25: expected 'of' after 'pad dim 0 to multiple', found '128'\n"
     "      pad dim 0 to multiple 128\n                            ^"),
    ("ucl 1\ntensor a -> b\n  where i <\n",
     "m.ucl:3:9: expected an expression, found 'i <'\n      where i <\n            ^"),
    ("ucl 1\nrequire tp.size > 1\n",
     "m.ucl:2:20: expected 'else' after 'require EXPR', found the end of the line\n"
     "    require tp.size > 1\n                       ^"),
    ("ucl 1\nrequire tp.size > 1 else\n",
     "m.ucl:2:25: expected a message after 'else' (what the layout breaks, and the rule)\n"
     "    require tp.size > 1 else\n                            ^"),
    ("ucl 1\nalso opt/x -> {name}\n",
     "m.ucl:2:6: expected a local key template containing {key}\n    also opt/x -> {name}\n         ^"),
]


@pytest.mark.parametrize("source,message", ERRORS, ids=[e[1].split(": ", 1)[1].split("\n")[0][:40] for e in ERRORS])
def test_syntax_errors_point_at_the_token_and_say_what_was_expected(source, message):
    with pytest.raises(UclSyntaxError) as info:
        parse(source, filename="m.ucl")
    assert str(info.value) == message


def test_syntax_error_is_a_ucp_error_and_a_syntax_error_with_location():
    with pytest.raises(SyntaxError) as info:
        parse("ucl 1\ntensor a -> b\n  split dim 0 by tp\n", filename="m.ucl")
    err = info.value
    assert isinstance(err, UcpError)
    assert (err.filename, err.lineno, err.offset, err.text) == ("m.ucl", 3, 15, "  split dim 0 by tp")


def test_comments_are_shown_in_the_error_line_but_not_parsed():
    with pytest.raises(UclSyntaxError) as info:
        parse("ucl 1\nparam heads  # the query heads\ntensor a -> b\n  fuse dim 0 groups\n", filename="m.ucl")
    assert str(info.value).startswith("m.ucl:4:20: expected an expression, found the end of the line")


def test_presets_parse_and_list():
    assert ucl.preset_names() == ["deepspeed-zero", "hf-llama", "megatron-gpt", "meta-llama"]
    for name in ucl.preset_names():
        assert ucl.load_program(name).program.rules


def test_program_string_form_round_trips_parameters():
    prog = ucl.load_program("megatron-gpt", num_layers=4, heads=8, states=("fp32", "exp_avg"))
    assert str(prog) == "megatron-gpt:num_layers=4,heads=8,states=fp32|exp_avg"
    assert ucl.load_program(str(prog)).params == {"num_layers": 4, "heads": 8, "states": ("fp32", "exp_avg")}


def test_unknown_preset_and_unknown_parameter_are_reported():
    with pytest.raises(ucl.UclError, match="no UCL preset 'gpt5': expected one of"):
        ucl.load_program("gpt5")
    with pytest.raises(ucl.UclError, match=r"unknown program parameter\(s\) \['layerz'\]"):
        ucl.spec_for_load("megatron-gpt:layerz=3", "tp=1", 0, {})


def test_unknown_names_are_syntax_errors_at_the_expression():
    with pytest.raises(UclSyntaxError) as info:
        parse("ucl 1\ntensor layers.{i}.w -> layers.{i + pp.rnak}.w\n", filename="m.ucl")
    assert str(info.value) == (
        "m.ucl:2:36: unknown name 'pp.rnak' in 'i + pp.rnak': expected a parameter, a let, a capture of this rule "
        "or a layout variable (tp.rank, pp.size, zero.stage, ...)\n"
        "    tensor layers.{i}.w -> layers.{i + pp.rnak}.w\n"
        "                                       ^")


def test_require_names_are_checked_in_the_condition_and_in_message_holes():
    with pytest.raises(UclSyntaxError) as info:
        parse("ucl 1\nparam kv\nrequire kv % tp.size == 0 else kv ({kv}) over tp ({tp.szie})\n", filename="m.ucl")
    assert str(info.value) == (
        "m.ucl:3:52: unknown name 'tp.szie' in 'tp.szie': expected a parameter, a let or a layout variable "
        "(tp.size, pp.size, zero.stage, ...)\n"
        "    require kv % tp.size == 0 else kv ({kv}) over tp ({tp.szie})\n"
        "                                                       ^")
    prog = parse("ucl 1\nparam kv\nrequire kv % tp.size == 0 else kv ({kv}) over tp ({tp.size})  # why\n")
    (req,) = prog.requires
    assert (req.line, req.condition.text, req.message) == (3, "kv % tp.size == 0", "kv ({kv}) over tp ({tp.size})")

