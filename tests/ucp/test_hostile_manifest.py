"""A damaged or hostile manifest gets a clear error before any file outside the checkpoint is read."""

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ucp
from ucp.errors import ManifestError, TensorTooLargeError


@pytest.fixture()
def checkpoint(tmp_path):
    path = tmp_path / "c"
    ucp.save({"w": torch.ones(4, 4)}, path)
    return path


def _edit(path, change):
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _fragment(m):
    return m["tensors"]["w"]["fragments"][0]


@pytest.mark.parametrize("key", ["../../../etc/passwd", "/etc/passwd", "r0/../../x", "r0//x", "r0/x\\y", ""])
def test_fragment_keys_cannot_leave_the_checkpoint(checkpoint, key):
    _edit(checkpoint, lambda m: _fragment(m).update(key=key))
    with pytest.raises(ManifestError, match="a fragment key must be a relative path of plain names under data/"):
        ucp.load(checkpoint)


@pytest.mark.parametrize("field, value, message", [
    ("pack_offset", -5, "field 'pack_offset' must be >= 0, got -5"),
    ("chunk_rows", 0, r"chunk_rows must be between 1 and 4 \(the rows it stores\), got 0"),
    ("nbytes", 65, "nbytes 65 does not match its region of 16 elements of 4 byte"),
])
def test_inconsistent_fragment_fields(checkpoint, field, value, message):
    _edit(checkpoint, lambda m: _fragment(m).update({field: value}))
    with pytest.raises(ManifestError, match=message):
        ucp.load(checkpoint)


def test_a_huge_claimed_shape_is_a_clear_error_not_an_allocator_crash(checkpoint):
    rows, cols = 10**7, 10**6  # 40 TB of float32: consistent fields, impossible tensor

    def huge(m):
        m["tensors"]["w"]["shape"] = [rows, cols]
        frag = _fragment(m)
        frag["region"]["box"]["sizes"] = [rows, cols]
        frag["nbytes"] = rows * cols * 4
        frag["chunk_rows"] = rows  # one chunk, as its one checksum says
        frag.pop("pack_offset")

    _edit(checkpoint, huge)
    with pytest.raises(TensorTooLargeError, match=r"cannot allocate 'w' float32\[10000000, 1000000\] \(37252\.9 GiB\)"):
        ucp.load(checkpoint)
    assert isinstance(TensorTooLargeError("x"), MemoryError)


def test_absurd_nesting_is_a_manifest_error(checkpoint):
    text = (checkpoint / "manifest.json").read_text()
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    (checkpoint / "manifest.json").write_text(text[:-1] + ',"extra2":' + deep + "}")
    with pytest.raises(ManifestError):
        ucp.load(checkpoint)


# -- raw Python errors from hostile values (issue 8, item 15) ---------------------------------------------


def _replace(path, old: str, new: str) -> None:
    text = (path / "manifest.json").read_text()
    assert old in text
    (path / "manifest.json").write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("old, new, message", [
    ('"rank": 0', '"rank": 1e400', "{m} holds the number 1e400, which is out of range; the manifest is damaged - "
                                   "load an older checkpoint"),
    ('"nbytes": 64', '"nbytes": ' + "9" * 5000,
     "{m} holds a value that cannot be read (Exceeds the limit (4300 digits) for integer string conversion: value has "
     "5000 digits; use sys.set_int_max_str_digits() to increase the limit); the manifest is damaged"),
    ('"rank": 0', '"rank": NaN', "{m} holds NaN, which JSON does not allow; the manifest is damaged"),
    ('"rank": 0', '"rank": ' + str(10**30), "{m}: tensor 'w' fragment 'r0/pack-000000': field 'rank' must be "
                                            "<= 2**63 - 1, got an integer of 100 bits"),
    ('"rank": 0', '"rank": "0"', "{m}: tensor 'w' fragment 'r0/pack-000000': field 'rank' must be an integer, "
                                 "got a string '0'"),
    ('"chunk_rows": 4', '"chunk_rows": 4.0', "{m}: tensor 'w' fragment 'r0/pack-000000': field 'chunk_rows' must "
                                             "be an integer, got a number 4.0"),
    ('"shape": [4, 4]', '"shape": [4, -4]', "{m}: tensor 'w': field 'shape' must be >= 0, got -4"),
    ('"world_size": 1', '"world_size": 0', "{m}: field 'world_size' must be >= 1, got 0"),
    ('"layout": null', '"layout": {"tp": "x"}', "{m}: field 'layout': 'tp' must be an integer, got a string 'x'"),
    ('"layout": null', '"layout": {"tp": 0}', "{m}: field 'layout': layout tp must be >= 1, got 0"),
    ('"layout": null', '"layout": {"bogus": 2}', "{m}: field 'layout': unknown layout dimension(s) ['bogus']; "
                                                 "expected some of ['tp', 'pp', 'dp', 'cp', 'ep', 'vpp', 'zero']"),
    ('"layout": null', '"layout": [2, 2]', '{m}: field \'layout\' must be an object like {{"tp": 2, "dp": 4}}, '
                                           "got a list"),
    ('"states": {"0"', '"states": {"7"', "{m}: states has key '7'; keys must be writer ranks 0..0 in decimal"),
    ('"region": {"box"', '"region": {"boxes"', "{m}: tensor 'w' fragment 'r0/pack-000000': field 'region': bad region "
                                              "{{'boxes': {{'offsets': [0, 0], 'sizes': [4, 4]}}}}: expected "
                                              "{{'box': ...}} or {{'flat': ...}}"),
], ids=["1e400", "5000-digits", "nan", "2**100", "string-int", "float-int", "negative-dim", "world-0",
        "layout-str", "layout-0", "layout-unknown", "layout-list", "states-rank", "region-kind"])
def test_hostile_values_are_manifest_errors_naming_the_field(checkpoint, capsys, old, new, message):
    from ucp.tools.cli import main as ucp_main

    text = json.dumps(json.loads((checkpoint / "manifest.json").read_text()), separators=(", ", ": "))
    (checkpoint / "manifest.json").write_text(text)
    _replace(checkpoint, old, new)
    message = message.format(m=checkpoint / "manifest.json")
    with pytest.raises(ManifestError) as err:
        ucp.load(checkpoint)
    assert str(err.value) == message
    assert ucp_main(["inspect", str(checkpoint)]) == 2  # an error line, never a traceback
    assert capsys.readouterr().err.strip() == f"ucp inspect: error: {message}"


# -- fragments that overlap and leave a gap (issue 8, item 7) -----------------------------------------------


def _save_two_ranks(path, **split):
    from ucp.sharding import local_shapes, split_fragment_map
    from ucp.spec import LogicalTensor

    full = torch.arange(16.0).view(4, 4)
    logical = {"w": LogicalTensor("w", (4, 4), "float32")}
    for rank in range(2):
        fmap = split_fragment_map(logical, rank=rank, world_size=2, **split)
        piece = fmap.tensors["w"].pieces[0]
        if "flat" in split:
            local = full.reshape(-1)[piece.target.start : piece.target.stop].clone()
        else:
            local = full[piece.target.slices()].clone()
        assert tuple(local.shape) == local_shapes(fmap)["w"]
        ucp.save({"w": local}, path, spec=fmap, rank=rank, world_size=2)
    ucp.finalize(path, world_size=2)


@pytest.mark.parametrize("split, region, shown", [
    ({"dim": 0}, {"box": {"offsets": [1, 0], "sizes": [2, 4]}}, "[1:3, 0:4]"),  # rows 1-2 twice, row 3 never
    ({"flat": True}, {"flat": {"start": 6, "stop": 14}}, "flat[6:14]"),  # elements 6-7 twice, 14-15 never
], ids=["boxes", "flat-ranges"])
def test_overlapping_fragments_that_leave_a_gap_are_refused(tmp_path, capsys, split, region, shown):
    from ucp.tools.cli import main as ucp_main

    path = tmp_path / "c"
    _save_two_ranks(path, **split)
    manifest = json.loads((path / "manifest.json").read_text())
    first, second = manifest["tensors"]["w"]["fragments"]
    second["region"] = region  # same element count: the count check alone passes
    (path / "manifest.json").write_text(json.dumps(manifest))
    first_shown = "[0:2, 0:4]" if "dim" in split else "flat[0:8]"
    message = (f"{path / 'manifest.json'}: tensor 'w': fragments {first['key']!r} ({first_shown}) and "
               f"{second['key']!r} ({shown}) overlap, so other elements of shape [4, 4] are in no fragment; the "
               "manifest is damaged - load an older checkpoint")
    with pytest.raises(ManifestError) as err:
        ucp.load(path)
    assert str(err.value) == message
    assert ucp_main(["verify", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(p["tensor"], p["message"]) for p in report["problems"]] == [("w", message)]


# -- a small fuzz over every field (siblings of the above) ---------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4) | st.sampled_from(["$tensor", "$tuple", "$dict", "$float", "$same_as", "box", "flat"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _places(node, path=()):
    """Every (path) to a value in a JSON tree."""
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _places(value, path + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _places(value, path + (index,))


@pytest.fixture(scope="module")
def fuzz_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "c"
    ucp.save({"w": torch.arange(12.0).view(3, 4), "b": torch.ones(2, dtype=torch.bfloat16),
              "opt": {"state": {0: {"step": torch.tensor(3)}}, "groups": [{"lr": 0.1, "betas": (0.9, 0.99)}]},
              "step": 7, "loss": float("nan")}, path)
    return path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_edit_of_one_field_gives_a_raw_python_error(fuzz_checkpoint, data):
    from ucp.summary import describe
    from ucp.verification import verify

    original = json.loads((fuzz_checkpoint / "manifest.json").read_text())
    places = sorted((p for p in _places(original) if p), key=repr)
    place = data.draw(st.sampled_from(places), label="place")
    edited = json.loads(json.dumps(original))
    parent = edited
    for part in place[:-1]:
        parent = parent[part]
    if isinstance(parent, dict) and data.draw(st.booleans(), label="delete"):
        del parent[place[-1]]
    else:
        parent[place[-1]] = data.draw(_JSON, label="value")
    try:
        (fuzz_checkpoint / "manifest.json").write_text(json.dumps(edited))
        for call in (ucp.load, describe, verify):
            try:
                call(fuzz_checkpoint)
            except ucp.UcpError:
                pass
    finally:
        (fuzz_checkpoint / "manifest.json").write_text(json.dumps(original))
