"""One fragment of a manifest: a stored region of one logical tensor, written by one rank.

>>> Fragment.from_dict({"key": "r0/w", "rank": 0, "region": {"box": {"offsets": [0], "sizes": [4]}}, "nbytes": 16,
...                     "chunk_rows": 4}).region
Box(offsets=(0,), sizes=(4,))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ucp.errors import ManifestError
from ucp.geometry import Box, Region, region_from_dict, region_to_dict
from ucp.manifest_json import MAX_INT, checked_int, json_field, json_type, plain_int


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
        if not (
            type(key) is str
            and plain_int(rank)
            and plain_int(nbytes)
            and plain_int(rows)
            and (offset is None or plain_int(offset))
            and type(checksums) is list
            and all(type(c) is str for c in checksums)
        ):
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
            raise ManifestError(f"{where}: expected a JSON object, got {json_type(data)}")
        key = json_field(data, "key", where)
        if not isinstance(key, str):
            raise ManifestError(f"{where}: field 'key' must be a string, got {json_type(key)}")
        checksums = data.get("checksums", [])
        if not isinstance(checksums, list) or not all(isinstance(c, str) for c in checksums):
            raise ManifestError(f"{where}: field 'checksums' must be a list of strings")
        offset = data.get("pack_offset")
        return cls(
            key=key,
            rank=checked_int(json_field(data, "rank", where), f"{where}: field 'rank'"),
            region=_region(json_field(data, "region", where), where),
            nbytes=checked_int(json_field(data, "nbytes", where), f"{where}: field 'nbytes'"),
            chunk_rows=checked_int(json_field(data, "chunk_rows", where), f"{where}: field 'chunk_rows'"),
            checksums=tuple(checksums),
            pack_offset=None if offset is None else checked_int(offset, f"{where}: field 'pack_offset'"),
        )


def _region(data: Any, where: str) -> Region:
    """The fragment's region (coordinates are ints >= 0 by region_from_dict, and fit in 64 bits here)."""
    try:
        region = region_from_dict(data)
    except ManifestError as err:
        raise ManifestError(f"{where}: field 'region': {err}") from None
    values = (region.offsets + region.sizes) if isinstance(region, Box) else (region.start, region.stop)
    if values and max(values) > MAX_INT:
        checked_int(max(values), f"{where}: field 'region'")
    return region
