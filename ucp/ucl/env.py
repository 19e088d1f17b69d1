"""The values a UCL expression can read: layout variables, parameters, lets and captures.

>>> from ucp.ucl.parser import parse
>>> ctx = Context.make(parse("ucl 1\\nparam heads = 8\\n"), Layout.parse("tp=2,pp=2"), 3)
>>> ctx.env()["pp.rank"], ctx.env()["heads"]
(1, 8)
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

from ucp.ucl.errors import UclError, UnboundNameError
from ucp.ucl.expr import MAX_INT, PARAM_HINT, Expr
from ucp.ucl.program import Program
from ucp.geometry import split_evenly
from ucp.layout import Layout, RankCoords

GROUP_DIM = {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp", "ep": "dp", "edp": "dp"}


def layout_vars(layout: Layout, coords: RankCoords) -> dict[str, int]:
    out = {}
    for g in ("tp", "cp", "dp", "pp", "ep"):
        out[f"{g}.size"] = getattr(layout, g)
        out[f"{g}.rank"] = getattr(coords, g)
    out["edp.size"] = layout.dp // layout.ep
    out["edp.rank"] = coords.edp
    out["vpp.size"] = layout.vpp
    out["zero.stage"] = layout.zero
    return out


def _cut(variables: dict[str, int], groups: tuple[str, ...]) -> tuple[int, int]:
    """Parts and this rank's index when a dimension is cut over ``groups`` (first group major)."""
    parts, index = 1, 0
    for g in groups:
        size, rank = variables[f"{g}.size"], variables[f"{g}.rank"]
        parts, index = parts * size, index * size + rank
    return parts, index


def param_value(program: str, name: str, value):
    """A parameter value as the language holds it: a bounded int, a word, or a tuple of those.

    >>> param_value("m.ucl", "states", ["exp_avg", 2])
    ('exp_avg', 2)
    """
    if isinstance(value, (list, tuple)):
        return tuple(_scalar(program, name, v) for v in value)
    return _scalar(program, name, value)


def _scalar(program: str, name: str, value):
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise UclError(
                f"{program}: parameter {name} = {str(value)[:20]}... is outside UCL's integer range "
                "(|value| <= 2**63 - 1)"
            )
        return value
    if isinstance(value, str):
        return value
    raise UclError(
        f"{program}: parameter {name} is {type(value).__name__} {str(value)[:40]!r}; expected an "
        "integer, a word or a list of those"
    )


class Env(dict):
    """Captures over a base of layout variables and parameters; ``let`` names computed on first use.

    A dict of the values known so far (expressions read it by subscription, one dict access per
    name); a ``let`` is evaluated the first time it is read and kept.
    """

    def __init__(self, base: dict, lets: dict[str, Expr], functions: dict):
        super().__init__(base)
        self._lets = lets
        self._functions = functions
        self._busy: set[str] = set()

    def __missing__(self, name: str):
        if name not in self._lets:
            raise KeyError(name)
        if name in self._busy:
            raise UclError(f"let {name} refers to itself")
        self._busy.add(name)
        try:
            value = self._lets[name].eval(self, self._functions)
        finally:
            self._busy.discard(name)
        self[name] = value
        return value


@contextmanager
def all_unset_named(program: Program, given: Mapping | None):
    """Turn the first "'x' has no value" met inside into one naming every parameter still without a value.

    A program's parameters are read lazily (one that is never used needs no value), so the
    first use is where a missing one shows up; the user should not have to fix them one run
    at a time.
    """
    try:
        yield
    except UnboundNameError as err:
        unset = [n for n, d in program.params.items() if d is None and n not in (given or {})]
        if not unset:
            raise
        first = str(err).removesuffix(f" ({PARAM_HINT})")
        raise UnboundNameError(
            f"{first}; the program's parameters without a value: {', '.join(unset)} ({PARAM_HINT})"
        ) from None


@dataclass(frozen=True)
class Context:
    """Everything fixed for one compile: program, layout, rank and resolved parameters."""

    program: Program
    layout: Layout
    coords: RankCoords
    params: dict

    @classmethod
    def make(cls, program: Program, layout: Layout, rank: int, overrides: Mapping | None = None) -> "Context":
        coords = layout.coords(rank)
        overrides = dict(overrides or {})
        unknown = set(overrides) - set(program.params)
        if unknown:
            raise UclError(
                f"{program.filename}: unknown program parameter(s) {sorted(unknown)}; "
                f"the program declares {sorted(program.params) or 'none'}"
            )
        params: dict = {}
        env = layout_vars(layout, coords)
        for name, default in program.params.items():
            if name in overrides:
                value = param_value(program.filename, name, overrides[name])
                if isinstance(default, tuple) and not isinstance(value, tuple):
                    value = (value,)  # a list parameter given one item
                params[name] = value
            elif isinstance(default, Expr):
                try:
                    params[name] = default.eval({**env, **params})
                except UnboundNameError:
                    pass  # depends on a parameter without a value: an error only where it is used
            elif default is not None:
                params[name] = default
        return cls(program, layout, coords, params)

    def at(self, **coords) -> "Context":
        """The same compile seen from another rank (used to find replicas)."""
        own = self.coords
        rank = self.layout.rank_of(
            tp=coords.get("tp", own.tp),
            cp=coords.get("cp", own.cp),
            dp=coords.get("dp", own.dp),
            pp=coords.get("pp", own.pp),
        )
        other = Context(self.program, self.layout, self.layout.coords(rank), self.params)
        if "_stages" in self.__dict__:  # a property of the layout and parameters, not of the rank: share it
            other.__dict__["_stages"] = self.__dict__["_stages"]
        return other

    @property
    def rank(self) -> int:
        return self.coords.rank

    def functions(self) -> dict:
        """The builtins that depend on the layout (one dict per context: expressions read it, never write it)."""
        return self._functions

    @cached_property
    def _functions(self) -> dict:
        return {"stage_start": self._stage_start, "stage_layers": self._stage_layers}

    @cached_property
    def variables(self) -> dict[str, int]:
        """The layout variables of this rank (``tp.rank``, ``pp.size``, ...): :func:`layout_vars`, once per context."""
        return layout_vars(self.layout, self.coords)

    def cut(self, groups: tuple[str, ...]) -> tuple[int, int]:
        """(parts, this rank's index) when a dimension is cut over ``groups`` (first group major)."""
        return _cut(self.variables, groups)

    @cached_property
    def _base(self) -> dict:
        return {**self.variables, **self.params}

    def env(self, captures: Mapping | None = None) -> Env:
        base = {**self._base, **captures} if captures else self._base
        return Env(base, self.program.lets, self.functions())

    @cached_property
    def _stages(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(layers of each stage, first layer of each stage), computed once per context."""
        stages = self.layout.pp * self.layout.vpp
        explicit = self.params.get("stage_layers_list") or ()
        if explicit:
            if len(explicit) != stages:
                raise UclError(
                    f"{self.program.filename}: stage_layers_list has {len(explicit)} entries, "
                    f"the layout has pp*vpp = {stages} stages"
                )
            if not all(isinstance(x, int) and x >= 0 for x in explicit):
                raise UclError(
                    f"{self.program.filename}: stage_layers_list must hold layer counts >= 0, got {list(explicit)[:8]}"
                )
            sizes = tuple(explicit)
        else:
            layers = self.params.get("num_layers")
            if not isinstance(layers, int) or layers < 0:
                raise UclError(
                    f"{self.program.filename}: stage_start()/stage_layers() need the parameter num_layers "
                    f"(an integer >= 0), got {layers!r}"
                )
            sizes = tuple(split_evenly(layers, stages, s)[1] for s in range(stages))
        starts = tuple(itertools.accumulate(sizes, initial=0))
        if starts[-1] > MAX_INT:
            raise UclError(f"{self.program.filename}: stage_layers_list adds up to more than 2**63 - 1 layers")
        return sizes, starts

    def _stage_start(self, stage: int) -> int:
        starts = self._stages[1]
        return starts[min(max(stage, 0), len(starts) - 1)]

    def _stage_layers(self, stage: int) -> int:
        sizes = self._stages[0]
        return sizes[stage] if isinstance(stage, int) and 0 <= stage < len(sizes) else 0


def unmet_requirements(ctx: Context) -> list[str]:
    """The messages (``file:line: text``) of the program's ``require`` statements that ``ctx`` breaks.

    Requirements are about the layout and parameters, not a rank: any rank's context gives the same answer.
    """
    out = []
    functions = ctx.functions()
    for req in ctx.program.requires:
        env = ctx.env()
        if req.condition.eval(env, functions):
            continue
        values = iter([h.eval(env, functions) for h in req.holes])
        message = re.sub(r"\{[^{}]*\}", lambda _m: str(next(values)), req.message)  # noqa: B023 - holes in parse order; re.sub calls it here
        out.append(f"{ctx.program.filename}:{req.line}: {message}")
    return out
