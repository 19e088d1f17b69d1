"""Checking a whole checkpoint: everything a load relies on, every problem reported.

    >>> import torch, ucp, tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "c")
    >>> _ = ucp.save({"w": torch.ones(3)}, d)
    >>> report = ucp.verify(d)
    >>> report.ok, report.tensors, report.fragments
    (True, 1, 1)

What is checked, so that a checkpoint ``verify`` passes is one ``ucp.load`` reads:

* the manifest: every field a reader relies on (``Manifest.from_dict``: types,
  ranges, fragments that tile each tensor exactly once, chunking, checksum
  counts) and every state tree (tags, depth). A damaged tensor entry or state
  tree is one problem; the rest is still checked. A recorded UCL program must
  parse and bind (a load under another layout compiles it);
* each array's ``zarr.json``: present, a regular file inside the checkpoint, and
  describing the array the manifest points at (shape, data type, chunk grid,
  chunk keys, codecs), since docs/FORMAT.md promises any zarr v3 reader opens it;
* every chunk of every fragment: present, a regular file inside the checkpoint,
  exactly the size its chunk must have, and equal to its checksum.

A missing or uncommitted checkpoint, or a path holding something else,
raises (``CheckpointNotFoundError``, ``NotACheckpointError``,
``IncompleteCheckpointError``): there is nothing to check. Everything else is a
:class:`Problem` in the report.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Callable

from ucp.commit import find_manifest, read_manifest
from ucp.dtypes import storage_dtype
from ucp.errors import ManifestError, UcpError
from ucp.geometry import region_shape
from ucp.manifest import MANIFEST_NAME, Fragment, Manifest, TensorEntry
from ucp.reader import CheckpointReader
from ucp.stores import Store
from ucp.zarr_array import ZARR_JSON_LIMIT, chunk_key, metadata_problems, parse_metadata


@dataclass(frozen=True)
class Problem:
    """One problem: the tensor (or ``states[R]``, or ``""`` for the whole manifest), the file, its kind, the message."""

    tensor: str
    file: str
    kind: str  # the error class name, e.g. "ChecksumError"
    message: str


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` found; ``ok`` when there is no problem."""

    path: str
    ok: bool
    tensors: int
    fragments: int
    bytes_checked: int
    checksums: bool  # False when the checkpoint was saved without checksums (only readability is checked)
    problems: tuple[Problem, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)


def verify(
    path: str | os.PathLike, *, storage_options: dict | None = None, progress: Callable[[int], None] | None = None
) -> VerifyReport:
    """Check everything ``ucp.load`` relies on; ``progress(nbytes)`` is called per fragment."""
    path = os.fspath(path)
    storage = find_manifest(path, storage_options=storage_options)
    manifest_file = storage.display(MANIFEST_NAME)
    collected: list[tuple[str, ManifestError]] = []
    try:
        manifest = read_manifest(storage, problems=collected)
    except (UcpError, OSError) as err:
        problem = Problem("", manifest_file, type(err).__name__, str(err))
        return VerifyReport(path, False, 0, 0, 0, False, (problem,))
    # Sharded metadata (format 2) is read while the tensors are: its problems are collected meanwhile.
    entries = sorted(manifest.tensors.items())
    for rank in manifest.states:
        try:
            manifest.states[rank]
        except ManifestError as err:
            collected.append((f"states[{rank}]", err))
    problems = [Problem(what, manifest_file, type(err).__name__, str(err)) for what, err in collected]
    problems.extend(_program_problems(manifest, manifest_file))
    reader = CheckpointReader(path, verify=True, opened=(storage, manifest))
    fragments = checked = 0
    packs: set[str] = set()
    try:
        for name, entry in entries:
            for frag in entry.fragments:
                fragments += 1
                where = storage.display("data", frag.key)
                if frag.pack_offset is None or frag.key not in packs:
                    problems.extend(
                        Problem(name, where, kind, message)
                        for kind, message in _array_problems(storage, reader, entry, frag)
                    )
                    if frag.pack_offset is not None:
                        packs.add(frag.key)
                try:
                    reader.check_fragment(name, frag)
                    checked += frag.nbytes
                except UcpError as err:
                    problems.append(Problem(name, where, type(err).__name__, str(err)))
                except OSError as err:  # unreadable: permissions, a link loop, an I/O error
                    problems.append(
                        Problem(
                            name,
                            where,
                            type(err).__name__,
                            f"tensor {name!r} (fragment {frag.key!r} of rank {frag.rank}): cannot read it: {err}",
                        )
                    )
                if progress is not None:
                    progress(frag.nbytes)
    finally:
        reader.close()
    return VerifyReport(
        path=path,
        ok=not problems,
        tensors=len(entries) + sum(1 for what, _ in collected if not what.startswith("states[")),
        fragments=fragments,
        bytes_checked=checked,
        checksums=reader.verify,
        problems=tuple(problems),
    )


def _program_problems(manifest: Manifest, manifest_file: str) -> list[Problem]:
    """The recorded UCL program must parse and bind: a load under another layout compiles it."""
    if manifest.program is None:
        return []
    from ucp.ucl.bind import load_program

    try:
        load_program(manifest.program)
    except UcpError as err:
        return [
            Problem(
                "program",
                manifest_file,
                type(err).__name__,
                f"{manifest_file}: the recorded UCL program cannot be used to load under another layout: {err}",
            )
        ]
    return []


def _array_problems(
    storage: Store, reader: CheckpointReader, entry: TensorEntry, frag: Fragment
) -> list[tuple[str, str]]:
    """``(kind, message)`` for each way the fragment's ``zarr.json`` fails the manifest."""
    rel = f"data/{frag.key}/zarr.json"
    what = f"tensor {entry.name!r} (fragment {frag.key!r} of rank {frag.rank})"
    try:
        meta = parse_metadata(storage.read_file(rel, limit=ZARR_JSON_LIMIT, allowed="a zarr.json may hold"))
    except FileNotFoundError:
        return [
            (
                "IncompleteCheckpointError",
                f"{what}: {storage.display(rel)} is missing; a zarr reader cannot "
                "open the array - restore it from a replica or load an older checkpoint",
            )
        ]
    except (UcpError, OSError) as err:
        return [(type(err).__name__, f"{what}: {storage.display(rel)}: {err}")]
    except ValueError as err:
        return [
            (
                "FormatError",
                f"{what}: {storage.display(rel)}: {err}; a zarr reader cannot open the array - "
                "the checkpoint is damaged",
            )
        ]
    problems = []
    if frag.pack_offset is not None:
        extent = reader.pack_extent(frag)
        found = meta.get("shape") if isinstance(meta, dict) else None
        length = found[0] if isinstance(found, list) and len(found) == 1 and isinstance(found[0], int) else extent
        shape: tuple[int, ...] = (max(length, extent),)
        data_type, rows = "uint8", max(length, extent)
        problems = _pack_size_problems(storage, frag, what, shape[0])
    else:
        shape, data_type, rows = region_shape(frag.region), storage_dtype(entry.dtype), frag.chunk_rows
    return problems + [
        (
            "FormatError",
            f"{what}: {storage.display(rel)}: {problem}; a zarr reader would not read the bytes the "
            "manifest points at - the checkpoint is damaged",
        )
        for problem in metadata_problems(meta, shape=shape, data_type=data_type, chunk_rows=rows)
    ]


def _pack_size_problems(storage: Store, frag: Fragment, what: str, length: int) -> list[tuple[str, str]]:
    """A pack's one chunk must hold exactly its array's length (a load reads only the bytes it needs)."""
    rel = f"data/{frag.key}/{chunk_key((length,), 0)}"
    try:
        size = storage.file_size(rel, what=what)
    except (UcpError, OSError):
        return []  # reading the fragment reports it
    if size == length:
        return []
    return [
        (
            "TruncatedDataError",
            f"{what}: {storage.display(rel)} holds {size} bytes but its zarr.json says "
            f"{length}; the file is damaged - restore it from a replica or load an older "
            "checkpoint",
        )
    ]
