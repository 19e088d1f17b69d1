"""Replicas: which ranks hold exactly the same pieces, found from the program itself.

A dimension whose rank no expression of the rule reads holds the same pieces
on every rank (a layer norm over tp, any weight over dp). Where a rule reads a
rank (``pp.rank`` for layers, ``ep.rank`` for experts) the other ranks of that
dimension are evaluated, including other rules that write the same logical
tensor (tied embeddings on the first and last stage).
"""

from __future__ import annotations

from ucl.env import GROUP_DIM, Context
from ucl.errors import UclError
from ucl.geometry_rules import local_geometry
from ucl.matching import bounds_of, enumerate_captures, member_order, where_ok
from ucl.names import let_closure, rule_exprs
from ucl.program import FlatRule, Program, TensorRule


def _rule_names(program: Program, rule) -> set[str]:
    """Every name a rule's expressions read, following lets."""
    names: set[str] = set()
    for expr in rule_exprs(rule):
        names |= expr.names
    for t in getattr(rule, "targets", ()):
        names |= t.names
    return let_closure(frozenset(names), program.lets)


def replication(rule, ctx: Context, captures: dict, shapes_by_name: dict, pieces: list) -> tuple[int, int]:
    """(replica, replicas): the ranks that hold exactly these pieces under this rule."""
    program = ctx.program
    names = _rule_names(program, rule)
    referenced = {GROUP_DIM[n.split(".")[0]] for n in names if n.endswith(".rank") and n.split(".")[0] in GROUP_DIM}
    split_groups = [g for s in getattr(rule, "splits", ()) for g in s.groups]
    if isinstance(rule, FlatRule):
        split_groups += list(rule.partition_groups)
    used = {GROUP_DIM[g] for g in split_groups if g in ("tp", "cp", "dp", "pp")}
    referenced |= {"dp" for g in split_groups if g in ("ep", "edp")}
    over = getattr(rule, "replicate_over", None)
    dims = ("tp", "cp", "dp", "pp") if over is None else tuple(dict.fromkeys(GROUP_DIM[g] for g in over))
    own = {(p.logical, str(p.target)) for p in pieces}
    replica, replicas = 0, 1
    for dim in dims:
        size = getattr(ctx.layout, dim)
        mine = getattr(ctx.coords, dim)
        if dim in used or size == 1:
            continue
        if dim not in referenced:
            replica, replicas = replica * size + mine, replicas * size
            continue
        holders = [v for v in range(size) if _holds(rule, ctx.at(**{dim: v}), captures, shapes_by_name, own)]
        replica, replicas = replica * len(holders) + holders.index(mine), replicas * len(holders)
    return replica, replicas


def _peers(program: Program, rule) -> list:
    """Tensor rules that may write the same logical tensors as ``rule`` (tied weights)."""
    if not isinstance(rule, TensorRule):
        return []
    texts = {t.text for t in rule.targets}
    return [r for r in program.rules if isinstance(r, TensorRule) and r is not rule and not r.virtual
            and texts & {t.text for t in r.targets}]


def _pieces_of(rule, ctx: Context, captures: dict, shapes_by_name: dict):
    env = ctx.env(captures)
    try:
        if not where_ok(rule, ctx, env):
            return None
        names = [t.format(env, ctx.functions()) for t in rule.targets]
        if any(n not in shapes_by_name for n in names):
            return None
        _, pieces = local_geometry(rule, ctx, env, names, [shapes_by_name[n] for n in names])
    except UclError:
        return None
    return {(p.logical, str(p.target)) for p in pieces}


def _holds(rule, other: Context, captures: dict, shapes_by_name: dict, own: set) -> bool:
    """Whether rank ``other`` holds exactly the pieces ``own``, under this rule or a tied peer."""
    if isinstance(rule, FlatRule):
        return False  # partitions are never identical across the partition group
    if _pieces_of(rule, other, captures, shapes_by_name) == own:
        return True
    for peer in _peers(other.program, rule):
        bounds = bounds_of(peer)
        for values, _ in enumerate_captures(peer, other, peer.local.captures, bounds, {}, 1):
            if _pieces_of(peer, other, values, shapes_by_name) == own:
                return True
    return False


def flat_replication(rule: FlatRule, ctx: Context, members: list, shapes_by_name: dict, cache: dict):
    """(replica, replicas, drop) of a flat buffer.

    The buffer is replicated along a dimension only where every member is. A
    member replicated where the buffer is not (a layer norm in the buffers of
    all TP ranks) is saved by its first holder only: ``drop`` names the members
    whose pieces this rank leaves out when saving (it still loads them).
    """
    used = {GROUP_DIM[g] for g in rule.partition_groups}
    wanted = set(member_order(rule, {i.key: i for i in members}, ctx.params))
    chosen = [m for m in members if m.key in wanted]
    replica, replicas, drop = 0, 1, set()
    for dim in ("tp", "cp", "dp", "pp"):
        size, mine = getattr(ctx.layout, dim), getattr(ctx.coords, dim)
        if dim in used or size == 1:
            continue
        per_member = {}
        for m in chosen:
            if (m.key, dim) not in cache:  # the same members recur in the buffer of every state
                own = {(p.logical, str(p.target)) for p in m.pieces}
                cache[(m.key, dim)] = [v for v in range(size) if v == mine
                                       or _holds(m.rule, ctx.at(**{dim: v}), m.captures, shapes_by_name, own)]
            per_member[m.key] = cache[(m.key, dim)]
        holders = [v for v in range(size) if all(v in h for h in per_member.values())]
        replica, replicas = replica * len(holders) + holders.index(mine), replicas * len(holders)
        if len(holders) == 1:
            drop |= {k for k, h in per_member.items() if h[0] != mine}
    return replica, replicas, drop
