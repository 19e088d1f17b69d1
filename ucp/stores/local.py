"""The local-disk store: plain chunk files written and read by a few threads, committed by one atomic rename.

Every array is written as its plain files (``zarr.json`` and the raw chunk
files, the same bytes tensorstore writes) straight from the tensor's memory,
each chunk hashed piece by piece right before it is written and fsynced right
after; packs of small tensors are written the same way. Chunk files are read
with plain reads straight into their destination (docs/FORMAT.md, section 8,
says why); every read is confined to the checkpoint root (:mod:`ucp.confined`).
``StoreOptions(direct_writes=False, direct_reads=False)`` sends multi-chunk
arrays through tensorstore's ``file`` driver instead (the reference).

Commit (strategy "rename"): writers fill ``.<name>.ucp-staging-<token>`` beside
the target; the manifest goes in last, everything is fsynced, and the
directory is renamed onto the target with a rename that never replaces
(:mod:`ucp.atomic_rename`).

Example::

    store = LocalStore("/tmp/ckpt")
    store.write_bytes("notes/a.json", b"{}")
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ucp import confined
from ucp.atomic_rename import rename_noreplace
from ucp.errors import CheckpointExistsError, TensorTooLargeError
from ucp.file_io import BounceBuffers, fsync_path, little_endian, on_memory_fs, write_all
from ucp.manifest_json import MANIFEST_NAME
from ucp.stores import errors
from ucp.stores.base import BaseStore
from ucp.stores.occupancy import check_replaceable, existing, exists_error
from ucp.stores.options import StoreOptions
from ucp.stores.staging_owner import owner_state, remove_markers, write_marker
from ucp.zarr_array import array_metadata, chunk_count, chunk_key

if TYPE_CHECKING:
    from ucp.stores.tensorstore_arrays import TensorstoreArrays

_COMMIT_ATTEMPTS = 20


def staging_path(root: str, token: str) -> str:
    """Where a save with ``token`` to ``root`` writes before its commit: ``.<name>.ucp-staging-<token>`` beside it."""
    parent, name = os.path.split(root.rstrip(os.sep))
    return os.path.join(parent, f".{name}.ucp-staging-{token}")


class LocalStore(BaseStore):
    """A directory on a local (or locally mounted) file system."""

    strategy = "rename"

    def __init__(self, path: str | os.PathLike, *, options: StoreOptions | None = None) -> None:
        root = os.path.abspath(os.fspath(path).removeprefix("file://"))
        # No fsspec and no tensorstore until something needs them: a fresh process (recovery)
        # would pay ~0.5 s of imports on its first save or load.
        super().__init__(os.fspath(path), None, root, options=options)
        self._synced: set[str] = set()  # chunk files already fsynced by their writer thread
        self._real_root: str | None = None  # the resolved root, once a read needs it (see ucp.confined)
        self._bounce: BounceBuffers | bool | None = None  # False: on a memory file system, never

    @property
    def fs(self) -> Any:
        """fsspec's local filesystem (for callers that want one; the store itself uses ``os``)."""
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("file")
        return self._fs

    def _tensorstore_arrays(self) -> TensorstoreArrays:
        from ucp.stores.tensorstore_arrays import TensorstoreArrays

        return TensorstoreArrays(
            self.context,
            lambda rel: {"driver": "file", "path": self.path(rel) + "/"},
            display=self.display,
            before_read=self._check_confined,
        )

    # -- names and plain bytes ------------------------------------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def display(self, *parts: str) -> str:
        return self.path(*parts)

    def exists(self, *parts: str) -> bool:
        return os.path.lexists(self.path(*parts))

    def read_bytes(self, *parts: str) -> bytes:
        with open(self.path(*parts), "rb") as fh:
            return fh.read()

    def remove(self, *parts: str) -> None:
        path = self.path(*parts)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)

    def listdir(self, *parts: str) -> list[str]:
        path = self.path(*parts)
        if os.path.isdir(path):
            return sorted(os.listdir(path))
        return [os.path.basename(path)] if os.path.lexists(path) else []

    def kind(self) -> str | None:
        """ "file", "directory", a phrase for anything else, or None when nothing is there."""
        try:
            mode = os.stat(self.root).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISREG(mode):
            return "file"
        if stat.S_ISDIR(mode):
            return "directory"
        return {
            stat.S_IFIFO: "a FIFO",
            stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device",
            stat.S_IFSOCK: "a socket",
        }.get(stat.S_IFMT(mode), "not a regular file")

    def makedirs(self) -> None:
        os.makedirs(self.root, exist_ok=True)

    def read_file(self, rel: str, *, limit: int, allowed: str) -> bytes:
        """A whole file of at most ``limit`` bytes, regular and inside the root (else UnsafePathError).

        ``allowed`` ends the refusal: "... more than the N that {allowed}".
        """
        return confined.read_inside(self.root, rel, limit=limit, size_limit=limit, real=self._real(), allowed=allowed)[
            0
        ]

    def read_range(self, rel: str, start: int, length: int, *, what: str | None = None) -> tuple[bytes, int | None]:
        """Bytes ``[start, start + length)`` of a file (fewer at its end) and the file's size."""
        return confined.read_inside(self.root, rel, limit=length, start=start, real=self._real(), what=what)

    def file_size(self, rel: str, *, what: str | None = None) -> int:
        """The size of a file that may be read (regular, inside the root, else UnsafePathError)."""
        fd, info = confined.open_inside(self.root, rel, real=self._real(), what=what)
        os.close(fd)
        return info.st_size

    def write_bytes(self, rel: str, data: bytes | memoryview) -> None:
        """Write a small file durably and atomically, never outside the root (:func:`ucp.confined.write_inside`)."""
        os.makedirs(self.root, exist_ok=True)
        confined.write_inside(self.root, rel, data, real=self._real())

    def _real(self) -> str:
        if self._real_root is None:
            self._real_root = confined.real_root(self.root)
        return self._real_root

    # -- writing arrays -------------------------------------------------------------
    def _writes_plain(self, array: np.ndarray, shape: tuple[int, ...], chunk_rows: int) -> bool:
        return self.options.direct_writes or super()._writes_plain(array, shape, chunk_rows)

    def _write_plain(
        self,
        rel: str,
        array: np.ndarray,
        *,
        dtype: str,
        chunk_rows: int,
        attributes: dict,
        hasher: Callable[[], Any] | None,
    ) -> list[Future]:
        """Each chunk file written straight from ``array``'s memory by a few threads and fsynced there.

        No copy: an edge chunk gets its zero fill by extending the file.
        """
        shape = tuple(array.shape)
        array = little_endian(array)
        rest = math.prod(max(1, s) for s in shape[1:]) if shape else 1
        full = chunk_rows * rest * array.itemsize if shape else array.itemsize
        directory = self._create_array(rel, array_metadata(shape, dtype, chunk_rows, attributes))
        pool = self._pool()
        return [
            pool.submit(
                self._write_file,
                os.path.join(directory, chunk_key(shape, i)),
                [array[i * chunk_rows : (i + 1) * chunk_rows] if shape else array],
                1,
                full,
                hasher,
            )
            for i in range(chunk_count(shape, chunk_rows))
        ]

    def write_pack(
        self, rel: str, arrays: list[np.ndarray], *, align: int, hasher: Callable[[], Any] | None = None
    ) -> Future:
        """Write a pack (docs/FORMAT.md, "Packs"): ``arrays``' bytes back to back, each at a multiple of ``align``.

        A future of the list of the arrays' hex digests (Nones without ``hasher``).
        """
        arrays = [little_endian(a) for a in arrays]
        total = sum(a.nbytes + (-a.nbytes % align) for a in arrays)
        directory = self._create_array(rel, array_metadata((total,), "uint8", total, {"ucp": {"pack": True}}))
        return self._pool().submit(
            self._write_file, os.path.join(directory, chunk_key((total,), 0)), arrays, align, total, hasher, every=True
        )

    def open_pack(self, rel: str) -> Any:
        """A pack written in place by the I/O threads, straight from each fragment's memory."""
        from ucp.stores.pack_files import LocalPackWriter

        return LocalPackWriter(
            self.path(rel),
            self._pool(),
            piece_bytes=self.options.write_piece_bytes,
            fresh=self.reused,
            on_synced=self._synced.add,
            bounce=self._bounce_buffers(),
        )

    def _bounce_buffers(self) -> BounceBuffers | None:
        """The bounce buffers of unbuffered pack writes; None on a memory file system or when turned off."""
        if self._bounce is None and self.options.unbuffered_packs:
            os.makedirs(self.root, exist_ok=True)
            self._bounce = False if on_memory_fs(self.root) else BounceBuffers(self.options.write_piece_bytes)
        return self._bounce if isinstance(self._bounce, BounceBuffers) else None

    def close(self) -> None:
        super().close()
        if isinstance(self._bounce, BounceBuffers):
            self._bounce.close()
        self._bounce = None

    def _read_packed_into(
        self, rel: str, start: int, outs: list[np.ndarray], what: str, digest: Callable[[np.ndarray], str] | None
    ) -> list[str | None]:
        """One ``preadv`` straight into the destinations, after the file's size is checked."""
        name = chunk_key((1,), 0)
        nbytes = sum(o.nbytes for o in outs)
        try:
            size, got = confined.read_range_into(
                self.root,
                os.path.join(rel, name),
                start,
                [o.reshape(-1).view(np.uint8).data for o in outs],
                real=self._real(),
                what=what,
            )
        except FileNotFoundError:
            raise errors.missing(what, self.path(rel, name)) from None
        if got != nbytes:
            raise errors.short_pack(what, self.path(rel, name), start, start + nbytes, max(0, size - start))
        return [digest(o) if digest is not None else None for o in outs]

    def _create_array(self, rel: str, metadata: dict) -> str:
        """Write an array's ``zarr.json``; its directory."""
        directory = self.path(rel)
        if self.reused and os.path.isdir(directory):
            shutil.rmtree(directory)  # a killed earlier attempt's files must not linger
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "zarr.json"), "wb") as fh:
            fh.write(json.dumps({"zarr_format": 3, "node_type": "array", **metadata}).encode())
        return directory

    def _write_file(
        self,
        path: str,
        arrays: list[np.ndarray],
        align: int,
        size: int,
        hasher: Callable | None,
        *,
        every: bool = False,
    ) -> Any:
        """Write ``arrays`` into one file (each padded to ``align``), zero-filled up to ``size``; fsync it.

        Each piece is hashed right before it is written, so the write reads it from cache.
        Returns the digest of every array (``every``) or of the first.
        """
        found = []
        zeros = bytes(align)
        piece_bytes = self.options.write_piece_bytes
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for array in arrays:
                digest = hasher() if hasher is not None else None
                view = array.reshape(-1).view(np.uint8).data
                for start in range(0, view.nbytes, piece_bytes):
                    piece = view[start : start + piece_bytes]
                    if digest is not None:
                        digest.update(piece)
                    write_all(fd, piece)
                if view.nbytes % align:
                    write_all(fd, memoryview(zeros)[: -view.nbytes % align])
                found.append(digest.hexdigest() if digest is not None else None)
            if size > os.lseek(fd, 0, os.SEEK_CUR):
                os.ftruncate(fd, size)  # an edge chunk's fill: zeros, as tensorstore writes it
            # Synced here, while other files are still being written, not all at the end.
            os.fsync(fd)
        finally:
            os.close(fd)
        self._synced.add(path)
        return found if every else found[0]

    def sync(self, under: str = "") -> None:
        """Make everything written under ``root/under`` durable (before a commit depends on it).

        Each file (and directory, up to the root) is fsynced, a few at a time: with small
        fragments packed there are few files, and unlike syncfs(2) this never waits for other
        processes' writes. Ranks sharing one staging root each pass their own ``under``: the
        other ranks' directories are still being written (temporary files come and go).
        """
        top = os.path.join(self.root, under) if under else self.root
        if not os.path.isdir(top):
            return
        paths = []
        for dirpath, _, files in os.walk(top):
            paths.append(dirpath)
            paths.extend(p for p in (os.path.join(dirpath, name) for name in files) if p not in self._synced)
        parent = top
        while os.path.normpath(parent) != os.path.normpath(self.root):  # the new entries' directories
            parent = os.path.dirname(parent)
            paths.append(parent)
        list(self._pool().map(fsync_path, paths))

    # -- reading arrays -------------------------------------------------------------
    def read_chunk(
        self, rel: str, shape: tuple[int, ...], dtype: str, index: int, chunk_rows: int, *, what: str
    ) -> Future:
        if not self.options.direct_reads:
            return super().read_chunk(rel, shape, dtype, index, chunk_rows, what=what)
        return self._pool().submit(self._read_direct, rel, shape, dtype, index, chunk_rows, what)

    def read_chunk_into(
        self,
        rel: str,
        shape: tuple[int, ...],
        dtype: str,
        index: int,
        chunk_rows: int,
        out: np.ndarray,
        *,
        what: str,
        digest: Callable[[np.ndarray], str] | None = None,
    ) -> Future:
        if not self.options.direct_reads:
            return super().read_chunk_into(rel, shape, dtype, index, chunk_rows, out, what=what, digest=digest)

        def job() -> str | None:
            self._read_direct(rel, shape, out.dtype.str, index, chunk_rows, what, out=out)
            return digest(out) if digest is not None else None

        return self._pool().submit(job)

    def _read_direct(
        self,
        rel: str,
        shape: tuple[int, ...],
        dtype: str,
        index: int,
        chunk_rows: int,
        what: str,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Only the chunk's valid rows are read (an edge chunk is stored full-size); the file's size is
        checked against the full chunk, so a truncated or padded file is reported."""
        np_dtype = np.dtype(dtype).newbyteorder("<")
        rest = tuple(shape[1:])
        rows = min(chunk_rows, shape[0] - index * chunk_rows) if shape else 1
        if out is None:
            try:
                out = np.empty((rows,) + rest if shape else (), dtype=np_dtype)
            except MemoryError:  # a chunk the manifest says is larger than this host's memory
                raise TensorTooLargeError(
                    f"{what}: cannot hold chunk {index} ({rows} rows of {list(rest)} {np_dtype.name}) in memory"
                ) from None
        full = (chunk_rows * math.prod(max(1, s) for s in rest) if shape else 1) * np_dtype.itemsize
        path = self.path(rel, chunk_key(shape, index))
        try:
            size, got = confined.read_exact_into(
                self.root,
                os.path.join(rel, chunk_key(shape, index)),
                out.reshape(-1).data.cast("B"),
                size=full,
                real=self._real(),
                what=what,
            )
        except FileNotFoundError:
            raise errors.missing(what, path) from None
        if size != full or got != out.nbytes:
            raise errors.wrong_size(what, path, size, full)
        return out

    def _check_confined(self, rel: str, name: str, limit: int, what: str) -> None:
        """Before tensorstore opens a local file itself: it must be one ucp.confined would read."""
        try:
            self.file_size(os.path.join(rel, name), what=what)
        except FileNotFoundError:
            pass  # tensorstore reports it, as for any missing key

    # -- the commit strategy: a staging directory renamed onto the target --------------
    def staging(self, token: str) -> tuple["LocalStore", str]:
        return LocalStore(staging_path(self.root, token), options=self.options), ""

    def prepare_staging(self, staged: "LocalStore", *, shared: bool, overwrite: bool) -> None:
        if not shared:
            staged.remove()  # a stale staging area of a killed save with the same token
        staged.makedirs()
        write_marker(staged.root)  # a sweep by another process must see that this save is alive

    def commit(self, staged: "LocalStore", manifest: bytes, *, overwrite: bool, key_prefix: str) -> None:
        """Manifest last, then one atomic rename that never replaces by accident.

        Without ``overwrite`` the commit fails (CheckpointExistsError) if a checkpoint appeared at
        the target while this save ran: the rename itself refuses an existing target, so two
        commits never both win. With it, the old checkpoint is moved aside, then deleted.
        """
        remove_markers(staged.root)  # a checkpoint never carries them
        staged.write_bytes(MANIFEST_NAME, manifest)
        fsync_path(staged.root)
        os.makedirs(os.path.dirname(self.root), exist_ok=True)
        moved_aside = []
        for _ in range(_COMMIT_ATTEMPTS):
            try:
                rename_noreplace(staged.root, self.root)
                break
            except FileExistsError:
                pass
            found = existing(self)
            if found == "empty":
                _rmdir_quietly(self.root)  # e.g. tempfile.mkdtemp(): nothing to keep
                continue
            if found == "checkpoint" and not overwrite:
                raise exists_error(self)
            check_replaceable(self)
            if found == "nothing":
                continue  # it went away meanwhile
            # Replacing a checkpoint (overwrite) or an uncommitted leftover: move it aside first.
            old = f"{staging_path(self.root, 'old')}-{_token()}"
            try:
                os.rename(self.root, old)
            except FileNotFoundError:
                continue
            moved_aside.append(old)
        else:
            raise CheckpointExistsError(
                f"could not commit {self.display()}: other saves kept committing to it; save to a new path"
            )
        fsync_path(os.path.dirname(self.root))
        for old in moved_aside:  # committed: a failure to delete leaves garbage (swept later), not a failed save
            try:
                LocalStore(old).remove()
            except OSError:
                pass

    def discard(self, staged: "LocalStore", key_prefix: str) -> None:
        staged.remove()

    def delete(self) -> None:
        """Renamed to a staging name first (atomic: it stops being a checkpoint at once), then removed."""
        aside = f"{staging_path(self.root, 'deleted')}-{_token()}"
        os.rename(self.root, aside)
        LocalStore(aside).remove()

    def unfinished_save(self) -> str | None:
        parent, name = os.path.split(self.root.rstrip(os.sep))
        prefix = f".{name}.ucp-staging-"
        entries = [e for e in os.listdir(parent) if e.startswith(prefix)] if os.path.isdir(parent) else []
        old = sorted(
            e
            for e in entries
            if e.startswith(prefix + "old-") and os.path.exists(os.path.join(parent, e, MANIFEST_NAME))
        )
        if old and not self.exists():
            return (
                f"{self.display()} has no committed {MANIFEST_NAME}: an overwrite was interrupted after moving "
                f"the previous checkpoint to {os.path.join(parent, old[-1])}; rename that directory back to "
                "recover it"
            )
        if entries or self._has_save_traces():
            return self._never_committed()
        return None

    def sweep(self, *, child: Callable[[str], bool], skip: set[str]) -> tuple[list[str], list[tuple[str, str]]]:
        """Recover checkpoints an interrupted overwrite moved aside, then delete what dead saves left.

        Only the staging areas of checkpoints named ``child(name)`` and not in ``skip`` are
        touched. Returns (names removed, [(checkpoint recovered, from where)]).
        """
        if not os.path.isdir(self.root):
            return [], []
        staged: dict[str, list[str]] = {}
        for entry in os.listdir(self.root):
            name, sep, token = entry[1:].partition(".ucp-staging-")
            if entry.startswith(".") and sep and child(name) and name not in skip:
                staged.setdefault(name, []).append(entry)
        recovered = []
        for name, entries in sorted(staged.items()):
            olds = [
                os.path.join(self.root, e)
                for e in entries
                if e.partition(".ucp-staging-")[2].startswith("old-")
                and os.path.isfile(os.path.join(self.root, e, MANIFEST_NAME))
            ]
            final = os.path.join(self.root, name)
            if not olds or os.path.lexists(final):
                continue  # the overwrite committed: the old copies are garbage, swept below
            newest = max(olds, key=lambda p: os.stat(os.path.join(p, MANIFEST_NAME)).st_mtime)
            try:
                rename_noreplace(newest, final)
            except OSError:
                continue  # someone else recovered (or saved) it meanwhile
            recovered.append((final, newest))
        removed = []
        for _, entries in sorted(staged.items()):
            for entry in sorted(entries):
                path = os.path.join(self.root, entry)
                # Another process's save still writing here is not a leftover (staging_owner).
                if os.path.isdir(path) and owner_state(path) == "dead":
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(entry)
        return sorted(removed), recovered


def _token() -> str:
    import uuid

    return uuid.uuid4().hex[:12]


def _rmdir_quietly(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty any more, or gone: the next attempt looks again
