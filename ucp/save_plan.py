"""What a rank's save writes, as a value: array keys, regions, chunk rows and packs, from shapes alone.

For every piece of every local tensor the plan says which sub-regions this replica writes
(:func:`ucp.write_units.write_plan`), how each is chunked (``StoreOptions.chunk_bytes``),
whether it goes into a pack of small fragments (docs/FORMAT.md, "Packs") and under which
key. :class:`~ucp.writer.CheckpointWriter` carries out these steps against a store, tensor by
tensor; the scale simulator and the tests read the same plan, so the rules exist once::

    >>> from ucp.sharding import split_fragment_map
    >>> from ucp.spec import LogicalTensor
    >>> fmap = split_fragment_map({"w": LogicalTensor("w", (4096, 1024), "float32")}, rank=1, world_size=2)
    >>> [(w.key, str(w.target), w.chunks) for w in plan_save(fmap, rank=1).writes]
    [('r1/pack-000000', '[2048:4096, 0:1024]', 1)]

The writer learns its tensors one at a time, so the plan is built by folding
:func:`plan_tensor` over them with a :class:`SaveCursor` (the next counter and the open
pack); :func:`plan_save` is that fold over a whole fragment map, with the open pack closed
at the end as ``close()`` closes it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Mapping

from ucp.dtypes import torch_dtype
from ucp.geometry import Region, region_shape
from ucp.manifest import Fragment
from ucp.spec import FragmentMap, LogicalTensor, TensorSpec
from ucp.stores.chunking import chunk_rows_for
from ucp.zarr_array import chunk_count
from ucp.stores import DEFAULT_OPTIONS, StoreOptions
from ucp.write_units import write_plan

__all__ = [
    "ClosePack",
    "SaveCursor",
    "SavePlan",
    "SaveRules",
    "WriteItem",
    "array_key",
    "close_pack",
    "plan_save",
    "plan_tensor",
]

_DIGEST = "0" * 16  # an xxh3_64 digest as the manifest writes it: 16 hex digits


def array_key(rank: int, counter: int, logical: str, *, prefix: str = "") -> str:
    """The key of a fragment's own array: ``r<rank>/<counter>-<sanitized logical name>`` (docs/FORMAT.md 1)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", logical)[:80]
    return f"{prefix}r{rank}/{counter:06d}-{safe}"


@dataclass(frozen=True)
class SaveRules:
    """The options a save plan depends on (the rest of :class:`~ucp.stores.StoreOptions` tunes I/O only).

    ``pack_max_bytes`` 0 disables packs.

    >>> SaveRules.of(StoreOptions(chunk_bytes=64), pack_max_bytes=0).chunk_bytes
    64
    """

    chunk_bytes: int = DEFAULT_OPTIONS.chunk_bytes
    pack_max_bytes: int = DEFAULT_OPTIONS.pack_max_bytes
    pack_target_bytes: int = DEFAULT_OPTIONS.pack_target_bytes
    pack_align: int = DEFAULT_OPTIONS.pack_align

    @classmethod
    def of(cls, options: StoreOptions, *, pack_max_bytes: int | None = None) -> "SaveRules":
        """The rules of ``options`` (``pack_max_bytes`` overrides the options' own, as the writer's argument does)."""
        return cls(
            options.chunk_bytes,
            options.pack_max_bytes if pack_max_bytes is None else pack_max_bytes,
            options.pack_target_bytes,
            options.pack_align,
        )


@dataclass(frozen=True)
class WriteItem:
    """One fragment: ``target`` (logical coordinates) of ``logical``, taken from ``local`` of the data of
    piece ``piece`` of local tensor ``tensor``, stored under array ``key`` (relative to ``data/``).

    Packed fragments (``pack_offset`` not None) share their pack's key: each is written into the
    open pack right away, and :class:`ClosePack` finishes the file; the others are one array each.
    """

    tensor: str
    piece: int
    logical: str
    dtype: str
    local: Region
    target: Region
    key: str
    nbytes: int
    chunk_rows: int
    chunks: int
    pack_offset: int | None = None

    def fragment(self, rank: int, checksums: tuple[str, ...] = ()) -> Fragment:
        """The manifest entry this write records (``checksums`` once known)."""
        return Fragment(
            self.key, rank, self.target, self.nbytes, self.chunk_rows, tuple(checksums), pack_offset=self.pack_offset
        )


@dataclass(frozen=True)
class ClosePack:
    """Finish the open pack ``key``: ``nbytes`` long, the alignment padding between its members included."""

    key: str
    nbytes: int


Step = WriteItem | ClosePack


@dataclass(frozen=True)
class SaveCursor:
    """Where a rank's plan stands between tensors: the next array counter and the open pack (if any)."""

    rank: int
    key_prefix: str = ""
    counter: int = 0
    pack_key: str | None = None
    pack_len: int = 0


@dataclass(frozen=True)
class SavePlan:
    """Every step of one rank's save, in order: fragment writes and pack closes."""

    rank: int
    steps: tuple[Step, ...]

    @property
    def writes(self) -> tuple[WriteItem, ...]:
        return tuple(s for s in self.steps if isinstance(s, WriteItem))

    @property
    def packs(self) -> tuple[ClosePack, ...]:
        return tuple(s for s in self.steps if isinstance(s, ClosePack))

    def fragments(self, *, checksums: bool = True) -> dict[str, list[Fragment]]:
        """logical name -> the manifest fragments this rank records; checksum values are placeholders
        of the right number (none without ``checksums``)."""
        out: dict[str, list[Fragment]] = {}
        for w in self.writes:
            out.setdefault(w.logical, []).append(w.fragment(self.rank, (_DIGEST,) * w.chunks if checksums else ()))
        return out


def plan_tensor(
    cursor: SaveCursor,
    tensor: str,
    tspec: TensorSpec,
    logical: Mapping[str, LogicalTensor],
    rules: SaveRules = SaveRules(),
) -> tuple[tuple[Step, ...], SaveCursor]:
    """The steps that save local tensor ``tensor`` (mapped by ``tspec``), and the cursor after them. Pure."""
    steps: list[Step] = []
    for index, piece in enumerate(tspec.pieces):
        lt = logical[piece.logical]
        itemsize = torch_dtype(lt.dtype).itemsize
        for local, target in write_plan(piece, piece.local.numel * itemsize, tspec):
            shape = region_shape(target)
            nbytes = math.prod(shape) * itemsize
            rows = chunk_rows_for(shape, itemsize, chunk_bytes=rules.chunk_bytes)
            chunks = chunk_count(shape, rows)
            item = WriteItem(tensor, index, lt.name, lt.dtype, local, target, "", nbytes, rows, chunks)
            if 0 < nbytes <= rules.pack_max_bytes:  # any number of chunks (format 3)
                if cursor.pack_key is None:
                    cursor = replace(
                        cursor,
                        pack_key=f"{cursor.key_prefix}r{cursor.rank}/pack-{cursor.counter:06d}",
                        counter=cursor.counter + 1,
                        pack_len=0,
                    )
                assert cursor.pack_key is not None, "a pack is open"
                steps.append(replace(item, key=cursor.pack_key, pack_offset=cursor.pack_len))
                cursor = replace(cursor, pack_len=cursor.pack_len + nbytes + (-nbytes % rules.pack_align))
                if cursor.pack_len >= rules.pack_target_bytes:
                    closed, cursor = close_pack(cursor)
                    steps += closed
            else:
                steps.append(
                    replace(item, key=array_key(cursor.rank, cursor.counter, lt.name, prefix=cursor.key_prefix))
                )
                cursor = replace(cursor, counter=cursor.counter + 1)
    return tuple(steps), cursor


def close_pack(cursor: SaveCursor) -> tuple[tuple[ClosePack, ...], SaveCursor]:
    """Close the open pack, if any (a flush, or the end of the save): the next small fragment opens a new one."""
    if cursor.pack_key is None:
        return (), cursor
    return (ClosePack(cursor.pack_key, cursor.pack_len),), replace(cursor, pack_key=None, pack_len=0)


def plan_save(fmap: FragmentMap, *, rank: int, rules: SaveRules = SaveRules(), key_prefix: str = "") -> SavePlan:
    """The save of every tensor of ``fmap`` (a save-direction map, in its order) by rank ``rank``. Pure."""
    cursor = SaveCursor(rank, key_prefix)
    steps: list[Step] = []
    for key, tspec in fmap.tensors.items():
        found, cursor = plan_tensor(cursor, key, tspec, fmap.logical, rules)
        steps += found
    steps += close_pack(cursor)[0]
    return SavePlan(rank, tuple(steps))
