"""Single-process save/load round trips: dtypes, odd shapes, nesting, ties, in-place loads."""

from __future__ import annotations

import math

import pytest
import torch

import ucp
from ucp.dtypes import _BIT_PATTERN, _NATIVE


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(math.prod(shape) + len(str(dtype)))
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=gen)
    if dtype.itemsize == 1 and dtype not in (torch.int8, torch.uint8):  # float8/float4 kinds: any bit pattern
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).view(dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(low, high, shape, dtype=torch.int64, generator=gen).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A view that compares bit-exactly (NaN payloads and float8 kinds included)."""
    if t.dtype == torch.bool or not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype.itemsize == 1):
        return t
    if t.dtype.is_complex:
        t = torch.view_as_real(t)
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


ALL_DTYPES = [getattr(torch, n) for n in sorted({**_NATIVE, **_BIT_PATTERN}) if hasattr(torch, n)]


@pytest.mark.parametrize("url", ["local", "memory"])
def test_every_dtype_round_trips_bit_exact(tmp_path, url):
    path = str(tmp_path / "c") if url == "local" else f"memory://rt-{tmp_path.name}/c"
    state = {dtype_name: _sample(dtype, (3, 5)) for dtype_name, dtype in ((str(d), d) for d in ALL_DTYPES)}
    ucp.save(state, path)
    loaded = ucp.load(path)
    assert list(loaded) == list(state)
    for key, value in state.items():
        assert loaded[key].dtype == value.dtype, key
        assert torch.equal(_bits(loaded[key]), _bits(value)), key


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.tensor(3.5),  # 0-d
        lambda: torch.zeros(0),  # empty
        lambda: torch.zeros(4, 0, 3),  # empty in the middle
        lambda: torch.arange(24.0).view(4, 6).t(),  # non-contiguous transpose
        lambda: torch.arange(40.0).view(5, 8)[1:4, ::3],  # strided slice
        lambda: torch.arange(10.0).expand(3, 10),  # zero stride
        lambda: torch.zeros(7, 3, dtype=torch.bfloat16),  # all zeros (every chunk still stored)
    ],
    ids=["0d", "empty", "empty-mid", "transpose", "strided", "expanded", "zeros"],
)
def test_odd_shapes_round_trip(tmp_path, make):
    value = make()
    ucp.save({"x": value}, tmp_path / "c")
    out = ucp.load(tmp_path / "c")["x"]
    assert out.shape == value.shape and out.dtype == value.dtype
    assert torch.equal(out, value)


def test_nested_training_state_round_trips(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng": torch.get_rng_state(),
        "step": 7,
        "data": {"epoch": 1, "position": 1234, "order": (3, 1, 2), "loss": float("nan"), "none": None, "ok": True},
    }
    ucp.save(state, tmp_path / "c")
    out = ucp.load(tmp_path / "c")
    assert out["step"] == 7 and out["data"]["order"] == (3, 1, 2) and math.isnan(out["data"]["loss"])
    assert out["data"]["none"] is None and out["data"]["ok"] is True
    assert torch.equal(out["rng"], state["rng"]) and out["rng"].dtype == torch.uint8
    assert set(out["optimizer"]["state"]) == {0, 1, 2, 3}  # int keys survive
    assert out["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert out["scheduler"] == sched.state_dict()
    model2 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    model2.load_state_dict(out["model"])
    opt2 = torch.optim.AdamW(model2.parameters())
    opt2.load_state_dict(out["optimizer"])
    for a, b in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_tied_tensors_are_saved_once_and_load_shared(tmp_path):
    emb = torch.randn(5, 3)
    state = {"model": {"embed.weight": emb, "lm_head.weight": emb}, "other": emb[1:]}
    result = ucp.save(state, tmp_path / "c")
    assert sorted(result.manifest.tensors) == ["model/embed.weight", "other"]
    out = ucp.load(tmp_path / "c")
    a, b = out["model"]["embed.weight"], out["model"]["lm_head.weight"]
    assert a is b and torch.equal(a, emb)
    assert torch.equal(out["other"], emb[1:])


def test_load_into_copies_in_place(tmp_path):
    model = torch.nn.Linear(4, 3)
    ucp.save({"model": model.state_dict(), "step": 2}, tmp_path / "c")
    target = torch.nn.Linear(4, 3)
    into = {"model": target.state_dict(), "step": 0}
    ptr = target.weight.data_ptr()
    out = ucp.load(tmp_path / "c", into=into)
    assert target.weight.data_ptr() == ptr and out["model"]["weight"] is into["model"]["weight"]
    assert torch.equal(target.weight, model.weight) and out["step"] == 2


def test_load_into_shape_mismatch_names_key_and_fix(tmp_path):
    ucp.save({"w": torch.zeros(2, 3)}, tmp_path / "c")
    with pytest.raises(ucp.ShapeMismatchError) as err:
        ucp.load(tmp_path / "c", into={"w": torch.zeros(3, 2)})
    assert str(err.value) == (
        "cannot load 'w': the checkpoint has float32[2, 3] but the tensor to load into is float32[3, 2]; "
        "pass a tensor of that shape and dtype, or load without into= and convert"
    )
    with pytest.raises(ucp.ShapeMismatchError, match=r"float32\[2, 3\] but the tensor to load into is float16\[2, 3\]"):
        ucp.load(tmp_path / "c", into={"w": torch.zeros(2, 3, dtype=torch.float16)})


def test_strict_key_mismatch_lists_missing_and_unexpected(tmp_path):
    ucp.save({"a": torch.zeros(1), "b": torch.zeros(1)}, tmp_path / "c")
    with pytest.raises(ucp.KeyMismatchError) as err:
        ucp.load(tmp_path / "c", into={"a": torch.zeros(1), "z": torch.zeros(1)})
    assert str(err.value) == (
        f"keys do not match checkpoint {tmp_path / 'c'}:\n"
        "  missing from the checkpoint (1): z\n"
        "  not expected by the target (1): b\n"
        "  a fresh optimizer has no per-parameter state yet: put the optimizer itself in the state "
        "({'optim': opt}), not opt.state_dict()\n"
        "  strict=False loads the keys both have and adds the saved ones the target lacks "
        "(those under top-level keys it does not have are skipped with a warning)"
    )
    assert isinstance(err.value, KeyError)
    with pytest.warns(ucp.PartialLoadWarning) as caught:
        out = ucp.load(tmp_path / "c", into={"a": torch.ones(1), "z": torch.ones(1)}, strict=False)
    assert torch.equal(out["a"], torch.zeros(1)) and "b" not in out
    assert str(caught[0].message) == (
        f"strict=False: 1 saved tensor(s) of {tmp_path / 'c'} were not loaded, the target has no top-level key for "
        "them: b; add those keys to the state to load them, or load without into="
    )


class _Opaque:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, _Opaque) and other.v == self.v


def test_python_objects_need_opt_in_on_save_and_load(tmp_path):
    state = {"cfg": {"obj": _Opaque(3)}}
    with pytest.raises(ucp.UnsafeObjectError) as err:
        ucp.save(state, tmp_path / "c")
    assert str(err.value) == (
        f"value at 'cfg/obj' is a {__name__}._Opaque, which is not JSON; "
        "pass allow_objects=True to save (and load) it pickled"
    )
    assert not (tmp_path / "c").exists()  # validated before writing
    ucp.save(state, tmp_path / "c", allow_objects=True)
    with pytest.raises(ucp.UnsafeObjectError) as err:
        ucp.load(tmp_path / "c")
    assert str(err.value) == (
        "checkpoint holds a pickled Python object at 'cfg/obj'; pass allow_objects=True to load it with the "
        "restricted unpickler (plain data types only), or allow_objects=['module.Class', ...] to allow more"
    )
    with pytest.raises(ucp.UnsafePickleError, match=f"allow it explicitly \\(allow_objects=\\['{__name__}._Opaque'\\]\\)"):
        ucp.load(tmp_path / "c", allow_objects=True)  # not a plain data type: the class must be named
    assert ucp.load(tmp_path / "c", allow_objects=[_Opaque]) == state


def test_existing_checkpoint_needs_overwrite(tmp_path):
    ucp.save({"a": torch.zeros(1)}, tmp_path / "c")
    with pytest.raises(ucp.CheckpointExistsError) as err:
        ucp.save({"a": torch.ones(1)}, tmp_path / "c")
    assert str(err.value) == (
        f"a checkpoint already exists at {tmp_path / 'c'}; pass overwrite=True to replace it or save to a new path"
    )
    ucp.save({"a": torch.ones(1)}, tmp_path / "c", overwrite=True)
    assert torch.equal(ucp.load(tmp_path / "c")["a"], torch.ones(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no staging or old copies left


def test_iter_tensors_and_read_tensor_regions(tmp_path):
    w = torch.arange(60.0).view(6, 10)
    ucp.save({"w": w, "b": torch.ones(3)}, f"memory://it-{tmp_path.name}")
    assert [n for n, _ in ucp.iter_tensors(f"memory://it-{tmp_path.name}")] == ["b", "w"]
    part = ucp.read_tensor(f"memory://it-{tmp_path.name}", "w", ucp.Box((2, 3), (3, 4)))
    assert torch.equal(part, w[2:5, 3:7])
    flat = ucp.read_tensor(f"memory://it-{tmp_path.name}", "w", ucp.FlatRange(7, 25))
    assert torch.equal(flat, w.reshape(-1)[7:25])


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_map_location_and_unsupported_dtype(tmp_path):
    with pytest.raises(ucp.UnsupportedDtypeError, match=r"tensor 'q' has dtype complex32, which the checkpoint format cannot store"):
        ucp.save({"q": torch.zeros(2, dtype=torch.complex32)}, tmp_path / "c")
    ucp.save({"a": torch.ones(2)}, tmp_path / "c")
    assert ucp.load(tmp_path / "c", map_location="meta")["a"].device.type == "meta"


def test_save_without_checksums(tmp_path):
    ucp.save({"w": torch.arange(5.0)}, tmp_path / "c", checksums=False)
    manifest = ucp.CheckpointReader(str(tmp_path / "c")).manifest
    assert manifest.checksum_algorithm is None
    assert all(not f.checksums for t in manifest.tensors.values() for f in t.fragments)
    assert torch.equal(ucp.load(tmp_path / "c")["w"], torch.arange(5.0))
    report = ucp.verify(tmp_path / "c")
    assert report.ok and report.checksums is False
