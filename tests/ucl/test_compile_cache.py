"""Compiled maps are kept per process under every input: another layout, rank, shape, dtype, parameter
or program never gets a kept map (docs/BENCHMARKS.md, zero=1: compiling took a fifth of a warm load)."""

from __future__ import annotations

import pytest

from ucp import ucl
from ucp.errors import LayoutError
from ucp.spec import LogicalTensor
from ucp.ucl import compile_cache, compiler

TEXT = "ucl 1\nparam parts = 1\ntensor w -> w\n  split dim 0 over tp\n"
LOGICAL = {"w": LogicalTensor("w", (8, 3), "float32")}


@pytest.fixture
def compiles(monkeypatch) -> list:
    """Every real compile, counted (the cache starts empty)."""
    compile_cache.clear()
    calls: list = []
    for name in ("compile_load", "compile_save"):
        real = getattr(compiler, name)

        def counted(*args, _real=real, **kwargs):
            calls.append(args[1:3])
            return _real(*args, **kwargs)

        counted.__module__, counted.__qualname__ = real.__module__, real.__qualname__
        monkeypatch.setattr(ucl.bind, name, counted)
    yield calls
    compile_cache.clear()


def _shapes(fmap) -> dict:
    return {k: (t.shape, t.dtype) for k, t in ucl.local_shapes(fmap).items()}


def test_the_same_load_is_compiled_once(compiles):
    first = ucl.spec_for_load(TEXT, "tp=2", 1, LOGICAL)
    again = ucl.spec_for_load(TEXT, "tp=2", 1, dict(LOGICAL))
    assert len(compiles) == 1 and again == first


@pytest.mark.parametrize(
    "change",
    [
        dict(layout="tp=4"),
        dict(rank=0),
        dict(logical={"w": LogicalTensor("w", (16, 3), "float32")}),
        dict(logical={"w": LogicalTensor("w", (8, 3), "bfloat16")}),
        dict(program=TEXT.replace("parts = 1", "parts = 2")),
        dict(program=ucl.load_program(TEXT, parts=3)),
    ],
    ids=["layout", "rank", "shape", "dtype", "program-text", "parameter"],
)
def test_any_other_input_is_compiled_for_itself(compiles, change):
    base = dict(program=TEXT, layout="tp=2", rank=1, logical=LOGICAL)
    ucl.spec_for_load(**base)
    args = {**base, **change}
    got = ucl.spec_for_load(args["program"], args["layout"], args["rank"], args["logical"])
    assert len(compiles) == 2
    compile_cache.clear()
    assert _shapes(got) == _shapes(ucl.spec_for_load(args["program"], args["layout"], args["rank"], args["logical"]))


def test_saves_are_kept_apart_from_loads_and_by_local_shapes(compiles):
    a = ucl.spec_for_save(TEXT, "tp=2", 1, {"w": ((4, 3), "float32")})
    b = ucl.spec_for_save(TEXT, "tp=2", 1, {"w": ((5, 3), "float32")})
    assert ucl.spec_for_save(TEXT, "tp=2", 1, {"w": ((4, 3), "float32")}) == a
    assert a.logical["w"].shape == (8, 3) and b.logical["w"].shape == (10, 3) and len(compiles) == 2
    ucl.spec_for_load(TEXT, "tp=2", 1, a.logical)
    assert len(compiles) == 3


def test_a_caller_changing_its_map_changes_no_kept_one(compiles):
    first = ucl.spec_for_load(TEXT, "tp=2", 1, LOGICAL)
    first.tensors.clear()
    first.local.clear()
    again = ucl.spec_for_load(TEXT, "tp=2", 1, LOGICAL)
    assert again.tensors and _shapes(again) == {"w": ((4, 3), "float32")}


def test_a_failing_compile_fails_every_time(compiles):
    for _ in range(2):
        with pytest.raises(LayoutError, match="rank 5 is outside"):
            ucl.spec_for_load(TEXT, "tp=2", 5, LOGICAL)  # no rank 5 in tp=2
    assert len(compiles) == 2
