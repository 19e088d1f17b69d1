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
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ucp.ucl.compile_cache import compiled
from ucp.ucl.compiler import BoundFragmentMap, compile_load, compile_save
from ucp.ucl.env import param_value
from ucp.ucl.errors import UclError
from ucp.ucl.expr import Expr
from ucp.ucl.parser import MAX_SOURCE_CHARS, parse
from ucp.ucl.program import Program
from ucp.layout import Layout
from ucp.program_record import ProgramRecord
from ucp.spec import FragmentMap, LocalTensor, LogicalTensor  # re-exported


# A UCL program is a page of text; a larger "program" file is a mistake (or /dev/zero), not read.
MAX_PROGRAM_BYTES = MAX_SOURCE_CHARS


@dataclass(frozen=True)
class BoundProgram:
    """A parsed program and values for its parameters; ``preset`` names the shipped preset it came from.

    It round-trips through a plain dict (the record a checkpoint's manifest keeps: the full text,
    the parameters and the preset name) and, for presets and files, through the short string
    form ``megatron-gpt:num_layers=4,heads=8`` that :func:`load_program` reads.
    """

    program: Program
    params: dict = field(default_factory=dict)
    preset: str | None = None

    @property
    def name(self) -> str:
        return self.program.filename

    def __str__(self) -> str:
        """The short string form ``preset:name=value,...`` (lists as ``a|b``); a file's path for file programs."""
        name = self.preset or self.program.filename
        items = format_params(self.params)
        return f"{name}:{items}" if items else name

    def unset_params(self) -> list[str]:
        """The parameters that must be given (no default) and have no value, in declaration order."""
        return [n for n, default in self.program.params.items() if default is None and n not in self.params]

    def record(self) -> ProgramRecord:
        """What a manifest keeps: the program's full text, its parameters and the preset name."""
        params = {k: list(v) if isinstance(v, tuple) else v for k, v in self.params.items()}
        return ProgramRecord(
            text=self.program.source, params=params, name=os.path.basename(self.program.filename), preset=self.preset
        )

    def to_dict(self) -> dict:
        return self.record().to_dict()

    @classmethod
    def from_dict(cls, data: dict) -> "BoundProgram":
        return load_program(ProgramRecord.from_dict(data, source="program"))


def parse_params(text: str) -> dict:
    """``num_layers=4,heads=8,states=fp32|exp_avg`` -> a dict (ints where they look like ints).

    A value with ``|`` is a list (``exp_avg|`` is a list of one item, ``|`` the empty list):

    >>> parse_params("heads=8,states=fp32|exp_avg,order=|")
    {'heads': 8, 'states': ('fp32', 'exp_avg'), 'order': ()}
    >>> format_params(parse_params("heads=8,states=fp32|exp_avg,order=|"))
    'heads=8,states=fp32|exp_avg,order=|'
    """
    out: dict = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UclError(f"bad program parameter {_short(item)}: expected NAME=VALUE")
        if name in out:
            raise UclError(f"program parameter {name!r} is given twice in {_short(text)}")
        values = [_param_word(name, v.strip()) for v in value.split("|")]
        out[name] = tuple(v for v in values if v != "") if "|" in value else values[0]
    return out


def format_params(params: dict) -> str:
    """The inverse of :func:`parse_params` (lists of fewer than two items end with ``|``)."""
    items = []
    for name, value in params.items():
        if isinstance(value, (tuple, list)):
            text = "|".join(_format_word(name, v) for v in value) + ("|" if len(value) < 2 else "")
        else:
            text = _format_word(name, value)
        items.append(f"{name}={text}")
    return ",".join(items)


def _param_word(name: str, text: str):
    if text.lstrip("-").isascii() and text.lstrip("-").isdigit():
        if len(text) > 20:
            raise UclError(
                f"program parameter {name}={text[:20]}... is outside UCL's integer range (|value| <= 2**63 - 1)"
            )
        return int(text)
    return text


def _format_word(name: str, value) -> str:
    text = str(int(value)) if isinstance(value, int) else str(value)
    if not isinstance(value, int) and any(c in text for c in ",|=:\n"):
        raise UclError(f"program parameter {name}={value!r} has no short string form (it holds one of , | = :)")
    return text


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:30] + "..." + text[-27:])


def preset_names() -> list[str]:
    """The presets shipped in ucp/ucl/presets/ (file names without ``.ucl``)."""
    return sorted(
        p.name[:-4] for p in resources.files("ucp.ucl").joinpath("presets").iterdir() if p.name.endswith(".ucl")
    )


def _preset(name: str, params: dict) -> BoundProgram:
    text = resources.files("ucp.ucl").joinpath("presets").joinpath(f"{name}.ucl").read_text()
    return _bind(parse(text, filename=f"{name}.ucl"), params, preset=name)


def _bind(program: Program, params: dict, *, preset: str | None = None) -> BoundProgram:
    return BoundProgram(program, {k: param_value(program.filename, k, v) for k, v in params.items()}, preset)


def read_program_file(path: str | os.PathLike) -> str:
    """The text of a ``.ucl`` file: a regular file of UTF-8 text, at most :data:`MAX_PROGRAM_BYTES`."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UclError(f"UCL program file {os.fspath(path)!r} does not exist") from None
    except OSError as err:
        raise UclError(f"UCL program file {os.fspath(path)!r} cannot be read: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UclError(f"UCL program {os.fspath(path)!r} is not a regular file: pass a .ucl text file")
    if info.st_size > MAX_PROGRAM_BYTES:
        raise UclError(
            f"UCL program file {os.fspath(path)!r} has {info.st_size} bytes, more than the "
            f"{MAX_PROGRAM_BYTES} a program may have: is it a program?"
        )
    with open(path, "rb") as fh:
        data = fh.read(MAX_PROGRAM_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UclError(
            f"UCL program file {os.fspath(path)!r} is not UTF-8 text (byte {err.start} is "
            f"{data[err.start]:#04x}): pass a .ucl text file"
        ) from None


def load_program(program, **params) -> BoundProgram:
    """Parse ``program`` (text, path, preset name, Program, BoundProgram or a manifest's
    :class:`~ucp.program_record.ProgramRecord`) and bind parameters.

    >>> prog = load_program("megatron-gpt", num_layers=4, heads=8, kv_heads=2, vocab_size=1000)
    >>> str(prog)
    'megatron-gpt:num_layers=4,heads=8,kv_heads=2,vocab_size=1000'
    >>> load_program(str(prog)).params["heads"]
    8
    >>> load_program(prog.to_dict()).to_dict() == prog.to_dict()
    True
    """
    if isinstance(program, BoundProgram):
        return _bind(program.program, {**program.params, **params}, preset=program.preset)
    if isinstance(program, Program):
        return _bind(program, params)
    if isinstance(program, dict):
        program = ProgramRecord.from_dict(program, source="program")
    if isinstance(program, ProgramRecord):
        return _from_record(program, params)
    if isinstance(program, os.PathLike):
        path = Path(program)
        return _bind(parse(read_program_file(path), filename=str(path)), params)
    if not isinstance(program, str):
        raise UclError(f"expected UCL text, a .ucl path, a preset name or a BoundProgram, got {type(program).__name__}")
    if "\n" not in program and ":" in program and not os.path.exists(program):
        # "megatron-gpt:num_layers=4,heads=8": a preset or file with parameters, as one string
        base, _, rest = program.rpartition(":")
        return load_program(load_program(base), **{**parse_params(rest), **params})
    if "\n" in program or program.lstrip().startswith("ucl "):
        return _bind(parse(program, filename="<ucl>"), params)
    if program.endswith(".ucl") or os.sep in program:
        return _bind(parse(read_program_file(program), filename=program), params)
    if program in preset_names():
        return _preset(program, params)
    raise UclError(f"no UCL preset {_short(program)}: expected one of {preset_names()}, UCL text or a .ucl path")


def _from_record(record: ProgramRecord, params: dict) -> BoundProgram:
    """The program a manifest recorded. Its own text is used; a file path is never followed."""
    params = {**record.params, **params}
    text = record.text
    if "\n" in text or text.lstrip().startswith("ucl "):
        bound = _bind(parse(text, filename=record.name or "<manifest>"), params)
        return BoundProgram(bound.program, bound.params, record.preset)
    # Manifests written before the record held the text kept a preset reference: "megatron-gpt:heads=8".
    base, _, rest = text.partition(":")
    if base not in preset_names():
        raise UclError(
            f"the checkpoint records its UCL program as {_short(text)}, which is neither UCL text nor a "
            "preset reference; pass program= (the program it was saved with) to load it under a layout"
        )
    return _preset(base, {**parse_params(rest), **params})


def model_params(bound: BoundProgram) -> dict:
    """The values of the program's model parameters (every ``param`` but the ``setting`` s).

    Given values, else defaults; a default that reads the layout (or a parameter without a
    value) is left out. What a load compares with the checkpoint's program.

    >>> model_params(load_program("megatron-gpt", num_layers=2, heads=8))["kv_heads"]
    8
    """
    prog = bound.program
    values: dict = {}
    for name, default in prog.params.items():
        if name in bound.params:
            value = bound.params[name]
            values[name] = (value,) if isinstance(default, tuple) and not isinstance(value, tuple) else value
        elif isinstance(default, Expr):
            try:
                values[name] = default.eval(values)
            except UclError:
                continue
        elif default is not None:
            values[name] = default
    return {n: v for n, v in values.items() if n not in prog.settings}


def param_conflicts(given: BoundProgram, saved: BoundProgram) -> list[tuple[str, object, object]]:
    """``(name, given value, saved value)`` for every model parameter both programs set differently."""
    mine, theirs = model_params(given), model_params(saved)
    skip = given.program.settings | saved.program.settings
    return [(n, mine[n], theirs[n]) for n in mine if n in theirs and n not in skip and mine[n] != theirs[n]]


def with_saved_params(given: BoundProgram, saved: BoundProgram) -> BoundProgram:
    """``given`` with the saved values of the model parameters it leaves without a value of its own."""
    fill = {
        n: v
        for n, v in saved.params.items()
        if n in given.program.params
        and n not in given.params
        and n not in given.program.settings
        and n not in saved.program.settings
    }
    return BoundProgram(given.program, {**given.params, **fill}, given.preset) if fill else given


def _layout(layout) -> Layout:
    return layout if isinstance(layout, Layout) else Layout.parse(str(layout))


def spec_for_save(
    program, layout, rank: int, local: dict, *, params: dict | None = None, shapes: dict | None = None
) -> BoundFragmentMap:
    """The fragment map of ``rank`` saving ``local`` (key -> (shape, dtype str)).

    ``shapes`` (logical name -> LogicalTensor) is needed only by programs whose
    parameters exist solely inside flat partitions (ZeRO-3).
    """
    bound = load_program(program, **(params or {}))
    return compiled(compile_save, bound.program, _layout(layout), rank, local, params=bound.params, shapes=shapes)


def spec_for_load(program, layout, rank: int, logical: dict, *, params: dict | None = None) -> BoundFragmentMap:
    """The fragment map of ``rank`` loading from logical tensors ``logical`` (name -> LogicalTensor)."""
    bound = load_program(program, **(params or {}))
    return compiled(compile_load, bound.program, _layout(layout), rank, logical, params=bound.params)


def local_shapes(fmap: FragmentMap) -> dict[str, LocalTensor]:
    """Shape and dtype of every local tensor of a map made by this module (padding included)."""
    if isinstance(fmap, BoundFragmentMap) or (fmap.local and set(fmap.local) >= set(fmap.tensors)):
        return dict(fmap.local)
    raise UclError("local_shapes() needs a map made by ucl.bind.spec_for_load or spec_for_save")


__all__ = [
    "BoundProgram",
    "LocalTensor",
    "LogicalTensor",
    "format_params",
    "load_program",
    "local_shapes",
    "model_params",
    "param_conflicts",
    "parse_params",
    "preset_names",
    "read_program_file",
    "spec_for_load",
    "spec_for_save",
    "with_saved_params",
]
