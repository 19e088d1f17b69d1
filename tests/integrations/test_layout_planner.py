"""The layout planner: keep tp and pp, shrink dp, spares when nothing fits, overridable."""

from __future__ import annotations

import pytest

from ucp.integrations.layout_planner import plan_layout
from ucp.errors import LayoutError
from ucp.layout import Layout


def _heads(n: int):
    def check(layout: Layout) -> None:
        if n % layout.tp:
            raise LayoutError(f"tp={layout.tp} must divide {n} heads")
    return check


@pytest.mark.parametrize("old,available,new,spares", [
    ("tp=2,dp=2,zero=1", 3, "tp=2,zero=1", 1),          # dp shrinks, one process idle
    ("tp=2,dp=2,zero=1", 4, "tp=2,dp=2,zero=1", 0),     # a spare came: same layout
    ("tp=2,dp=2,zero=1", 9, "tp=2,dp=2,zero=1", 5),     # never grows past the old layout
    ("tp=2,pp=2,dp=2", 7, "tp=2,pp=2", 3),
    ("tp=2,pp=2", 3, "tp=2", 1),                        # no dp left: pp shrinks first
    ("tp=4,pp=2", 3, "tp=2", 1),                        # then tp
    ("dp=4,ep=2", 3, "dp=2,ep=2", 1),                   # ep must divide dp
])
def test_keeps_tp_and_pp_and_shrinks_dp(old, available, new, spares):
    choice = plan_layout(old, available)
    assert (str(choice.layout), choice.spares, choice.active + choice.spares) == (new, spares, available)


def test_the_models_constraints_and_the_reason():
    choice = plan_layout("tp=4,dp=2", 3, check=_heads(6))
    assert str(choice.layout) == "tp=2"
    assert choice.why == "kept pp=1, cp=1; tp 4 -> 2, dp 2 -> 1: 2 of 3 processes active, 1 idle as a spare"


def test_override_and_refusals():
    assert str(plan_layout("tp=2,dp=2", 3, override="dp=3").layout) == "dp=3"
    with pytest.raises(LayoutError, match=r"the layout given \(dp=4\) needs 4 processes; only 3 are left"):
        plan_layout("tp=2,dp=2", 3, override="dp=4")
    with pytest.raises(LayoutError, match="no process is left to run layout tp=2"):
        plan_layout("tp=2", 0)
    with pytest.raises(LayoutError, match="no layout derived from tp=2 runs this model on 1 processes"):
        plan_layout("tp=2", 1, check=lambda layout: (_ for _ in ()).throw(LayoutError("never")))
