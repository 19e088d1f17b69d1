"""Name patterns: local keys with captures, logical names with index expressions.

A *local* pattern matches the keys of one rank's state and captures parts of them:

* ``{i}``      an integer (``layers.{i}.``),
* ``{v?}``     an optional integer: no digits read as 0 (``model{v?}/`` matches ``model/`` and ``model1/``),
* ``{s:states}`` one word of the list parameter ``states``,
* ``{name*}``  any text without ``/``.

A *logical* pattern computes a name: each ``{...}`` is an expression over the
captures, layout variables and parameters::

    >>> p = parse_pattern("model{v?}/layers.{i}.w", where=("m.ucl", 1, 1, ""), local=True)
    >>> p.match("model/layers.3.w", {})
    {'v': 0, 'i': 3}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterable, Mapping, cast

from ucp.ucl.errors import UclSyntaxError
from ucp.ucl.expr import Expr, parse_expr

MAX_DIGITS = 18  # an integer capture reads at most this many digits (int64 range)
_CAPTURE = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:(?P<opt>\?)|(?P<star>\*)|:(?P<list>[A-Za-z_]\w*))?$")


@dataclass(frozen=True)
class Capture:
    name: str
    kind: str  # "int" | "optint" | "list" | "text"
    list_param: str = ""


@dataclass(frozen=True)
class Pattern:
    """A parsed pattern: literal strings alternating with captures (local) or expressions (logical)."""

    text: str
    parts: tuple  # str | Capture | Expr
    local: bool

    @property
    def captures(self) -> tuple[Capture, ...]:
        return tuple(p for p in self.parts if isinstance(p, Capture))

    @property
    def names(self) -> frozenset[str]:
        out: set[str] = set()
        for p in self.parts:
            if isinstance(p, Expr):
                out |= p.names
            elif isinstance(p, Capture) and p.kind == "list":
                out.add(p.list_param)
        return frozenset(out)

    @cached_property
    def compiled(self) -> re.Pattern:
        """:meth:`regex`, compiled once per pattern (re's own cache holds only 512 and programs may have more)."""
        return self.regex()

    def regex(self) -> re.Pattern:
        out = []
        for p in self.parts:
            if isinstance(p, str):
                out.append(re.escape(p))
            elif isinstance(p, Capture):
                body = {"int": r"\d+", "optint": r"\d*", "list": r"[^/]+", "text": r"[^/]+"}[p.kind]
                out.append(f"(?P<{p.name}>{body})")
            else:  # an expression: a bare name of a text capture reads text, anything else digits
                out.append(r"[^/]+?" if len(p.names) == 1 and p.text in p.names else r"\d+")
        return re.compile("^" + "".join(out) + "$")

    def match(self, key: str, params: Mapping[str, object]) -> dict | None:
        """Captures of ``key`` (local patterns), or None when it does not match."""
        m = self.compiled.match(key)
        if not m:
            return None
        values: dict[str, object] = {}
        for cap in self.captures:
            raw = m.group(cap.name)
            if cap.kind in ("int", "optint"):
                if len(raw) > MAX_DIGITS:
                    return None  # no index of a real model has 19 digits; int() of thousands would be slow
                value: object = int(raw) if raw else 0
            elif cap.kind == "list":
                if raw not in list(cast(Iterable, params.get(cap.list_param, ()) or ())):
                    return None
                value = raw
            else:
                value = raw
            if cap.name in values and values[cap.name] != value:
                return None
            values[cap.name] = value
        return values

    def format(
        self, env: Mapping[str, object], functions: Mapping[str, Callable], *, omit: frozenset = frozenset()
    ) -> str:
        out = []
        for p in self.parts:
            if isinstance(p, str):
                out.append(p)
            elif isinstance(p, Capture):
                value = env[p.name]
                out.append("" if p.name in omit and value == 0 else str(value))
            else:
                out.append(str(p.eval(env, functions)))
        return "".join(out)


def parse_pattern(text: str, *, where: tuple, local: bool) -> Pattern:
    """Parse a pattern; ``where`` = (filename, line, column of text's first char, source line)."""
    filename, line, column, source = where
    parts: list = []
    pos = 0
    while pos < len(text):
        start = text.find("{", pos)
        close_stray = text.find("}", pos)
        if close_stray != -1 and (start == -1 or close_stray < start):
            raise UclSyntaxError(
                "expected '{' before '}'", filename=filename, line=line, column=column + close_stray, source_line=source
            )
        if start == -1:
            parts.append(text[pos:])
            break
        if start > pos:
            parts.append(text[pos:start])
        end = text.find("}", start)
        if end == -1:
            raise UclSyntaxError(
                "expected '}' to close '{'", filename=filename, line=line, column=column + start, source_line=source
            )
        body = text[start + 1 : end]
        col = column + start + 1
        if local:
            m = _CAPTURE.match(body.strip())
            if not m:
                raise UclSyntaxError(
                    f"expected a capture like {{i}}, {{v?}}, {{s:states}} or {{name*}}, found {{{body}}}",
                    filename=filename,
                    line=line,
                    column=col,
                    source_line=source,
                )
            kind = "optint" if m["opt"] else "text" if m["star"] else "list" if m["list"] else "int"
            parts.append(Capture(m["name"], kind, m["list"] or ""))
        else:
            parts.append(parse_expr(body, where=(filename, line, col, source)))
        pos = end + 1
    return Pattern(text, tuple(parts), local)
