"""The logical tensors a program declares on its own: names from its rules, shapes from ``shape`` clauses.

A program whose every rule bounds its captures (``where i < num_layers``) and declares its
shape (``shape [hidden, heads * head_dim]``) lists the model's logical tensors from its
parameters alone, so ``ucp ucl check PROGRAM --layout L --param ...`` needs no shapes file::

    >>> prog = "ucl 1\\nparam n\\ntensor l.{i}.w -> l.{i}.w\\n  where i < n\\n  split dim 0 over tp\\n  shape [4, 2]\\n"
    >>> sorted(declared_logical(prog, "tp=2", params={"n": 2}))
    ['l.0.w', 'l.1.w']

Every tensor is found on the ranks of ``pp`` (with the layout's ``vpp`` and ZeRO stage) and
sizes 1 elsewhere, where no tensor is split.
"""

from __future__ import annotations

from ucp.ucl.bind import load_program
from ucp.ucl.env import Context, all_unset_named
from ucp.ucl.errors import UclError
from ucp.ucl.geometry_rules import declared_shapes
from ucp.ucl.matching import bounds_of, enumerate_captures, member_order, where_ok
from ucp.ucl.program import FlatRule, TensorRule
from ucp.layout import Layout
from ucp.spec import LogicalTensor

DTYPE = "float32"  # a declaration gives shapes, not dtypes; checks need only shapes


def declared_logical(program, layout, *, params: dict | None = None) -> dict[str, LogicalTensor]:
    """name -> LogicalTensor for every tensor ``program`` maps under ``layout``'s pipeline and ZeRO stage.

    Raises UclError naming the rule that leaves a capture unbounded, captures free text
    (``{name*}``: the names are the model's own) or declares no shape.
    """
    bound = load_program(program, **(params or {}))
    prog = bound.program
    lay = layout if isinstance(layout, Layout) else Layout.parse(str(layout))
    base = Layout(pp=lay.pp, vpp=lay.vpp, zero=lay.zero)
    for rule in prog.rules:
        _check_listable(prog, rule)
    with all_unset_named(prog, bound.params):
        return _declared(prog, base, bound.params)


def _declared(prog, base: Layout, params: dict) -> dict[str, LogicalTensor]:
    logical: dict[str, LogicalTensor] = {}
    for rank in range(base.world_size):
        ctx = Context.make(prog, base, rank, params)
        members: dict[str, list] = {}
        for rule in (r for r in prog.rules if isinstance(r, TensorRule)):
            for values, omit in enumerate_captures(rule, ctx, rule.local.captures, bounds_of(rule), {}, 0):
                env = ctx.env(values)
                if not where_ok(rule, ctx, env):
                    continue
                names = [t.format(env, ctx.functions()) for t in rule.targets]
                for name, shape in zip(names, declared_shapes(rule, ctx, env), strict=True):
                    assert shape is not None, "_check_listable refuses rules that declare no shape"
                    logical[name] = LogicalTensor(name, shape, DTYPE)
                if not rule.derived:
                    members[rule.local.format(values, {}, omit=omit)] = names
        for flat_rule in (r for r in prog.rules if isinstance(r, FlatRule)):
            _flat_names(flat_rule, ctx, members, logical)
    return logical


def _flat_names(rule: FlatRule, ctx: Context, members: dict[str, list], logical: dict) -> None:
    """The logical tensors of a flat buffer: its template applied to each member's names."""
    for values, _ in enumerate_captures(rule, ctx, rule.local.captures, bounds_of(rule), {}, 0):
        if not where_ok(rule, ctx, ctx.env(values)):
            continue
        holders = {key: _Member(names) for key, names in members.items()}
        for key in member_order(rule, holders, ctx.params):
            for name in members[key]:
                new = rule.logical.replace("{name}", name)
                for cap, value in values.items():
                    new = new.replace("{" + cap + "}", str(value))
                logical[new] = LogicalTensor(new, logical[name].shape, DTYPE)


class _Member:
    """What member_order reads of a member: its logical names."""

    def __init__(self, names: list[str]):
        self.names = names


def _check_listable(prog, rule) -> None:
    where = prog.where(rule.line)
    bounds = bounds_of(rule)
    for cap in rule.local.captures:
        if cap.kind == "text":
            raise UclError(
                f"{where}: rule {rule.local.text!r} captures {{{cap.name}*}}, names only a model has; "
                "give the logical shapes (--shapes, --against, --model or --hf-config)"
            )
        if cap.kind in ("int", "optint") and cap.name not in bounds:
            raise UclError(
                f"{where}: rule {rule.local.text!r} does not bound {{{cap.name}}} ('where {cap.name} < "
                "EXPR'), so its tensors cannot be listed from the program; bound it or give the shapes"
            )
    if isinstance(rule, TensorRule) and any(s is None for s in rule.declared_shapes):
        raise UclError(
            f"{where}: rule {rule.local.text!r} declares no logical shape; add 'shape [...]' (on each "
            "'part' line of a fused tensor) or give the shapes"
        )
