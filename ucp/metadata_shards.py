"""Writing sharded metadata (format 2): groups of ranks, their shards, and the root that indexes them.

A save with a process group of ``W`` ranks forms ``G`` groups of ``g = ceil(sqrt(W))``
consecutive group ranks (docs/FORMAT.md, section 9). At close:

1. every rank sends its *part* (:mod:`ucp.parts`: fragments, state tree, replica
   digests) to its group's first rank, the *leader*;
2. the leader checks its group (shapes agree, fragments fit and do not overlap,
   replicas equal), writes the group's fragments and state trees as one metadata
   shard, and sends rank 0 a :class:`GroupSummary`: per logical tensor its dtype,
   shape, element count and coverage weight (:mod:`ucp.coverage_weight`), the
   digest of each replicated piece, and the shard's size and digest;
3. rank 0 checks the summaries across groups - every tensor covered exactly once,
   replicas equal, a whole load possible - and commits the root manifest.

No rank receives more than ``max(g, G) - 1 ~ sqrt(W)`` messages (128 at 16,384
ranks) and none holds more than one group's fragments; rank 0 holds the
summaries, whose size grows with the tensors, not with the fragments.

    >>> plan = GroupPlan(10)
    >>> plan.size, [plan.ranks(k) for k in range(plan.count)]
    (4, [range(0, 4), range(4, 8), range(8, 10)])
    >>> plan.group_of(9), plan.leader(2)
    (2, 8)
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field

from ucp import checksum as _checksum
from ucp.coverage_weight import PRIME, CoverageWeights
from ucp.errors import CoverageError, LayoutError, ReplicaMismatchError, UcpError
from ucp.geometry import overlapping_regions, region_fits, region_from_dict
from ucp.manifest import Fragment, _dedupe_states
from ucp.parts import agree_logical, check_replicas, check_whole_load, failure_message
from ucp.sharded_manifest import SHARDED_FORMAT_VERSION, ShardRef, shard_key


@dataclass(frozen=True)
class GroupPlan:
    """Groups of ``ceil(sqrt(world))`` consecutive ranks; the first rank of each is its leader."""

    world: int

    @property
    def size(self) -> int:
        return max(1, math.isqrt(self.world - 1) + 1) if self.world > 1 else 1

    @property
    def count(self) -> int:
        return -(-self.world // self.size)

    def group_of(self, rank: int) -> int:
        return rank // self.size

    def ranks(self, group: int) -> range:
        return range(group * self.size, min(self.world, (group + 1) * self.size))

    def leader(self, group: int) -> int:
        return group * self.size


@dataclass
class GroupSummary:
    """What a leader tells rank 0 about its group: sizes that grow with tensors, never with fragments."""

    index: int
    failed: list[tuple[int, str]] = field(default_factory=list)  # the group's first failure, and how many
    failures: int = 0
    logical: dict[str, tuple[str, tuple[int, ...], int]] = field(default_factory=dict)  # name -> dtype, shape, rank
    cover: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (elements, weight)
    replicas: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)  # (name, region) -> digest, rank
    shard: dict | None = None  # ShardRef.to_dict() once written
    check_error: Exception | None = None  # a failed check or shard write, raised as is on every rank


def write_group_shard(
    parts: list[dict], *, index: int, ranks: range, seed: str, key_prefix: str, write
) -> GroupSummary:
    """Check one group's parts, write its shard with ``write(key, bytes)``, and summarise it for rank 0.

    A failed rank or a failed check is reported in the summary (the shard is not written), so
    rank 0 can tell every rank why the save failed.
    """
    summary = GroupSummary(index)
    failed = [(p["rank"], p["error"]) for p in parts if p.get("error")]
    if failed:
        summary.failed, summary.failures = [failed[0]], len(failed)
        return summary
    try:
        summary.logical = agree_logical(parts)
        check_replicas(parts)
        fragments = _group_fragments(parts, summary.logical)
        weights = CoverageWeights(seed)
        for name, frags in fragments.items():
            shape = summary.logical[name][1]
            summary.cover[name] = (
                sum(f.region.numel for f in frags),
                sum(weights.weight(f.region, shape) for f in frags) % PRIME,
            )
        for part in parts:
            for name, region, digest in part["replica_digests"]:
                summary.replicas.setdefault((name, str(region_from_dict(region))), (digest, part["rank"]))
        shard = {
            "format_version": SHARDED_FORMAT_VERSION,
            "ranks": [ranks.start, ranks.stop],
            "tensors": {name: [f.to_dict() for f in frags] for name, frags in sorted(fragments.items())},
            "states": _dedupe_states({p["rank"]: p["state"] for p in parts}),
        }
        data = json.dumps(shard, separators=(",", ":"), allow_nan=False).encode()
        key = shard_key(key_prefix, index)
        write(key, data)
        summary.shard = ShardRef(key, ranks.start, ranks.stop, len(data), _checksum.digest(data)).to_dict()
    except Exception as err:  # noqa: BLE001 - a failed check or write must reach rank 0, or it waits forever
        summary.check_error = err
        summary.logical, summary.cover, summary.replicas = {}, {}, {}
    return summary


def _group_fragments(parts: list[dict], logical: dict) -> dict[str, list[Fragment]]:
    """The group's fragments by tensor, each fitting its tensor and none overlapping another."""
    fragments: dict[str, list[Fragment]] = defaultdict(list)
    for part in parts:
        for name, frags in part["fragments"].items():
            fragments[name].extend(Fragment.from_dict(f) for f in frags)
    for name, frags in fragments.items():
        frags.sort(key=lambda f: (f.rank, f.key))
        shape = logical[name][1]
        bad = next((f for f in frags if not region_fits(f.region, shape)), None)
        if bad is not None:
            raise CoverageError(
                f"logical tensor {name!r} {list(shape)}: the fragment of rank {bad.rank} "
                f"({bad.region}) does not fit its shape; check the fragment maps"
            )
        pair = overlapping_regions([f.region for f in frags], shape) if len(frags) > 1 else None
        if pair is not None:
            a, b = frags[pair[0]], frags[pair[1]]
            raise CoverageError(
                f"logical tensor {name!r} {list(shape)} is not covered exactly once: fragments of ranks {a.rank} "
                f"and {b.rank} overlap ({a.region} and {b.region}); check the fragment maps (every element must "
                "belong to exactly one piece or one replica group)"
            )
    return fragments


def root_manifest(
    summaries: list[GroupSummary], first_part: dict, *, seed: str, world_size: int, created: str | None
) -> bytes:
    """The format-2 root from every group's summary (ordered by group); raises on any failed check."""
    failed = [(s.failed[0], s.failures) for s in summaries if s.failed]
    if failed:
        raise UcpError(failure_message(failed[0][0], sum(n for _, n in failed)))
    for summary in summaries:
        if summary.check_error is not None:
            raise summary.check_error
    logical: dict[str, tuple[str, tuple[int, ...], int]] = {}
    for summary in summaries:
        for name, seen in summary.logical.items():
            first = logical.setdefault(name, seen)
            if first[:2] != seen[:2]:
                raise LayoutError(
                    f"ranks disagree on logical tensor {name!r}: rank {first[2]} has {first[0]}{list(first[1])}, "
                    f"rank {seen[2]} has {seen[0]}{list(seen[1])}; fix the spec of one of them"
                )
    _check_cover(summaries, logical, seed)
    _check_replicas_across(summaries)
    check_whole_load(first_part, logical)
    holders: dict[str, list[int]] = defaultdict(list)
    for summary in summaries:
        for name, (count, _) in summary.cover.items():
            if count:
                holders[name].append(summary.index)
    root = {
        "format_version": SHARDED_FORMAT_VERSION,
        "producer": "ucp-middleware",
        "created": created,
        "world_size": world_size,
        "checksum_algorithm": first_part["checksum_algorithm"],
        "layout": first_part.get("layout"),
        "program": first_part.get("program"),
        "tensors": {
            name: {"dtype": dtype, "shape": list(shape), "shards": holders.get(name, [])}
            for name, (dtype, shape, _) in sorted(logical.items())
        },
        "shards": [s.shard for s in summaries],
        "extra": {},
    }
    return json.dumps(root, separators=(",", ":"), allow_nan=False).encode()


def _check_cover(summaries: list[GroupSummary], logical: dict, seed: str) -> None:
    """Every tensor's elements counted once and its coverage weights adding up to the whole's."""
    weights = CoverageWeights(seed)
    counts: dict[str, int] = defaultdict(int)
    sums: dict[str, int] = defaultdict(int)
    for summary in summaries:
        for name, (count, weight) in summary.cover.items():
            counts[name] += count
            sums[name] += weight
    for name, (_, shape, _) in sorted(logical.items()):
        numel = math.prod(shape)
        if counts[name] != numel or sums[name] % PRIME != weights.whole(shape):
            detail = (
                f"its fragments hold {counts[name]} of {numel} elements"
                if counts[name] != numel
                else "fragments of ranks in different groups overlap, leaving other elements unwritten"
            )
            raise CoverageError(
                f"logical tensor {name!r} {list(shape)} is not covered exactly once: {detail}; check the fragment "
                "maps (every element must belong to exactly one piece or one replica group)"
            )


def _check_replicas_across(summaries: list[GroupSummary]) -> None:
    seen: dict[tuple[str, str], tuple[str, int]] = {}
    for summary in summaries:
        for piece, (digest, rank) in summary.replicas.items():
            first = seen.setdefault(piece, (digest, rank))
            if first[0] != digest:
                raise ReplicaMismatchError(
                    f"replicas of {piece[0]!r} {piece[1]} differ between ranks [{first[1]}] vs [{rank}]; they must be "
                    "equal under the 'check-equal' policy - find why the replicas diverged, or choose policy "
                    "'take-first' or 'average'"
                )
