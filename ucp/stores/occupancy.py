"""What is at a checkpoint's path, judged the same way on every store (the commit's safety rules).

A save never replaces something that is not a checkpoint of ours: a file, or a
directory holding anything besides what a ucp save writes::

    existing(store)          # "nothing", "empty", "checkpoint", "leftover" or "foreign"
    check_replaceable(store)  # CheckpointExistsError for "foreign"
    array_entries(manifest_bytes)  # the entries of data/ a committed checkpoint's arrays live in
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from ucp.errors import CheckpointExistsError
from ucp.manifest_json import DATA_DIR, MANIFEST_NAME

if TYPE_CHECKING:
    from ucp.stores.protocol import Store

PARTS_DIR = "parts"
# The staging token of ranks that save without a process group into one shared location
# (ucp.commit, ucp.shared_save); a store that stages under prefixes gives it none.
SHARED_TOKEN = "shared"
# Entries a save of ours puts in a checkpoint directory; a directory holding anything else is
# not one, and no save replaces it (not even with overwrite=True).
OWN_ENTRIES = (DATA_DIR, PARTS_DIR)


def existing(final: "Store") -> str:
    """What is at a save's final path: "nothing", "empty", "checkpoint", "leftover" (ours, uncommitted) or "foreign"."""
    if final.exists(MANIFEST_NAME):
        return "checkpoint"
    kind = final.kind()
    if kind is None:
        return "nothing"
    if kind != "directory":
        return "foreign"  # a file
    entries = final.listdir()
    if not entries:
        return "empty"
    if all(e in OWN_ENTRIES or e.startswith(MANIFEST_NAME) for e in entries):
        return "leftover"
    return "foreign"


def check_replaceable(final: "Store") -> None:
    """Refuse a final path that holds something that is not a checkpoint (a file, someone's directory)."""
    if existing(final) != "foreign":
        return
    if final.kind() != "directory":
        raise CheckpointExistsError(
            f"{final.display()} is a file, not a checkpoint; ucp never replaces one: remove it or save to a new path"
        )
    entries = final.listdir()
    shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
    raise CheckpointExistsError(
        f"{final.display()} is a directory that is not a checkpoint (it holds {shown}); ucp never replaces one: "
        "remove it or save to a new path"
    )


def exists_error(final: "Store") -> CheckpointExistsError:
    return CheckpointExistsError(
        f"a checkpoint already exists at {final.display()}; pass overwrite=True to replace it or save to a new path"
    )


_ENTRY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def array_entries(manifest: bytes) -> set[str]:
    """The entries of ``data/`` that hold a committed checkpoint's arrays (and metadata shards).

    An overwrite on a marker store deletes exactly these once its own manifest is in place:
    everything else under ``data/`` may be another save still in progress. Format 1 names
    every fragment's key (``<token>/r0/...`` or, from a shared save, ``r0/...``); a format-2
    root names its shards (``data/<token>/meta/...``; without a token, the arrays are
    ``data/r<rank>/``). A manifest that cannot be read gives nothing: garbage left behind is
    harmless, a deleted array is not.

    >>> sorted(array_entries(b'{"format_version":1,"tensors":{"w":{"fragments":[{"key":"5f2a/r0/000001-w"}]}}}'))
    ['5f2a']
    >>> sorted(array_entries(b'{"format_version":2,"world_size":2,"shards":[{"key":"data/meta/g00000.json"}]}'))
    ['meta', 'r0', 'r1']
    """
    try:
        data = json.loads(manifest)
        if data.get("format_version") in (2, 4):  # a sharded root (docs/FORMAT.md 9.1)
            keys = [shard["key"].split("/") for shard in data["shards"]]
            tops = {parts[1] for parts in keys if len(parts) > 2 and parts[0] == DATA_DIR}
            if "meta" in tops:
                tops |= {f"r{rank}" for rank in range(int(data["world_size"]))}
        else:
            tops = {
                fragment["key"].split("/")[0] for entry in data["tensors"].values() for fragment in entry["fragments"]
            }
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        return set()
    return {top for top in tops if isinstance(top, str) and _ENTRY.fullmatch(top) and top not in (".", "..")}
