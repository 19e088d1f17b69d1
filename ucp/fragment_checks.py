"""What a reader relies on about one fragment of a manifest, checked before any byte is read.

A fragment's key must stay under ``data/``, its rank below the world size, its
region inside the tensor, its byte count match the region, its chunking be sane
(``chunk_rows`` between 1 and the rows it stores; no more than
``max(MAX_SMALL_CHUNKS, nbytes / MIN_CHUNK_BYTES)`` chunks, so no manifest asks for
millions of tiny reads) and its checksums be one digest per chunk. The check runs
once per fragment on every load, so it is one fast expression; only a fragment
that fails it is examined again, to say what is wrong::

    >>> frag = Fragment("r0/w", 0, Box((0,), (4,)), 16, 4, ("0" * 16,))
    >>> check_fragment("w", frag, (4,), 4, 4, "manifest.json", "xxh3_64", 1)
    >>> check_fragment("w", frag, (4,), 4, 4, "manifest.json", None, 1)
    Traceback (most recent call last):
    ...
    ucp.errors.ManifestError: manifest.json: tensor 'w' fragment 'r0/w': 1 checksum(s) for 1 chunk(s) (the manifest has checksum_algorithm null); the manifest is damaged - load an older checkpoint
"""

from __future__ import annotations

import re

from ucp.errors import ManifestError
from ucp.fragment import Fragment
from ucp.geometry import Box, box_fits, region_fits

# A fragment may have up to MAX_SMALL_CHUNKS chunks of any size; beyond that its chunks must
# average MIN_CHUNK_BYTES (writers aim at 32 MiB), so no manifest can ask for millions of reads.
MAX_SMALL_CHUNKS = 4096
MIN_CHUNK_BYTES = 64 << 10
_HEX_DIGEST = re.compile(r"^[0-9a-f]{16}$")

# A fragment key names a directory under data/: plain path segments only, so that a damaged
# or hostile manifest can never make a reader open a file outside the checkpoint.
_SAFE_KEY = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def check_fragment(
    name: str,
    frag: Fragment,
    shape: tuple[int, ...],
    numel: int,
    itemsize: int,
    source: str,
    algorithm: str | None,
    world_size: int,
) -> None:
    """Everything a reader relies on about one fragment, before any byte is read."""
    region = frag.region
    stored = region.sizes if isinstance(region, Box) else (region.numel,)
    rows = stored[0] if stored else 1
    chunks = 0 if region.numel == 0 else -(-rows // frag.chunk_rows) if frag.chunk_rows else -1
    fine = (
        _SAFE_KEY.match(frag.key)
        and "/./" not in f"/{frag.key}/"
        and "/../" not in f"/{frag.key}/"
        and frag.rank < world_size
        and (box_fits(region, shape) if isinstance(region, Box) else region.stop <= numel)
        and frag.nbytes == region.numel * itemsize
        and 1 <= frag.chunk_rows <= max(1, rows)
        and chunks <= max(MAX_SMALL_CHUNKS, frag.nbytes // MIN_CHUNK_BYTES)
        and (frag.pack_offset is None or chunks >= 1)
        and len(frag.checksums) == (0 if algorithm is None else chunks)
        and all(_HEX_DIGEST.match(c) for c in frag.checksums)
    )
    if not fine:  # the fast check failed: find what, and say it
        _raise_fragment_problem(name, frag, shape, itemsize, source, algorithm, world_size, rows, chunks)


def _raise_fragment_problem(
    name: str,
    frag: Fragment,
    shape: tuple[int, ...],
    itemsize: int,
    source: str,
    algorithm: str | None,
    world_size: int,
    rows: int,
    chunks: int,
) -> None:
    where = f"{source}: tensor {name!r} fragment {frag.key[:200]!r}"
    if not _SAFE_KEY.match(frag.key) or any(part in (".", "..") for part in frag.key.split("/")):
        raise ManifestError(f"{where}: a fragment key must be a relative path of plain names under data/")
    if frag.rank >= world_size:
        raise ManifestError(f"{where}: rank {frag.rank} is not below world_size {world_size}")
    if not region_fits(frag.region, shape):
        kind = "box" if isinstance(frag.region, Box) else "flat range"
        raise ManifestError(
            f"{where}: region does not fit shape {list(shape)} ({kind} {frag.region} does not fit in shape {shape})"
        )
    if frag.nbytes != frag.region.numel * itemsize:
        raise ManifestError(
            f"{where}: nbytes {frag.nbytes} does not match its region of {frag.region.numel} elements "
            f"of {itemsize} byte(s); the manifest is damaged - load an older checkpoint"
        )
    if not 1 <= frag.chunk_rows <= max(1, rows):
        raise ManifestError(
            f"{where}: chunk_rows must be between 1 and {max(1, rows)} (the rows it stores), got {frag.chunk_rows}"
        )
    if chunks > max(MAX_SMALL_CHUNKS, frag.nbytes // MIN_CHUNK_BYTES):
        raise ManifestError(
            f"{where}: chunk_rows {frag.chunk_rows} cuts {frag.nbytes} bytes into {chunks} chunks; a fragment of "
            f"more than {MAX_SMALL_CHUNKS} chunks needs chunks of {MIN_CHUNK_BYTES} bytes or more on average"
        )
    if frag.pack_offset is not None and chunks < 1:
        raise ManifestError(f"{where}: a packed fragment must not be empty (empty tensors are never packed)")
    if len(frag.checksums) != (0 if algorithm is None else chunks):
        raise ManifestError(
            f"{where}: {len(frag.checksums)} checksum(s) for {chunks} chunk(s)"
            + (" (the manifest has checksum_algorithm null)" if algorithm is None else "")
            + "; the manifest is damaged - load an older checkpoint"
        )
    raise ManifestError(f"{where}: checksums must be {algorithm} digests of 16 lowercase hex digits")


def is_safe_key(key: object) -> bool:
    """A fragment key a reader may open: plain names under ``data/``, no ``.`` or ``..`` segment.

    The same rule as :func:`check_fragment`'s, for keys read from files other than a
    manifest (replica maps, replica tiers)::

        >>> is_safe_key("r0/000001-w"), is_safe_key("r0/../../escape"), is_safe_key("/etc")
        (True, False, False)
    """
    return (
        isinstance(key, str)
        and len(key) <= 1024
        and bool(_SAFE_KEY.match(key))
        and not any(part in (".", "..") for part in key.split("/"))
    )
