"""The contract with the checkpoint engine: UCL program + layout + rank -> FragmentMap.

    >>> fmap = spec_for_save("ucl 1\\ntensor w -> w\\n  split dim 0 over tp\\n", "tp=2", 1, {"w": ((4, 3), "float32")})
    >>> fmap.logical["w"].shape
    (8, 3)
    >>> local_shapes(spec_for_load("ucl 1\\ntensor w -> w\\n  split dim 0 over tp\\n", "tp=4", 3, fmap.logical))
    {'w': LocalTensor(key='w', shape=(2, 3), dtype='float32')}

``program`` is UCL source text, a path to a ``.ucl`` file, a preset name
(``megatron-gpt``, ``deepspeed-zero``, ``hf-llama``, ``meta-llama``), or a
:class:`BoundProgram` from :func:`load_program` (a program with parameter values,
e.g. the model's head counts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ucl.compiler import BoundFragmentMap, LocalTensor, compile_load, compile_save
from ucl.errors import UclError
from ucl.parser import parse
from ucl.program import Program
from ucp.layout import Layout
from ucp.spec import FragmentMap, LogicalTensor  # noqa: F401 - re-exported


@dataclass(frozen=True)
class BoundProgram:
    """A parsed program and values for its parameters."""

    program: Program
    params: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.program.filename

    def __str__(self) -> str:
        """The short string form ``preset:name=value,...`` (lists as ``a|b``), for presets."""
        name = self.program.filename.removesuffix(".ucl")
        items = ",".join(f"{k}={'|'.join(map(str, v)) if isinstance(v, (tuple, list)) else v}"
                         for k, v in self.params.items())
        return f"{name}:{items}" if items else name


def _parse_params(text: str) -> dict:
    """``num_layers=4,heads=8,states=fp32|exp_avg`` -> a dict (ints where they look like ints)."""
    out: dict = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise UclError(f"bad program parameter {item!r}: expected NAME=VALUE")
        values = [int(v) if v.strip().lstrip("-").isdigit() else v.strip() for v in value.split("|")]
        out[name.strip()] = tuple(v for v in values if v != "") if "|" in value else values[0]
    return out


def preset_names() -> list[str]:
    """The presets shipped in ucl/presets/ (file names without ``.ucl``)."""
    return sorted(p.name[:-4] for p in resources.files("ucl").joinpath("presets").iterdir() if p.name.endswith(".ucl"))


def load_program(program, **params) -> BoundProgram:
    """Parse ``program`` (text, path, preset name, Program or BoundProgram) and bind parameters.

    >>> prog = load_program("megatron-gpt", num_layers=4, heads=8, kv_heads=2, vocab_size=1000)
    >>> str(prog)
    'megatron-gpt:num_layers=4,heads=8,kv_heads=2,vocab_size=1000'
    >>> load_program(str(prog)).params["heads"]
    8
    """
    if isinstance(program, BoundProgram):
        return BoundProgram(program.program, {**program.params, **params})
    if isinstance(program, Program):
        return BoundProgram(program, params)
    if isinstance(program, os.PathLike):
        path = Path(program)
        return BoundProgram(parse(path.read_text(), filename=str(path)), params)
    if not isinstance(program, str):
        raise UclError(f"expected UCL text, a .ucl path or a preset name, got {type(program).__name__}")
    if "\n" not in program and ":" in program and not os.path.exists(program):
        # "megatron-gpt:num_layers=4,heads=8": a preset or file with parameters, as one string
        base, _, rest = program.partition(":")
        return load_program(load_program(base), **{**_parse_params(rest), **params})
    if "\n" in program or program.lstrip().startswith("ucl "):
        return BoundProgram(parse(program, filename="<ucl>"), params)
    if program.endswith(".ucl") or os.sep in program:
        path = Path(program)
        if not path.is_file():
            raise UclError(f"UCL program file {program!r} does not exist")
        return BoundProgram(parse(path.read_text(), filename=str(path)), params)
    if program in preset_names():
        text = resources.files("ucl").joinpath("presets", f"{program}.ucl").read_text()
        return BoundProgram(parse(text, filename=f"{program}.ucl"), params)
    raise UclError(f"no UCL preset {program!r}: expected one of {preset_names()}, UCL text or a .ucl path")


def _layout(layout) -> Layout:
    return layout if isinstance(layout, Layout) else Layout.parse(str(layout))


def spec_for_save(program, layout, rank: int, local: dict, *, params: dict | None = None,
                  shapes: dict | None = None) -> BoundFragmentMap:
    """The fragment map of ``rank`` saving ``local`` (key -> (shape, dtype str)).

    ``shapes`` (logical name -> LogicalTensor) is needed only by programs whose
    parameters exist solely inside flat partitions (ZeRO-3).
    """
    bound = load_program(program, **(params or {}))
    return compile_save(bound.program, _layout(layout), rank, local, params=bound.params, shapes=shapes)


def spec_for_load(program, layout, rank: int, logical: dict, *, params: dict | None = None) -> BoundFragmentMap:
    """The fragment map of ``rank`` loading from logical tensors ``logical`` (name -> LogicalTensor)."""
    bound = load_program(program, **(params or {}))
    return compile_load(bound.program, _layout(layout), rank, logical, params=bound.params)


def local_shapes(fmap: FragmentMap) -> dict[str, LocalTensor]:
    """Shape and dtype of every local tensor of a map made by this module (padding included)."""
    if isinstance(fmap, BoundFragmentMap):
        return dict(fmap.local)
    raise UclError("local_shapes() needs a map made by ucl.bind.spec_for_load or spec_for_save")


__all__ = ["BoundProgram", "LocalTensor", "LogicalTensor", "load_program", "local_shapes", "preset_names",
           "spec_for_load", "spec_for_save"]
