"""The manifest's JSON: its file names, format versions and limits, and strict readers of its fields.

Format 1 (:mod:`ucp.manifest`) and format 2 (:mod:`ucp.sharded_manifest`) are read side by side
with these, so neither imports the other's internals::

    >>> checked_int(3, "manifest.json: field 'world_size'", low=1)
    3
    >>> checked_int(True, "manifest.json: field 'world_size'")
    Traceback (most recent call last):
    ...
    ucp.errors.ManifestError: manifest.json: field 'world_size' must be an integer, got a boolean True
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeGuard

from ucp.errors import ManifestError

# Formats 1 and 3 are one manifest.json; 2 and 4 (ucp.sharded_manifest) a root plus metadata shards.
# 3 and 4 let a pack hold fragments of any size and number of chunks (docs/FORMAT.md, "Packs"):
# a rank's bytes go into a few large files. Readers read all four.
FORMAT_VERSION = 3
SHARDED_FORMAT_VERSION = 4
SHARDED_VERSIONS = (2, SHARDED_FORMAT_VERSION)
READABLE_VERSIONS = (1, 2, FORMAT_VERSION, SHARDED_FORMAT_VERSION)
MANIFEST_NAME = "manifest.json"
DATA_DIR = "data"

# A manifest larger than this is refused before it is read. 10^6 fragments take ~160 MB of JSON;
# parsed, JSON costs up to ~20x its size in Python objects, so the limit also bounds that.
MAX_MANIFEST_BYTES = 512 << 20
# Integers in a manifest (sizes, offsets, byte counts) fit in a signed 64-bit integer.
MAX_INT = (1 << 63) - 1


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


def json_field(data: dict, name: str, where: str) -> Any:
    try:
        return data[name]
    except KeyError:
        raise ManifestError(f"{where}: missing field {name!r}") from None


def json_type(value: Any) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)


def show_value(value: Any) -> str:
    """A short rendering of a value for a message (a huge value is described, not printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def checked_int(value: Any, where: str, *, low: int = 0, high: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"{where} must be an integer, got {json_type(value)} {show_value(value)}")
    if value < low:
        raise ManifestError(f"{where} must be >= {low}, got {show_value(value)}")
    if value > high:
        raise ManifestError(f"{where} must be <= {'2**63 - 1' if high == MAX_INT else high}, got {show_value(value)}")
    return value


def plain_int(value: Any) -> TypeGuard[int]:
    return type(value) is int and 0 <= value <= MAX_INT
