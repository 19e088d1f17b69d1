"""The commit rule: a checkpoint exists only once its manifest is committed.

Two named strategies (docs/FORMAT.md, "Commit"):

* **rename** (local disks): writers fill a staging directory next to the
  target, ``.<name>.ucp-staging-<token>``; the coordinator writes
  ``manifest.json`` into it, fsyncs, and renames it onto the target path. A
  kill at any instant leaves either no checkpoint or a complete one, and never
  touches another checkpoint directory.
* **marker** (fsspec stores without atomic rename): writers write straight
  into the target and ``manifest.json`` is written last; it is the commit
  marker. Readers never look at a directory without one.

Ranks that save without a process group write into a shared staging location
(token ``shared``) plus one part file each (``parts/rank-00003.json``);
:func:`finalize` commits once every part is present.

Example::

    target = begin_save("ckpt/step_5", token=new_token(), overwrite=False)
    ...  # write fragments under target.storage
    commit(target, manifest)
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass

from ucp.errors import CheckpointExistsError, CheckpointNotFoundError, IncompleteCheckpointError
from ucp.manifest import MANIFEST_NAME, Manifest
from ucp.storage import Storage

PARTS_DIR = "parts"
SHARED_TOKEN = "shared"


def new_token() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class SaveTarget:
    """Where one save writes (``storage``) and where it ends up (``final``)."""

    final: Storage
    storage: Storage
    strategy: str  # "rename" or "marker"


def staging_path(final: Storage, token: str) -> str:
    parent, name = os.path.split(final.root.rstrip(os.sep))
    return os.path.join(parent, f".{name}.ucp-staging-{token}")


def open_target(url: str, *, token: str, storage_options: dict | None = None) -> SaveTarget:
    """The save target for ``url`` without touching the store (every rank calls this)."""
    final = Storage(url, storage_options=storage_options)
    if final.local:
        return SaveTarget(final, Storage(staging_path(final, token)), "rename")
    return SaveTarget(final, final, "marker")


def begin_save(url: str, *, token: str, overwrite: bool, storage_options: dict | None = None) -> SaveTarget:
    """Check the target and prepare the staging area (the coordinator calls this once)."""
    target = open_target(url, token=token, storage_options=storage_options)
    if target.final.exists(MANIFEST_NAME) and not overwrite:
        raise CheckpointExistsError(
            f"a checkpoint already exists at {target.final.display()}; pass overwrite=True to replace it "
            "or save to a new path"
        )
    if target.strategy == "rename":
        target.storage.remove()  # a stale staging area of a killed save with the same token
        os.makedirs(target.storage.root, exist_ok=True)
    elif overwrite:
        # Without rename the old checkpoint must stop being one before its files change.
        target.final.remove(MANIFEST_NAME)
        target.final.remove()
    return target


def write_part(target: SaveTarget, rank: int, part: dict) -> None:
    target.storage.write_bytes(f"{PARTS_DIR}/rank-{rank:05d}.json", json.dumps(part).encode())


def read_parts(target: SaveTarget, world_size: int) -> list[dict]:
    """Every rank's part file; IncompleteCheckpointError naming the ranks whose part is missing."""
    names = set(target.storage.listdir(PARTS_DIR))
    missing = [r for r in range(world_size) if f"rank-{r:05d}.json" not in names]
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise IncompleteCheckpointError(
            f"cannot finalize {target.final.display()}: no part from rank(s) {shown} of {world_size} "
            f"in {target.storage.display(PARTS_DIR)}; wait until every rank has closed its writer"
        )
    return [json.loads(target.storage.read_bytes(PARTS_DIR, f"rank-{r:05d}.json")) for r in range(world_size)]


def commit(target: SaveTarget, manifest: Manifest) -> None:
    """Make the checkpoint exist: manifest last, then (locally) one atomic rename."""
    target.storage.remove(PARTS_DIR)
    target.storage.write_bytes(MANIFEST_NAME, manifest.to_json().encode())
    if target.strategy == "marker":
        return
    final_root = target.final.root
    _fsync_dir(target.storage.root)
    old = None
    if os.path.exists(final_root):
        # Replacing: move the old one aside first (rename over a non-empty dir is not allowed).
        old = f"{staging_path(target.final, 'old')}-{new_token()}"
        os.rename(final_root, old)
    os.makedirs(os.path.dirname(final_root), exist_ok=True)
    os.rename(target.storage.root, final_root)
    _fsync_dir(os.path.dirname(final_root))
    if old is not None:
        Storage(old).remove()


def abort(target: SaveTarget) -> None:
    """Remove what a failed save left in its staging area (never a committed checkpoint)."""
    if target.strategy == "rename":
        target.storage.remove()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def find_manifest(url: str, *, storage_options: dict | None = None) -> Storage:
    """The storage of a committed checkpoint, or the error that says what is there instead.

    ``IncompleteCheckpointError`` only where a ucp save left traces (a staging
    directory, ``data/`` or ``parts/`` without a manifest); ``NotACheckpointError``
    for anything else that exists (another format - with the command that converts
    it -, a plain file, a device, an empty or foreign directory);
    ``CheckpointNotFoundError`` when nothing is there.
    """
    final = Storage(url, storage_options=storage_options)
    if final.exists(MANIFEST_NAME):
        return final
    if final.local:
        parent, name = os.path.split(final.root.rstrip(os.sep))
        prefix = f".{name}.ucp-staging-"
        entries = [e for e in os.listdir(parent) if e.startswith(prefix)] if os.path.isdir(parent) else []
        old = sorted(e for e in entries if e.startswith(prefix + "old-")
                     and os.path.exists(os.path.join(parent, e, MANIFEST_NAME)))
        if old and not final.exists():
            raise IncompleteCheckpointError(
                f"{final.display()} has no committed {MANIFEST_NAME}: an overwrite was interrupted after moving the "
                f"previous checkpoint to {os.path.join(parent, old[-1])}; rename that directory back to recover it"
            )
        started = bool(entries)
    else:
        started = False
    if started or _has_save_traces(final):
        raise IncompleteCheckpointError(
            f"{final.display()} has no committed {MANIFEST_NAME}: a save was started but never committed "
            "(crashed or still running); load an older checkpoint"
        )
    raise _not_a_checkpoint(final)


def _has_save_traces(final: Storage) -> bool:
    """Whether a ucp save wrote into this directory (marker stores write into the target itself)."""
    from ucp.manifest import DATA_DIR

    if final.local and not os.path.isdir(final.root):
        return False
    return final.exists(PARTS_DIR) or final.exists(DATA_DIR)


def _not_a_checkpoint(final: Storage) -> CheckpointNotFoundError:
    """The error for a path with neither a manifest nor traces of a ucp save: say what is there."""
    from ucp.errors import NotACheckpointError

    where = final.display()
    kind = _local_kind(final.root) if final.local else ("directory" if final.exists() else None)
    if kind is None:
        return CheckpointNotFoundError(f"no checkpoint at {where} (no {MANIFEST_NAME}); check the path")
    if kind not in ("file", "directory"):
        return NotACheckpointError(f"{where} is {kind}, not a ucp checkpoint (a directory with {MANIFEST_NAME})")
    fmt = _foreign_format(final.url)
    if fmt is not None:
        return NotACheckpointError(
            f"{where} is a {fmt.description} (format {fmt.name!r}), not a ucp checkpoint; convert it with: "
            f"ucp convert {where} NEW_PATH"
        )
    if kind == "file":
        return NotACheckpointError(
            f"{where} is a file, not a ucp checkpoint (a directory with {MANIFEST_NAME}), and no known format "
            f"recognises it; if it is a checkpoint of another format, name the format: ucp convert --from FORMAT "
            f"{where} NEW_PATH"
        )
    names = final.listdir()
    if not names:
        return NotACheckpointError(f"{where} is an empty directory, not a checkpoint (no {MANIFEST_NAME})")
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return NotACheckpointError(
        f"{where} is not a ucp checkpoint (no {MANIFEST_NAME}; it holds {shown}) and no known format recognises it"
    )


def _local_kind(path: str) -> str | None:
    """"file", "directory", a phrase for anything else, or None when nothing is there."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    return {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
            stat.S_IFSOCK: "a socket"}.get(stat.S_IFMT(mode), "not a regular file")


def _foreign_format(url: str):
    """The registered format that recognises ``url`` (a file or directory), or None."""
    import ucp.formats  # noqa: F401 - each format registers itself on import
    from ucp.errors import UcpError
    from ucp.formats.base import detect_format

    try:
        return detect_format(url)
    except UcpError:
        return None


def read_manifest(storage: Storage, *, problems: list | None = None) -> Manifest:
    """Read and check a committed checkpoint's manifest, refusing one larger than MAX_MANIFEST_BYTES unread.

    ``problems``: collect damaged tensor entries and state trees instead of raising (Manifest.from_dict).
    """
    from ucp.manifest import MAX_MANIFEST_BYTES

    data = storage.read_file(MANIFEST_NAME, limit=MAX_MANIFEST_BYTES,
                             allowed="a manifest may hold (ucp.manifest.MAX_MANIFEST_BYTES)")
    return Manifest.from_json(data, source=storage.display(MANIFEST_NAME), problems=problems)
