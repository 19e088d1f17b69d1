"""Files that state impossible or hostile tensor geometry: every reader refuses them by name, before reading.

Each case was read wrongly or with a raw traceback before ``ucp.formats.tensor_geometry`` (issue 17).
"""

from __future__ import annotations

import os
import pickle
import tracemalloc

import pytest
import torch

import ucp
from tests.ucp.formats.hostile import Record, archive_bytes, floats, write_archive, write_dcp, write_pt
from ucp.conversion import ConversionError
from ucp.errors import FormatError, UcpError
from ucp.formats.dcp import DcpReader
from ucp.formats.deepspeed.universal import resolve_universal_dir
from ucp.formats.deepspeed.zero import resolve_step_dir
from ucp.formats.inspection import verify_format
from ucp.formats.torch_file import TorchFileReader
from ucp import unpickle


def _read_all(reader) -> dict:
    with reader:
        return {t.name: t.read() for t in reader.tensors()}


def test_a_negative_storage_offset_is_refused_not_read_from_the_bytes_before_it(tmp_path):
    path = tmp_path / "neg.pt"
    write_pt(path, {"a": Record("0", 0, (4,), (1,)), "b": Record("1", -4, (4,), (1,))},
             {"0": floats(1, 2, 3, 4), "1": floats(5, 6, 7, 8)})
    with pytest.raises(RuntimeError, match="invalid storage offset"):
        torch.load(path, weights_only=True)  # torch refuses it too
    with pytest.raises(FormatError, match=rf"^{path}: tensor 'b' starts at storage offset -4; offsets are never "
                                          r"negative \(damaged or hostile file\)$"):
        TorchFileReader(path)
    assert not verify_format(path).ok
    with pytest.raises(FormatError, match="storage offset -4"):
        ucp.convert(path, tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("offset, stride, message", [
    (-10**9, (1,), "tensor 'w' starts at storage offset -1000000000"),
    (0, (-1,), r"tensor 'w' has negative strides \[-1\]; torch never saves those"),
    (0, (1, 1), "tensor 'w' has 1 sizes but 2 strides"),
    ("x", (1,), "tensor 'w' has storage offset 'x', not an integer"),
    (2, (1,), r"tensor 'w' needs bytes 8..24 of its storage, which holds 16"),
])
def test_impossible_geometry_is_a_format_error_naming_file_and_tensor(tmp_path, offset, stride, message):
    path = tmp_path / "x.pt"
    write_pt(path, {"w": Record("0", offset, (4,), stride)}, {"0": floats(1, 2, 3, 4)})
    with pytest.raises(FormatError, match=f"^{path}: {message}"):
        TorchFileReader(path)


def test_a_negative_offset_inside_a_dcp_chunk_does_not_read_the_previous_chunk(tmp_path):
    first = archive_bytes(Record("0", 0, (4,), (1,)), {"0": floats(1, 2, 3, 4)})
    second = archive_bytes(Record("0", -64, (4,), (1,)), {"0": floats(5, 6, 7, 8)})
    write_dcp(tmp_path / "dcp", {"a": ((4,), first), "b": ((4,), second)})
    from ucp.formats.torch_file import saved_tensor_at

    with open(tmp_path / "dcp" / "__0_0.distcp", "rb") as fh:
        with pytest.raises(FormatError, match="starts at storage offset -64"):
            saved_tensor_at(fh.name, len(first), len(second), fh)
    reader = DcpReader(str(tmp_path / "dcp"))
    with pytest.raises(UcpError, match=r"dcp: reading tensor 'b' failed .*invalid storage offset"):
        _read_all(reader)
    assert not verify_format(tmp_path / "dcp").ok


def _two_tensor_dcp(tmp_path, planner_data):
    data = archive_bytes(Record("0", 0, (4,), (1,)), {"0": floats(1, 2, 3, 4)})
    write_dcp(tmp_path / "dcp", {"a": ((4,), data), "b": ((4,), data)}, planner_data=planner_data)
    return str(tmp_path / "dcp")


@pytest.mark.parametrize("planner_data, message", [
    ({"a": ("model", "w"), "b": ("model", "w")}, r"gives entries 'a' and 'b' the same path \(\['model', 'w'\]\)"),
    ({"a": ("model",), "b": ("model", "w")}, r"gives entries 'a' and 'b' a path inside 'a''s \(\['model'\]\)"),
    ({"a": (), "b": ("b",)}, r"gives entry 'a' the path \(\); a path is a non-empty list"),
    ({"a": ("model", ["w"]), "b": ("b",)}, r"gives entry 'a' the path \('model', \['w'\]\)"),
    ({"a": "model.w", "b": ("b",)}, r"gives entry 'a' the path 'model.w'"),
])
def test_dcp_planner_data_that_would_drop_or_crash_is_refused(tmp_path, planner_data, message):
    path = _two_tensor_dcp(tmp_path, planner_data)
    with pytest.raises(FormatError, match=f"^{path}/.metadata: planner_data {message}"):
        DcpReader(path)
    assert not verify_format(path).ok


def test_dcp_planner_data_as_lists_still_reads(tmp_path):
    path = _two_tensor_dcp(tmp_path, {"a": ["model", "a"], "b": ["model", "b"]})
    got = _read_all(DcpReader(path))
    assert sorted(got) == ["a", "b"] and torch.equal(got["a"], torch.tensor([1.0, 2, 3, 4]))


@pytest.mark.parametrize("tag", ["../outside", "/etc", "a/../../x", "..", "", "x\\..\\y"])
@pytest.mark.parametrize("resolve, tag_file", [(resolve_step_dir, "latest"), (resolve_universal_dir, "latest_universal")])
def test_deepspeed_tags_that_leave_the_checkpoint_are_refused(tmp_path, tag, resolve, tag_file):
    root = tmp_path / "ckpt"
    (tmp_path / "outside" / "zero").mkdir(parents=True)
    (tmp_path / "outside" / "zero" / "optimizer_state.pt").write_bytes(b"")
    root.mkdir()
    (root / tag_file).write_text(tag)
    with pytest.raises(FormatError, match=f"^{root}/{tag_file} names tag .*(not one folder name inside|outside)"):
        resolve(str(root))


def test_a_tag_folder_linked_outside_the_checkpoint_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "ckpt").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "ckpt" / "global_step1")
    (tmp_path / "ckpt" / "latest").write_text("global_step1")
    with pytest.raises(FormatError, match=r"names tag 'global_step1', which resolves to .*elsewhere, outside"):
        resolve_step_dir(str(tmp_path / "ckpt"))


def _expanded(path, shape):
    write_pt(path, {"w": Record("0", 0, shape, (0,) * len(shape))}, {"0": floats(*range(8))})


def test_a_stride_0_view_verifies_its_stored_bytes_and_convert_refuses_with_the_budget_it_needs(tmp_path):
    path = tmp_path / "expanded.pt"
    _expanded(path, (10**7, 10**5))  # 4 TB presented, 32 bytes stored
    assert os.path.getsize(path) < 2000
    report = verify_format(path)
    assert report.ok and report.bytes_checked < 100
    with pytest.raises(ConversionError, match=rf"^{path}: tensor 'w' is a view of 4 stored bytes presented as "
                                              r"float32\[10000000, 100000\] \(4000000000000 bytes, as expand\(\) "
                                              r"saves it\); converting writes every element: pass --memory-budget "
                                              "4000000000000"):
        ucp.convert(path, tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


def test_a_small_stride_0_view_converts_to_what_torch_load_returns(tmp_path):
    path = tmp_path / "small.pt"
    write_pt(path, {"w": Record("0", 1, (3, 5), (1, 0))}, {"0": floats(*range(8))})
    ucp.convert(path, tmp_path / "out.safetensors")
    from safetensors.torch import load_file

    assert torch.equal(load_file(tmp_path / "out.safetensors")["w"], torch.load(path, weights_only=True)["w"])


def test_deepspeed_pt_files_refuse_views_that_expand_beyond_the_file(tmp_path):
    from ucp.formats.deepspeed.pt import load_pt

    path = tmp_path / "optim_states.pt"
    torch.save({"flat": torch.arange(8.0)[:1].expand(10**7)}, path)
    with pytest.raises(FormatError, match=rf"^{path}: tensor flat is a view of 4 stored bytes presented as "
                                          r"\[10000000\] \(40000000 bytes"):
        load_pt(path)
    torch.save({"flat": torch.arange(8.0)[:1].expand(4)}, path)  # small: kept as the view it is
    assert torch.equal(load_pt(path)["flat"], torch.zeros(4))


class _Huge:
    def __init__(self, name, n):
        self.name, self.n = name, n

    def __reduce__(self):
        return ({"bytearray": bytearray, "bytes": bytes, "list": list}[self.name], (self.n,))


@pytest.mark.parametrize("call", [_Huge("bytearray", 3 * 10**9), _Huge("bytes", 3 * 10**9),
                                  _Huge("list", range(10**9)), _Huge("bytearray", range(10**30))])
def test_the_unpickler_refuses_allocations_the_file_cannot_justify(tmp_path, call):
    data = pickle.dumps({"x": call}, protocol=2)
    assert len(data) < 500
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=r"^the pickle: the pickle asks builtins\.\w+ for about \d+ bytes, more "
                                              "than a file of its size can describe"):
            unpickle.loads(data)
        assert tracemalloc.get_traced_memory()[1] < 50 << 20  # refused before allocating
    finally:
        tracemalloc.stop()
    path = tmp_path / "huge.pt"
    write_archive(path, data, {})
    with pytest.raises(FormatError, match=rf"^{path}: the pickle asks builtins"):
        TorchFileReader(path)
    assert unpickle.loads(pickle.dumps(bytearray(1000))) == bytearray(1000)  # plain data still reads


def test_fraction_and_malformed_calls_are_format_errors_not_raw_tracebacks():
    import fractions

    class Frac:
        def __reduce__(self):
            return (fractions.Fraction, ("1e999999999",))

    with pytest.raises(FormatError, match="Fraction"):
        unpickle.loads(pickle.dumps(Frac()))
    assert unpickle.loads(pickle.dumps(fractions.Fraction(3, 4))) == fractions.Fraction(3, 4)

    class Bad:
        def __reduce__(self):
            return (int, ([1],))

    with pytest.raises(FormatError, match=r"^the pickle is not a readable torch.save/pickle file \(TypeError"):
        unpickle.loads(pickle.dumps(Bad()))
