"""How one rank's local tensors map onto logical tensors: the fragment map.

This is the seam between whoever knows the parallel layout (an explicit spec
written by hand, DTensor placements, or a compiled UCL program) and the
checkpoint engine, which only moves bytes. Plain frozen dataclasses, so the
compiler that produces them and the engine that consumes them are tested apart.

A local tensor (addressed by its *key*, the ``/``-joined path in the nested
state, e.g. ``"model/layers.0.attn.qkv.weight"``) holds one or more
:class:`ShardPiece` s; each piece is a region of the local tensor that equals a
region of one logical tensor. Parts of a local tensor that no piece names
(vocabulary padding, ZeRO alignment padding) are not saved, and are left
untouched on load.

Example: rank 1 of tp=2 holds rows 4..7 of an 8x3 column-parallel weight::

    >>> spec = TensorSpec(
    ...     key="model/fc.weight",
    ...     pieces=(ShardPiece("fc.weight", local=Box((0, 0), (4, 3)), target=Box((4, 0), (4, 3))),),
    ... )
    >>> fmap = FragmentMap(rank=1, logical={"fc.weight": LogicalTensor("fc.weight", (8, 3), "float32")},
    ...                    tensors={spec.key: spec})
    >>> fmap.validate()

A map also round-trips through plain JSON data (what ``ucp ucl compile`` prints)::

    >>> FragmentMap.from_dict(fmap.to_dict()) == fmap
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Any

from ucp.errors import LayoutError, ManifestError
from ucp.geometry import Box, FlatRange, Region, region_from_dict, region_to_dict

# A replicated piece is split among its replicas for writing into parts of at least
# this many bytes (at most one per replica); smaller ones are written whole by one
# replica chosen by name hash (ucp.write_units).
SPREAD_MIN_BYTES = 4 << 20
# ... and into at most this many parts, whatever the number of replicas: the fragments of a
# replicated piece (manifest entries, files, checksums) do not grow with dp. The writes still
# spread, because each piece starts at its own replica (a hash) and a rank holds many pieces.
SPREAD_MAX_PARTS = 16

REPLICA_POLICIES = ("check-equal", "take-first", "average")


@dataclass(frozen=True)
class LogicalTensor:
    """A whole, un-parallelised tensor: the unit a checkpoint is loaded by."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"


@dataclass(frozen=True)
class ShardPiece:
    """A region of a local tensor equal to a region of logical tensor ``logical``.

    Three kinds, each with equal element counts on both sides:

    * ``Box <-> Box`` of equal sizes (the local box is over the local tensor's
      shape, the target box over the logical shape);
    * ``FlatRange <-> FlatRange`` of equal length (over the row-major flattenings);
    * ``FlatRange <-> Box``: a run of the local tensor's flattening that holds the
      target box in row-major order (a ZeRO buffer's share of a row-parallel
      shard: whole rows of the box, one run of the buffer)::

        >>> ShardPiece("w", local=FlatRange(10, 16), target=Box((0, 4), (2, 3))).local.numel
        6
    """

    logical: str
    local: Region
    target: Region

    def __post_init__(self) -> None:
        if isinstance(self.local, Box) and isinstance(self.target, Box):
            if self.local.sizes != self.target.sizes:
                raise LayoutError(
                    f"piece of {self.logical!r}: local box {self.local} and target box {self.target} differ in size"
                )
        elif isinstance(self.local, FlatRange) and isinstance(self.target, (FlatRange, Box)):
            if self.local.numel != self.target.numel:
                raise LayoutError(
                    f"piece of {self.logical!r}: local {self.local} and target {self.target} differ in length"
                )
        else:
            raise LayoutError(
                f"piece of {self.logical!r}: a local box needs a target box of the same sizes, and a local flat "
                "range a target flat range or box of the same length"
            )


@dataclass(frozen=True)
class TensorSpec:
    """All pieces of one local tensor, and how it is replicated.

    ``replica``/``replicas``: this rank is replica ``replica`` of ``replicas``
    ranks holding the same pieces (e.g. the dp ranks of a non-ZeRO weight).
    Each piece is written once in total: large ones split among the replicas,
    small ones by one replica. ``policy`` says what happens when replicas differ
    (checked only where a process group is available).
    """

    key: str
    pieces: tuple[ShardPiece, ...]
    replica: int = 0
    replicas: int = 1
    policy: str = "check-equal"

    def __post_init__(self) -> None:
        if not 0 <= self.replica < self.replicas:
            raise LayoutError(f"tensor {self.key!r}: replica {self.replica} not in [0, {self.replicas})")
        if self.policy not in REPLICA_POLICIES:
            raise LayoutError(f"tensor {self.key!r}: replica policy {self.policy!r} is not one of {REPLICA_POLICIES}")


@dataclass(frozen=True)
class LocalTensor:
    """A tensor a rank holds: what the engine allocates before loading into it (padding included)."""

    key: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class FragmentMap:
    """One rank's mapping: logical tensors it touches and the spec of each local tensor.

    ``local`` (optional) gives the shape and dtype of local tensors, key -> :class:`LocalTensor`.
    Where a key has none, a load sizes the tensor from its pieces, which is exact only when no
    padding is involved; maps compiled from UCL programs give every key one.
    """

    rank: int
    logical: dict[str, LogicalTensor]
    tensors: dict[str, TensorSpec] = field(default_factory=dict)
    local: dict[str, LocalTensor] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain JSON data; :meth:`from_dict` is its inverse."""
        local = self.local
        return {
            "rank": self.rank,
            "logical": {n: {"shape": list(t.shape), "dtype": t.dtype} for n, t in self.logical.items()},
            "tensors": {
                key: {
                    "shape": list(local[key].shape) if key in local else None,
                    "dtype": local[key].dtype if key in local else None,
                    "replica": spec.replica,
                    "replicas": spec.replicas,
                    "policy": spec.policy,
                    "pieces": [
                        {"logical": p.logical, "local": region_to_dict(p.local), "target": region_to_dict(p.target)}
                        for p in spec.pieces
                    ],
                }
                for key, spec in self.tensors.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Any) -> "FragmentMap":
        """A map from :meth:`to_dict`'s data; raises LayoutError naming the bad field."""
        try:
            logical = {
                str(n): LogicalTensor(str(n), _ints(t["shape"]), _word(t["dtype"])) for n, t in data["logical"].items()
            }
            tensors, local = {}, {}
            for key, t in data["tensors"].items():
                pieces = tuple(
                    ShardPiece(str(p["logical"]), region_from_dict(p["local"]), region_from_dict(p["target"]))
                    for p in t["pieces"]
                )
                tensors[key] = TensorSpec(
                    str(key),
                    pieces,
                    _int(t.get("replica", 0)),
                    _int(t.get("replicas", 1)),
                    str(t.get("policy", "check-equal")),
                )
                if t.get("shape") is not None:
                    local[key] = LocalTensor(str(key), _ints(t["shape"]), _word(t.get("dtype")))
            fmap = cls(rank=_int(data["rank"]), logical=logical, tensors=tensors, local=local)
        except LayoutError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError, ManifestError) as err:
            raise LayoutError(f"not a fragment map: {type(err).__name__}: {err}") from None
        fmap.validate()
        return fmap

    def validate(self) -> None:
        """Check that every piece names a known logical tensor and fits in it."""
        from ucp.geometry import region_pieces

        for spec in self.tensors.values():
            for piece in spec.pieces:
                if piece.logical not in self.logical:
                    raise LayoutError(f"tensor {spec.key!r} maps onto unknown logical tensor {piece.logical!r}")
                shape = self.logical[piece.logical].shape
                try:
                    region_pieces(piece.target, shape)
                except ValueError as err:
                    raise LayoutError(f"tensor {spec.key!r} -> {piece.logical!r}: {err}") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _ints(values: Any) -> tuple[int, ...]:
    if not isinstance(values, list):
        raise TypeError(f"expected a list of integers, got {values!r}")
    return tuple(_int(v) for v in values)


def _word(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value
