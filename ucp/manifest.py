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
import re
from dataclasses import dataclass, field
from typing import Any

from ucp.checksum import SUPPORTED as CHECKSUM_ALGORITHMS
from ucp.dtypes import UnsupportedDtypeError, torch_dtype
from ucp.errors import FormatVersionError, ManifestError
from ucp.geometry import Region, region_from_dict, region_pieces, region_to_dict
from ucp.programs import ProgramRecord

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
DATA_DIR = "data"


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
    def from_dict(cls, data: dict) -> "Fragment":
        offset = data.get("pack_offset")
        return cls(
            key=str(data["key"]),
            rank=int(data["rank"]),
            region=region_from_dict(data["region"]),
            nbytes=int(data["nbytes"]),
            chunk_rows=int(data["chunk_rows"]),
            checksums=tuple(str(c) for c in data.get("checksums", ())),
            pack_offset=None if offset is None else int(offset),
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
        # Compact: the C encoder is ~10x faster than an indented dump on manifests of 10^4 tensors.
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "manifest.json") -> "Manifest":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ManifestError(
                f"{source} is not valid JSON ({err}); the checkpoint is damaged - load an older checkpoint"
            ) from None
        except RecursionError:
            raise ManifestError(f"{source} nests deeper than JSON can be read here; the manifest is damaged") from None
        return cls.from_dict(data, source=source)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "manifest.json") -> "Manifest":
        if not isinstance(data, dict):
            raise ManifestError(f"{source}: expected a JSON object at the top level")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise FormatVersionError(
                f"{source} has format_version {version!r}; this reader understands {FORMAT_VERSION} "
                "(upgrade ucp-middleware to read newer checkpoints)"
            )
        try:
            algorithm = data["checksum_algorithm"]
            if algorithm is not None and algorithm not in CHECKSUM_ALGORITHMS:
                raise ManifestError(f"{source}: unknown checksum_algorithm {algorithm!r}")
            tensors = {name: _tensor_from_dict(name, t, source) for name, t in data["tensors"].items()}
            states = _resolve_states(data["states"], source)
            return cls(
                tensors=tensors,
                states=states,
                world_size=int(data["world_size"]),
                checksum_algorithm=algorithm,
                layout=data.get("layout"),
                program=None if data.get("program") is None else ProgramRecord.from_dict(data["program"], source=source),
                created=data.get("created"),
                producer=str(data.get("producer", "")),
                extra=dict(data.get("extra") or {}),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ManifestError(f"{source}: malformed field ({type(err).__name__}: {err})") from None


def _tensor_from_dict(name: str, data: dict, source: str) -> TensorEntry:
    try:
        torch_dtype(data["dtype"])
    except UnsupportedDtypeError as err:
        raise ManifestError(f"{source}: tensor {name!r}: {err}") from None
    shape = tuple(int(s) for s in data["shape"])
    if any(s < 0 for s in shape):
        raise ManifestError(f"{source}: tensor {name!r} has a negative dimension in shape {list(shape)}")
    fragments = tuple(Fragment.from_dict(f) for f in data["fragments"])
    itemsize = torch_dtype(data["dtype"]).itemsize
    covered = 0
    for frag in fragments:
        _check_fragment_fields(name, frag, itemsize, source)
        try:
            region_pieces(frag.region, shape)
        except ValueError as err:
            raise ManifestError(
                f"{source}: tensor {name!r} fragment {frag.key!r}: region does not fit shape {list(shape)} ({err})"
            ) from None
        covered += frag.region.numel
    if covered != math.prod(shape):
        raise ManifestError(
            f"{source}: tensor {name!r} has shape {list(shape)} ({math.prod(shape)} elements) "
            f"but its fragments hold {covered} elements; the manifest is damaged - load an older checkpoint"
        )
    return TensorEntry(name=name, dtype=str(data["dtype"]), shape=shape, fragments=fragments)


# A fragment key names a directory under data/: plain path segments only, so that a damaged
# or hostile manifest can never make a reader open a file outside the checkpoint.
_SAFE_KEY = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def _check_fragment_fields(name: str, frag: Fragment, itemsize: int, source: str) -> None:
    where = f"{source}: tensor {name!r} fragment {frag.key!r}"
    if not _SAFE_KEY.match(frag.key) or any(part in (".", "..") for part in frag.key.split("/")):
        raise ManifestError(f"{where}: a fragment key must be a relative path of plain names under data/")
    if frag.pack_offset is not None and frag.pack_offset < 0:
        raise ManifestError(f"{where}: negative pack_offset {frag.pack_offset}")
    if frag.chunk_rows < 1:
        raise ManifestError(f"{where}: chunk_rows must be >= 1, got {frag.chunk_rows}")
    if frag.nbytes != frag.region.numel * itemsize:
        raise ManifestError(
            f"{where}: nbytes {frag.nbytes} does not match its region of {frag.region.numel} elements "
            f"of {itemsize} byte(s); the manifest is damaged - load an older checkpoint"
        )


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


def _resolve_states(data: dict, source: str) -> dict[int, Any]:
    states: dict[int, Any] = {}
    for key, tree in sorted(data.items(), key=lambda item: int(item[0])):
        rank = int(key)
        if isinstance(tree, dict) and set(tree) == {"$same_as"}:
            other = tree["$same_as"]
            if isinstance(other, bool) or not isinstance(other, int) or other not in states or other >= rank:
                raise ManifestError(f"{source}: states[{rank}] refers to {other!r}, which is not a lower rank's tree")
            tree = states[other]
        states[rank] = tree
    return states
