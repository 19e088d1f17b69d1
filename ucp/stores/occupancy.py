"""What is at a checkpoint's path, judged the same way on every store (the commit's safety rules).

A save never replaces something that is not a checkpoint of ours: a file, or a
directory holding anything besides what a ucp save writes::

    existing(store)          # "nothing", "empty", "checkpoint", "leftover" or "foreign"
    check_replaceable(store)  # CheckpointExistsError for "foreign"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ucp.errors import CheckpointExistsError
from ucp.manifest import DATA_DIR, MANIFEST_NAME

if TYPE_CHECKING:
    from ucp.stores.protocol import Store

PARTS_DIR = "parts"
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
        raise CheckpointExistsError(f"{final.display()} is a file, not a checkpoint; ucp never replaces one: "
                                    "remove it or save to a new path")
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
