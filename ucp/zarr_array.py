"""What a fragment's zarr v3 array looks like on the store (docs/FORMAT.md, section 4), written and checked.

Every fragment (and every pack of small fragments) is one uncompressed zarr v3
array, chunked along dim 0 only. The same few facts describe it for the writer
(:func:`array_metadata`), for readers that open chunk files directly
(:func:`chunk_key`, :func:`chunk_count`) and for ``ucp verify``, which checks
each ``zarr.json`` against the manifest (:func:`metadata_problems`)::

    >>> meta = array_metadata((5, 3), "float32", 2, {})
    >>> chunk_count((5, 3), 2), chunk_key((5, 3), 2)
    (3, 'c.2.0')
    >>> metadata_problems({"zarr_format": 3, "node_type": "array", **meta}, shape=(5, 3), data_type="float32",
    ...                   chunk_rows=2)
    []
    >>> metadata_problems({"zarr_format": 3, "node_type": "array", **meta}, shape=(5, 3), data_type="int32",
    ...                   chunk_rows=4)
    ['data_type is "float32", the manifest says "int32"', 'chunk_shape is [2, 3], the manifest says [4, 3]']
"""

from __future__ import annotations

import json
import math
from typing import Any

# The most bytes an array's zarr.json may hold (ours are ~600 bytes).
ZARR_JSON_LIMIT = 1 << 20


def chunk_count(shape: tuple[int, ...], chunk_rows: int) -> int:
    """Chunks of an array of ``shape`` cut every ``chunk_rows`` rows (0 for an empty array)."""
    if math.prod(shape) == 0:
        return 0
    if not shape:
        return 1
    return -(-shape[0] // chunk_rows)


def chunk_key(shape: tuple[int, ...], index: int) -> str:
    """The zarr v3 default chunk key (separator ".") of chunk ``index`` along dim 0 ("c.3.0.0").

    "." rather than "/" keeps every chunk file directly in the array's directory:
    one directory per fragment, not one per dimension.
    """
    if not shape:
        return "c"
    return "c." + ".".join([str(index)] + ["0"] * (len(shape) - 1))


def chunk_shape(shape: tuple[int, ...], chunk_rows: int) -> list[int]:
    """The regular chunk grid's chunk shape: ``chunk_rows`` rows, whole along the other dims."""
    return [chunk_rows] + [max(1, s) for s in shape[1:]] if shape else []


def array_metadata(shape: tuple[int, ...], dtype: str, chunk_rows: int, attributes: dict) -> dict:
    """The members of ``zarr.json`` (besides ``zarr_format`` and ``node_type``) for an array we write."""
    return {
        "shape": list(shape),
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk_shape(shape, chunk_rows)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "fill_value": False if dtype == "bool" else [0, 0] if dtype.startswith("complex") else 0,
        "attributes": attributes,
    }


def parse_metadata(data: bytes) -> Any:
    """The JSON of a ``zarr.json`` (ValueError when it is not JSON)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"zarr.json is not valid JSON ({str(err)[:120]})") from None


def metadata_problems(
    meta: Any, *, shape: tuple[int, ...], data_type: str, chunk_rows: int, itemsize: int | None = None
) -> list[str]:
    """How ``meta`` (a parsed ``zarr.json``) differs from the array the manifest describes; [] if it does not.

    Checks what a zarr v3 reader needs to read the bytes the manifest points at:
    an array node of that shape, data type and chunk grid, with the default "."
    chunk keys and exactly the little-endian ``bytes`` codec (which may omit
    ``endian`` for one-byte types, as tensorstore writes them).
    """
    if not isinstance(meta, dict):
        return ["zarr.json is not a JSON object"]
    problems = []
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        problems.append(
            f"zarr.json is not a zarr v3 array (zarr_format {_short(meta.get('zarr_format'))}, "
            f"node_type {_short(meta.get('node_type'))})"
        )
    if meta.get("shape") != list(shape):
        problems.append(f"shape is {_short(meta.get('shape'))}, the manifest says {list(shape)}")
    if meta.get("data_type") != data_type:
        problems.append(f'data_type is {_short(meta.get("data_type"))}, the manifest says "{data_type}"')
    grid = meta.get("chunk_grid")
    found = (
        grid.get("configuration", {}).get("chunk_shape")
        if isinstance(grid, dict) and isinstance(grid.get("configuration"), dict)
        else None
    )
    if not isinstance(grid, dict) or grid.get("name") != "regular":
        problems.append(f"chunk_grid is {_short(grid)}, not a regular grid")
    elif found != chunk_shape(shape, chunk_rows):
        problems.append(f"chunk_shape is {_short(found)}, the manifest says {chunk_shape(shape, chunk_rows)}")
    if meta.get("chunk_key_encoding") != {"name": "default", "configuration": {"separator": "."}}:
        problems.append(f'chunk_key_encoding is {_short(meta.get("chunk_key_encoding"))}, not default with "."')
    codecs = meta.get("codecs")
    little = [{"name": "bytes", "configuration": {"endian": "little"}}]
    one_byte = itemsize == 1 or data_type in ("bool", "int8", "uint8")
    if codecs != little and not (
        one_byte and codecs in ([{"name": "bytes"}], [{"name": "bytes", "configuration": {}}])
    ):
        problems.append(f"codecs are {_short(codecs)}, not exactly the little-endian bytes codec")
    return problems


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
