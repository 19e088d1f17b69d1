"""Compile a UCL program for one rank: local tensors <-> logical tensors as a FragmentMap.

Two directions, both pure functions:

* :func:`compile_save` starts from the shapes of the tensors a rank holds and
  infers the logical tensors (used when saving);
* :func:`compile_load` starts from the logical tensors of a checkpoint and
  says which local tensors a rank must hold, their shapes and pieces (used
  when loading under any layout, and by the checker).

The first rule (in program order) whose pattern matches a key and whose
``where`` holds owns that key.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from ucp.ucl.env import Context, all_unset_named, unmet_requirements
from ucp.ucl.errors import DeclaredShapeError, UclError
from ucp.ucl.flat import compose, flat_layout
from ucp.ucl.geometry_rules import check_declared, declared_shapes, local_geometry, logical_shapes
from ucp.ucl.matching import bounds_of, enumerate_captures, member_order, switched_off, where_ok
from ucp.ucl.pattern import MAX_DIGITS
from ucp.ucl.program import FlatRule, Program, TensorRule
from ucp.ucl.replicas import flat_replication, replication
from ucp.layout import Layout
from ucp.spec import FragmentMap, LocalTensor, LogicalTensor, TensorSpec

Shape = tuple[int, ...]


@dataclass(frozen=True)
class BoundFragmentMap(FragmentMap):
    """A FragmentMap compiled from a program: ``local`` lists every local tensor, and it knows its rules."""

    rules_used: frozenset = frozenset()  # lines of the rules that produced tensors


@dataclass
class _Instance:
    rule: TensorRule
    captures: dict
    key: str
    local_shape: Shape
    dtype: str
    pieces: list
    names: list
    shapes: list


# --------------------------------------------------------------------------- helpers


def _flat_spec(
    rule: FlatRule,
    ctx: Context,
    captures: dict,
    key: str,
    members: dict[str, _Instance],
    dtype_of,
    shapes_by_name: dict,
):
    env = ctx.env(captures)
    parts, index = ctx.cut(rule.partition_groups)
    pad = rule.pad_multiple.eval_int(env, ctx.functions()) if rule.pad_multiple is not None else 1
    align = rule.align.eval_int(env, ctx.functions()) if rule.align is not None else 1
    order = member_order(rule, members, ctx.params)
    numel, runs = flat_layout(
        [math.prod(members[k].local_shape) for k in order],
        parts=parts,
        index=index,
        each=rule.each,
        pad_multiple=pad,
        align=align,
    )

    def rename(name: str) -> str:
        out = rule.logical.replace("{name}", name)
        for cap, value in captures.items():
            out = out.replace("{" + cap + "}", str(value))
        return out

    pieces, owners = [], []
    for m, lo, hi, bstart in runs:
        inst = members[order[m]]
        new = compose(inst.pieces, inst.local_shape, shapes_by_name, (lo, hi), bstart, rename)
        pieces += new
        owners += [inst.key] * len(new)
    logical = {}
    for k in order:
        for name in members[k].names:
            renamed = rename(name)
            logical[renamed] = LogicalTensor(renamed, shapes_by_name[name], dtype_of(renamed))
    return (numel,), pieces, logical, owners


def _finish(
    ctx: Context, instances: list[_Instance], logical: dict, flats: list, used: set, *, saving: bool
) -> BoundFragmentMap:
    shapes_by_name = {n: t.shape for n, t in logical.items()}
    tensors, local = {}, {}
    holder_cache: dict = {}  # which ranks hold each local tensor's pieces: asked again by the flat buffers
    for inst in instances:
        if inst.rule.virtual:
            continue
        replica, replicas = replication(inst.rule, ctx, inst.captures, shapes_by_name, inst.pieces, holder_cache)
        tensors[inst.key] = TensorSpec(inst.key, tuple(inst.pieces), replica, replicas, inst.rule.policy)
        local[inst.key] = LocalTensor(inst.key, inst.local_shape, inst.dtype)
    members = [i for i in instances if not i.rule.derived]
    for rule, key, shape, pieces, dtype, owners in flats:
        replica, replicas, drop = flat_replication(rule, ctx, members, shapes_by_name, holder_cache)
        if saving and drop:
            pieces = [p for p, owner in zip(pieces, owners, strict=True) if owner not in drop]
        tensors[key] = TensorSpec(key, tuple(pieces), replica, replicas, rule.policy)
        local[key] = LocalTensor(key, shape, dtype)
    touched = {p.logical for spec in tensors.values() for p in spec.pieces}
    fmap = BoundFragmentMap(
        rank=ctx.rank,
        logical={n: t for n, t in logical.items() if n in touched},
        tensors=tensors,
        local=local,
        rules_used=frozenset(used),
    )
    fmap.validate()
    return fmap


def _require_layout(ctx: Context) -> None:
    unmet = unmet_requirements(ctx)
    if unmet:
        raise UclError(f"{ctx.layout} is not a layout this program supports: " + "; ".join(unmet))


# --------------------------------------------------------------------------- save


def _all_unset_named(compile_fn):
    """A parameter met without a value is reported with every other parameter that lacks one."""

    @functools.wraps(compile_fn)
    def run(program: Program, layout: Layout, rank: int, tensors: dict, *, params=None, **kwargs):
        with all_unset_named(program, params):
            return compile_fn(program, layout, rank, tensors, params=params, **kwargs)

    return run


@_all_unset_named
def compile_save(
    program: Program, layout: Layout, rank: int, local: dict, *, params=None, shapes: dict | None = None
) -> BoundFragmentMap:
    """Save direction. ``local``: key -> (shape, dtype). ``shapes``: logical name -> LogicalTensor
    (only needed for ``virtual`` rules, e.g. ZeRO-3 whose parameters exist only as flat partitions)."""
    ctx = Context.make(program, layout, rank, params)
    _require_layout(ctx)
    tensor_rules = [r for r in program.rules if isinstance(r, TensorRule)]
    flat_rules = [r for r in program.rules if isinstance(r, FlatRule)]
    instances: list[_Instance] = []
    logical: dict[str, LogicalTensor] = {}
    pending_flat = []
    used: set[int] = set()
    for key, (shape, dtype) in local.items():
        shape = tuple(int(s) for s in shape)
        dtype = str(dtype).replace("torch.", "")
        blocked = []
        for rule in tensor_rules:
            if rule.virtual:
                continue
            caps = rule.local.match(key, ctx.params)
            if caps is None:
                continue
            env = ctx.env(caps)
            if not where_ok(rule, ctx, env):
                blocked.append(rule.line)
                continue
            names = [t.format(env, ctx.functions()) for t in rule.targets]
            shapes_ = _save_shapes(rule, ctx, env, key, names, shape)
            again, pieces = local_geometry(rule, ctx, env, names, shapes_)
            if again != shape:
                raise UclError(
                    f"{program.where(rule.line)}: local tensor {key!r} has shape {shape}, but logical "
                    f"shape(s) {shapes_} give {again} on rank {rank} of {layout} (declare 'size dim D = ...' "
                    "for uneven or padded dimensions)"
                )
            for n, s in zip(names, shapes_, strict=True):
                _add_logical(logical, LogicalTensor(n, s, dtype), key, program, rule)
            instances.append(_Instance(rule, caps, key, shape, dtype, pieces, names, list(shapes_)))
            used.add(rule.line)
            break
        else:
            flat = next(
                (
                    (r, c)
                    for r in flat_rules
                    if (c := r.local.match(key, ctx.params)) is not None and where_ok(r, ctx, ctx.env(c))
                ),
                None,
            )
            if flat is None:
                where = f" (rules at lines {blocked} match but their 'where' is false)" if blocked else ""
                raise UclError(
                    f"{program.filename}: no rule maps local tensor {key!r} on rank {rank} of {layout}{where}"
                )
            pending_flat.append((flat[0], flat[1], key, shape, dtype))
    if pending_flat and any(r.virtual and not switched_off(r, ctx) for r in tensor_rules):
        if shapes is None:
            raise UclError(
                f"{program.filename}: flat buffers with virtual members need the logical shapes: pass shapes="
            )
        virtual = _load_instances(ctx, [r for r in tensor_rules if r.virtual], shapes, set())
        instances += virtual
        for inst in virtual:
            for n in inst.names:
                logical.setdefault(n, shapes[n])
    flats = []
    shapes_by_name = {n: t.shape for n, t in logical.items()}
    for flat_rule, caps, key, shape, dtype in pending_flat:
        members = {i.key: i for i in instances if not i.rule.derived}
        buf_shape, pieces, flat_logical, owners = _flat_spec(
            flat_rule, ctx, caps, key, members, lambda _n, d=dtype: d, shapes_by_name
        )
        if buf_shape != shape:
            raise UclError(
                f"{program.where(flat_rule.line)}: flat buffer {key!r} has shape {shape}, the program computes "
                f"{buf_shape} on rank {rank} of {layout} (check members, alignment and padding)"
            )
        logical.update(flat_logical)
        flats.append((flat_rule, key, shape, pieces, dtype, owners))
        used.add(flat_rule.line)
    return _finish(ctx, instances, logical, flats, used, saving=True)


def _save_shapes(rule: TensorRule, ctx: Context, env, key: str, names: list[str], shape: Shape) -> list[Shape]:
    """The logical shapes a local tensor stands for: declared (``shape [...]``) where the rule says, else inferred.

    A local tensor that does not fit the declared shapes (a row-parallel weight under ``split dim 0``)
    is refused here, before anything is saved.
    """
    declared = declared_shapes(rule, ctx, env)
    try:
        implied: list | None = logical_shapes(rule, ctx, env, names, shape)
    except UclError:
        if any(d is None for d in declared):
            raise
        implied = None  # a padded dimension without 'size dim': the declared shape says it
    shapes_ = [d if d is not None else i for d, i in zip(declared, implied or declared, strict=True)]
    if all(d is None for d in declared):
        return shapes_
    again, _ = local_geometry(rule, ctx, env, names, shapes_)
    if again != shape:
        wrong = [
            (n, i, d, e)
            for n, i, d, e in zip(names, implied or [None] * len(names), declared, rule.declared_shapes, strict=True)
            if d is not None
        ]
        name, implied_shape, want, exprs = next(((n, i, d, e) for n, i, d, e in wrong if i != d), wrong[0])
        saying = f"makes logical {name!r} {implied_shape} under the rule's clauses, but " if implied_shape else ""
        raise DeclaredShapeError(
            f"{ctx.program.where(rule.line)}: local tensor {key!r} of shape {shape} on rank {ctx.rank} of "
            f"{ctx.layout} {saying}the program declares {name!r} [{', '.join(x.text for x in exprs or ())}] = {want}, of "
            f"which this rank would hold {again}; check the rule's split, pad and fuse clauses (a row-parallel "
            "weight splits dim 1) or the parameters"
        )
    return shapes_


def _add_logical(logical: dict, lt: LogicalTensor, key: str, program: Program, rule) -> None:
    old = logical.get(lt.name)
    if old is not None and old.shape != lt.shape:
        raise UclError(
            f"{program.where(rule.line)}: {key!r} implies logical {lt.name!r} of shape {lt.shape}, "
            f"another local tensor implies {old.shape}"
        )
    logical[lt.name] = lt


# --------------------------------------------------------------------------- load


def _int_candidates(logical: dict) -> int:
    best = 0
    for name in logical:
        for digits in re.findall(r"\d+", name):
            if len(digits) <= MAX_DIGITS:  # longer runs cannot be a capture's value (Pattern.match)
                best = max(best, int(digits))
    return best + 1


def _load_instances(ctx: Context, rules: list, logical: dict, claimed: set) -> list[_Instance]:
    out = []
    fallback = functools.cache(
        lambda: _int_candidates(logical)
    )  # a scan of every name: only where a capture is unbounded
    for rule in rules:
        caps = rule.local.captures
        text_caps = [c.name for c in caps if c.kind == "text"]
        text_options = _reverse_text(rule, logical, text_caps) if text_caps else [{}]
        bounds = bounds_of(rule)
        for text_values in text_options:
            for values, omit in enumerate_captures(rule, ctx, caps, bounds, dict(text_values), fallback):
                env = ctx.env(values)
                # errors propagate: a parameter without a value must not silently load fewer tensors
                if not where_ok(rule, ctx, env):
                    continue
                names = [t.format(env, ctx.functions()) for t in rule.targets]
                if not names or any(n not in logical for n in names):
                    continue
                key = rule.local.format(values, {}, omit=omit)
                if key in claimed:
                    continue
                shapes_ = [tuple(logical[n].shape) for n in names]
                check_declared(rule, ctx, env, names, shapes_)
                shape, pieces = local_geometry(rule, ctx, env, names, shapes_)
                claimed.add(key)
                out.append(_Instance(rule, values, key, shape, logical[names[0]].dtype, pieces, names, shapes_))
    return out


def _reverse_text(rule: TensorRule, logical: dict, text_caps: list[str]) -> list[dict]:
    pattern = rule.targets[0]
    rx = []
    for p in pattern.parts:
        if isinstance(p, str):
            rx.append(re.escape(p))
        elif p.text in text_caps:
            rx.append(f"(?P<{p.text}>[^/]+)")
        else:
            rx.append(r"[^/]+?")
    regex = re.compile("^" + "".join(rx) + "$")
    seen, out = set(), []
    for name in logical:
        m = regex.match(name)
        if m:
            values = tuple(sorted(m.groupdict().items()))
            if values not in seen:
                seen.add(values)
                out.append(dict(values))
    return out


@_all_unset_named
def compile_load(program: Program, layout: Layout, rank: int, logical: dict, *, params=None) -> BoundFragmentMap:
    """Load direction. ``logical``: name -> LogicalTensor from a checkpoint manifest."""
    ctx = Context.make(program, layout, rank, params)
    _require_layout(ctx)
    logical = {
        n: (t if isinstance(t, LogicalTensor) else LogicalTensor(n, tuple(t[0]), str(t[1]))) for n, t in logical.items()
    }
    tensor_rules = [r for r in program.rules if isinstance(r, TensorRule)]
    claimed: set[str] = set()
    instances = _load_instances(ctx, tensor_rules, logical, claimed)
    used = {i.rule.line for i in instances}
    flats = []
    shapes_by_name = {n: t.shape for n, t in logical.items()}
    members = {i.key: i for i in instances if not i.rule.derived}
    for rule in (r for r in program.rules if isinstance(r, FlatRule)):
        for values, omit in enumerate_captures(rule, ctx, rule.local.captures, bounds_of(rule), {}, 1):
            if not where_ok(rule, ctx, ctx.env(values)):
                continue
            key = rule.local.format(values, {}, omit=omit)
            probe = rule.logical.replace("{name}", "\0")
            for cap, value in values.items():
                probe = probe.replace("{" + cap + "}", str(value))
            # a flat buffer exists when the logical tensors it would hold are in the checkpoint
            if not members or not any(probe.replace("\0", n) in logical for i in members.values() for n in i.names):
                continue
            dtype_of = lambda n: logical[n].dtype if n in logical else "float32"  # noqa: E731
            shape, pieces, flat_logical, owners = _flat_spec(rule, ctx, values, key, members, dtype_of, shapes_by_name)
            missing = [n for n in flat_logical if n not in logical]
            if missing:
                raise UclError(
                    f"{program.where(rule.line)}: flat buffer {key!r} needs {missing[:3]} which the "
                    "checkpoint does not hold"
                )
            dtype = next((logical[p.logical].dtype for p in pieces), "float32")
            flats.append((rule, key, shape, pieces, dtype, owners))
            claimed.add(key)
            used.add(rule.line)
    return _finish(ctx, instances, logical, flats, used, saving=False)


__all__ = ["BoundFragmentMap", "LocalTensor", "compile_save", "compile_load", "switched_off"]
