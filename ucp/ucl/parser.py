"""The UCL parser: one statement per line, precise errors.

    >>> prog = parse("ucl 1\\ntensor fc.weight -> fc.weight\\n  split dim 0 over tp\\n")
    >>> prog.rules[0].splits
    (Split(dim=0, groups=('tp',)),)

Every error is a :class:`ucp.ucl.errors.UclSyntaxError` with file:line:col, the
line and a caret under the offending token, and what was expected.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from typing import Any

from ucp.ucl.errors import UclSyntaxError
from ucp.ucl.expr import MAX_INT, Expr, parse_expr
from ucp.ucl.names import check_names
from ucp.ucl.pattern import parse_pattern
from ucp.ucl.program import GROUPS, FlatRule, Fuse, Pad, Part, Program, Require, Split, TensorRule, View
from ucp.spec import REPLICA_POLICIES

_NAME = re.compile(r"[A-Za-z_]\w*")
MAX_RULES = 10000  # rules after `also` expansion; the presets have a few dozen
MAX_SOURCE_CHARS = 1 << 20
STATEMENTS = ("ucl", "param", "setting", "let", "require", "tensor", "flat", "also", "view")
TENSOR_CLAUSES = ("split", "pad", "size", "shape", "fuse", "part", "where", "replicate", "virtual")
FLAT_CLAUSES = ("members", "order", "partition", "align", "where", "replicate")


class _Line:
    """A cursor over one source line."""

    def __init__(self, text: str, number: int, filename: str, source: str | None = None):
        self.text, self.number, self.filename, self.pos = text, number, filename, 0
        self.source = text if source is None else source  # shown in errors, comment included

    def error(self, message: str, column: int | None = None) -> UclSyntaxError:
        col = (self.pos if column is None else column) + 1
        return UclSyntaxError(message, filename=self.filename, line=self.number, column=col, source_line=self.source)

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def peek(self) -> str:
        self.skip()
        end, depth = self.pos, 0
        while end < len(self.text) and (depth or self.text[end] not in " \t,"):
            depth += {"{": 1, "}": -1}.get(self.text[end], 0)
            end += 1
        return self.text[self.pos : end]

    def found(self) -> str:
        tok = self.peek()
        return f"{tok!r}" if tok else "the end of the line"

    def token(self, what: str) -> tuple[str, int]:
        """The next whitespace-delimited token (a pattern), and its column."""
        tok = self.peek()
        if not tok:
            raise self.error(f"expected {what}, found the end of the line")
        col = self.pos
        self.pos += len(tok)
        return tok, col

    def word(self, what: str) -> str:
        self.skip()
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected {what}, found {self.found()}")
        self.pos = m.end()
        return m.group()

    def keyword(self, kw: str, after: str) -> None:
        if self.peek() != kw:
            raise self.error(f"expected '{kw}' after '{after}', found {self.found()}")
        self.pos += len(kw)

    def maybe(self, kw: str) -> bool:
        if self.peek() == kw:
            self.pos += len(kw)
            return True
        return False

    def integer(self, what: str) -> int:
        tok = self.peek()
        if not (tok.isascii() and tok.isdigit()):
            raise self.error(f"expected {what}, found {self.found()}")
        if len(tok) > 6:  # a version or a dimension number: anything longer is a mistake, never a value
            raise self.error(f"expected {what}, found a {len(tok)}-digit number")
        self.pos += len(tok)
        return int(tok)

    def shape(self, after: str) -> tuple[Expr, ...]:
        """``[EXPR, EXPR, ...]`` (``[]`` for a 0-d tensor): a declared logical shape."""
        self.skip()
        if self.text[self.pos : self.pos + 1] != "[":
            raise self.error(f"expected '[' after '{after}' (a shape such as [hidden, heads * head_dim])")
        start, depth, items, item_start = self.pos, 0, [], self.pos + 1
        for i in range(self.pos + 1, len(self.text)):
            ch = self.text[i]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif ch in ",]" and depth == 0:
                items.append((self.text[item_start:i], item_start))
                item_start = i + 1
                if ch == "]":
                    self.pos = i + 1
                    break
        else:
            raise self.error("expected ']' to close the shape", start)
        if len(items) == 1 and not items[0][0].strip():
            return ()
        return tuple(parse_expr(text, where=(self.filename, self.number, col + 1, self.source)) for text, col in items)

    def rest(self):
        """The rest of the line as (text, column) for an expression."""
        self.skip()
        text, col = self.text[self.pos :], self.pos
        self.pos = len(self.text)
        return text, col

    def expr(self, stop: tuple[str, ...] = ()):
        """An expression up to the end of the line or the first stop keyword (as a whole word)."""
        self.skip()
        end = len(self.text)
        for kw in stop:
            m = re.search(rf"\s{kw}\b", self.text[self.pos :])
            if m:
                end = min(end, self.pos + m.start())
        text, col = self.text[self.pos : end], self.pos
        self.pos = end
        return parse_expr(text, where=(self.filename, self.number, col + 1, self.source))

    def groups(self, after: str) -> tuple[str, ...]:
        out = []
        while True:
            self.skip()
            col = self.pos
            name = self.word(f"a group ({', '.join(GROUPS)}) after '{after}'")
            if name not in GROUPS:
                raise self.error(f"expected a group ({', '.join(GROUPS)}) after '{after}', found {name!r}", col)
            out.append(name)
            self.skip()
            if self.pos < len(self.text) and self.text[self.pos] == ",":
                self.pos += 1
                continue
            return tuple(out)

    def end(self, after: str) -> None:
        if not self.at_end():
            raise self.error(f"expected the end of the line after '{after}', found {self.found()}")

    def pattern(self, what: str, *, local: bool):
        tok, col = self.token(what)
        return parse_pattern(tok, where=(self.filename, self.number, col + 1, self.source), local=local)


def _strip_comment(text: str) -> str:
    cut = text.find("#")
    return (text if cut == -1 else text[:cut]).rstrip()


def parse(source: str, *, filename: str = "<ucl>") -> Program:
    """Parse UCL source text into a :class:`Program` (see docs/UCL.md).

    Parsed once per ``(source, filename)`` and process: every save and load of a run names the same
    program, and parsing a preset costs more than a small rank's whole load. The result is shared,
    which is safe because nothing changes a Program after parsing; errors are raised again each time.

    >>> parse("ucl 1\\ntensor w -> w\\n", filename="w.ucl") is parse("ucl 1\\ntensor w -> w\\n", filename="w.ucl")
    True
    """
    return _parse_cached(source, filename)


@functools.lru_cache(maxsize=64)
def _parse_cached(source: str, filename: str) -> Program:
    return _parse(source, filename=filename)


def _parse(source: str, *, filename: str) -> Program:
    if len(source) > MAX_SOURCE_CHARS:  # from a file, a string or a manifest: a program is a page, not megabytes
        raise UclSyntaxError(
            f"a program has at most {MAX_SOURCE_CHARS} characters, this one {len(source)}",
            filename=filename,
            line=1,
            column=1,
            source_line=source[:80],
        )
    params: dict = {}
    lets: dict = {}
    rules: list = []
    views: list = []
    alsos: list = []
    requires: list = []
    settings: set = set()
    seen_version = False
    current = None  # the rule the following clauses belong to (a dict of fields while open)

    def close() -> None:
        nonlocal current
        if current is None:
            return
        kind, fields, ln = current
        if kind == "tensor":
            if fields.get("fuse") is not None:
                fuse_dim, fuse_groups, parts = fields.pop("fuse")
                if not parts:
                    raise ln.error("expected 'part' lines after 'fuse'", 0)
                if fields["logical"] is not None:
                    raise ln.error("a fused tensor names its targets with 'part' lines, not '->'", 0)
                if "shape" in fields:
                    raise ln.error(
                        "a fused tensor declares each part's shape on its 'part' line: part NAME shape [...]", 0
                    )
                fields["fuse"] = Fuse(fuse_dim, fuse_groups, tuple(parts))
            elif fields["logical"] is None:
                raise ln.error(
                    "expected '-> LOGICAL' after the local pattern (or 'fuse' with 'part' lines)", len(ln.text)
                )
            rules.append(TensorRule(**fields))
        else:
            rules.append(FlatRule(**fields))
        current = None

    for number, raw in enumerate(source.splitlines(), start=1):
        text = _strip_comment(raw)
        if not text.strip():
            continue
        ln = _Line(text, number, filename, raw.rstrip())
        ln.skip()
        kw_col = ln.pos
        kw = ln.word("a statement")
        if kw in STATEMENTS:
            close()
        if not seen_version and kw != "ucl":
            raise ln.error("expected 'ucl 1' as the first statement", kw_col)
        if kw == "ucl":
            if seen_version:
                raise ln.error("'ucl' may appear only once, as the first statement", kw_col)
            version = ln.integer("a language version (1)")
            if version != 1:
                raise ln.error(f"expected language version 1, found {version}", ln.pos - len(str(version)))
            ln.end("ucl 1")
            seen_version = True
        elif kw in ("param", "setting"):
            ln.skip()
            name_col = ln.pos
            name = ln.word("a parameter name")
            if name in params:
                raise ln.error(f"parameter {name!r} is declared twice", name_col)
            if kw == "setting":
                settings.add(name)
            if ln.at_end():
                params[name] = None
                continue
            ln.keyword("=", f"{kw} {name}")
            ln.skip()
            if ln.text[ln.pos : ln.pos + 1] == "[":
                close_at = ln.text.find("]", ln.pos)
                if close_at == -1:
                    raise ln.error("expected ']' to close the list", ln.pos)
                items = [s.strip() for s in ln.text[ln.pos + 1 : close_at].split(",") if s.strip()]
                params[name] = tuple(_list_item(ln, s, ln.pos + 1) for s in items)
                ln.pos = close_at + 1
                ln.end("]")
            else:
                params[name] = ln.expr()
        elif kw == "let":
            ln.skip()
            name_col = ln.pos
            name = ln.word("a name")
            if name in lets:
                raise ln.error(f"let {name!r} is defined twice", name_col)
            ln.keyword("=", f"let {name}")
            lets[name] = ln.expr()
        elif kw == "require":
            requires.append(_require(ln, number))
        elif kw in ("tensor", "flat"):
            local = ln.pattern("a local key pattern", local=True)
            logical = None
            if ln.maybe("->"):
                if kw == "tensor":
                    logical = ln.pattern("a logical name pattern", local=False)
                else:
                    logical, _ = ln.token("a logical name template such as {name}/{s}")
            ln.end("the pattern")
            if kw == "tensor":
                current = ("tensor", {"line": number, "local": local, "logical": logical}, ln)
            else:
                current = ("flat", {"line": number, "local": local, "logical": logical or "{name}"}, ln)
        elif kw == "also":
            local, _ = ln.token("a local key template containing {key}")
            if "{key}" not in local:
                raise ln.error("expected a local key template containing {key}", ln.pos - len(local))
            ln.keyword("->", "the local template")
            logical, col = ln.token("a logical name template containing {name}")
            if "{name}" not in logical:
                raise ln.error("expected a logical name template containing {name}", col)
            scalar = ln.maybe("scalar")
            where = ln.expr() if ln.maybe("where") else None
            ln.end("also")
            alsos.append((number, local, logical, scalar, where, ln))
        elif kw == "view":
            logical = ln.pattern("a logical name pattern", local=True)
            ln.keyword("=", "the logical pattern")
            canonical = ln.pattern("a canonical name pattern", local=True)
            transpose = ln.maybe("transpose")
            rope = None
            if ln.maybe("rope"):
                ln.keyword("heads", "rope")
                rope = ln.expr()
            ln.end("view")
            views.append(View(number, logical, canonical, transpose, rope))
        elif current is None:
            raise ln.error(f"expected a statement ({', '.join(STATEMENTS)}), found {kw!r}", kw_col)
        else:
            _clause(kw, kw_col, ln, current)
    close()
    if not seen_version:
        raise UclSyntaxError(
            "expected 'ucl 1' as the first statement, found an empty program",
            filename=filename,
            line=1,
            column=1,
            source_line="",
        )
    rules = [_analyze_where(r) for r in _expand_alsos(rules, alsos, filename)]
    check_names(rules, params, lets, requires, views, lines=source.splitlines(), filename=filename)
    return Program(
        filename=filename,
        source=source,
        params=params,
        lets=lets,
        rules=tuple(rules),
        views=tuple(views),
        requires=tuple(requires),
        settings=frozenset(settings),
    )


def _list_item(ln: _Line, text: str, column: int):
    """An item of a list parameter: a word, or an integer within UCL's range."""
    if text.isascii() and text.lstrip("-").isdigit():
        if len(text) > 19 or abs(int(text)) > MAX_INT:
            raise ln.error(f"integer {text[:20]}... is larger than UCL's maximum 2**63 - 1", column)
        return int(text)
    return text


def _require(ln: _Line, number: int) -> Require:
    """``require EXPR else MESSAGE``; the message runs to the end of the line, ``{EXPR}`` holes allowed."""
    condition = ln.expr(stop=("else",))
    ln.keyword("else", "require EXPR")
    message, col = ln.rest()
    if not message:
        raise ln.error("expected a message after 'else' (what the layout breaks, and the rule)")
    holes = []
    for m in re.finditer(r"\{([^{}]*)\}", message):
        holes.append(parse_expr(m.group(1), where=(ln.filename, number, col + m.start(1) + 1, ln.source)))
    return Require(number, condition, message, tuple(holes))


def _refuse_sized_fuse(kw: str, dim: int, kw_col: int, ln: _Line, f: dict) -> None:
    """A fused dimension takes neither ``pad`` nor ``size``: its parts are equal groups sized by their
    weights, so the compiler has nowhere to apply them; ignoring them would save the padding as data."""
    fused = f.get("fuse")
    if kw in ("pad", "size") and fused is not None and fused[0] == dim:
        clash = f"'{kw} dim {dim}' on the fused dimension ('fuse dim {dim}' above)"
    elif kw == "fuse" and dim in {p.dim for p in f.get("pads", ())} | {d for d, _ in f.get("sizes", ())}:
        clash = f"'fuse dim {dim}' on a dimension the rule pads or sizes ('pad dim {dim}' or 'size dim {dim}' above)"
    else:
        return
    raise ln.error(
        f"{clash}: a fused dimension is cut into equal groups of its parts, so it cannot be padded "
        "or sized; declare each part's logical shape instead: part NAME shape [...]",
        kw_col,
    )


def _clause(kw: str, kw_col: int, ln: _Line, current) -> None:
    kind, f, _ = current
    allowed = TENSOR_CLAUSES if kind == "tensor" else FLAT_CLAUSES
    if kw not in allowed:
        raise ln.error(f"expected a {kind} clause ({', '.join(allowed)}) or a statement, found {kw!r}", kw_col)
    if kw == "where":
        f["where"] = f.get("where", ()) + (ln.expr(),)
    elif kw == "replicate":
        if ln.maybe("over"):
            f["replicate_over"] = ln.groups("replicate over")
        if ln.maybe("policy"):
            ln.skip()
            col = ln.pos
            policy, _ = ln.token(f"a policy ({', '.join(REPLICA_POLICIES)})")
            if policy not in REPLICA_POLICIES:
                raise ln.error(f"expected a policy ({', '.join(REPLICA_POLICIES)}), found {policy!r}", col)
            f["policy"] = policy
        ln.end("replicate")
        if kind == "flat":
            f.pop("replicate_over", None)
    elif kw == "virtual":
        ln.end("virtual")
        f["virtual"] = True
    elif kw == "shape":
        if "shape" in f:
            raise ln.error("the rule declares its shape twice", kw_col)
        if f.get("fuse") is not None:
            raise ln.error(
                "a fused tensor declares each part's shape on its 'part' line: part NAME shape [...]", kw_col
            )
        f["shape"] = ln.shape("shape")
        ln.end("shape [...]")
    elif kw in ("split", "pad", "size", "fuse"):
        ln.keyword("dim", kw)
        dim = ln.integer(f"a dimension number after '{kw} dim'")
        after = f"{kw} dim {dim}"
        _refuse_sized_fuse(kw, dim, kw_col, ln, f)
        if kw == "split":
            ln.keyword("over", after)
            f["splits"] = f.get("splits", ()) + (Split(dim, ln.groups(f"{after} over")),)
            ln.end(after)
        elif kw == "pad":
            ln.keyword("to", after)
            ln.keyword("multiple", f"{after} to")
            ln.keyword("of", f"{after} to multiple")
            f["pads"] = f.get("pads", ()) + (Pad(dim, ln.expr()),)
        elif kw == "size":
            ln.keyword("=", after)
            f["sizes"] = f.get("sizes", ()) + ((dim, ln.expr()),)
        else:
            groups = ln.expr() if ln.maybe("groups") else None
            ln.end(after)
            f["fuse"] = (dim, groups, [])
    elif kw == "part":
        if f.get("fuse") is None:
            raise ln.error("expected 'fuse dim D' before 'part'", kw_col)
        target = ln.pattern("a logical name pattern", local=False)
        weight = ln.expr(stop=("shape",)) if ln.maybe("weight") else None
        shape = ln.shape("part ... shape") if ln.maybe("shape") else None
        ln.end("part")
        f["fuse"][2].append(Part(target, weight, shape))
    elif kw == "members":
        globs = [s.strip() for s in ln.rest()[0].split(",") if s.strip()]
        if not globs:
            raise ln.error("expected one or more key patterns after 'members'")
        f["members"] = tuple(globs)
    elif kw == "partition":
        f["each"] = ln.maybe("each")
        ln.keyword("over", "partition")
        f["partition_groups"] = ln.groups("partition over")
        if ln.maybe("pad"):
            ln.keyword("to", "pad")
            ln.keyword("multiple", "pad to")
            ln.keyword("of", "pad to multiple")
            f["pad_multiple"] = ln.expr()
        ln.end("partition")
    elif kw == "align":
        f["align"] = ln.expr()
    elif kw == "order":
        ln.keyword("by", "order")
        f["order"] = ln.word("a list parameter of logical names")
        ln.end("order by")


def _expand_alsos(rules: list, alsos: list, filename: str) -> list:
    """``also`` makes, for every tensor rule, a rule for each optimizer state with the same geometry."""
    tensors = sum(isinstance(r, TensorRule) for r in rules)
    if len(rules) + tensors * len(alsos) > MAX_RULES:
        number, *_, ln = alsos[-1]
        raise ln.error(
            f"the program expands to {len(rules) + tensors * len(alsos)} rules ({tensors} tensor rules x "
            f"{len(alsos)} 'also' lines), more than the {MAX_RULES} a program may have",
            0,
        )
    out = list(rules)
    for number, local_t, logical_t, scalar, where, ln in alsos:
        for rule in rules:
            if not isinstance(rule, TensorRule) or rule.derived:
                continue
            src = (filename, number, 1, ln.source)
            local = parse_pattern(local_t.replace("{key}", rule.local.text), where=src, local=True)
            if rule.fuse is not None and not scalar:
                parts = tuple(
                    Part(
                        parse_pattern(logical_t.replace("{name}", p.logical.text), where=src, local=False),
                        p.weight,
                        p.shape,
                    )
                    for p in rule.fuse.parts
                )
                fields: dict[str, Any] = {"logical": None, "fuse": Fuse(rule.fuse.dim, rule.fuse.groups, parts)}
            else:
                first = rule.targets[0].text
                fields = {
                    "logical": parse_pattern(logical_t.replace("{name}", first), where=src, local=False),
                    "fuse": None,
                }
            if scalar:
                fields.update(splits=(), pads=(), sizes=(), scalar=True, shape=())
            extra = (where,) if where is not None else ()
            out.append(dataclasses.replace(rule, local=local, where=rule.where + extra, derived=True, **fields))
    return out


def _analyze_where(rule):
    """Split the ``where`` clauses into and-ed conditions once, and find capture bounds among them."""
    conjuncts, bounds = [], []
    for w in rule.where:
        body = w.tree.body
        nodes = body.values if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) else [body]
        for node in nodes:
            conjuncts.append(Expr(ast.unparse(node), ast.Expression(node), w.names, w.where))
            if (
                isinstance(node, ast.Compare)
                and len(node.ops) == 1
                and isinstance(node.left, ast.Name)
                and isinstance(node.ops[0], (ast.Lt, ast.LtE))
            ):
                limit = ast.Expression(node.comparators[0])
                bounds.append(
                    (node.left.id, Expr(ast.unparse(limit), limit, w.names, w.where), isinstance(node.ops[0], ast.LtE))
                )
    return dataclasses.replace(rule, conjuncts=tuple(conjuncts), bounds=tuple(bounds))
