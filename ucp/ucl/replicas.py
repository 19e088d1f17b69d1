"""Replicas: which ranks hold exactly the same pieces, found from the program itself.

A dimension whose rank no expression of the rule reads holds the same pieces
on every rank (a layer norm over tp, any weight over dp). Where a rule reads a
rank (``pp.rank`` for layers, ``ep.rank`` for experts) the other ranks of that
dimension are evaluated, including other rules that write the same logical
tensor (tied embeddings on the first and last stage).
"""

from __future__ import annotations

from ucp.ucl.env import GROUP_DIM, Context
from ucp.ucl.errors import UclError
from ucp.ucl.geometry_rules import local_geometry
from ucp.ucl.matching import bounds_of, enumerate_captures, member_order, where_ok
from ucp.ucl.names import LAYOUT_NAMES, let_closure, rule_exprs
from ucp.ucl.program import FlatRule, Program, TensorRule


def _rule_names(program: Program, rule) -> set[str]:
    """Every name a rule's expressions read, following lets."""
    names: set[str] = set()
    for expr in rule_exprs(rule):
        names |= expr.names
    for t in getattr(rule, "targets", ()):
        names |= t.names
    return let_closure(frozenset(names), program.lets)


def _rank_names(rules: list, program: Program) -> tuple[str, ...]:
    """The rank variables (``ep.rank``, ...) that decide what these rules hold on a rank.

    Everything else a rule's pieces depend on (sizes, parameters, captures, the stage
    functions) is the same on every rank of the layout, so two ranks that agree on these
    hold the same pieces.
    """
    names: set[str] = set()
    for rule in rules:
        names |= {n for n in _rule_names(program, rule) if n in LAYOUT_NAMES and n.endswith(".rank")}
        groups = [g for s in getattr(rule, "splits", ()) for g in s.groups] + list(
            getattr(rule, "partition_groups", ())
        )
        names |= {f"{g}.rank" for g in groups}
    return tuple(sorted(names))


def _dims(rule, program: Program) -> tuple[set, set]:
    """(dims whose rank the rule reads, dims it splits or partitions over)."""
    names = _rule_names(program, rule)
    referenced = {GROUP_DIM[n.split(".")[0]] for n in names if n.endswith(".rank") and n.split(".")[0] in GROUP_DIM}
    split_groups = [g for s in getattr(rule, "splits", ()) for g in s.groups]
    if isinstance(rule, FlatRule):
        split_groups += list(rule.partition_groups)
    used = {GROUP_DIM[g] for g in split_groups if g in ("tp", "cp", "dp", "pp")}
    referenced |= {"dp" for g in split_groups if g in ("ep", "edp")}
    return referenced, used


def holders(rule, ctx: Context, captures: dict, shapes_by_name: dict, pieces, dim: str, cache: dict) -> list[int]:
    """The coordinates along ``dim`` of the ranks that hold exactly ``pieces`` under this tensor rule.

    A dim the rule splits over holds other pieces on every other rank; a dim whose rank it never
    reads holds the same pieces everywhere; only the others are evaluated, once per compile for
    each local tensor (``cache``: the same members recur in the flat buffer of every state), and
    once per distinct value of the rank variables the rule reads: the dp ranks of an expert
    weight differ in ``ep.rank`` only every ``ep`` ranks.
    """
    size, mine = getattr(ctx.layout, dim), getattr(ctx.coords, dim)
    if ("dims", id(rule)) not in cache:
        cache[("dims", id(rule))] = _dims(rule, ctx.program)
    referenced, used = cache[("dims", id(rule))]
    if dim in used:
        return [mine]
    if dim not in referenced:
        return list(range(size))
    key = (id(rule), tuple(sorted(captures.items())), dim)
    if key not in cache:
        if ("peers", id(rule)) not in cache:
            peers = _peers(ctx.program, rule)
            cache[("peers", id(rule))] = peers, _rank_names([rule, *peers], ctx.program)
        peers, reads = cache[("peers", id(rule))]
        own = {(p.logical, str(p.target)) for p in pieces}
        found = {mine}
        for ranks in _by_rank_values(ctx, dim, reads, cache).values():
            other = next(((v, o) for v, o in ranks if v != mine), None)
            if other is not None and _holds(rule, other[1], captures, shapes_by_name, own, peers):
                found.update(v for v, _ in ranks)
        cache[key] = sorted(found)
    return cache[key]


def _by_rank_values(ctx: Context, dim: str, reads: tuple[str, ...], cache: dict) -> dict:
    """The ranks along ``dim`` (coordinate and context), grouped by the values they give the variables ``reads``."""
    if ("groups", dim, reads) not in cache:
        groups: dict[tuple, list] = {}
        for v in range(getattr(ctx.layout, dim)):
            other = ctx.at(**{dim: v})
            groups.setdefault(tuple(other.variables[n] for n in reads), []).append((v, other))
        cache[("groups", dim, reads)] = groups
    return cache[("groups", dim, reads)]


def replication(
    rule, ctx: Context, captures: dict, shapes_by_name: dict, pieces: list, cache: dict | None = None
) -> tuple[int, int]:
    """(replica, replicas): the ranks that hold exactly these pieces under this rule."""
    over = getattr(rule, "replicate_over", None)
    dims = ("tp", "cp", "dp", "pp") if over is None else tuple(dict.fromkeys(GROUP_DIM[g] for g in over))
    replica, replicas = 0, 1
    for dim in dims:
        if getattr(ctx.layout, dim) == 1:
            continue
        found = holders(rule, ctx, captures, shapes_by_name, pieces, dim, {} if cache is None else cache)
        replica, replicas = replica * len(found) + found.index(getattr(ctx.coords, dim)), replicas * len(found)
    return replica, replicas


def _peers(program: Program, rule) -> list:
    """Tensor rules that may write the same logical tensors as ``rule`` (tied weights)."""
    if not isinstance(rule, TensorRule):
        return []
    texts = {t.text for t in rule.targets}
    return [
        r
        for r in program.rules
        if isinstance(r, TensorRule) and r is not rule and not r.virtual and texts & {t.text for t in r.targets}
    ]


def _same_pieces(rule, ctx: Context, captures: dict, shapes_by_name: dict, own: set) -> bool:
    """Whether this rule instance holds exactly the pieces ``own`` on rank ``ctx`` (False where it fails)."""
    env = ctx.env(captures)
    try:
        if not where_ok(rule, ctx, env):
            return False
        names = [t.format(env, ctx.functions()) for t in rule.targets]
        if any(n not in shapes_by_name for n in names):
            return False
        if any(logical not in names for logical, _ in own):
            return False  # every piece is of one of the names: no need for the geometry
        _, pieces = local_geometry(rule, ctx, env, names, [shapes_by_name[n] for n in names])
    except UclError:
        return False
    return {(p.logical, str(p.target)) for p in pieces} == own


def _holds(rule, other: Context, captures: dict, shapes_by_name: dict, own: set, peers: list) -> bool:
    """Whether rank ``other`` holds exactly the pieces ``own``, under this rule or a tied peer (``peers``)."""
    if isinstance(rule, FlatRule):
        return False  # partitions are never identical across the partition group
    if _same_pieces(rule, other, captures, shapes_by_name, own):
        return True
    for peer in peers:
        bounds = bounds_of(peer)
        for values, _ in enumerate_captures(peer, other, peer.local.captures, bounds, {}, 1):
            if _same_pieces(peer, other, values, shapes_by_name, own):
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
        per_member = {m.key: holders(m.rule, ctx, m.captures, shapes_by_name, m.pieces, dim, cache) for m in chosen}
        common = [v for v in range(size) if all(v in h for h in per_member.values())]
        replica, replicas = replica * len(common) + common.index(mine), replicas * len(common)
        if len(common) == 1:
            drop |= {k for k, h in per_member.items() if h[0] != mine}
    return replica, replicas, drop
