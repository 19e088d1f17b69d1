"""Megatron-style process groups for a :class:`~ucp.layout.Layout`.

Rank order is Megatron's: tp fastest, then cp, dp, pp. Expert parallelism
subdivides dp: the ep group is ``ep`` consecutive dp ranks, the expert-data-parallel
(edp) group the dp ranks holding the same experts. Every rank creates every group
in the same order (``new_group`` is collective); groups of one rank are ``None``.

    groups = ParallelGroups.build(Layout.parse("tp=2,pp=2,dp=2"), rank)
    dist.all_reduce(x, group=groups.tp)
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import torch.distributed as dist

from ucp.layout import Layout

__all__ = ["ParallelGroups"]

KINDS = ("tp", "cp", "dp", "pp", "ep", "edp", "dp_cp", "edp_cp")


def _members(layout: Layout, kind: str) -> list[list[int]]:
    """Every group of ``kind`` as a list of global ranks (in rank order)."""
    tps, cps, dps, pps = (range(n) for n in (layout.tp, layout.cp, layout.dp, layout.pp))
    at = lambda t, c, d, p: layout.rank_of(tp=t, cp=c, dp=d, pp=p)  # noqa: E731
    edp_size = layout.dp // layout.ep
    if kind == "tp":
        return [[at(t, c, d, p) for t in tps] for p, d, c in product(pps, dps, cps)]
    if kind == "cp":
        return [[at(t, c, d, p) for c in cps] for p, d, t in product(pps, dps, tps)]
    if kind == "dp":
        return [[at(t, c, d, p) for d in dps] for p, c, t in product(pps, cps, tps)]
    if kind == "pp":
        return [[at(t, c, d, p) for p in pps] for d, c, t in product(dps, cps, tps)]
    if kind == "dp_cp":
        return [sorted(at(t, c, d, p) for d in dps for c in cps) for p, t in product(pps, tps)]
    if kind == "ep":  # consecutive dp ranks: dp rank = edp * ep + ep rank
        return [[at(t, c, k * layout.ep + e, p) for e in range(layout.ep)]
                for p, c, t, k in product(pps, cps, tps, range(edp_size))]
    if kind == "edp":
        return [[at(t, c, k * layout.ep + e, p) for k in range(edp_size)]
                for p, c, t, e in product(pps, cps, tps, range(layout.ep))]
    if kind == "edp_cp":
        return [sorted(at(t, c, k * layout.ep + e, p) for k in range(edp_size) for c in cps)
                for p, t, e in product(pps, tps, range(layout.ep))]
    raise ValueError(f"unknown group kind {kind!r}")


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's groups (None where the group is this rank alone) and its pipeline neighbours."""

    layout: Layout
    rank: int
    tp: object = None
    cp: object = None
    dp: object = None
    pp: object = None
    ep: object = None
    edp: object = None
    dp_cp: object = None
    edp_cp: object = None
    prev_rank: int | None = None
    next_rank: int | None = None

    @classmethod
    def build(cls, layout: Layout, rank: int) -> "ParallelGroups":
        mine: dict = {}
        for kind in KINDS:
            for members in _members(layout, kind):
                if len(members) == 1:
                    continue  # collectives over one rank are no-ops: no group at all
                group = dist.new_group(members)
                if rank in members:
                    mine[kind] = group
        coords = layout.coords(rank)
        def stage(pp: int) -> int | None:
            return layout.rank_of(tp=coords.tp, cp=coords.cp, dp=coords.dp, pp=pp) if 0 <= pp < layout.pp else None

        prev_rank, next_rank = stage(coords.pp - 1), stage(coords.pp + 1)
        return cls(layout, rank, prev_rank=prev_rank, next_rank=next_rank, **mine)

    @staticmethod
    def size(group) -> int:
        return 1 if group is None else dist.get_world_size(group)

    @staticmethod
    def index(group) -> int:
        return 0 if group is None else dist.get_rank(group)
