"""Parse-time name checks: every name an expression reads must have a value where it is evaluated.

A typo (``pp.rnak``, a let that reads a capture its rule does not have, ``order by`` a list
that is not declared) is a syntax error pointing at the expression, not a silent miss later::

    >>> from ucp.ucl.parser import parse
    >>> try:
    ...     parse("ucl 1\\nlet stage = v * pp.size + pp.rnak\\n", filename="m.ucl")
    ... except UclSyntaxError as err:
    ...     print(err.msg)
    ...     print(err.lineno, err.column)
    unknown name 'pp.rnak' in 'v * pp.size + pp.rnak': expected a parameter, a let, a layout variable (tp.rank, pp.size, zero.stage, ...) or a capture of the rules that use this let
    2 27
"""

from __future__ import annotations

from ucp.ucl.errors import UclSyntaxError
from ucp.ucl.expr import Expr
from ucp.ucl.program import FlatRule, TensorRule

LAYOUT_NAMES = frozenset(
    {f"{g}.{a}" for g in ("tp", "cp", "dp", "pp", "ep", "edp") for a in ("size", "rank")} | {"vpp.size", "zero.stage"}
)


def check_names(
    rules: list, params: dict, lets: dict, requires: list, views: list, *, lines: list[str], filename: str
) -> None:
    """Raise UclSyntaxError at the first expression that reads a name without a value there."""
    _check_param_names(params)
    _check_let_names(rules, params, lets)
    _check_let_depth(lets)
    _check_rule_names(rules, params, lets, lines, filename)
    _check_require_names(requires, params, lets)
    _check_view_names(views, params, lets)


def _unknown(expr: Expr, known: set, message: str) -> None:
    unknown = sorted(expr.names - known)
    if unknown:
        filename, line, column, source = expr.where
        column += max(expr.text.find(unknown[0]), 0)  # the caret under the name itself
        raise UclSyntaxError(
            message.format(name=unknown[0], text=expr.text),
            filename=filename,
            line=line,
            column=column,
            source_line=source,
        )


def _check_param_names(params: dict) -> None:
    """A default reads earlier parameters and layout variables (it is evaluated before any let)."""
    seen: set = set()
    for name, default in params.items():
        if isinstance(default, Expr):
            _unknown(
                default,
                seen | LAYOUT_NAMES,
                "unknown name {name!r} in {text!r}: a parameter's default may read the parameters declared "
                "above it and layout variables (tp.size, pp.size, ...)",
            )
        seen.add(name)


def _check_let_names(rules: list, params: dict, lets: dict) -> None:
    """A let reads parameters, lets, layout variables and the captures of the rules that use it."""
    captures = {c.name for r in rules for c in r.local.captures}
    for expr in lets.values():
        _unknown(
            expr,
            set(params) | set(lets) | LAYOUT_NAMES | captures,
            "unknown name {name!r} in {text!r}: expected a parameter, a let, a layout variable (tp.rank, "
            "pp.size, zero.stage, ...) or a capture of the rules that use this let",
        )


MAX_LET_DEPTH = 32  # lets are evaluated recursively: a chain this long is already unreadable


def _check_let_depth(lets: dict) -> None:
    """No let refers to itself (through others), and no chain of lets is longer than MAX_LET_DEPTH."""
    depth: dict[str, int] = {}
    for start in lets:
        stack, path = [(start, iter(sorted(lets[start].names & set(lets))))], [start]
        while stack:
            name, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                depth[name] = 1 + max((depth[c] for c in lets[name].names & set(lets)), default=0)
                if depth[name] > MAX_LET_DEPTH:
                    _let_error(lets[name], f"let {name!r} is the end of a chain of more than {MAX_LET_DEPTH} lets")
                continue
            if child in path:
                cycle = " -> ".join(path[path.index(child) :] + [child])
                _let_error(lets[child], f"let {child!r} refers to itself ({cycle})")
            if child not in depth:
                stack.append((child, iter(sorted(lets[child].names & set(lets)))))
                path.append(child)


def _let_error(expr: Expr, message: str) -> None:
    filename, line, column, source = expr.where
    raise UclSyntaxError(message, filename=filename, line=line, column=column, source_line=source)


def let_closure(names: frozenset, lets: dict) -> set:
    """``names`` and every name the lets among them read, transitively."""
    out, todo = set(names), list(names)
    while todo:
        name = todo.pop()
        if name in lets:
            new = lets[name].names - out
            out |= new
            todo += list(new)
    return out


def rule_exprs(rule) -> list:
    """Every expression of a rule, its targets' included."""
    exprs = list(rule.where)
    if isinstance(rule, TensorRule):
        exprs += [e for _, e in rule.sizes] + [p.multiple for p in rule.pads] + list(rule.shape or ())
        if rule.fuse is not None:
            exprs += [p.weight for p in rule.fuse.parts if p.weight is not None]
            exprs += [e for p in rule.fuse.parts for e in (p.shape or ())]
            exprs += [rule.fuse.groups] if rule.fuse.groups is not None else []
        exprs += [part for t in rule.targets for part in t.parts if isinstance(part, Expr)]
    else:
        exprs += [e for e in (rule.pad_multiple, rule.align) if e is not None]
    return exprs


def _check_rule_names(rules: list, params: dict, lets: dict, lines: list[str], filename: str) -> None:
    """Every name an expression reads, directly or through lets, must have a value where the rule applies."""
    known = set(params) | LAYOUT_NAMES
    for rule in rules:
        captures = {c.name for c in rule.local.captures}
        allowed = known | set(lets) | captures
        for expr in rule_exprs(rule):
            _unknown(
                expr,
                allowed,
                "unknown name {name!r} in {text!r}: expected a parameter, a let, a capture of this rule or a "
                "layout variable (tp.rank, pp.size, zero.stage, ...)",
            )
            through = let_closure(expr.names, lets) - allowed
            if through:
                via = sorted(n for n in expr.names & set(lets) if through & let_closure(frozenset({n}), lets))
                filename_, line, column, source = expr.where
                raise UclSyntaxError(
                    f"let {via[0]!r} reads {sorted(through)[0]!r}, which is not a capture of the rule at line "
                    f"{rule.line} (its captures: {sorted(captures) or 'none'})",
                    filename=filename_,
                    line=line,
                    column=column,
                    source_line=source,
                )
        where = (filename, rule.line, 1, lines[rule.line - 1] if 0 < rule.line <= len(lines) else "")
        for cap in rule.local.captures:
            if cap.kind == "list" and not isinstance(params.get(cap.list_param, None), tuple):
                raise UclSyntaxError(
                    f"capture {{{cap.name}:{cap.list_param}}} needs a list parameter {cap.list_param!r}: declare "
                    f"'param {cap.list_param} = [a, b]'",
                    filename=where[0],
                    line=where[1],
                    column=1,
                    source_line=where[3],
                )
        if isinstance(rule, FlatRule) and rule.order and not isinstance(params.get(rule.order, None), tuple):
            raise UclSyntaxError(
                f"'order by {rule.order}' needs a list parameter {rule.order!r} (the members' logical names in "
                f"the model's order): declare 'param {rule.order} = []'",
                filename=where[0],
                line=where[1],
                column=1,
                source_line=where[3],
            )


def _check_view_names(views: list, params: dict, lets: dict) -> None:
    for view in views:
        if view.rope_heads is not None:
            _unknown(
                view.rope_heads,
                set(params) | set(lets) | LAYOUT_NAMES,
                "unknown name {name!r} in {text!r}: expected a parameter or a let",
            )


def _check_require_names(requires: list, params: dict, lets: dict) -> None:
    known = set(params) | set(lets) | LAYOUT_NAMES
    for req in requires:
        for expr in (req.condition, *req.holes):
            _unknown(
                expr,
                known,
                "unknown name {name!r} in {text!r}: expected a parameter, a let or a layout "
                "variable (tp.size, pp.size, zero.stage, ...)",
            )
