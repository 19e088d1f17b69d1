"""The commit rule: a checkpoint exists only once its manifest is committed.

Two named strategies (docs/FORMAT.md, "Commit"):

* **rename** (local disks): writers fill a staging directory next to the
  target, ``.<name>.ucp-staging-<token>``; the coordinator writes
  ``manifest.json`` into it, fsyncs, and renames it onto the target path with a
  rename that fails if the target exists (so a concurrent commit never gets
  replaced unasked). A kill at any instant leaves either no checkpoint or a
  complete one, and never touches another checkpoint directory.
* **marker** (fsspec stores without atomic rename): writers write straight
  into the target, under a prefix of their own, and ``manifest.json`` is written
  last (exclusively created where the store can); it is the commit marker.
  Readers never look at a directory without one.

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

from ucp.atomic_rename import rename_noreplace
from ucp.errors import CheckpointExistsError, CheckpointNotFoundError, IncompleteCheckpointError, ManifestError
from ucp.manifest import MANIFEST_NAME, Manifest
from ucp.parts import check_part
from ucp.storage import Storage

PARTS_DIR = "parts"
SHARED_TOKEN = "shared"
# Entries a save of ours puts in a checkpoint directory; a directory holding anything else is
# not one, and no save replaces it (not even with overwrite=True).
_OWN_ENTRIES = ("data", PARTS_DIR)
_COMMIT_ATTEMPTS = 20


def new_token() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class SaveTarget:
    """Where one save writes (``storage``) and where it ends up (``final``).

    ``key_prefix`` goes before every array key: on a marker store a save writes into the
    target itself, so each save's arrays get their own prefix (its token) and a concurrent
    save to the same path never writes over them.
    """

    final: Storage
    storage: Storage
    strategy: str  # "rename" or "marker"
    overwrite: bool = False
    token: str = SHARED_TOKEN
    key_prefix: str = ""


def staging_path(final: Storage, token: str) -> str:
    parent, name = os.path.split(final.root.rstrip(os.sep))
    return os.path.join(parent, f".{name}.ucp-staging-{token}")


def open_target(url: str, *, token: str, overwrite: bool = False, storage_options: dict | None = None) -> SaveTarget:
    """The save target for ``url`` without touching the store (every rank calls this)."""
    final = Storage(url, storage_options=storage_options)
    if final.local:
        return SaveTarget(final, Storage(staging_path(final, token)), "rename", overwrite, token)
    prefix = "" if token == SHARED_TOKEN else f"{token}/"
    return SaveTarget(final, final, "marker", overwrite, token, prefix)


def begin_save(url: str, *, token: str, overwrite: bool, storage_options: dict | None = None) -> SaveTarget:
    """Check the target and prepare the staging area (the coordinator calls this once)."""
    target = open_target(url, token=token, overwrite=overwrite, storage_options=storage_options)
    if existing(target.final) == "checkpoint" and not overwrite:
        raise _exists(target.final)
    check_replaceable(target.final)
    if target.strategy == "rename":
        target.storage.remove()  # a stale staging area of a killed save with the same token
        os.makedirs(target.storage.root, exist_ok=True)
    # On a marker store the old checkpoint stays whole (its arrays have other keys than this
    # save's) until the new manifest replaces it; commit then deletes the old arrays.
    return target


def existing(final: Storage) -> str:
    """What is at a save's final path: "nothing", "empty", "checkpoint", "leftover" (ours, uncommitted) or "foreign"."""
    if final.exists(MANIFEST_NAME):
        return "checkpoint"
    if not final.exists():
        return "nothing"
    if final.local and not os.path.isdir(final.root):
        return "foreign"  # a file
    entries = final.listdir()
    if not entries:
        return "empty"
    if all(e in _OWN_ENTRIES or e.startswith(MANIFEST_NAME) for e in entries):
        return "leftover"
    return "foreign"


def check_replaceable(final: Storage) -> None:
    """Refuse a final path that holds something that is not a checkpoint (a file, someone's directory)."""
    if existing(final) != "foreign":
        return
    if final.local and not os.path.isdir(final.root):
        raise CheckpointExistsError(f"{final.display()} is a file, not a checkpoint; ucp never replaces one: "
                                    "remove it or save to a new path")
    entries = final.listdir()
    shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
    raise CheckpointExistsError(
        f"{final.display()} is a directory that is not a checkpoint (it holds {shown}); ucp never replaces one: "
        "remove it or save to a new path"
    )


def _exists(final: Storage) -> CheckpointExistsError:
    return CheckpointExistsError(
        f"a checkpoint already exists at {final.display()}; pass overwrite=True to replace it or save to a new path"
    )


def write_part(target: SaveTarget, rank: int, part: dict) -> None:
    target.storage.write_bytes(f"{PARTS_DIR}/rank-{rank:05d}.json", json.dumps(part).encode())


def read_parts(target: SaveTarget, world_size: int) -> list[dict]:
    """Every rank's part file, schema-checked; IncompleteCheckpointError naming the ranks whose part is missing."""
    names = set(target.storage.listdir(PARTS_DIR))
    missing = [r for r in range(world_size) if f"rank-{r:05d}.json" not in names]
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise IncompleteCheckpointError(
            f"cannot finalize {target.final.display()}: no part from rank(s) {shown} of {world_size} "
            f"in {target.storage.display(PARTS_DIR)}; wait until every rank has closed its writer"
        )
    parts = []
    for rank in range(world_size):
        name = f"rank-{rank:05d}.json"
        source = target.storage.display(PARTS_DIR, name)
        try:
            part = json.loads(target.storage.read_bytes(PARTS_DIR, name).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise ManifestError(f"{source}: not valid UTF-8 JSON ({err}); the rank's save is damaged - save "
                                "that rank again") from None
        parts.append(check_part(part, rank=rank, world_size=world_size, source=source))
    return parts


def commit(target: SaveTarget, manifest: Manifest) -> None:
    """Make the checkpoint exist: manifest last, then (locally) one atomic rename that never replaces by accident.

    Without ``overwrite`` the commit fails (CheckpointExistsError) if a checkpoint appeared at
    the target while this save ran, e.g. another process's concurrent save: the rename itself
    refuses an existing target (:mod:`ucp.atomic_rename`), so two commits never both win.
    """
    target.storage.remove(PARTS_DIR)
    if target.strategy == "marker":
        _commit_marker(target, manifest.to_json().encode())
        return
    target.storage.write_bytes(MANIFEST_NAME, manifest.to_json().encode())
    final_root = target.final.root
    _fsync_dir(target.storage.root)
    os.makedirs(os.path.dirname(final_root), exist_ok=True)
    moved_aside = []
    for _ in range(_COMMIT_ATTEMPTS):
        try:
            rename_noreplace(target.storage.root, final_root)
            break
        except FileExistsError:
            pass
        found = existing(target.final)
        if found == "empty":
            _rmdir_quietly(final_root)  # e.g. tempfile.mkdtemp(): nothing to keep
            continue
        if found == "checkpoint" and not target.overwrite:
            raise _exists(target.final)
        check_replaceable(target.final)
        if found == "nothing":
            continue  # it went away meanwhile
        # Replacing a checkpoint (overwrite) or an uncommitted leftover: move it aside first.
        old = f"{staging_path(target.final, 'old')}-{new_token()}"
        try:
            os.rename(final_root, old)
        except FileNotFoundError:
            continue
        moved_aside.append(old)
    else:
        raise CheckpointExistsError(
            f"could not commit {target.final.display()}: other saves kept committing to it; save to a new path"
        )
    _fsync_dir(os.path.dirname(final_root))
    for old in moved_aside:  # committed: a failure to delete leaves garbage (swept later), not a failed save
        try:
            Storage(old).remove()
        except OSError:
            pass


def _commit_marker(target: SaveTarget, data: bytes) -> None:
    """Write the manifest (the commit marker); without overwrite, only if none is there yet."""
    path = target.final.path(MANIFEST_NAME)
    if target.overwrite:
        target.final.write_bytes(MANIFEST_NAME, data)  # one object replaced: old or new, never neither
        if target.key_prefix:  # now the old checkpoint's arrays (any other prefix) are garbage
            own = target.key_prefix.rstrip("/")
            for entry in target.final.listdir("data"):
                if entry != own:
                    try:
                        target.final.remove("data", entry)
                    except OSError:
                        pass  # left as garbage; readers only follow the manifest
        return
    try:  # exclusive create where the store offers it: atomic against a concurrent commit
        with target.final.fs.open(path, "xb") as fh:
            fh.write(data)
        return
    except FileExistsError:
        raise _exists(target.final) from None
    except (ValueError, NotImplementedError, TypeError):
        pass  # no exclusive create on this store: check, then write (not atomic)
    if target.final.exists(MANIFEST_NAME):
        raise _exists(target.final)
    target.final.write_bytes(MANIFEST_NAME, data)


def abort(target: SaveTarget) -> None:
    """Remove what a failed save left in its staging area (never a committed checkpoint, never another save's)."""
    if target.strategy == "rename":
        target.storage.remove()
    elif target.key_prefix:
        target.storage.remove("data", target.key_prefix.rstrip("/"))


def delete_checkpoint(url: str, *, storage_options: dict | None = None) -> None:
    """Delete a committed checkpoint so that a failure part-way never leaves one that looks complete.

    Locally the directory is first renamed to a staging name (atomic; it stops being a
    checkpoint at once, and :meth:`ucp.manager.CheckpointManager.sweep_stale_saves` removes
    what a crash leaves); on a marker store the manifest goes first.
    """
    final = Storage(url, storage_options=storage_options)
    if final.local:
        aside = f"{staging_path(final, 'deleted')}-{new_token()}"
        os.rename(final.root, aside)
        Storage(aside).remove()
        return
    final.remove(MANIFEST_NAME)
    final.remove()


def _rmdir_quietly(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty any more, or gone: the next attempt looks again


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
    return Manifest.from_json(data, source=storage.display(MANIFEST_NAME), checkpoint=storage.display(),
                              problems=problems)
