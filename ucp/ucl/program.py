"""The parsed form of a UCL program: plain frozen dataclasses, no behaviour.

See docs/UCL.md for the language. :func:`ucp.ucl.parser.parse` builds these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ucp.ucl.expr import Expr
from ucp.ucl.pattern import Pattern

GROUPS = ("tp", "cp", "dp", "pp", "ep", "edp")


@dataclass(frozen=True)
class Split:
    """``split dim D over G[, G2]``: the dimension is cut into parts, one per rank of the groups."""

    dim: int
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Pad:
    """``pad dim D to multiple of EXPR``: the local dimension is padded, the logical one is not."""

    dim: int
    multiple: Expr


@dataclass(frozen=True)
class Part:
    """One sub-parameter of a fused tensor, its relative size and (``shape [...]``) its logical shape."""

    logical: Pattern
    weight: Expr | None
    shape: tuple[Expr, ...] | None = None


@dataclass(frozen=True)
class Fuse:
    """``fuse dim D [groups G]`` with its ``part`` lines: sub-parameters stacked along D."""

    dim: int
    groups: Expr | None
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class TensorRule:
    """``tensor LOCAL -> LOGICAL`` and its clauses."""

    line: int
    local: Pattern
    logical: Pattern | None
    splits: tuple[Split, ...] = ()
    pads: tuple[Pad, ...] = ()
    sizes: tuple[tuple[int, Expr], ...] = ()
    fuse: Fuse | None = None
    where: tuple[Expr, ...] = ()
    replicate_over: tuple[str, ...] | None = None
    policy: str = "check-equal"
    virtual: bool = False
    scalar: bool = False
    derived: bool = False  # made by an `also` statement
    bounds: tuple = ()  # (capture, Expr, inclusive) from `where NAME < EXPR` conjuncts
    conjuncts: tuple = ()  # every and-ed condition of the `where` clauses, as its own Expr
    shape: tuple[Expr, ...] | None = None  # `shape [EXPR, ...]`: the declared logical shape

    @property
    def targets(self) -> tuple[Pattern, ...]:
        """The logical patterns this rule writes: the fused parts, or the single target."""
        if self.fuse is not None:
            return tuple(p.logical for p in self.fuse.parts)
        return (self.logical,) if self.logical is not None else ()

    @property
    def declared_shapes(self) -> tuple[tuple[Expr, ...] | None, ...]:
        """The declared logical shape of each target (None where the rule declares none)."""
        if self.scalar:
            return ((),) * len(self.targets)
        if self.fuse is not None:
            return tuple(p.shape for p in self.fuse.parts)
        return (self.shape,) * len(self.targets)


@dataclass(frozen=True)
class FlatRule:
    """``flat LOCAL [-> TEMPLATE]``: a 1-d buffer holding a partition of many tensors."""

    line: int
    local: Pattern
    logical: str  # template over {name}, the member's logical name, e.g. "{name}/{s}"
    members: tuple[str, ...] = ()
    partition_groups: tuple[str, ...] = ("dp",)
    each: bool = False
    pad_multiple: Expr | None = None
    align: Expr | None = None
    where: tuple[Expr, ...] = ()
    policy: str = "check-equal"
    order: str = ""  # a list parameter of logical names giving the members' order (the model's)
    bounds: tuple = ()
    conjuncts: tuple = ()


@dataclass(frozen=True)
class View:
    """``view LOGICAL = CANONICAL [transpose] [rope heads EXPR]``: how a name maps to the common scheme."""

    line: int
    logical: Pattern
    canonical: Pattern
    transpose: bool = False
    rope_heads: Expr | None = None


@dataclass(frozen=True)
class Require:
    """``require EXPR else MESSAGE``: a condition on the layout and parameters the program cannot work without.

    ``message`` is literal text with ``{EXPR}`` holes (``holes`` holds their parsed expressions, in order).
    """

    line: int
    condition: Expr
    message: str
    holes: tuple[Expr, ...] = ()


@dataclass(frozen=True)
class Program:
    """A parsed program. ``params`` holds defaults (None: must be given), ``lets`` the definitions.

    ``settings`` names the parameters declared with ``setting``: properties of a run (padding
    multiple, pipeline split, optimizer states) that a load may give other values than the
    save did. Every other parameter describes the model and must match the checkpoint's.
    """

    filename: str
    source: str
    params: dict = field(default_factory=dict)
    lets: dict = field(default_factory=dict)
    rules: tuple = ()
    views: tuple[View, ...] = ()
    requires: tuple[Require, ...] = ()
    settings: frozenset = frozenset()

    def where(self, line: int) -> str:
        return f"{self.filename}:{line}"
