"""The manifest: plain dataclasses <-> the JSON of ``manifest.json``.

The manifest is the whole index of a checkpoint (docs/FORMAT.md): logical
tensors, the fragments that store them, the source layout and UCL program, and
each rank's non-tensor state as JSON. It is never pickled. Parsing validates
everything a loader relies on, so a damaged manifest fails here, naming the
field, instead of deep inside a read::

    >>> m = Manifest(tensors={}, states={0: {"step": 3}}, world_size=1)
    >>> Manifest.from_json(m.to_json()).states[0]
    {'step': 3}
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ucp.checksum import SUPPORTED as CHECKSUM_ALGORITHMS
from ucp.dtypes import UnsupportedDtypeError, torch_dtype
from ucp.errors import FormatVersionError, ManifestError
from ucp.fragment import Fragment  # part of the manifest's API (ucp.manifest.Fragment)
from ucp.fragment_checks import check_fragment
from ucp.geometry import overlapping_regions, tiles_exactly
from ucp.manifest_json import (  # noqa: F401 - the names, versions and limits are the manifest's API too
    DATA_DIR,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_INT,
    MAX_MANIFEST_BYTES,
    READABLE_VERSIONS,
    SHARDED_FORMAT_VERSION,
    SHARDED_VERSIONS,
    checked_int,
    json_field,
    json_type,
    parse_json,
    plain_int,
    show_value,
)
from ucp.program_record import ProgramRecord
from ucp.sharded_manifest import ShardedStates, ShardedTensors, ShardSource, parse_shard_refs
from ucp.state_schema import check_state_tree


@dataclass(frozen=True)
class TensorEntry:
    """A logical tensor and the fragments that tile it exactly once."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    fragments: tuple[Fragment, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self.fragments)


@dataclass(frozen=True)
class Manifest:
    """Everything in ``manifest.json``; ``states`` maps a writer rank to its JSON tree."""

    tensors: dict[str, TensorEntry]
    states: dict[int, Any]
    world_size: int = 1
    checksum_algorithm: str | None = None
    layout: dict | None = None
    program: ProgramRecord | None = None  # a str or dict (a rank part's JSON) is read into a record
    created: str | None = None
    producer: str = "ucp-middleware"
    extra: dict = field(default_factory=dict)
    version: int | None = None  # the format_version it was read with (None: made here, written as the newest)

    def __post_init__(self) -> None:
        if self.program is not None and not isinstance(self.program, ProgramRecord):
            object.__setattr__(self, "program", ProgramRecord.from_dict(self.program))

    def to_dict(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "producer": self.producer,
            "created": self.created,
            "world_size": self.world_size,
            "checksum_algorithm": self.checksum_algorithm,
            "layout": self.layout,
            "program": self.program.to_dict() if self.program is not None else None,
            "tensors": {
                name: {
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "fragments": [f.to_dict() for f in t.fragments],
                }
                for name, t in sorted(self.tensors.items())
            },
            "states": _dedupe_states(self.states),
            "extra": self.extra,
        }

    def to_json(self) -> str:
        """The manifest's JSON; refuses (ManifestError) a state tree that no reader would load back."""
        for rank, tree in sorted(self.states.items()):
            check_state_tree(tree, where=f"state tree of rank {rank}")
        # Compact: the C encoder is ~10x faster than an indented dump on manifests of 10^4 tensors.
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        *,
        source: str = "manifest.json",
        checkpoint: str | None = None,
        problems: list[tuple[str, ManifestError]] | None = None,
        read_shard: Callable[[str], bytes] | None = None,
    ) -> "Manifest":
        """Parse and check a manifest (see :meth:`from_dict`)."""
        return cls.from_dict(
            parse_json(text, source=source),
            source=source,
            checkpoint=checkpoint,
            problems=problems,
            read_shard=read_shard,
        )

    @classmethod
    def from_dict(
        cls,
        data: Any,
        *,
        source: str = "manifest.json",
        checkpoint: str | None = None,
        problems: list[tuple[str, ManifestError]] | None = None,
        read_shard: Callable[[str], bytes] | None = None,
    ) -> "Manifest":
        """Check everything a loader relies on and build the manifest; ManifestError names the field.

        ``source`` (the manifest file) starts messages; a state tree's name ``checkpoint``
        (the directory), as a load names it. With ``problems`` (a list), a damaged tensor
        entry or state tree is recorded there as ``(what, error)`` and left out instead of
        raising, so ``ucp verify`` can report every problem; damage to the top-level fields
        still raises. A format-2 root (sharded metadata, :mod:`ucp.sharded_manifest`) reads
        its shards through ``read_shard(key) -> bytes`` when a tensor or state is first used.
        """
        if not isinstance(data, dict):
            raise ManifestError(f"{source}: expected a JSON object at the top level")
        version = data.get("format_version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise FormatVersionError(
                f"{source} has format_version {show_value(version)}; this reader understands "
                f"{', '.join(map(str, READABLE_VERSIONS))} (upgrade ucp-middleware to read newer checkpoints)"
            )
        algorithm = json_field(data, "checksum_algorithm", source)
        if algorithm is not None and algorithm not in CHECKSUM_ALGORITHMS:
            raise ManifestError(f"{source}: unknown checksum_algorithm {show_value(algorithm)}")
        world_size = checked_int(json_field(data, "world_size", source), f"{source}: field 'world_size'", low=1)
        layout = _layout(data.get("layout"), source)
        for name in ("created", "producer"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise ManifestError(f"{source}: field {name!r} must be a string, got {json_type(data[name])}")
        extra = data.get("extra") or {}
        if not isinstance(extra, dict):
            raise ManifestError(f"{source}: field 'extra' must be an object, got {json_type(extra)}")
        raw_tensors = json_field(data, "tensors", source)
        if not isinstance(raw_tensors, dict):
            raise ManifestError(f"{source}: field 'tensors' must be an object, got {json_type(raw_tensors)}")
        header = dict(
            world_size=world_size,
            checksum_algorithm=algorithm,
            layout=layout,
            program=None if data.get("program") is None else ProgramRecord.from_dict(data["program"], source=source),
            created=data.get("created"),
            producer=data.get("producer") or "",
            extra=dict(extra),
        )
        header["version"] = version
        if version in SHARDED_VERSIONS:
            return cls._from_root(
                data,
                raw_tensors,
                header,
                source=source,
                checkpoint=checkpoint or source,
                problems=problems,
                read_shard=read_shard,
            )
        tensors = {}
        for name, t in raw_tensors.items():
            try:
                tensors[name] = _tensor_from_dict(name, t, source, algorithm, world_size)
            except ManifestError as err:
                if problems is None:
                    raise
                problems.append((name, err))
        return cls(
            tensors=tensors,
            states=_resolve_states(
                json_field(data, "states", source), source, world_size, problems, checkpoint=checkpoint or source
            ),
            **header,
        )

    @classmethod
    def _from_root(
        cls,
        data: dict,
        raw_tensors: dict,
        header: dict,
        *,
        source: str,
        checkpoint: str,
        problems: list | None,
        read_shard: Callable[[str], bytes] | None,
    ) -> "Manifest":
        """A format-2 root: the tensor index and shard list checked now, the shards read when first needed."""
        world_size, algorithm = header["world_size"], header["checksum_algorithm"]
        refs = parse_shard_refs(json_field(data, "shards", source), source, world_size)
        index = {}
        for name, entry in raw_tensors.items():
            where = f"{source}: tensor {name!r}"
            dtype, shape = _dtype_shape(entry, where)
            holders = json_field(entry, "shards", where)
            if (
                not isinstance(holders, list)
                or len(set(holders)) != len(holders)
                or not all(plain_int(i) and i < len(refs) for i in holders)
            ):
                raise ManifestError(f"{where}: field 'shards' must list distinct shard indexes below {len(refs)}")
            index[name] = (dtype, shape, tuple(holders))
        shards = ShardSource(refs, read_shard, source)

        def parse_entry(name: str, entry: dict, where: str) -> TensorEntry:
            return _tensor_from_dict(name, entry, where, algorithm, world_size)

        # Format 2: mappings that parse on first use stand in for format 1's dicts.
        return cls(
            tensors=ShardedTensors(index, shards, parse_entry, problems),  # type: ignore[arg-type]
            states=ShardedStates(world_size, shards, checkpoint),  # type: ignore[arg-type]
            **header,
        )

    @property
    def format_version(self) -> int:
        """The version it was read with; for one made here, the version it is written with."""
        if self.version is not None:
            return self.version
        return SHARDED_FORMAT_VERSION if isinstance(self.tensors, ShardedTensors) else FORMAT_VERSION

    def header(self, name: str) -> tuple[str, tuple[int, ...]]:
        """``(dtype, shape)`` of logical tensor ``name`` without reading fragments (KeyError if absent)."""
        head = getattr(self.tensors, "header", None)
        if head is not None:
            return head(name)
        entry = self.tensors[name]
        return entry.dtype, entry.shape

    def pack_extents(self, rank: int) -> dict[str, int]:
        """Pack key -> bytes its fragments reach, for the packs of writer ``rank`` (maybe more).

        Sharded metadata holds all of a rank's packs in one shard; format 1 gives every pack at once.
        """
        from_shard = getattr(self.tensors, "pack_extents", None)
        if from_shard is not None:
            return from_shard(rank)
        extents: dict[str, int] = {}
        for entry in self.tensors.values():
            for f in entry.fragments:
                if f.pack_offset is not None:
                    extents[f.key] = max(extents.get(f.key, 0), f.pack_offset + f.nbytes)
        return extents


def _label(fragment: Any, index: int) -> str:
    """A fragment's key for messages, or its position when the key is unusable."""
    key = fragment.get("key") if isinstance(fragment, dict) else None
    return repr(key) if isinstance(key, str) and 0 < len(key) <= 200 else f"#{index}"


def _layout(data: Any, source: str) -> dict | None:
    if data is None:
        return None
    from ucp.errors import UcpError
    from ucp.layout import Layout

    where = f"{source}: field 'layout'"
    if not isinstance(data, dict):
        raise ManifestError(f'{where} must be an object like {{"tp": 2, "dp": 4}}, got {json_type(data)}')
    for name, value in data.items():
        checked_int(value, f"{where}: {name[:40]!r}", high=1 << 31)
    try:
        Layout.from_dict(data)
    except (UcpError, TypeError, ValueError) as err:
        raise ManifestError(f"{where}: {err}") from None
    return data


def _dtype_shape(data: Any, where: str) -> tuple[str, tuple[int, ...]]:
    """A tensor entry's checked ``dtype`` and ``shape``."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {json_type(data)}")
    dtype = json_field(data, "dtype", where)
    try:
        itemsize = torch_dtype(dtype).itemsize if isinstance(dtype, str) else None
    except UnsupportedDtypeError as err:
        raise ManifestError(f"{where}: {err}") from None
    if itemsize is None:
        raise ManifestError(f"{where}: field 'dtype' must be a string, got {json_type(dtype)}")
    raw_shape = json_field(data, "shape", where)
    if not isinstance(raw_shape, list):
        raise ManifestError(f"{where}: field 'shape' must be a list of integers, got {json_type(raw_shape)}")
    shape = tuple(checked_int(s, f"{where}: field 'shape'") for s in raw_shape)
    if math.prod(shape) * itemsize > MAX_INT:
        raise ManifestError(f"{where}: shape {list(shape)} holds more bytes than any tensor can")
    return dtype, shape


def _tensor_from_dict(name: str, data: Any, source: str, algorithm: str | None, world_size: int) -> TensorEntry:
    where = f"{source}: tensor {name!r}"
    dtype, shape = _dtype_shape(data, where)
    itemsize = torch_dtype(dtype).itemsize
    numel = math.prod(shape)
    raw_fragments = json_field(data, "fragments", where)
    if not isinstance(raw_fragments, list):
        raise ManifestError(f"{where}: field 'fragments' must be a list, got {json_type(raw_fragments)}")
    fragments = tuple(
        Fragment._parse_plain(f) or Fragment._from_dict_checked(f, f"{where} fragment {_label(f, i)}")
        for i, f in enumerate(raw_fragments)
    )
    covered = 0
    for frag in fragments:
        check_fragment(name, frag, shape, numel, itemsize, source, algorithm, world_size)
        covered += frag.region.numel
    if covered != numel:
        raise ManifestError(
            f"{where} has shape {list(shape)} ({numel} elements) "
            f"but its fragments hold {covered} elements; the manifest is damaged - load an older checkpoint"
        )
    if len(fragments) > 1 and not tiles_exactly([f.region for f in fragments], shape):
        pair = overlapping_regions([f.region for f in fragments], shape)
        detail = (
            (
                f"fragments {fragments[pair[0]].key!r} ({fragments[pair[0]].region}) and {fragments[pair[1]].key!r} "
                f"({fragments[pair[1]].region}) overlap"
            )
            if pair
            else "some fragments overlap"
        )
        raise ManifestError(
            f"{where}: {detail}, so other elements of shape {list(shape)} are in no fragment; "
            "the manifest is damaged - load an older checkpoint"
        )
    return TensorEntry(name=name, dtype=dtype, shape=shape, fragments=fragments)


def _dedupe_states(states: dict[int, Any]) -> dict[str, Any]:
    """Ranks whose tree equals a lower rank's are written as ``{"$same_as": that_rank}``.

    Data-parallel replicas save identical trees: at thousands of ranks this keeps the
    manifest the size of the distinct trees, not of the world.
    """
    out: dict[str, Any] = {}
    first_with: dict[str, int] = {}
    for rank, tree in sorted(states.items()):
        text = json.dumps(tree, sort_keys=True, separators=(",", ":"), allow_nan=False)
        if text in first_with:
            out[str(rank)] = {"$same_as": first_with[text]}
        else:
            first_with[text] = rank
            out[str(rank)] = tree
    return out


def _resolve_states(
    data: Any, source: str, world_size: int, problems: list[tuple[str, ManifestError]] | None, *, checkpoint: str
) -> dict[int, Any]:
    """Rank -> state tree, ``$same_as`` references resolved, each tree checked (state_schema)."""
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: field 'states' must be an object, got {json_type(data)}")
    for key in data:
        if not (key.isascii() and key.isdigit() and len(key) < 12 and int(key) < world_size):
            raise ManifestError(
                f"{source}: states has key {show_value(key)}; keys must be writer ranks 0..{world_size - 1} in decimal"
            )
    states: dict[int, Any] = {}
    for key, tree in sorted(data.items(), key=lambda item: int(item[0])):
        rank = int(key)
        if isinstance(tree, dict) and set(tree) == {"$same_as"}:
            other = tree["$same_as"]
            if isinstance(other, bool) or not isinstance(other, int) or other not in states or other >= rank:
                raise ManifestError(
                    f"{source}: states[{rank}] refers to {show_value(other)}, which is not a lower rank's tree"
                )
            states[rank] = states[other]
            continue
        try:
            check_state_tree(tree, where=f"state tree of {checkpoint}" + (f" (rank {rank})" if rank else ""))
        except ManifestError as err:
            if problems is None:
                raise
            problems.append((f"states[{rank}]", err))
            tree = None
        states[rank] = tree
    return states
