"""Integer expressions of UCL: layout variables, parameters, captures and a few builtins.

Expressions use Python's surface syntax, restricted to what index arithmetic
needs: integers, names (``pp.rank``, ``heads``, ``i``), ``+ - * // %``,
comparisons, ``and``/``or``/``not`` and calls of the builtins below. They are
parsed once with :mod:`ast` (so precedence is the one everybody knows) and then
checked against a whitelist, so a program can never run arbitrary code::

    >>> e = parse_expr("i + stage_start(pp.rank)", where=("m.ucl", 1, 1, "..."))
    >>> e.eval({"i": 2, "pp.rank": 1}, {"stage_start": lambda s: 4 * s})
    6
    >>> sorted(e.names)
    ['i', 'pp.rank']

Integers are bounded: every literal and every intermediate result must lie
within ``±MAX_INT`` (int64, what tensor sizes and offsets are), and arithmetic
takes integers only, so an expression costs a bounded time however its
parameters are chained (``param b = a * a`` squared twenty times is refused,
not computed)::

    >>> parse_expr("a * a", where=("m.ucl", 3, 1, "")).eval({"a": 2 ** 40})
    Traceback (most recent call last):
    ...
    ucp.ucl.errors.UclError: m.ucl:3: 'a * a' leaves UCL's integer range (|value| <= 2**63 - 1): 1099511627776 * 1099511627776
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ucp.ucl.errors import UclError, UclSyntaxError, UnboundNameError

MAX_INT = 2**63 - 1  # int64: the range of tensor sizes and offsets
# Index arithmetic is short: these bounds keep parsing and evaluating (both recursive) cheap and safe.
MAX_EXPR_CHARS = 4096
MAX_EXPR_DEPTH = 64

_BINOPS: dict[type, tuple[str, Callable[[int, int], int]]] = {
    ast.Add: ("+", lambda a, b: a + b),
    ast.Sub: ("-", lambda a, b: a - b),
    ast.Mult: ("*", lambda a, b: a * b),
    ast.FloorDiv: ("//", lambda a, b: a // b),
    ast.Mod: ("%", lambda a, b: a % b),
}
_BY_SYMBOL = dict(_BINOPS.values())
_CMPOPS: dict[type, Callable[[int, int], bool]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
BUILTINS = ("min", "max", "ceil_div", "stage_start", "stage_layers", "len")


@dataclass(frozen=True)
class Expr:
    """A parsed, whitelisted expression and the names it reads."""

    text: str
    tree: ast.Expression | ast.expr  # a parsed expression, or one node of one (parser.py's bounds)
    names: frozenset[str]
    where: tuple  # (filename, line, column, source_line) for error messages
    code: Any = field(default=None, compare=False, repr=False)  # the code object, compiled in __post_init__

    def __post_init__(self) -> None:
        if self.code is None:  # compiled once; the tree is whitelisted before any Expr is made
            object.__setattr__(self, "code", _compile(self.tree))

    def eval(self, env: Mapping[str, object], functions: Mapping[str, Callable] | None = None):
        scope = {
            "__builtins__": {},
            "ceil_div": _ceil_div,
            "min": min,
            "max": max,
            "len": len,
            _ARITH: _arith,
            **(functions or {}),
            _ENV: env,
        }
        try:
            # The tree was whitelisted by parse_expr, so compiling it runs only index arithmetic.
            return eval(self.code, scope)  # noqa: S307
        except ZeroDivisionError:
            raise UclError(f"{self.where[0]}:{self.where[1]}: division by zero in {self.text!r}") from None
        except _Problem as err:
            raise UclError(f"{self.where[0]}:{self.where[1]}: {self.text!r} {err}") from None
        except TypeError as err:  # a comparison or builtin given a word or list where it needs an integer
            raise UclError(
                f"{self.where[0]}:{self.where[1]}: {self.text!r} cannot be evaluated ({err}): "
                "a parameter has a value of the wrong kind"
            ) from None
        except KeyError as err:  # a name the environment has no value for (the code reads names as env[name])
            missing = str(err.args[0]) if err.args else "?"
            raise UnboundNameError(
                f"{self.where[0]}:{self.where[1]}: {missing!r} has no value in {self.text!r} ({PARAM_HINT})"
            ) from None

    def eval_int(self, env: Mapping[str, object], functions: Mapping[str, Callable] | None = None) -> int:
        """:meth:`eval`, refusing anything but an integer (a size, a multiple, a bound)."""
        value = self.eval(env, functions)
        if not isinstance(value, int):
            raise UclError(f"{self.where[0]}:{self.where[1]}: {self.text!r} is {_brief(value)}, expected an integer")
        return int(value)

    def __str__(self) -> str:
        return self.text


_ENV = "__ucl_env__"
_ARITH = "__ucl_arith__"


class _Problem(Exception):
    """Raised inside an evaluation; :meth:`Expr.eval` turns it into a UclError with the location."""


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _arith(symbol: str, a, b) -> int:
    """One arithmetic operation on bounded integers (checked before computing, so cost stays bounded)."""
    if not isinstance(a, int) or not isinstance(b, int):
        raise _Problem(f"needs integers on both sides of {symbol}, got {_brief(a)} and {_brief(b)}")
    value = _BY_SYMBOL[symbol](a, b)
    if not -MAX_INT <= value <= MAX_INT:
        raise _Problem(f"leaves UCL's integer range (|value| <= 2**63 - 1): {a} {symbol} {b}")
    return value


def _depth(node: ast.AST) -> int:
    """Nesting depth of an expression tree, without recursing (a long chain of ``+`` is deep)."""
    deepest, todo = 0, [(node, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_EXPR_DEPTH:
            todo += [(child, depth + 1) for child in ast.iter_child_nodes(node)]
    return deepest


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Rewrite(ast.NodeTransformer):
    """``pp.rank`` -> ``__ucl_env__["pp.rank"]``; ``a op b`` and ``-a`` -> calls of the bounded :func:`_arith`.

    Reading names by subscription makes a lookup one dict access (an :class:`ucp.ucl.env.Env` is a
    dict that computes ``let`` names on first use); builtins and the arithmetic helper stay
    plain names of the evaluation's globals.
    """

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        name = _dotted(node)
        assert name is not None, "parse_expr admits only dotted names"
        return self._read(node, name)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return self._read(node, node.id)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        node.args = [self.visit(a) for a in node.args]  # the callee keeps its plain name
        return node

    @staticmethod
    def _read(node: ast.AST, name: str) -> ast.AST:
        read = ast.Subscript(ast.Name(_ENV, ast.Load()), ast.Constant(name), ast.Load())
        return ast.copy_location(read, node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        symbol = _BINOPS[type(node.op)][0]
        call = ast.Call(ast.Name(_ARITH, ast.Load()), [ast.Constant(symbol), node.left, node.right], [])
        return ast.copy_location(call, node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.op, ast.USub):
            return node
        call = ast.Call(ast.Name(_ARITH, ast.Load()), [ast.Constant("-"), ast.Constant(0), node.operand], [])
        return ast.copy_location(call, node)


def _compile(tree: ast.Expression | ast.expr):
    rewritten = _Rewrite().visit(ast.parse(ast.unparse(tree), mode="eval"))
    return compile(ast.fix_missing_locations(rewritten), "<ucl>", "eval")


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def parse_expr(text: str, *, where: tuple) -> Expr:
    """Parse ``text``; ``where`` = (filename, line, column of text's first char, source line)."""
    filename, line, column, source = where
    stripped = text.strip()
    lead = len(text) - len(text.lstrip())
    if not stripped:
        raise UclSyntaxError(
            "expected an expression, found the end of the line",
            filename=filename,
            line=line,
            column=column + len(text),
            source_line=source,
        )
    if len(stripped) > MAX_EXPR_CHARS:
        raise UclSyntaxError(
            f"expected an expression of at most {MAX_EXPR_CHARS} characters, found {len(stripped)}",
            filename=filename,
            line=line,
            column=column + lead,
            source_line=source,
        )
    try:
        tree = ast.parse(stripped, mode="eval")
    except SyntaxError as err:
        col = column + lead + max((err.offset or 1) - 1, 0)
        raise UclSyntaxError(
            f"expected an expression, found {_brief(stripped)}",
            filename=filename,
            line=line,
            column=col,
            source_line=source,
        ) from None
    except (RecursionError, MemoryError):  # Python's own parser gives up on deep nesting
        raise UclSyntaxError(
            "expected an expression, found one nested too deeply",
            filename=filename,
            line=line,
            column=column + lead,
            source_line=source,
        ) from None
    if _depth(tree.body) > MAX_EXPR_DEPTH:
        raise UclSyntaxError(
            f"expected an expression nested at most {MAX_EXPR_DEPTH} deep",
            filename=filename,
            line=line,
            column=column + lead,
            source_line=source,
        )
    names: set[str] = set()

    def bad(node: ast.AST, why: str) -> UclSyntaxError:
        col = column + lead + getattr(node, "col_offset", 0)
        return UclSyntaxError(why, filename=filename, line=line, column=col, source_line=source)

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or isinstance(node.value, bool):
                raise bad(node, f"expected an integer, found {_brief(node.value)}")
            if node.value > MAX_INT:
                raise bad(node, f"integer {_brief(node.value)} is larger than UCL's maximum 2**63 - 1")
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = _dotted(node)
            if name is None:
                raise bad(node, "expected a name like pp.rank")
            names.add(name)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                hint = " (use // for integer division)" if isinstance(node.op, ast.Div) else ""
                raise bad(node, f"expected one of + - * // %{hint}")
            check(node.left)
            check(node.right)
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.Not)):
                raise bad(node, "expected - or not")
            check(node.operand)
        elif isinstance(node, ast.BoolOp):
            for v in node.values:
                check(v)
        elif isinstance(node, ast.Compare):
            if any(type(op) not in _CMPOPS for op in node.ops):
                raise bad(node, "expected a comparison (== != < <= > >=)")
            check(node.left)
            for c in node.comparators:
                check(c)
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in BUILTINS or node.keywords:
                raise bad(node, f"expected a call of one of {', '.join(BUILTINS)}")
            for a in node.args:
                check(a)
        else:
            raise bad(node, f"expected index arithmetic, found {type(node).__name__.lower()}")

    check(tree.body)
    return Expr(stripped, tree, frozenset(names), where)


def ceil_to(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple if multiple > 0 else value


__all__ = ["Expr", "parse_expr", "ceil_to", "BUILTINS", "MAX_INT", "PARAM_HINT"]

# How to give a program parameter a value, in Python and on every command that takes a program.
PARAM_HINT = (
    "give each a value: ucl.load_program(..., NAME=VALUE), or --param NAME=VALUE to ucp ucl check / ucp convert"
)
