"""Merging the ranks' parts into one manifest, with the checks a commit needs.

Each writer rank describes what it wrote in a *part* (a JSON-able dict): the
logical tensors it touched, its fragments, its non-tensor state, and digests
of its replicated pieces. The coordinator merges all parts; nothing is
committed unless

* every rank agrees on each logical tensor's shape and dtype,
* the fragments tile every logical tensor exactly once (no gap, no overlap),
* replicas under the ``check-equal`` policy hold equal values.

Example::

    manifest = merge_parts([part0, part1], created="2026-01-01T00:00:00Z")
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ucp.errors import CoverageError, LayoutError, ReplicaMismatchError, UcpError
from ucp.geometry import coverage_gaps, region_from_dict
from ucp.manifest import Fragment, Manifest, TensorEntry


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
    }


def merge_parts(parts: list[dict], *, created: str | None = None) -> Manifest:
    """One manifest from every rank's part (ordered by rank); raises on any failed check."""
    failed = [(p["rank"], p["error"]) for p in parts if p.get("error")]
    if failed:
        rank, error = failed[0]
        raise UcpError(f"save failed on rank {rank}: {error}" + (f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""))
    world_size = parts[0]["world_size"]
    logical: dict[str, tuple[str, tuple[int, ...], int]] = {}
    fragments: dict[str, list[Fragment]] = defaultdict(list)
    for part in parts:
        for name, info in part["logical"].items():
            seen = (info["dtype"], tuple(info["shape"]), part["rank"])
            first = logical.setdefault(name, seen)
            if first[:2] != seen[:2]:
                raise LayoutError(
                    f"ranks disagree on logical tensor {name!r}: rank {first[2]} has {first[0]}{list(first[1])}, "
                    f"rank {seen[2]} has {seen[0]}{list(seen[1])}; fix the spec of one of them"
                )
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
    _check_replicas(parts)
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


def _check_replicas(parts: list[dict]) -> None:
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


def json_safe(value: Any) -> Any:
    """Raise early (naming nothing secret) if a state tree is not JSON."""
    import json

    json.dumps(value, allow_nan=False)
    return value
