"""Choosing the layout a job goes on with after it lost ranks.

:func:`plan_layout` takes the layout the job had, how many processes are left (survivors
plus waiting spares) and the model's constraints (a ``check(layout)`` that raises when
the model cannot run under it: tp must divide the heads, pp the layers...). It keeps tp,
pp, cp and ep and shrinks dp, since only dp changes nothing inside a model replica; when
no dp fits, it shrinks pp, then tp. Processes beyond the layout's world stay idle as
spares. The choice says why; ``override`` imposes a layout instead (it must fit).

    >>> choice = plan_layout("tp=2,dp=4,zero=1", available=7)
    >>> str(choice.layout), choice.spares
    ('tp=2,dp=3,zero=1', 1)
    >>> choice.why
    'kept tp=2, pp=1, cp=1; dp 4 -> 3: 6 of 7 processes active, 1 idle as a spare'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ucp.errors import LayoutError, UcpError
from ucp.layout import Layout

__all__ = ["LayoutChoice", "plan_layout"]


@dataclass(frozen=True)
class LayoutChoice:
    """The new layout, how many processes it uses, how many stay idle, and why."""

    layout: Layout
    active: int
    spares: int
    why: str

    def to_dict(self) -> dict:
        return {"layout": str(self.layout), "active": self.active, "spares": self.spares, "why": self.why}

    @classmethod
    def from_dict(cls, data: dict) -> "LayoutChoice":
        return cls(Layout.parse(data["layout"]), int(data["active"]), int(data["spares"]), str(data["why"]))


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _candidates(old: Layout, available: int):
    """Layouts in order of preference: the old tp/pp with the largest dp first, then smaller pp, then tp."""
    for tp in _divisors_desc(old.tp):
        for pp in _divisors_desc(old.pp):
            per_replica = tp * pp * old.cp
            for dp in range(min(old.dp, available // per_replica) if (tp, pp) == (old.tp, old.pp)
                            else available // per_replica, 0, -1):
                if dp % old.ep == 0:
                    yield dataclasses.replace(old, tp=tp, pp=pp, dp=dp)


def plan_layout(previous: Layout | str, available: int, *, check: Callable[[Layout], None] | None = None,
                override: Layout | str | None = None) -> LayoutChoice:
    """The layout to go on with on ``available`` processes (see the module doc)."""
    old = Layout.parse(previous) if isinstance(previous, str) else previous
    if available < 1:
        raise LayoutError(f"no process is left to run layout {old}; restart the job from its last checkpoint")
    if override is not None:
        layout = Layout.parse(override) if isinstance(override, str) else override
        if layout.world_size > available:
            raise LayoutError(f"the layout given ({layout}) needs {layout.world_size} processes; "
                              f"only {available} are left")
        if check is not None:
            check(layout)
        return LayoutChoice(layout, layout.world_size, available - layout.world_size,
                            f"given: {layout} on {layout.world_size} of {available} processes")
    refused = []
    for layout in _candidates(old, available):
        try:
            if check is not None:
                check(layout)
        except (UcpError, ValueError) as err:
            refused.append(f"{layout}: {err}")
            continue
        active = layout.world_size
        kept = [f"{d}={getattr(layout, d)}" for d in ("tp", "pp", "cp") if getattr(layout, d) == getattr(old, d)]
        changed = [f"{d} {getattr(old, d)} -> {getattr(layout, d)}" for d in ("tp", "pp", "dp")
                   if getattr(layout, d) != getattr(old, d)]
        spares = available - active
        why = (f"kept {', '.join(kept) or 'nothing'}; {', '.join(changed) or 'same layout'}: {active} of {available} "
               f"processes active" + (f", {spares} idle as {'a spare' if spares == 1 else 'spares'}" if spares else ""))
        return LayoutChoice(layout, active, spares, why)
    detail = "; ".join(refused[:3]) or "none has few enough ranks"
    raise LayoutError(f"no layout derived from {old} runs this model on {available} processes ({detail}); "
                      "pass override= with one that does")
