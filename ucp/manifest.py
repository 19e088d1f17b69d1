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
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from ucp.checksum import SUPPORTED as CHECKSUM_ALGORITHMS
from ucp.dtypes import UnsupportedDtypeError, torch_dtype
from ucp.errors import FormatVersionError, ManifestError
from ucp.fragment_checks import check_fragment
from ucp.geometry import Box, Region, overlapping_regions, region_from_dict, region_to_dict, tiles_exactly
from ucp.program_record import ProgramRecord
from ucp.state_schema import check_state_tree

FORMAT_VERSION = 1  # one manifest.json; format 2 (ucp.sharded_manifest) is a root plus metadata shards
SHARDED_FORMAT_VERSION = 2
READABLE_VERSIONS = (FORMAT_VERSION, SHARDED_FORMAT_VERSION)
MANIFEST_NAME = "manifest.json"
DATA_DIR = "data"

# A manifest larger than this is refused before it is read. 10^6 fragments take ~160 MB of JSON;
# parsed, JSON costs up to ~20x its size in Python objects, so the limit also bounds that.
MAX_MANIFEST_BYTES = 512 << 20
# Integers in a manifest (sizes, offsets, byte counts) fit in a signed 64-bit integer.
MAX_INT = (1 << 63) - 1


@dataclass(frozen=True)
class Fragment:
    """One stored region of one logical tensor, written by one rank.

    ``key`` is the zarr array's directory under ``data/`` (for a small, packed
    fragment: the pack array holding it at byte ``pack_offset``); ``chunk_rows`` the chunk
    length along dim 0 of the stored array; ``checksums`` one hex digest per
    chunk (empty when the checkpoint was saved without checksums).
    """

    key: str
    rank: int
    region: Region
    nbytes: int
    chunk_rows: int
    checksums: tuple[str, ...] = ()
    pack_offset: int | None = None  # set when the bytes live at this offset of the pack array ``key``

    def to_dict(self) -> dict:
        out = {
            "key": self.key,
            "rank": self.rank,
            "region": region_to_dict(self.region),
            "nbytes": self.nbytes,
            "chunk_rows": self.chunk_rows,
            "checksums": list(self.checksums),
        }
        if self.pack_offset is not None:
            out["pack_offset"] = self.pack_offset
        return out

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "fragment") -> "Fragment":
        """Parse one fragment, checking the type and range of every field (``where`` starts messages)."""
        found = cls._parse_plain(data)
        return found if found is not None else cls._from_dict_checked(data, where)

    @classmethod
    def _parse_plain(cls, data: Any) -> "Fragment | None":
        """The fast path, for the many fragments of a manifest: the fragment, or None if anything is off."""
        if type(data) is not dict:
            return None
        key, rank, nbytes, rows = data.get("key"), data.get("rank"), data.get("nbytes"), data.get("chunk_rows")
        checksums, offset = data.get("checksums", []), data.get("pack_offset")
        if not (type(key) is str and _plain_int(rank) and _plain_int(nbytes) and _plain_int(rows)
                and (offset is None or _plain_int(offset)) and type(checksums) is list
                and all(type(c) is str for c in checksums)):
            return None
        try:
            region = region_from_dict(data.get("region"))
        except ManifestError:
            return None
        values = (region.offsets + region.sizes) if isinstance(region, Box) else (region.start, region.stop)
        if values and max(values) > MAX_INT:
            return None
        return cls(key, rank, region, nbytes, rows, tuple(checksums), offset)

    @classmethod
    def _from_dict_checked(cls, data: Any, where: str) -> "Fragment":
        """:meth:`from_dict` field by field, raising the ManifestError that names what is wrong."""
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: expected a JSON object, got {_type(data)}")
        key = _field(data, "key", where)
        if not isinstance(key, str):
            raise ManifestError(f"{where}: field 'key' must be a string, got {_type(key)}")
        checksums = data.get("checksums", [])
        if not isinstance(checksums, list) or not all(isinstance(c, str) for c in checksums):
            raise ManifestError(f"{where}: field 'checksums' must be a list of strings")
        offset = data.get("pack_offset")
        return cls(
            key=key,
            rank=_int(_field(data, "rank", where), f"{where}: field 'rank'"),
            region=_region(_field(data, "region", where), where),
            nbytes=_int(_field(data, "nbytes", where), f"{where}: field 'nbytes'"),
            chunk_rows=_int(_field(data, "chunk_rows", where), f"{where}: field 'chunk_rows'"),
            checksums=tuple(checksums),
            pack_offset=None if offset is None else _int(offset, f"{where}: field 'pack_offset'"),
        )


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
    def from_json(cls, text: str | bytes, *, source: str = "manifest.json", checkpoint: str | None = None,
                  problems: list[tuple[str, ManifestError]] | None = None,
                  read_shard: Callable[[str], bytes] | None = None) -> "Manifest":
        """Parse and check a manifest (see :meth:`from_dict`)."""
        return cls.from_dict(parse_json(text, source=source), source=source, checkpoint=checkpoint,
                             problems=problems, read_shard=read_shard)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "manifest.json", checkpoint: str | None = None,
                  problems: list[tuple[str, ManifestError]] | None = None,
                  read_shard: Callable[[str], bytes] | None = None) -> "Manifest":
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
                f"{source} has format_version {_show(version)}; this reader understands "
                f"{' and '.join(map(str, READABLE_VERSIONS))} (upgrade ucp-middleware to read newer checkpoints)"
            )
        algorithm = _field(data, "checksum_algorithm", source)
        if algorithm is not None and algorithm not in CHECKSUM_ALGORITHMS:
            raise ManifestError(f"{source}: unknown checksum_algorithm {_show(algorithm)}")
        world_size = _int(_field(data, "world_size", source), f"{source}: field 'world_size'", low=1)
        layout = _layout(data.get("layout"), source)
        for name in ("created", "producer"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise ManifestError(f"{source}: field {name!r} must be a string, got {_type(data[name])}")
        extra = data.get("extra") or {}
        if not isinstance(extra, dict):
            raise ManifestError(f"{source}: field 'extra' must be an object, got {_type(extra)}")
        raw_tensors = _field(data, "tensors", source)
        if not isinstance(raw_tensors, dict):
            raise ManifestError(f"{source}: field 'tensors' must be an object, got {_type(raw_tensors)}")
        header = dict(world_size=world_size, checksum_algorithm=algorithm, layout=layout,
                      program=None if data.get("program") is None else ProgramRecord.from_dict(data["program"],
                                                                                               source=source),
                      created=data.get("created"), producer=data.get("producer") or "", extra=dict(extra))
        if version == SHARDED_FORMAT_VERSION:
            return cls._from_root(data, raw_tensors, header, source=source, checkpoint=checkpoint or source,
                                  problems=problems, read_shard=read_shard)
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
            states=_resolve_states(_field(data, "states", source), source, world_size, problems,
                                   checkpoint=checkpoint or source),
            **header,
        )

    @classmethod
    def _from_root(cls, data: dict, raw_tensors: dict, header: dict, *, source: str, checkpoint: str,
                   problems: list | None, read_shard: Callable[[str], bytes] | None) -> "Manifest":
        """A format-2 root: the tensor index and shard list checked now, the shards read when first needed."""
        from ucp.sharded_manifest import ShardedStates, ShardedTensors, ShardSource, parse_shard_refs

        world_size, algorithm = header["world_size"], header["checksum_algorithm"]
        refs = parse_shard_refs(_field(data, "shards", source), source, world_size)
        index = {}
        for name, entry in raw_tensors.items():
            where = f"{source}: tensor {name!r}"
            dtype, shape = _dtype_shape(entry, where)
            holders = _field(entry, "shards", where)
            if not isinstance(holders, list) or len(set(holders)) != len(holders) or not all(
                    _plain_int(i) and i < len(refs) for i in holders):
                raise ManifestError(f"{where}: field 'shards' must list distinct shard indexes below {len(refs)}")
            index[name] = (dtype, shape, tuple(holders))
        shards = ShardSource(refs, read_shard, source)

        def parse_entry(name: str, entry: dict, where: str) -> TensorEntry:
            return _tensor_from_dict(name, entry, where, algorithm, world_size)

        return cls(tensors=ShardedTensors(index, shards, parse_entry, problems),
                   states=ShardedStates(world_size, shards, checkpoint), **header)

    @property
    def format_version(self) -> int:
        """2 for a sharded root read from a checkpoint (its tensors come from shards), else 1."""
        return SHARDED_FORMAT_VERSION if hasattr(self.tensors, "shards_read") else FORMAT_VERSION

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


def parse_json(text: str | bytes, *, source: str = "manifest.json") -> Any:
    """``json.loads`` for manifests: strict about what RFC 8259 allows, every failure a ManifestError.

    >>> parse_json('{"a": 1e400}')
    Traceback (most recent call last):
    ...
    ucp.errors.ManifestError: manifest.json holds the number 1e400, which is out of range; the manifest is damaged - load an older checkpoint
    """
    try:
        return json.loads(text, parse_constant=_reject_constant(source), parse_float=_finite_float(source))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ManifestError(
            f"{source} is not valid JSON ({err}); the checkpoint is damaged - load an older checkpoint"
        ) from None
    except RecursionError:
        raise ManifestError(f"{source} nests deeper than JSON can be read here; the manifest is damaged") from None
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        if isinstance(err, ManifestError):
            raise
        raise ManifestError(f"{source} holds a value that cannot be read ({err}); the manifest is damaged") from None


def _reject_constant(source: str):
    def reject(name: str) -> float:
        raise ManifestError(f"{source} holds {name}, which JSON does not allow; the manifest is damaged")

    return reject


def _finite_float(source: str):
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ManifestError(
                f"{source} holds the number {text[:40]}, which is out of range; the manifest is damaged - "
                "load an older checkpoint"
            )
        return value

    return parse


def _field(data: dict, name: str, where: str) -> Any:
    try:
        return data[name]
    except KeyError:
        raise ManifestError(f"{where}: missing field {name!r}") from None


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """A short rendering of a value for a message (a huge value is described, not printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(value: Any, where: str, *, low: int = 0, high: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"{where} must be an integer, got {_type(value)} {_show(value)}")
    if value < low:
        raise ManifestError(f"{where} must be >= {low}, got {_show(value)}")
    if value > high:
        raise ManifestError(f"{where} must be <= {'2**63 - 1' if high == MAX_INT else high}, got {_show(value)}")
    return value


def _plain_int(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_INT


def _region(data: Any, where: str) -> Region:
    """The fragment's region (coordinates are ints >= 0 by region_from_dict, and fit in 64 bits here)."""
    try:
        region = region_from_dict(data)
    except ManifestError as err:
        raise ManifestError(f"{where}: field 'region': {err}") from None
    values = (region.offsets + region.sizes) if isinstance(region, Box) else (region.start, region.stop)
    if values and max(values) > MAX_INT:
        _int(max(values), f"{where}: field 'region'")
    return region


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
        raise ManifestError(f"{where} must be an object like {{\"tp\": 2, \"dp\": 4}}, got {_type(data)}")
    for name, value in data.items():
        _int(value, f"{where}: {name[:40]!r}", high=1 << 31)
    try:
        Layout.from_dict(data)
    except (UcpError, TypeError, ValueError) as err:
        raise ManifestError(f"{where}: {err}") from None
    return data


def _dtype_shape(data: Any, where: str) -> tuple[str, tuple[int, ...]]:
    """A tensor entry's checked ``dtype`` and ``shape``."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {_type(data)}")
    dtype = _field(data, "dtype", where)
    try:
        itemsize = torch_dtype(dtype).itemsize if isinstance(dtype, str) else None
    except UnsupportedDtypeError as err:
        raise ManifestError(f"{where}: {err}") from None
    if itemsize is None:
        raise ManifestError(f"{where}: field 'dtype' must be a string, got {_type(dtype)}")
    raw_shape = _field(data, "shape", where)
    if not isinstance(raw_shape, list):
        raise ManifestError(f"{where}: field 'shape' must be a list of integers, got {_type(raw_shape)}")
    shape = tuple(_int(s, f"{where}: field 'shape'") for s in raw_shape)
    if math.prod(shape) * itemsize > MAX_INT:
        raise ManifestError(f"{where}: shape {list(shape)} holds more bytes than any tensor can")
    return dtype, shape


def _tensor_from_dict(name: str, data: Any, source: str, algorithm: str | None, world_size: int) -> TensorEntry:
    where = f"{source}: tensor {name!r}"
    dtype, shape = _dtype_shape(data, where)
    itemsize = torch_dtype(dtype).itemsize
    numel = math.prod(shape)
    raw_fragments = _field(data, "fragments", where)
    if not isinstance(raw_fragments, list):
        raise ManifestError(f"{where}: field 'fragments' must be a list, got {_type(raw_fragments)}")
    fragments = tuple(Fragment._parse_plain(f) or Fragment._from_dict_checked(f, f"{where} fragment {_label(f, i)}")
                      for i, f in enumerate(raw_fragments))
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
        detail = (f"fragments {fragments[pair[0]].key!r} ({fragments[pair[0]].region}) and {fragments[pair[1]].key!r} "
                  f"({fragments[pair[1]].region}) overlap") if pair else "some fragments overlap"
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


def _resolve_states(data: Any, source: str, world_size: int, problems: list[tuple[str, ManifestError]] | None,
                    *, checkpoint: str) -> dict[int, Any]:
    """Rank -> state tree, ``$same_as`` references resolved, each tree checked (state_schema)."""
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: field 'states' must be an object, got {_type(data)}")
    for key in data:
        if not (key.isascii() and key.isdigit() and len(key) < 12 and int(key) < world_size):
            raise ManifestError(
                f"{source}: states has key {_show(key)}; keys must be writer ranks 0..{world_size - 1} in decimal"
            )
    states: dict[int, Any] = {}
    for key, tree in sorted(data.items(), key=lambda item: int(item[0])):
        rank = int(key)
        if isinstance(tree, dict) and set(tree) == {"$same_as"}:
            other = tree["$same_as"]
            if isinstance(other, bool) or not isinstance(other, int) or other not in states or other >= rank:
                raise ManifestError(f"{source}: states[{rank}] refers to {_show(other)}, which is not a lower rank's tree")
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
