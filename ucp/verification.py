"""Checking a whole checkpoint: every chunk of every fragment against its checksum.

    >>> import torch, ucp, tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "c")
    >>> _ = ucp.save({"w": torch.ones(3)}, d)
    >>> report = ucp.verify(d)
    >>> report.ok, report.tensors, report.fragments
    (True, 1, 1)

A missing or uncommitted checkpoint raises (``CheckpointNotFoundError``,
``IncompleteCheckpointError``) and so does an unreadable manifest
(``ManifestError``, ``FormatVersionError``): there is nothing to check. Damage
to tensor data is collected into the report, one problem per bad fragment.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from ucp.errors import UcpError
from ucp.reader import CheckpointReader


@dataclass(frozen=True)
class Problem:
    """One damaged fragment: the tensor, the file, the kind of damage and the full message."""

    tensor: str
    file: str
    kind: str  # the error class name, e.g. "ChecksumError"
    message: str


@dataclass(frozen=True)
class VerifyReport:
    path: str
    ok: bool
    tensors: int
    fragments: int
    bytes_checked: int
    checksums: bool  # False when the checkpoint was saved without checksums (only readability is checked)
    problems: tuple[Problem, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)


def verify(path: str | os.PathLike, *, storage_options: dict | None = None, progress=None) -> VerifyReport:
    """Read every byte of a checkpoint and check it; ``progress(nbytes)`` is called per fragment."""
    reader = CheckpointReader(os.fspath(path), verify=True, storage_options=storage_options)
    problems: list[Problem] = []
    fragments = checked = 0
    for name, entry in sorted(reader.manifest.tensors.items()):
        for frag in entry.fragments:
            fragments += 1
            try:
                reader.check_fragment(name, frag)
                checked += frag.nbytes
            except UcpError as err:
                problems.append(Problem(name, reader.storage.display("data", frag.key), type(err).__name__, str(err)))
            if progress is not None:
                progress(frag.nbytes)
    reader.close()
    return VerifyReport(
        path=os.fspath(path),
        ok=not problems,
        tensors=len(reader.manifest.tensors),
        fragments=fragments,
        bytes_checked=checked,
        checksums=reader.verify,
        problems=tuple(problems),
    )
