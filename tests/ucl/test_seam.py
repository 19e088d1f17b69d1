"""The seam between ucp and ucl: declared fields, and plain-dict / short-string round trips."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ucp import ucl
import ucp
from ucp.errors import LayoutError
from ucp.geometry import Box, FlatRange
from ucp.layout import Layout
from ucp.spec import FragmentMap, LocalTensor, LogicalTensor, ShardPiece, TensorSpec


def test_a_fragment_map_declares_its_local_shapes():
    fmap = FragmentMap(rank=0, logical={})
    assert fmap.local == {}  # a declared field with a default, not an attribute some maps happen to have
    compiled = ucl.spec_for_load("ucl 1\ntensor w -> w\n  split dim 0 over tp\n", "tp=2", 1,
                                 {"w": LogicalTensor("w", (5, 2), "float32")})
    assert isinstance(compiled, FragmentMap) and compiled.local == {"w": LocalTensor("w", (2, 2), "float32")}


def test_the_engine_allocates_from_a_hand_written_maps_local_shapes(tmp_path):
    # rows 3..4 of a 5-row tensor, held in a local tensor padded to 4 rows (the padding is no piece)
    path = str(tmp_path / "ckpt")
    whole = torch.arange(10.0).view(5, 2)
    ucp.save({"w": whole}, path)
    piece = ShardPiece("w", Box((0, 0), (2, 2)), Box((3, 0), (2, 2)))
    fmap = FragmentMap(rank=0, logical={"w": LogicalTensor("w", (5, 2), "float32")},
                       tensors={"w": TensorSpec("w", (piece,))}, local={"w": LocalTensor("w", (4, 2), "float32")})
    got = ucp.load(path, spec=fmap)["w"]
    assert got.shape == (4, 2) and torch.equal(got[:2], whole[3:]) and not got[2:].any()


layouts = st.builds(lambda tp, dp, zero: Layout(tp=tp, dp=dp, zero=zero), st.integers(1, 3), st.integers(1, 3),
                    st.integers(0, 2))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts, data=st.data())
def test_compiled_maps_round_trip_through_plain_dicts(layout, data, models):
    rank = data.draw(st.integers(0, layout.world_size - 1))
    meta = {n: LogicalTensor(n, tuple(t.shape), "float32") for n, t in models.deepspeed().items()}
    fmap = ucl.spec_for_load("deepspeed-zero", layout, rank, meta)  # boxes, flat ranges, replicas, padding
    back = FragmentMap.from_dict(fmap.to_dict())
    assert (back.rank, back.logical, back.tensors, back.local) == (fmap.rank, fmap.logical, fmap.tensors, fmap.local)


def test_a_fragment_map_with_flat_pieces_round_trips():
    spec = TensorSpec("buf", (ShardPiece("a", FlatRange(0, 3), FlatRange(5, 8)),), replica=1, replicas=2,
                      policy="take-first")
    fmap = FragmentMap(rank=3, logical={"a": LogicalTensor("a", (2, 4), "bfloat16")}, tensors={"buf": spec})
    assert FragmentMap.from_dict(fmap.to_dict()) == fmap


@pytest.mark.parametrize("data, message", [
    ({"rank": 0, "logical": {}, "tensors": {"w": {"pieces": [{"logical": "x", "local": {"box": {}}}]}}},
     "not a fragment map: ManifestError: bad region {'box': {}}: a box needs lists of integers >= 0 'offsets' and 'sizes'"),
    ({"rank": "0", "logical": {}, "tensors": {}}, "not a fragment map: TypeError: expected an integer, got '0'"),
    ({"rank": 0, "logical": {}, "tensors": {"w": {"pieces": [{"logical": "x", "local": {"flat": {"start": 0, "stop": 1}},
                                                              "target": {"flat": {"start": 0, "stop": 1}}}]}}},
     "tensor 'w' maps onto unknown logical tensor 'x'"),
])
def test_fragment_map_from_dict_names_what_is_wrong(data, message):
    with pytest.raises(LayoutError) as info:
        FragmentMap.from_dict(data)
    assert str(info.value) == message


words = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
values = st.one_of(st.integers(-(2**63) + 1, 2**63 - 1), words, st.lists(st.one_of(st.integers(0, 99), words),
                                                                           max_size=3).map(tuple))


@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), values, max_size=4))
def test_program_parameters_round_trip_through_the_short_string_form(params):
    assert ucl.parse_params(ucl.format_params(params)) == params


def test_parameter_strings_are_checked():
    with pytest.raises(ucl.UclError, match=r"bad program parameter 'heads': expected NAME=VALUE"):
        ucl.parse_params("heads")
    with pytest.raises(ucl.UclError, match=r"program parameter 'heads' is given twice"):
        ucl.parse_params("heads=2,heads=4")
    with pytest.raises(ucl.UclError, match=r"outside UCL's integer range"):
        ucl.parse_params("heads=" + "9" * 5000)
    with pytest.raises(ucl.UclError, match=r"has no short string form"):
        ucl.format_params({"order": ("a,b",)})


@pytest.mark.parametrize("preset", ucl.preset_names())
def test_every_preset_round_trips_through_its_record_and_its_string(preset):
    prog = ucl.load_program(preset, states=["exp_avg"]) if "states" in ucl.load_program(preset).program.params \
        else ucl.load_program(preset, heads=4)
    again = ucl.BoundProgram.from_dict(prog.to_dict())
    assert again.to_dict() == prog.to_dict() and again.preset == preset
    assert ucl.load_program(str(prog)).to_dict() == prog.to_dict()
