"""The commit rule: a checkpoint exists only once its manifest is committed.

Each store owns its commit strategy (:mod:`ucp.stores`; docs/FORMAT.md, "Commit"):

* **rename** (:class:`~ucp.stores.local.LocalStore`): writers fill a staging
  directory next to the target, ``.<name>.ucp-staging-<token>``; the coordinator
  writes ``manifest.json`` into it, fsyncs, and renames it onto the target path
  with a rename that fails if the target exists (so a concurrent commit never gets
  replaced unasked). A kill at any instant leaves either no checkpoint or a
  complete one, and never touches another checkpoint directory.
* **marker** (object and fsspec stores, without atomic rename): writers write
  straight into the target, under a prefix of their own, and ``manifest.json`` is
  written last (exclusively created where the store can: an S3 conditional put);
  it is the commit marker. Readers never look at a directory without one.

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
import uuid
from dataclasses import dataclass

from ucp.errors import CheckpointNotFoundError, IncompleteCheckpointError, ManifestError
from ucp.format_hook import recognise
from ucp.manifest import MANIFEST_NAME, Manifest
from ucp.parts import check_part
from ucp.stores import Store, StoreOptions, open_store
from ucp.stores.occupancy import PARTS_DIR, SHARED_TOKEN, check_replaceable, existing, exists_error

__all__ = [
    "PARTS_DIR",
    "SHARED_TOKEN",
    "SaveTarget",
    "new_token",
    "open_target",
    "begin_save",
    "existing",
    "check_replaceable",
    "write_part",
    "read_parts",
    "commit",
    "abort",
    "delete_checkpoint",
    "find_manifest",
    "read_manifest",
]


def new_token() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class SaveTarget:
    """Where one save writes (``storage``) and where it ends up (``final``).

    ``key_prefix`` goes before every array key: on a marker store a save writes into the
    target itself, so each save's arrays get their own prefix (its token) and a concurrent
    save to the same path never writes over them.
    """

    final: Store
    storage: Store
    overwrite: bool = False
    token: str = SHARED_TOKEN
    key_prefix: str = ""

    @property
    def strategy(self) -> str:
        return self.final.strategy


def open_target(
    url: str,
    *,
    token: str,
    overwrite: bool = False,
    storage_options: dict | None = None,
    options: StoreOptions | None = None,
) -> SaveTarget:
    """The save target for ``url`` without touching the store (every rank calls this)."""
    final = open_store(url, storage_options=storage_options, options=options)
    staged, prefix = final.staging(token)
    return SaveTarget(final, staged, overwrite, token, prefix)


def begin_save(
    url: str, *, token: str, overwrite: bool, storage_options: dict | None = None, options: StoreOptions | None = None
) -> SaveTarget:
    """Check the target and prepare the staging area (the coordinator calls this once)."""
    target = open_target(url, token=token, overwrite=overwrite, storage_options=storage_options, options=options)
    if existing(target.final) == "checkpoint" and not overwrite:
        raise exists_error(target.final)
    check_replaceable(target.final)
    target.final.prepare_staging(target.storage, shared=False, overwrite=overwrite)
    return target


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
            raise ManifestError(
                f"{source}: not valid UTF-8 JSON ({err}); the rank's save is damaged - save that rank again"
            ) from None
        parts.append(check_part(part, rank=rank, world_size=world_size, source=source))
    return parts


def commit(target: SaveTarget, manifest: Manifest | bytes) -> None:
    """Make the checkpoint exist by the store's own strategy (manifest last; never replacing by accident).

    ``manifest``: a Manifest, or the JSON of a format-2 root (its shards already written).

    Without ``overwrite`` the commit fails (CheckpointExistsError) if a checkpoint appeared at
    the target while this save ran, e.g. another process's concurrent save.
    """
    target.storage.remove(PARTS_DIR)
    data = manifest if isinstance(manifest, bytes) else manifest.to_json().encode()
    target.final.commit(target.storage, data, overwrite=target.overwrite, key_prefix=target.key_prefix)


def abort(target: SaveTarget) -> None:
    """Remove what a failed save left in its staging area (never a committed checkpoint, never another save's)."""
    target.final.discard(target.storage, target.key_prefix)


def delete_checkpoint(url: str, *, storage_options: dict | None = None) -> None:
    """Delete a committed checkpoint so that a failure part-way never leaves one that looks complete.

    Locally the directory is first renamed to a staging name (atomic; it stops being a
    checkpoint at once, and :meth:`ucp.manager.CheckpointManager.sweep_stale_saves` removes
    what a crash leaves); on a marker store the manifest goes first.
    """
    open_store(url, storage_options=storage_options).delete()


def find_manifest(url: str, *, storage_options: dict | None = None, options: StoreOptions | None = None) -> Store:
    """The storage of a committed checkpoint, or the error that says what is there instead.

    ``IncompleteCheckpointError`` only where a ucp save left traces (a staging
    directory, ``data/`` or ``parts/`` without a manifest); ``NotACheckpointError``
    for anything else that exists (another format - with the command that converts
    it -, a plain file, a device, an empty or foreign directory);
    ``CheckpointNotFoundError`` when nothing is there.
    """
    final = open_store(url, storage_options=storage_options, options=options)
    if final.exists(MANIFEST_NAME):
        return final
    unfinished = final.unfinished_save()
    if unfinished is not None:
        raise IncompleteCheckpointError(unfinished)
    raise _not_a_checkpoint(final)


def _not_a_checkpoint(final: Store) -> CheckpointNotFoundError:
    """The error for a path with neither a manifest nor traces of a ucp save: say what is there."""
    from ucp.errors import NotACheckpointError

    where = final.display()
    kind = final.kind()
    if kind is None:
        return CheckpointNotFoundError(f"no checkpoint at {where} (no {MANIFEST_NAME}); check the path")
    if kind not in ("file", "directory"):
        return NotACheckpointError(f"{where} is {kind}, not a ucp checkpoint (a directory with {MANIFEST_NAME})")
    fmt = recognise(final.url)
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


def read_manifest(storage: Store, *, problems: list | None = None) -> Manifest:
    """Read and check a committed checkpoint's manifest, refusing one larger than MAX_MANIFEST_BYTES unread.

    ``problems``: collect damaged tensor entries and state trees instead of raising (Manifest.from_dict).
    """
    from ucp.manifest import MAX_MANIFEST_BYTES
    from ucp.sharded_manifest import MAX_SHARD_BYTES

    def read_shard(key: str) -> bytes:
        return storage.read_file(
            key, limit=MAX_SHARD_BYTES, allowed="a metadata shard may hold (ucp.sharded_manifest.MAX_SHARD_BYTES)"
        )

    data = storage.read_file(
        MANIFEST_NAME, limit=MAX_MANIFEST_BYTES, allowed="a manifest may hold (ucp.manifest.MAX_MANIFEST_BYTES)"
    )
    return Manifest.from_json(
        data,
        source=storage.display(MANIFEST_NAME),
        checkpoint=storage.display(),
        problems=problems,
        read_shard=read_shard,
    )
