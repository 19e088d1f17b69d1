"""Merging the ranks' parts into one manifest, with the checks a commit needs.

Each writer rank describes what it wrote in a *part* (a JSON-able dict): the
logical tensors it touched, its fragments, its non-tensor state, and digests
of its replicated pieces. The coordinator merges all parts; nothing is
committed unless

* every rank agrees on each logical tensor's shape and dtype,
* the fragments tile every logical tensor exactly once (no gap, no overlap),
* replicas under the ``check-equal`` policy hold equal values,
* a whole load could return every logical tensor: one the state tree does not
  place must not share its name with a top-level key of the tree
  (docs/FORMAT.md, "Loading a whole checkpoint").

Parts read back from files (saves without a process group) are schema-checked
first (:func:`check_part`): a damaged file is refused naming itself.

Example::

    manifest = merge_parts([part0, part1], created="2026-01-01T00:00:00Z")
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ucp.errors import CoverageError, LayoutError, ManifestError, NameConflictError, ReplicaMismatchError, UcpError
from ucp.geometry import coverage_gaps, region_from_dict
from ucp.manifest import Fragment, Manifest, TensorEntry
from ucp.program_record import ProgramRecord
from ucp.state import tensor_refs, top_level_keys

_FRAGMENT_MEMBERS = {"key": str, "rank": int, "region": dict, "nbytes": int, "chunk_rows": int}


def new_part(*, rank: int, world_size: int, checksum_algorithm: str | None) -> dict:
    return {
        "rank": rank,
        "world_size": world_size,
        "checksum_algorithm": checksum_algorithm,
        "logical": {},  # name -> {"dtype", "shape"}
        "fragments": {},  # name -> [fragment dicts]
        "replica_digests": [],  # [name, region dict, digest]
        "state": None,
        "layout": None,
        "program": None,
        "error": None,
        "overwrite": False,  # whether the rank's save may replace a checkpoint (finalize needs it)
    }


def merge_parts(parts: list[dict], *, created: str | None = None) -> Manifest:
    """One manifest from every rank's part (ordered by rank); raises on any failed check."""
    failed = [(p["rank"], p["error"]) for p in parts if p.get("error")]
    if failed:
        raise UcpError(failure_message(failed[0], len(failed)))
    world_size = parts[0]["world_size"]
    logical = agree_logical(parts)
    fragments: dict[str, list[Fragment]] = defaultdict(list)
    for part in parts:
        for name, frags in part["fragments"].items():
            fragments[name].extend(Fragment.from_dict(f) for f in frags)
    tensors = {}
    for name, (dtype, shape, _) in logical.items():
        frags = tuple(sorted(fragments.get(name, ()), key=lambda f: (f.rank, f.key)))
        uncovered, overlaps = coverage_gaps([f.region for f in frags], shape)
        if uncovered or overlaps:
            detail = f"{uncovered} element(s) not written" if uncovered else ""
            if overlaps:
                a, b = overlaps[0]
                detail += ("; " if detail else "") + (
                    f"fragments of ranks {frags[a].rank} and {frags[b].rank} overlap ({frags[a].region} and {frags[b].region})"
                )
            raise CoverageError(
                f"logical tensor {name!r} {list(shape)} is not covered exactly once: {detail}; "
                "check the fragment maps (every element must belong to exactly one piece or one replica group)"
            )
        tensors[name] = TensorEntry(name=name, dtype=dtype, shape=shape, fragments=frags)
    check_replicas(parts)
    check_whole_load(parts[0], tensors)
    first = parts[0]
    return Manifest(
        tensors=tensors,
        states={p["rank"]: p["state"] for p in parts},
        world_size=world_size,
        checksum_algorithm=first["checksum_algorithm"],
        layout=first.get("layout"),
        program=first.get("program"),
        created=created,
    )


def failure_message(first: tuple[int, str], count: int) -> str:
    """Why a save failed: the first failed rank's error, and how many ranks failed."""
    rank, error = first
    return f"save failed on rank {rank}: {error}" + (f" (and {count - 1} more ranks)" if count > 1 else "")


def agree_logical(parts: list[dict]) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """Logical tensor name -> ``(dtype, shape, first rank naming it)``; LayoutError where ranks disagree."""
    logical: dict[str, tuple[str, tuple[int, ...], int]] = {}
    for part in parts:
        for name, info in part["logical"].items():
            seen = (info["dtype"], tuple(info["shape"]), part["rank"])
            first = logical.setdefault(name, seen)
            if first[:2] != seen[:2]:
                raise LayoutError(
                    f"ranks disagree on logical tensor {name!r}: rank {first[2]} has {first[0]}{list(first[1])}, "
                    f"rank {seen[2]} has {seen[0]}{list(seen[1])}; fix the spec of one of them"
                )
    return logical


def check_replicas(parts: list[dict]) -> None:
    """ReplicaMismatchError when ranks hold different values of one replicated piece (``check-equal``)."""
    groups: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for part in parts:
        for name, region, digest in part["replica_digests"]:
            groups[(name, str(region_from_dict(region)))].append((part["rank"], digest))
    for (name, region), entries in sorted(groups.items()):
        digests = {d for _, d in entries}
        if len(digests) > 1:
            by_digest: dict[str, list[int]] = defaultdict(list)
            for rank, d in entries:
                by_digest[d].append(rank)
            groups_text = " vs ".join(str(sorted(r)) for r in sorted(by_digest.values()))
            raise ReplicaMismatchError(
                f"replicas of {name!r} {region} differ between ranks {groups_text}; they must be equal under the "
                "'check-equal' policy - find why the replicas diverged, or choose policy 'take-first' or 'average'"
            )


def check_whole_load(first: dict, tensors) -> None:
    """Refuse what ``ucp.load(path)`` could not return: an unplaced logical tensor named like a top-level key."""
    tree = first.get("state")
    placed = set(tensor_refs(tree))
    unplaced = [name for name in tensors if name not in placed]
    if not unplaced:
        return
    keys = top_level_keys(tree)
    if keys is None:
        raise NameConflictError(
            f"the state tree of rank {first['rank']} is not a dict, so ucp.load(path) could not return the logical "
            f"tensors it does not place ({', '.join(map(repr, unplaced[:5]))}); save a dict"
        )
    for name in unplaced:
        if name in keys:
            raise NameConflictError(
                f"logical tensor {name!r} is not placed by the state tree of rank {first['rank']}, which also has a "
                f"top-level key {name!r}: ucp.load(path) could not return both; rename the logical tensor (spec or "
                "program) or the state key"
            )


def check_part(part: Any, *, rank: int, world_size: int, source: str) -> dict:
    """``part`` if it is a well-formed part of rank ``rank`` of ``world_size``, else ManifestError naming ``source``."""
    problem = _part_problem(part, rank, world_size)
    if problem:
        raise ManifestError(f"{source}: {problem}; the rank's save is damaged - save that rank again")
    return part


def _part_problem(part: Any, rank: int, world_size: int) -> str | None:
    if not isinstance(part, dict):
        return "not a JSON object"
    for name in new_part(rank=0, world_size=1, checksum_algorithm=None):
        if name not in part:
            return f"missing member {name!r}"
    for name, expected in (("rank", rank), ("world_size", world_size)):
        value = part[name]
        if value != expected or isinstance(value, bool):
            told = "the file is rank " + f"{rank}'s" if name == "rank" else f"finalize was told world_size={world_size}"
            return f"member {name!r} is {value!r}, but {told}"
    for name in ("checksum_algorithm", "error"):
        if part[name] is not None and not isinstance(part[name], str):
            return f"member {name!r} is not a string or null"
    if part["program"] is not None:
        try:
            ProgramRecord.from_dict(part["program"], source="the part")
        except ManifestError as err:
            return f"member 'program' is not a UCL program record ({err})"
    if not isinstance(part["overwrite"], bool):
        return "member 'overwrite' is not true or false"
    if part["layout"] is not None and not isinstance(part["layout"], dict):
        return "member 'layout' is not an object or null"
    logical = part["logical"]
    if not isinstance(logical, dict):
        return 'member \'logical\' is not a map of tensor name to {"dtype", "shape"}'
    for name, info in logical.items():
        bad = _logical_problem(name, info)
        if bad:
            return f'member \'logical\' is not a map of tensor name to {{"dtype", "shape"}}: {bad}'
    fragments = part["fragments"]
    if not isinstance(fragments, dict) or not all(isinstance(v, list) for v in fragments.values()):
        return "member 'fragments' is not a map of tensor name to a list of fragments"
    for name, frags in fragments.items():
        if name not in logical:
            return f"member 'fragments' names {name!r}, which member 'logical' does not"
        for index, frag in enumerate(frags):
            bad = _fragment_problem(frag)
            if bad:
                return (
                    f"member 'fragments' is not a map of tensor name to a list of fragments: fragment {index} "
                    f"of {name!r}: {bad}"
                )
    digests = part["replica_digests"]
    if not isinstance(digests, list) or not all(
        isinstance(d, list)
        and len(d) == 3
        and isinstance(d[0], str)
        and isinstance(d[1], dict)
        and isinstance(d[2], str)
        for d in digests
    ):
        return "member 'replica_digests' is not a list of [name, region, digest]"
    return None


def _logical_problem(name: str, info: Any) -> str | None:
    if not isinstance(info, dict) or not isinstance(info.get("dtype"), str):
        return f"no dtype for {name!r}"
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        return f"bad shape {shape!r} of {name!r}"
    return None


def _fragment_problem(frag: Any) -> str | None:
    if not isinstance(frag, dict):
        return "not an object"
    for member in _FRAGMENT_MEMBERS:
        if member not in frag:
            return f"missing member {member!r}"
    for member, kind in _FRAGMENT_MEMBERS.items():
        if not isinstance(frag[member], kind) or isinstance(frag[member], bool):
            return f"member {member!r} is not {'an object' if kind is dict else 'a ' + kind.__name__}"
    try:
        Fragment.from_dict(frag)
    except (KeyError, TypeError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def json_safe(value: Any) -> Any:
    """Raise early (naming nothing secret) if a state tree is not JSON."""
    import json

    json.dumps(value, allow_nan=False)
    return value
