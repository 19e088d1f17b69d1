"""Which keys and names a rule matches: ``where`` conditions, capture bounds, enumeration, member order.

Shared by the compiler (both directions) and the replica finder. Pure functions.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Callable

from ucp.ucl.env import Context
from ucp.ucl.errors import UclError, UnboundNameError
from ucp.ucl.program import FlatRule


def where_ok(rule, ctx: Context, env) -> bool:
    return all(bool(w.eval(env, ctx.functions())) for w in rule.where)


def bounds_of(rule) -> dict:
    """Upper bounds of int captures: capture -> (Expr, inclusive), from ``where NAME < EXPR``."""
    return {name: (expr, inclusive) for name, expr, inclusive in rule.bounds}


def switched_off(rule, ctx: Context) -> bool:
    """Whether a conjunct of the rule's ``where`` is false on this rank whatever the captures."""
    env = ctx.env()
    for cond in rule.conjuncts:
        try:
            if not cond.eval(env, ctx.functions()):
                return True
        except UnboundNameError:
            continue  # reads a capture: decided per key, not here
    for _, limit, inclusive in rule.bounds:  # `where e < experts_here` with no experts: nothing to match
        try:
            if limit.eval_int(env, ctx.functions()) + (1 if inclusive else 0) <= 0:
                return True
        except UnboundNameError:
            continue
    return False


def natural(key: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def member_order(rule: FlatRule, members: dict, params: dict) -> list[str]:
    """Member keys in buffer order: by ``order by`` list (logical names), else glob order then natural order."""
    include = [g for g in rule.members if not g.startswith("!")] or ["*"]
    exclude = [g[1:] for g in rule.members if g.startswith("!")]
    chosen: list[str] = []
    for glob in include:
        for k in sorted(members, key=natural):
            if fnmatch.fnmatchcase(k, glob) and not any(fnmatch.fnmatchcase(k, x) for x in exclude) and k not in chosen:
                chosen.append(k)
    order = list(params.get(rule.order, ()) or ()) if rule.order else []
    if order:
        rank = {name: i for i, name in enumerate(order)}
        first = {k: min((rank.get(n, len(order)) for n in members[k].names), default=len(order)) for k in chosen}
        chosen.sort(key=lambda k: first[k])  # stable: unlisted members keep glob/natural order, last
    return chosen


# Capture values one rule may enumerate in one compile: real models stay far below (a rank of a
# 128-layer model with 256 experts holds 32768 expert tensors); a bound like `where i < 10**12`
# is refused before the walk, not walked.
MAX_ASSIGNMENTS = 1 << 18


def enumerate_captures(rule, ctx: Context, caps, bounds, fixed: dict, fallback: int | Callable[[], int]):
    """Every assignment of the rule's int and list captures (text captures fixed), with the omit set.

    ``fallback`` bounds an int capture without a usable ``where`` bound: a number, or a function
    that computes it (called only where such a capture is met).

    Raises UclError, naming the rule, when the captures would take more than :data:`MAX_ASSIGNMENTS`
    values: at once where the ranges are known up front, else as soon as the walk passes the budget.
    """
    names = [c for c in caps if c.name not in fixed]
    budget = [MAX_ASSIGNMENTS]

    def too_many(cap) -> UclError:
        return UclError(
            f"{ctx.program.where(rule.line)}: rule {rule.local.text!r} would try more than {MAX_ASSIGNMENTS} "
            f"values of its captures (at {{{cap.name}}}) on rank {ctx.rank} of {ctx.layout}; bound them by the "
            "model's sizes with 'where NAME < EXPR' (and check the parameters, e.g. num_layers)"
        )

    def options_of(cap, values: dict):
        """(the values ``cap`` takes, whether its bound was read) given the captures bound so far.

        Where the bound reads a capture not bound yet the values are None: the fallback range,
        computed by :func:`unbounded` only if the walk gets there with the bound still unread.
        """
        if cap.kind == "list":
            return list(ctx.params.get(cap.list_param, ()) or ()), True
        if cap.name not in bounds:
            return unbounded(), True
        expr, inclusive = bounds[cap.name]
        try:
            return range(max(expr.eval_int(ctx.env(values), ctx.functions()) + (1 if inclusive else 0), 0)), True
        except UnboundNameError:  # reads a capture bound later: try the fallback range
            return None, False

    def unbounded() -> range:
        return range(max(fallback() if callable(fallback) else fallback, 0))

    estimate = 1  # the product of the ranges that read no other capture: refused before any walk
    for cap in names:
        options, known = options_of(cap, dict(fixed))
        estimate *= len(options) if known else 1
        if estimate > MAX_ASSIGNMENTS:
            raise too_many(cap)

    def walk(i: int, values: dict, omit: frozenset):
        if i == len(names):
            yield dict(values), omit
            return
        cap = names[i]
        options, _ = options_of(cap, values)
        options = unbounded() if options is None else options
        if cap.kind == "optint" and cap.name in bounds and len(options) == 1:
            omit = omit | {cap.name}
        budget[0] -= len(options)
        if budget[0] < 0:
            raise too_many(cap)
        for option in options:
            values[cap.name] = option
            yield from walk(i + 1, values, omit)
        values.pop(cap.name, None)

    yield from walk(0, dict(fixed), frozenset())
