"""``inspect`` and ``verify`` for a checkpoint of any registered format.

:func:`describe_format` lists the logical tensors and the training state from
the format's reader (no tensor bytes read). :func:`verify_format` opens the
checkpoint (each reader checks its format's structure on open: safetensors
header bounds and offsets, DCP chunk coverage and data file sizes, torch.save
storage records...) and then reads every tensor, block by block, checking that
each read succeeds and gives the shape and dtype the reader announced. Problems
are collected, one per tensor (or one for the whole file when it cannot be
opened), never raised.

>>> import torch, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
>>> torch.save({"w": torch.ones(3), "step": 2}, path)
>>> describe_format(path).tensors[0].name, verify_format(path).ok
('w', True)
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ucp.errors import UcpError

__all__ = ["describe_format", "verify_format", "FormatSummary", "FormatVerifyReport", "TensorLine", "Problem"]


@dataclass(frozen=True)
class TensorLine:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class FormatSummary:
    path: str
    format: str
    step: int | None
    param_groups: int
    total_bytes: int
    tensors: tuple[TensorLine, ...]
    state: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Problem:
    tensor: str  # "" for the checkpoint as a whole
    kind: str  # the error class name
    message: str


@dataclass(frozen=True)
class FormatVerifyReport:
    path: str
    format: str
    ok: bool
    tensors: int
    bytes_checked: int
    problems: tuple[Problem, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)


def _format(path: str, name: str | None):
    from ucp.formats import detect_format, get_format

    return get_format(name) if name else detect_format(path)


def describe_format(path: str | os.PathLike, *, format: str | None = None) -> FormatSummary:
    """What a checkpoint holds, from its reader alone (raises when it cannot be opened)."""
    path = os.fspath(path)
    fmt = _format(path, format)
    with fmt.open_reader(path) as reader:
        lines = tuple(TensorLine(t.name, t.dtype, tuple(t.shape), t.nbytes) for t in reader.tensors())
        state = reader.state()
    return FormatSummary(
        path=path,
        format=fmt.name,
        step=state.step,
        param_groups=len(state.param_groups),
        total_bytes=sum(t.nbytes for t in lines),
        tensors=lines,
        state=state.to_dict(),
    )


def verify_format(
    path: str | os.PathLike,
    *,
    format: str | None = None,
    memory_budget: int | str = "2GiB",
    progress: Callable[[int], None] | None = None,
) -> FormatVerifyReport:
    """Open and read every tensor of a checkpoint of any format; ``progress(nbytes)`` after each block.

    Raises only when no format recognises ``path`` (nothing to check); everything else is a problem.
    """
    from ucp.formats.base import block_bytes_for
    from ucp.formats import blocks, parse_size
    from ucp.geometry import Box

    path = os.fspath(path)
    fmt = _format(path, format)
    block = block_bytes_for(parse_size(memory_budget))
    problems: list[Problem] = []
    count = checked = 0
    try:
        reader = fmt.open_reader(path)
    except (UcpError, OSError, ValueError) as err:
        return FormatVerifyReport(path, fmt.name, False, 0, 0, (Problem("", type(err).__name__, str(err)),))
    with reader:
        for info in reader.tensors():
            count += 1
            try:
                if info.stored is None or info.stored.nbytes >= info.nbytes:
                    boxes = blocks(info.shape, info.dtype, block)
                else:
                    # A view repeating its storage (expand()): check the bytes stored, and that it reads.
                    stored = info.stored.read()
                    checked += stored.numel() * stored.element_size()
                    boxes = (Box((0,) * len(info.shape), tuple(min(1, s) for s in info.shape)),)
                for box in boxes:
                    got = info.read(box)
                    _check(info, box, got)
                    checked += got.numel() * got.element_size()
                    if progress is not None:
                        progress(got.numel() * got.element_size())
            except (UcpError, OSError, ValueError, RuntimeError) as err:
                problems.append(Problem(info.name, type(err).__name__, str(err)))
    return FormatVerifyReport(path, fmt.name, not problems, count, checked, tuple(problems))


class _ReadMismatch(UcpError, ValueError):
    """A reader returned something other than the region it was asked for."""


def _check(info: Any, box: Any, got: Any) -> None:
    dtype = str(got.dtype).removeprefix("torch.")
    if tuple(got.shape) != tuple(box.sizes) or dtype != info.dtype:
        raise _ReadMismatch(
            f"tensor {info.name!r}: reading {box} gave {dtype}{list(got.shape)}, expected {info.dtype}{list(box.sizes)}"
        )
