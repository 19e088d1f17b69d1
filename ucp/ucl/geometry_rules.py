"""Geometry of one ``tensor`` rule instance: logical shapes <-> local shape and shard pieces.

Pure integer arithmetic over the rule's split / pad / size / fuse clauses.
*Load direction*: logical shapes -> local shape + pieces. *Save direction*:
a local shape -> the logical shapes (then checked by running the load
direction and comparing local shapes)::

    split dim 0 over tp         rank t of tp holds rows split_evenly(N, tp, t)
    pad dim 0 to multiple of m  the local rows include padding, the logical rows do not
    fuse dim 0 groups G         parts stacked per group: [q_g; k_g; v_g] for each local group g
"""

from __future__ import annotations

import itertools
import math

from ucp.ucl.env import Context, Env
from ucp.ucl.errors import DeclaredShapeError, UclError
from ucp.ucl.expr import ceil_to
from ucp.ucl.program import TensorRule
from ucp.geometry import Box, split_evenly
from ucp.spec import ShardPiece

Shape = tuple[int, ...]


def _dim_cut(rule: TensorRule, ctx: Context, dim: int) -> tuple[int, int]:
    return ctx.cut(tuple(g for s in rule.splits if s.dim == dim for g in s.groups))


def _pad(rule: TensorRule, env: Env, ctx: Context, dim: int) -> int:
    for p in rule.pads:
        if p.dim == dim:
            return p.multiple.eval_int(env, ctx.functions())
    return 1


def _check_dims(rule: TensorRule, ctx: Context, ndim: int, what: str) -> None:
    dims = [s.dim for s in rule.splits] + [p.dim for p in rule.pads] + [d for d, _ in rule.sizes]
    if rule.fuse is not None:
        dims.append(rule.fuse.dim)
    bad = [d for d in dims if d >= ndim]
    if bad:
        raise UclError(f"{ctx.program.where(rule.line)}: {what} has {ndim} dimension(s), the rule names dim {bad[0]}")


def _weights(rule: TensorRule, env: Env, ctx: Context) -> list[int]:
    out = []
    assert rule.fuse is not None, "called for fused rules only"
    for part in rule.fuse.parts:
        w = 1 if part.weight is None else part.weight.eval_int(env, ctx.functions())
        if w <= 0:
            raise UclError(f"{ctx.program.where(rule.line)}: part weight {part.weight} is {w}, must be > 0")
        out.append(w)
    return out


def _groups(rule: TensorRule, env: Env, ctx: Context, parts: int) -> int:
    assert rule.fuse is not None, "called for fused rules only"
    if rule.fuse.groups is None:
        return parts
    return rule.fuse.groups.eval_int(env, ctx.functions())


def local_geometry(rule: TensorRule, ctx: Context, env: Env, names: list[str], shapes: list[Shape]):
    """Load direction: (local shape, pieces) for logical tensors ``names`` of ``shapes``."""
    if rule.scalar:
        return (), [ShardPiece(names[0], Box((), ()), Box((), ()))]
    ndim = len(shapes[0])
    _check_dims(rule, ctx, ndim, f"logical tensor {names[0]!r}")
    fuse_dim = rule.fuse.dim if rule.fuse is not None else None
    local_shape: list[int] = []
    # per dim: list of (local_offset, target_offset, length) per part
    segments: list[list[list[tuple[int, int, int]]]] = []
    for d in range(ndim):
        parts, index = _dim_cut(rule, ctx, d)
        if d == fuse_dim:
            groups = _groups(rule, env, ctx, parts)
            units = []
            for name, shape in zip(names, shapes, strict=True):
                if groups <= 0 or shape[d] % groups:
                    raise UclError(
                        f"{ctx.program.where(rule.line)}: {name!r} has {shape[d]} elements along dim {d}, "
                        f"not a multiple of the {groups} fused groups: a fused dimension is cut into equal "
                        "groups, so an uneven split of it is refused (Megatron refuses it too: ffn_hidden_size "
                        "and the query/key/value heads must divide by tp)"
                    )
                units.append(shape[d] // groups)
            g0, gl = split_evenly(groups, parts, index)
            unit_total = sum(units)
            local_shape.append(gl * unit_total)
            per_part = []
            for c, unit in enumerate(units):
                prefix = sum(units[:c])
                per_part.append([(j * unit_total + prefix, (g0 + j) * unit, unit) for j in range(gl)])
            segments.append(per_part)
            continue
        sizes = {s[d] for s in shapes}
        if len(sizes) != 1:
            raise UclError(f"{ctx.program.where(rule.line)}: fused parts {names} differ along dim {d}: {sorted(sizes)}")
        n = shapes[0][d]
        padded = ceil_to(n, _pad(rule, env, ctx, d))
        off, length = split_evenly(padded, parts, index)
        valid = max(0, min(off + length, n) - off)
        local_shape.append(length)
        segments.append([[(0, off, valid)] if valid else [] for _ in names])
    pieces = []
    for c, name in enumerate(names):
        for combo in itertools.product(*(segments[d][c] for d in range(ndim))):
            local = Box(tuple(s[0] for s in combo), tuple(s[2] for s in combo))
            target = Box(tuple(s[1] for s in combo), tuple(s[2] for s in combo))
            if not local.is_empty():
                pieces.append(ShardPiece(name, local, target))
    return tuple(local_shape), pieces


def logical_shapes(rule: TensorRule, ctx: Context, env: Env, names: list[str], local_shape: Shape) -> list[Shape]:
    """Save direction: the logical shapes of ``names`` implied by a local tensor of ``local_shape``."""
    if rule.scalar:
        return [()] * len(names)
    ndim = len(local_shape)
    _check_dims(rule, ctx, ndim, f"local tensor of shape {tuple(local_shape)}")
    declared = {d: e.eval_int(env, ctx.functions()) for d, e in rule.sizes}
    out = [list(local_shape) for _ in names]
    for d in range(ndim):
        parts, index = _dim_cut(rule, ctx, d)
        if rule.fuse is not None and d == rule.fuse.dim:
            groups = _groups(rule, env, ctx, parts)
            _, gl = split_evenly(groups, parts, index)
            weights = _weights(rule, env, ctx)
            total = sum(weights)
            if gl == 0 or local_shape[d] % gl:
                raise UclError(
                    f"{ctx.program.where(rule.line)}: local size {local_shape[d]} along fused dim {d} does not "
                    f"divide into {gl} group(s) of parts weighted {weights}"
                )
            unit_total = local_shape[d] // gl
            for c, w in enumerate(weights):
                if unit_total * w % total:
                    raise UclError(
                        f"{ctx.program.where(rule.line)}: fused part {names[c]!r} gets {unit_total}*{w}/{total} "
                        "elements per group, not an integer"
                    )
                out[c][d] = groups * (unit_total * w // total)
            continue
        if d in declared:
            n = declared[d]
        elif any(p.dim == d for p in rule.pads):
            raise UclError(
                f"{ctx.program.where(rule.line)}: dim {d} is padded, so its true size must be declared "
                f"to save: add 'size dim {d} = EXPR'"
            )
        else:
            n = local_shape[d] * parts
        for o in out:
            o[d] = n
    return [tuple(o) for o in out]


def declared_shapes(rule: TensorRule, ctx: Context, env: Env) -> list[Shape | None]:
    """The logical shape each target declares with ``shape [...]`` (None where it declares none).

    ``size dim D = ...`` clauses must agree with a declared shape.
    """
    out: list[Shape | None] = []
    sizes = {d: e for d, e in rule.sizes}
    for exprs in rule.declared_shapes:
        if exprs is None:
            out.append(None)
            continue
        dims = tuple(e.eval_int(env, ctx.functions()) for e in exprs)
        if any(d < 0 for d in dims):
            raise UclError(f"{ctx.program.where(rule.line)}: declared shape {_text(exprs)} is {dims}, a negative size")
        for d, e in sizes.items():
            if not rule.scalar and d < len(dims) and e.eval_int(env, ctx.functions()) != dims[d]:
                raise UclError(
                    f"{ctx.program.where(rule.line)}: 'size dim {d} = {e}' is "
                    f"{e.eval_int(env, ctx.functions())} but the declared shape {_text(exprs)} has {dims[d]}"
                )
        out.append(dims)
    return out


def check_declared(rule: TensorRule, ctx: Context, env: Env, names: list[str], shapes: list[Shape]) -> None:
    """Load direction: the logical shapes of a checkpoint must be the ones the rule declares.

    Catches a model parameter given the wrong value (``heads``, ``vocab_size``) before any byte moves.
    """
    for name, shape, exprs, dims in zip(
        names, shapes, rule.declared_shapes, declared_shapes(rule, ctx, env), strict=True
    ):
        if dims is not None and tuple(shape) != dims:
            raise DeclaredShapeError(
                f"{ctx.program.where(rule.line)}: logical tensor {name!r} has shape {tuple(shape)}, but the program "
                f"declares {_text(exprs)} = {dims}{_params_read(exprs, ctx)}; check the program's parameters"
            )
    if rule.scalar:
        return
    for d, e in rule.sizes:
        want = e.eval_int(env, ctx.functions())
        for name, shape in zip(names, shapes, strict=True):
            if d < len(shape) and shape[d] != want:
                raise DeclaredShapeError(
                    f"{ctx.program.where(rule.line)}: logical tensor {name!r} has {shape[d]} elements along dim {d}, "
                    f"but the program declares 'size dim {d} = {e}' = {want}{_params_read((e,), ctx)}; check the "
                    "program's parameters"
                )


def _text(exprs) -> str:
    return "[" + ", ".join(e.text for e in exprs) + "]"


def _params_read(exprs, ctx: Context) -> str:
    """`` (with heads=4, hidden=64)``: the parameter values a declaration read, for the error message."""
    names = sorted({n for e in exprs for n in e.names if n in ctx.params})
    return f" (with {', '.join(f'{n}={ctx.params[n]}' for n in names)})" if names else ""


def numel(shape: Shape) -> int:
    return math.prod(shape)
