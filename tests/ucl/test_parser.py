"""The UCL parser: what parses, and the exact text of every kind of syntax error."""

from __future__ import annotations

import pytest

from ucp import ucl
from ucp.ucl.errors import UclSyntaxError
from ucp.ucl.parser import parse
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



NAME_ERRORS = [
    # typos the parser must catch, wherever the expression is (each parsed silently before)
    ("ucl 1\nlet stage = v * pp.size + pp.rnak\n",
     "m.ucl:2:27: unknown name 'pp.rnak' in 'v * pp.size + pp.rnak': expected a parameter, a let, a layout "
     "variable (tp.rank, pp.size, zero.stage, ...) or a capture of the rules that use this let"),
    ("ucl 1\nlet layer = stage_start(pp.rank) + j\ntensor l.{i}.w -> l.{layer}.w\n",
     "m.ucl:2:36: unknown name 'j' in 'stage_start(pp.rank) + j': expected a parameter, a let, a layout variable "
     "(tp.rank, pp.size, zero.stage, ...) or a capture of the rules that use this let"),
    ("ucl 1\nlet layer = i + 1\ntensor a.{i}.w -> a.{layer}.w\ntensor b.{k}.w -> b.{layer}.w\n",
     "m.ucl:4:22: let 'layer' reads 'i', which is not a capture of the rule at line 4 (its captures: ['k'])"),
    ("ucl 1\nparam kv = heds\nparam heads = 4\n",
     "m.ucl:2:12: unknown name 'heds' in 'heds': a parameter's default may read the parameters declared above it "
     "and layout variables (tp.size, pp.size, ...)"),
    ("ucl 1\nparam order = []\nflat f -> {name}\n  order by ordr\n",
     "m.ucl:3:1: 'order by ordr' needs a list parameter 'ordr' (the members' logical names in the model's order): "
     "declare 'param ordr = []'"),
    ("ucl 1\nparam states = [a]\ntensor opt/{s:state}/w -> w/{s}\n",
     "m.ucl:3:1: capture {s:state} needs a list parameter 'state': declare 'param state = [a, b]'"),
    ("ucl 1\nparam heads\nview q = canonical.q rope heads hedas\n",
     "m.ucl:3:33: unknown name 'hedas' in 'hedas': expected a parameter or a let"),
    ("ucl 1\ntensor a -> b\nalso opt/{key} -> {name}/m where zero.stgae == 0\n",
     "m.ucl:3:34: unknown name 'zero.stgae' in 'zero.stgae == 0': expected a parameter, a let, a capture of this "
     "rule or a layout variable (tp.rank, pp.size, zero.stage, ...)"),
    ("ucl 1\ntensor a -> b\n  shape [hidden, 4]\n",
     "m.ucl:3:10: unknown name 'hidden' in 'hidden': expected a parameter, a let, a capture of this rule or a "
     "layout variable (tp.rank, pp.size, zero.stage, ...)"),
    ("ucl 1\nparam n\nsetting n = 2\n", "m.ucl:3:9: parameter 'n' is declared twice"),
    ("ucl 1\nlet x = 1\nlet x = 2\n", "m.ucl:3:5: let 'x' is defined twice"),
]

SHAPE_ERRORS = [
    ("ucl 1\ntensor a -> b\n  shape 4, 4\n",
     "m.ucl:3:9: expected '[' after 'shape' (a shape such as [hidden, heads * head_dim])"),
    ("ucl 1\ntensor a -> b\n  shape [4, 4\n", "m.ucl:3:9: expected ']' to close the shape"),
    ("ucl 1\ntensor a -> b\n  shape [4]\n  shape [4]\n", "m.ucl:4:3: the rule declares its shape twice"),
    ("ucl 1\ntensor a\n  fuse dim 0\n    part x\n  shape [4]\n",
     "m.ucl:5:3: a fused tensor declares each part's shape on its 'part' line: part NAME shape [...]"),
    ("ucl 1\ntensor a -> b\n  shape [4, 4.5]\n", "m.ucl:3:13: expected an integer, found 4.5"),
]


@pytest.mark.parametrize("source, message", NAME_ERRORS + SHAPE_ERRORS,
                         ids=[m.split(": ", 1)[1][:40] for _, m in NAME_ERRORS + SHAPE_ERRORS])
def test_names_and_shapes_are_checked_at_parse_time_everywhere(source, message):
    with pytest.raises(UclSyntaxError) as info:
        parse(source, filename="m.ucl")
    assert str(info.value).splitlines()[0] == message


def test_shapes_settings_and_parts_parse():
    prog = parse("ucl 1\nparam h\nparam heads\nsetting states = [m]\n"
                 "tensor qkv\n  fuse dim 0 groups 2\n    part q weight heads // 2 shape [heads * 2, h]\n"
                 "    part k shape [max(h, 2), h]\n  split dim 0 over tp\n"
                 "tensor n -> n\n  shape []\nalso opt/{s:states}/{key} -> {name}/{s}\n", filename="m.ucl")
    fused, norm = prog.rules[:2]
    assert [[e.text for e in p.shape] for p in fused.fuse.parts] == [["heads * 2", "h"], ["max(h, 2)", "h"]]
    assert fused.fuse.parts[0].weight.text == "heads // 2"
    assert norm.shape == ()
    assert prog.settings == frozenset({"states"}) and set(prog.params) == {"h", "heads", "states"}
    derived = [r for r in prog.rules if r.derived]  # optimizer states keep their parameter's declared shapes
    assert [r.declared_shapes for r in derived][1] == ((),)
    assert [[e.text for e in s] for s in derived[0].declared_shapes] == [["heads * 2", "h"], ["max(h, 2)", "h"]]
