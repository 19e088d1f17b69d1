"""Compare two checkpoints of any readable formats: logical tensors and training state, streaming.

::

    report = ucp.diff("dcp/step_100", "hf/")          # formats detected
    for d in report.differences:
        print(d.name, d.kind, d.detail)

Tensors are matched by logical name and compared block by block (a quarter
of the memory budget each side), so checkpoints larger than memory compare
fine. With ``atol=0`` values must be equal bit for bit (NaNs equal where both
have them); otherwise ``|a - b| <= atol`` element-wise. Each difference is
named: ``missing`` (only in A), ``extra`` (only in B), ``shape``, ``dtype``,
``values`` (with the largest absolute difference and how many elements
differ), or ``state`` (step, param groups, RNG, other entries; the shape of the
tree a format stores it in is not compared).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

__all__ = ["diff", "DiffReport", "Difference"]


@dataclass(frozen=True)
class Difference:
    """One way the two checkpoints differ."""

    name: str
    kind: str  # missing | extra | shape | dtype | values | state
    detail: str
    max_abs_diff: float | None = None
    elements: int | None = None  # values: how many elements differ


@dataclass(frozen=True)
class DiffReport:
    a: str
    b: str
    a_format: str
    b_format: str
    tensors_compared: int
    bytes_compared: int
    atol: float
    differences: tuple[Difference, ...] = field(default_factory=tuple)

    @property
    def equal(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict:
        return {**asdict(self), "equal": self.equal}


def diff(
    a: str | os.PathLike,
    b: str | os.PathLike,
    *,
    a_format: str | None = None,
    b_format: str | None = None,
    atol: float = 0.0,
    compare_state: bool = True,
    memory_budget: int | str = "2GiB",
    progress: Callable[[int, int, str], None] | None = None,
    only: str | None = None,
    b_whole: bool = False,
) -> DiffReport:
    """Compare checkpoints ``a`` and ``b`` (see the module doc).

    ``only`` compares one part of each side, as :func:`ucp.convert` writes it (``"model"``:
    the model's tensors; a root such as ``"ema"``: its tensors without the prefix), and no
    training state: ``ucp.diff(ckpt, exported, only="model")`` checks a weights-only export.
    ``b_whole`` applies ``only`` to ``a`` alone (``b`` is such an export already: ``only="ema"``).

    >>> import torch, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> torch.save({"w": torch.ones(3), "v": torch.zeros(1)}, os.path.join(d, "a.pt"))
    >>> torch.save({"w": torch.tensor([1.0, 1.5, 1.0])}, os.path.join(d, "b.pt"))
    >>> [(x.name, x.kind, x.max_abs_diff) for x in diff(os.path.join(d, "a.pt"), os.path.join(d, "b.pt")).differences]
    [('v', 'missing', None), ('w', 'values', 0.5)]
    """
    from ucp.formats.base import block_bytes_for
    from ucp.formats import blocks, detect_format, get_format, parse_size
    from ucp.formats.selection import select_tensors

    if atol < 0 or math.isnan(atol):
        raise ValueError(f"atol must be >= 0, got {atol}")
    block = block_bytes_for(parse_size(memory_budget))
    a, b = os.fspath(a), os.fspath(b)
    fa = get_format(a_format) if a_format else detect_format(a)
    fb = get_format(b_format) if b_format else detect_format(b)
    out: list[Difference] = []
    compared = done = 0
    with fa.open_reader(a) as ra, fb.open_reader(b) as rb:
        ia = {t.name: t for t in select_tensors(ra.tensors(), only, where=a)[0]}
        ib = {t.name: t for t in select_tensors(rb.tensors(), None if b_whole else only, where=b)[0]}
        out += [Difference(n, "missing", f"in {a} only") for n in ia if n not in ib]
        out += [Difference(n, "extra", f"in {b} only") for n in ib if n not in ia]
        common = [n for n in ia if n in ib]
        total = sum(ia[n].nbytes for n in common)
        for name in common:
            ta, tb = ia[name], ib[name]
            if ta.shape != tb.shape:
                out.append(Difference(name, "shape", f"{list(ta.shape)} vs {list(tb.shape)}"))
            elif ta.dtype != tb.dtype:
                out.append(Difference(name, "dtype", f"{ta.dtype} vs {tb.dtype}"))
            else:
                found = _compare(ta, tb, blocks(ta.shape, ta.dtype, block), atol)
                if found is not None:
                    out.append(
                        Difference(
                            name,
                            "values",
                            f"{found[1]} of {ta.numel} elements differ "
                            f"(max |a-b| = {found[0]:.6g})" + (f" beyond atol {atol:g}" if atol else ""),
                            found[0],
                            found[1],
                        )
                    )
                compared += 1
            done += ta.nbytes
            if progress is not None:
                progress(done, total, name)
        if compare_state and only is None:
            out += _compare_state(ra.state().to_dict(), rb.state().to_dict())
    order = {"missing": 0, "extra": 1, "shape": 2, "dtype": 3, "values": 4, "state": 5}
    out.sort(key=lambda d: (order[d.kind], d.name))
    return DiffReport(a, b, fa.name, fb.name, compared, done, atol, tuple(out))


def _compare(ta: Any, tb: Any, boxes: tuple, atol: float) -> tuple[float, int] | None:
    """``(max |a-b|, elements differing)`` over all blocks, or None when equal."""
    worst, count = 0.0, 0
    for box in boxes:
        xa, xb = ta.read(box), tb.read(box)
        bad = _bits_differ(xa, xb)
        if not bool(bad.any()):
            continue
        wide = torch.complex128 if xa.is_complex() else torch.float64
        delta = (xa.to(wide) - xb.to(wide)).abs()  # NaN where either side is NaN
        if atol:
            both_nan = torch.isnan(xa) & torch.isnan(xb) if xa.is_floating_point() or xa.is_complex() else None
            bad = ~(delta <= atol)
            if both_nan is not None:
                bad &= ~both_nan
        n = int(bad.sum())
        if n:
            count += n
            worst = max(worst, float(torch.nan_to_num(delta[bad], nan=math.inf).max()))
    return (worst, count) if count else None


def _bits_differ(xa: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
    """Element-wise: do the bit patterns differ (so equal NaNs are equal, and -0.0 differs from 0.0)?"""
    if xa.is_complex():
        return _bits_differ(torch.view_as_real(xa), torch.view_as_real(xb)).any(-1)
    kinds = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    kind = kinds[xa.element_size()]
    return xa.contiguous().view(kind) != xb.contiguous().view(kind)


def _compare_state(sa: dict, sb: dict) -> list[Difference]:
    out = []
    for key in ("step", "param_groups", "rng"):
        if sa.get(key) != sb.get(key):
            out.append(Difference(key, "state", f"{_short(sa.get(key))} vs {_short(sb.get(key))}"))
    ea = {k: v for k, v in (sa.get("extra") or {}).items() if k != "$roots"}
    eb = {k: v for k, v in (sb.get("extra") or {}).items() if k != "$roots"}
    for key in sorted(set(ea) | set(eb)):
        if ea.get(key) != eb.get(key):
            out.append(Difference(f"extra.{key}", "state", f"{_short(ea.get(key))} vs {_short(eb.get(key))}"))
    return out


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
