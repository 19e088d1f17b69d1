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

from ucl.env import Context, Env, group_size_rank
from ucl.errors import UclError
from ucl.expr import ceil_to
from ucl.program import TensorRule
from ucp.geometry import Box, split_evenly
from ucp.spec import ShardPiece

Shape = tuple[int, ...]


def _dim_cut(rule: TensorRule, ctx: Context, dim: int) -> tuple[int, int]:
    groups: tuple[str, ...] = ()
    for s in rule.splits:
        if s.dim == dim:
            groups += s.groups
    return group_size_rank(ctx.layout, ctx.coords, groups)


def _pad(rule: TensorRule, env: Env, ctx: Context, dim: int) -> int:
    for p in rule.pads:
        if p.dim == dim:
            return int(p.multiple.eval(env, ctx.functions()))
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
    for part in rule.fuse.parts:
        w = 1 if part.weight is None else int(part.weight.eval(env, ctx.functions()))
        if w <= 0:
            raise UclError(f"{ctx.program.where(rule.line)}: part weight {part.weight} is {w}, must be > 0")
        out.append(w)
    return out


def _groups(rule: TensorRule, env: Env, ctx: Context, parts: int) -> int:
    if rule.fuse.groups is None:
        return parts
    return int(rule.fuse.groups.eval(env, ctx.functions()))


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
            for name, shape in zip(names, shapes):
                if groups <= 0 or shape[d] % groups:
                    raise UclError(
                        f"{ctx.program.where(rule.line)}: {name!r} has {shape[d]} elements along dim {d}, "
                        f"not a multiple of the {groups} fused groups"
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
    declared = {d: int(e.eval(env, ctx.functions())) for d, e in rule.sizes}
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


def numel(shape: Shape) -> int:
    return math.prod(shape)
