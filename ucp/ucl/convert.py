"""Renames between naming schemes: logical tensors of one program -> logical tensors of another.

Each program's ``view`` lines say how its logical names map onto a shared
canonical scheme (Hugging Face Llama names and conventions) and which
transforms that takes: ``transpose`` (the two dims swapped) and ``rope heads N``
(query/key rows stored in the interleaved rotary order; canonical is the
half-split order). Names without a view are canonical already. A converter
goes A -> canonical -> B, tensor by tensor::

    hf = convert_names(meta_tensors, "meta-llama", "hf-llama", from_params={"heads": 32, "kv_heads": 8})

Optimizer states named ``{name}/{state}`` follow their parameter (same rows permuted).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

from ucp.ucl.bind import BoundProgram, load_program
from ucp.ucl.env import Context
from ucp.ucl.errors import UclError
from ucp.ucl.expr import Expr
from ucp.layout import Layout


def rope_interleaved_to_half(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head from the interleaved order (x0, y0, x1, y1, ...) to half-split (x0, x1, ..., y0, y1, ...).

    Works on weights (rows = heads * head_dim) and biases (1-d).
    """
    rows = weight.shape[0]
    if heads <= 0 or rows % (2 * heads):
        raise UclError(f"rope permutation: {rows} rows do not split into {heads} heads of even size")
    rest = weight.shape[1:]
    return weight.reshape(heads, rows // heads // 2, 2, *rest).transpose(1, 2).reshape(weight.shape)


def rope_half_to_interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of :func:`rope_interleaved_to_half`."""
    rows = weight.shape[0]
    if heads <= 0 or rows % (2 * heads):
        raise UclError(f"rope permutation: {rows} rows do not split into {heads} heads of even size")
    rest = weight.shape[1:]
    return weight.reshape(heads, 2, rows // heads // 2, *rest).transpose(1, 2).reshape(weight.shape)


def _split_state(name: str) -> tuple[str, str]:
    base, sep, state = name.partition("/")
    return base, sep + state


def _heads(heads: Expr, bound: BoundProgram) -> int:
    ctx = Context.make(bound.program, Layout(), 0, bound.params)
    return heads.eval_int(ctx.env(), ctx.functions())


def to_canonical(name: str, tensor: torch.Tensor, bound: BoundProgram) -> tuple[str, torch.Tensor]:
    """One logical tensor of ``bound``'s scheme in the canonical scheme."""
    base, suffix = _split_state(name)
    for view in bound.program.views:
        caps = view.logical.match(base, {})
        if caps is None:
            continue
        if tensor.dim() > 0:
            if view.rope_heads is not None:
                tensor = rope_interleaved_to_half(tensor, _heads(view.rope_heads, bound))
            if view.transpose:
                tensor = tensor.transpose(0, 1).contiguous()
        return view.canonical.format(caps, {}) + suffix, tensor
    return name, tensor


def from_canonical(name: str, tensor: torch.Tensor, bound: BoundProgram) -> tuple[str, torch.Tensor]:
    """One canonical logical tensor in ``bound``'s scheme (the inverse of :func:`to_canonical`)."""
    base, suffix = _split_state(name)
    for view in bound.program.views:
        caps = view.canonical.match(base, {})
        if caps is None:
            continue
        if tensor.dim() > 0:
            if view.transpose:
                tensor = tensor.transpose(0, 1).contiguous()
            if view.rope_heads is not None:
                tensor = rope_half_to_interleaved(tensor, _heads(view.rope_heads, bound))
        return view.logical.format(caps, {}) + suffix, tensor
    return name, tensor


def convert_names(
    tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    from_program,
    to_program,
    *,
    from_params: dict | None = None,
    to_params: dict | None = None,
) -> dict[str, torch.Tensor]:
    """Logical tensors of ``from_program``'s scheme renamed and transformed into ``to_program``'s.

    Streams tensor by tensor (pass a generator to keep memory bounded).
    """
    a = load_program(from_program, **(from_params or {}))
    b = load_program(to_program, **(to_params or {}))
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    out: dict[str, torch.Tensor] = {}
    for name, tensor in items:
        canonical, t = to_canonical(name, tensor, a)
        new, t = from_canonical(canonical, t, b)
        if new in out:
            raise UclError(f"two tensors map onto {new!r} in {b.name}")
        out[new] = t
    return out
