"""Differential fuzzing of every foreign-format reader: valid and hostile files, built by hypothesis.

The property, for every file: our reader either returns tensors equal to what the framework's own
reader returns on the same file (``torch.load(weights_only=True)``, ``dcp.load``,
``safetensors.torch.load_file``), or raises a :class:`~ucp.errors.UcpError` naming the file; never a
raw exception, and never more memory than the file can justify. Valid files (written by the
framework itself) must read.

The suite runs a few examples per reader; before a release run many more::

    UCP_FUZZ_EXAMPLES=2000 pytest tests/ucp/formats/test_reader_fuzz.py -p no:randomly

(docs/CONVERT.md, "What readers refuse").
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ucp.formats.hostile import Record, write_pt
from ucp.errors import UcpError
from ucp.formats import get_format
from ucp.formats.naming import split_tree

EXAMPLES = int(os.environ.get("UCP_FUZZ_EXAMPLES", "12"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="UCP_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# A tensor presented larger than this is not read whole (only its stored bytes and one element).
READ_LIMIT = 16 << 20
DTYPES = (torch.float32, torch.int64, torch.bfloat16, torch.uint8, torch.float64)


@pytest.fixture(autouse=True, scope="module")
def _memory_stays_bounded():
    """No example may make the process allocate what a few-KiB file cannot justify."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 512, f"fuzzing grew the peak memory by {grown_mib:.0f} MiB"


def _ours(fmt: str, path: str) -> dict[str, torch.Tensor] | UcpError:
    """Every tensor our reader returns, by logical name, or the UcpError it raised (which must name ``path``)."""
    try:
        out = {}
        with get_format(fmt).open_reader(path) as reader:
            for info in reader.tensors():
                if info.nbytes > READ_LIMIT:
                    assert info.stored is not None and info.stored.nbytes <= os.path.getsize(path) + (1 << 20)
                    info.stored.read()
                    continue
                got = info.read()
                assert tuple(got.shape) == tuple(info.shape) and str(got.dtype) == f"torch.{info.dtype}"
                out[info.name] = got
        return out
    except UcpError as err:
        assert os.path.basename(os.path.normpath(path)) in str(err), f"error does not name the file: {err}"
        return err


def _same(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(n for n, t in theirs.items() if t.numel() * t.element_size() <= READ_LIMIT)
    for name, tensor in ours.items():
        assert tensor.dtype == theirs[name].dtype and torch.equal(tensor, theirs[name]), name


# ---- torch.save archives ---------------------------------------------------------------------------------

_sizes = st.one_of(st.integers(0, 4), st.sampled_from([10**7, 2**40]))
_records = st.dictionaries(st.sampled_from(["0", "1", "2"]), st.binary(max_size=64), min_size=1, max_size=3)


@st.composite
def _hostile_records(draw):
    records = draw(_records)
    tensors = {}
    for name in draw(st.lists(st.sampled_from(["w", "b", "model.w", "a.b", "x"]), min_size=1, max_size=4, unique=True)):
        ndim = draw(st.integers(0, 3))
        shape = tuple(draw(_sizes) for _ in range(ndim))
        stride = tuple(draw(st.one_of(st.integers(-2, 6), st.just(0))) for _ in range(ndim))
        tensors[name] = Record(draw(st.sampled_from(sorted(records) + ["missing"])),
                               draw(st.one_of(st.integers(-8, 24), st.sampled_from([-10**9, 2**40]))),
                               shape, stride, draw(st.sampled_from(DTYPES)),
                               draw(st.one_of(st.none(), st.integers(0, 20), st.just(-1))))
    return tensors, records


def _torch_names(path: str) -> dict[str, torch.Tensor]:
    names, _ = split_tree(torch.load(path, weights_only=True))
    return names


@FUZZ
@given(case=_hostile_records())
def test_torch_archives_with_any_geometry_read_as_torch_load_or_refuse(case):
    tensors, records = case
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fuzz.pt")
        write_pt(path, tensors, records)
        ours = _ours("torch", path)
        if isinstance(ours, UcpError):
            return
        _same(ours, _torch_names(path))  # we returned: torch.load must agree, value for value


@st.composite
def _valid_state(draw):
    state = {}
    for name in draw(st.lists(st.sampled_from(["w", "b", "emb", "head"]), min_size=1, max_size=4, unique=True)):
        shape = tuple(draw(st.lists(st.integers(1, 5), max_size=3)))
        base = torch.arange(max(1, torch.Size(shape).numel()) * 2, dtype=torch.float32).to(draw(st.sampled_from(DTYPES)))
        view = draw(st.sampled_from(["plain", "offset", "transpose", "expand"]))
        t = base[: torch.Size(shape).numel()].reshape(shape)
        if view == "offset":
            t = base[1: 1 + torch.Size(shape).numel()].reshape(shape)
        elif view == "transpose" and len(shape) >= 2:
            t = t.transpose(0, 1)
        elif view == "expand":
            t = base[:1].reshape((1,) * len(shape)).expand(shape) if shape else base[0]
        state[name] = t
    return state


@FUZZ
@given(state=_valid_state())
def test_torch_archives_torch_writes_read_exactly(state):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "valid.pt")
        torch.save(state, path)
        ours = _ours("torch", path)
        assert not isinstance(ours, UcpError), ours
        _same(ours, _torch_names(path))


# ---- DCP folders -----------------------------------------------------------------------------------------

def _dcp_save(folder: str) -> None:
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.arange(5, dtype=torch.int64)},
             "step": 7}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=folder, no_dist=True)


_DCP_MUTATIONS = st.sampled_from(["chunk_offset", "chunk_size", "size", "dtype", "storage_offset", "storage_length",
                                  "planner_dup", "planner_prefix", "planner_empty", "planner_list", "truncate",
                                  "none"])


def _mutate_dcp(folder: str, kind: str, value: int) -> None:
    path = os.path.join(folder, ".metadata")
    with open(path, "rb") as fh:
        md = pickle.load(fh)
    entries = md.state_dict_metadata
    fqn = "model.w" if value % 2 else "model.b"
    tensor = entries[fqn]
    index = next(k for k in md.storage_data if k.fqn == fqn)
    info = md.storage_data[index]
    if kind == "chunk_offset":
        tensor.chunks[0].offsets = torch.Size([value - 3] + list(tensor.chunks[0].offsets)[1:])
    elif kind == "chunk_size":
        tensor.chunks[0].sizes = torch.Size([value] + list(tensor.chunks[0].sizes)[1:])
    elif kind == "size":
        tensor.size = torch.Size([value] + list(tensor.size)[1:])
    elif kind == "dtype":
        tensor.properties.dtype = [torch.float64, torch.int8, torch.qint8, torch.bfloat16][value % 4]
    elif kind == "storage_offset":
        md.storage_data[index] = type(info)(info.relative_path, info.offset + value - 40, info.length)
    elif kind == "storage_length":
        md.storage_data[index] = type(info)(info.relative_path, info.offset, max(0, info.length + value - 40))
    elif kind.startswith("planner"):
        other = "model.b" if fqn == "model.w" else "model.w"
        md.planner_data[fqn] = {"planner_dup": md.planner_data[other], "planner_prefix": md.planner_data[other][:1],
                                "planner_empty": (), "planner_list": ["model", ["x"]]}[kind]
    elif kind == "truncate":
        data = os.path.join(folder, info.relative_path)
        with open(data, "r+b") as fh:
            fh.truncate(max(0, os.path.getsize(data) - value * 13))
    with open(path, "wb") as fh:
        pickle.dump(md, fh)


def _dcp_load(folder: str, reader) -> dict[str, torch.Tensor]:
    """DCP's own reading of every tensor our reader named, through templates of the shapes we reported."""
    import warnings

    import torch.distributed.checkpoint as dcp

    fqns = {name: leaf.fqn for name, leaf in reader._names.items()}
    template = {fqns[n]: torch.empty(info.shape, dtype=getattr(torch, info.dtype)) for n, info in
                ((i.name, i) for i in reader.tensors())}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(template, checkpoint_id=folder, no_dist=True)
    return {name: template[fqn] for name, fqn in fqns.items()}


@FUZZ
@given(kind=_DCP_MUTATIONS, value=st.integers(0, 60))
def test_dcp_folders_with_hostile_metadata_read_as_dcp_load_or_refuse(kind, value):
    from ucp.formats.dcp import DcpReader

    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "dcpfuzz")
        _dcp_save(folder)
        _mutate_dcp(folder, kind, value)
        ours = _ours("dcp", folder)
        if kind == "none":
            assert not isinstance(ours, UcpError), ours
        if isinstance(ours, UcpError):
            return
        with DcpReader(folder) as reader:
            _same(ours, _dcp_load(folder, reader))


# ---- safetensors files and HF indexes --------------------------------------------------------------------

_ST_DTYPES = ["F32", "I64", "BF16", "U8", "F64", "Q4", 7]


@st.composite
def _safetensors_file(draw):
    header: dict = {}
    for name in draw(st.lists(st.sampled_from(["w", "b", "a.b", "__metadata__"]), max_size=4, unique=True)):
        if name == "__metadata__":
            header[name] = draw(st.one_of(st.just({"step": "3"}), st.just({"x": 1}), st.just([])))
            continue
        begin = draw(st.one_of(st.integers(-4, 64), st.just(2**63)))
        header[name] = {"dtype": draw(st.sampled_from(_ST_DTYPES)),
                        "shape": draw(st.one_of(st.lists(st.integers(-1, 4), max_size=3), st.just("x"))),
                        "data_offsets": [begin, begin + draw(st.integers(-4, 64))]}
    raw = json.dumps(header).encode()
    length = draw(st.one_of(st.just(len(raw)), st.integers(0, len(raw) + 8), st.just(2**62)))
    return length.to_bytes(8, "little") + raw + draw(st.binary(max_size=96))


@FUZZ
@given(data=_safetensors_file())
def test_safetensors_headers_read_as_safetensors_or_refuse(data):
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fuzz.safetensors")
        with open(path, "wb") as fh:
            fh.write(data)
        ours = _ours("safetensors", path)
        if isinstance(ours, UcpError):
            return
        try:
            theirs = load_file(path)
        except (SafetensorError, Exception) as err:  # noqa: BLE001 - any refusal of theirs
            pytest.fail(f"we read {sorted(ours)} where safetensors refuses: {err}")
        _same(ours, theirs)


_INDEX_VALUES = st.sampled_from(["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                                 "../pytorch_model-00001-of-00002.bin", "/etc/passwd", "missing.bin", 3, None])


@FUZZ
@given(weight_map=st.one_of(st.dictionaries(st.sampled_from(["w", "b", "c", "../w"]), _INDEX_VALUES, max_size=4),
                            st.just([]), st.just("x")))
def test_hf_indexes_read_as_their_shards_or_refuse(weight_map):
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "hffuzz")
        os.makedirs(folder)
        shards = {"pytorch_model-00001-of-00002.bin": {"w": torch.ones(2)},
                  "pytorch_model-00002-of-00002.bin": {"b": torch.arange(3)}}
        for name, state in shards.items():
            torch.save(state, os.path.join(folder, name))
        with open(os.path.join(folder, "pytorch_model.bin.index.json"), "w") as fh:
            json.dump({"metadata": {}, "weight_map": weight_map}, fh)
        ours = _ours("hf-torch", folder)
        if isinstance(ours, UcpError):
            return
        theirs = {k: v for state in shards.values() for k, v in state.items()}
        assert all(k in shards.get(weight_map[k], {}) for k in ours)  # each from the shard the index names
        _same(ours, theirs)


# ---- DeepSpeed folders -----------------------------------------------------------------------------------

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "fixtures", "deepspeed",
                       "zero2-dp2")
_TAGS = st.one_of(st.sampled_from(["global_step3", "../zero2-dp2/global_step3", "/tmp", "..", "", "global_step3/..",
                                   "global_step9", "global_step3\n\n"]), st.text(max_size=12))
_DS_FILES = ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"]


@pytest.mark.skipif(not os.path.isdir(FIXTURE), reason="the shared DeepSpeed fixtures are not here")
@FUZZ
@given(tag=_TAGS, target=st.sampled_from(_DS_FILES), damage=st.sampled_from(["none", "truncate", "flip", "expand"]),
       at=st.integers(0, 10**6))
def test_deepspeed_folders_with_hostile_tags_and_files_read_or_refuse(tag, target, damage, at):
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "dsfuzz")
        shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("*_universal"))
        with open(os.path.join(root, "latest"), "w") as fh:
            fh.write(tag)
        file = os.path.join(root, "global_step3", target)
        size = os.path.getsize(file)
        if damage == "truncate":
            with open(file, "r+b") as fh:
                fh.truncate(at % size)
        elif damage == "flip":
            with open(file, "r+b") as fh:
                fh.seek(at % size)
                byte = fh.read(1)
                fh.seek(at % size)
                fh.write(bytes([byte[0] ^ 0xFF]))
        elif damage == "expand":
            state = torch.load(file, weights_only=False)
            flat = state.get("optimizer_state_dict", {}).get("single_partition_of_fp32_groups") if isinstance(
                state, dict) else None
            if flat:
                flat[0] = flat[0][:1].expand(10**8)
                torch.save(state, file)
        ours = _ours("deepspeed-zero", root)
        if tag.strip() == "global_step3" and damage == "none":
            assert not isinstance(ours, UcpError), ours
