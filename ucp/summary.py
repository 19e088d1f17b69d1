"""A short description of a checkpoint, for ``ucp inspect`` and for people.

>>> import torch, ucp, tempfile, os
>>> d = os.path.join(tempfile.mkdtemp(), "c")
>>> _ = ucp.save({"w": torch.ones(3), "step": 12}, d)
>>> s = ucp.describe(d)
>>> s.step, s.tensors[0].name, s.total_bytes
(12, 'w', 12)
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from ucp.commit import find_manifest, read_manifest
from ucp.layout import Layout


@dataclass(frozen=True)
class TensorSummary:
    name: str
    dtype: str
    shape: tuple[int, ...]
    fragments: int
    nbytes: int
    writers: tuple[int, ...]


@dataclass(frozen=True)
class CheckpointSummary:
    path: str
    format_version: int
    created: str | None
    world_size: int
    layout: str | None
    has_program: bool
    checksum_algorithm: str | None
    step: Any
    total_bytes: int
    tensors: tuple[TensorSummary, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def describe(path: str | os.PathLike, *, storage_options: dict | None = None) -> CheckpointSummary:
    """Summarize a committed checkpoint from its manifest alone (no tensor bytes are read)."""
    manifest = read_manifest(find_manifest(os.fspath(path), storage_options=storage_options))
    tensors = tuple(
        TensorSummary(name, t.dtype, t.shape, len(t.fragments), t.nbytes, tuple(sorted({f.rank for f in t.fragments})))
        for name, t in sorted(manifest.tensors.items())
    )
    state = manifest.states.get(0, next(iter(manifest.states.values()), None))
    return CheckpointSummary(
        path=os.fspath(path),
        format_version=manifest.format_version,
        created=manifest.created,
        world_size=manifest.world_size,
        layout=str(Layout.from_dict(manifest.layout)) if manifest.layout else None,
        has_program=manifest.program is not None,
        checksum_algorithm=manifest.checksum_algorithm,
        step=_find_step(state),
        total_bytes=sum(t.nbytes for t in tensors),
        tensors=tensors,
    )


def _find_step(state: Any) -> Any:
    """The first int under a key named step/global_step/iteration, breadth first (each node visited once)."""
    queue = deque([state])
    while queue:
        node = queue.popleft()
        if isinstance(node, dict):
            for key in ("step", "global_step", "iteration"):
                if isinstance(node.get(key), int) and not isinstance(node.get(key), bool):
                    return node[key]
            queue.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            queue.extend(v for v in node if isinstance(v, (dict, list)))
    return None
