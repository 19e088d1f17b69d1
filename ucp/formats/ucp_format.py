"""The universal checkpoint format itself, behind the format protocol (in and out).

**In**: :class:`ucp.CheckpointReader` reads any region of any logical tensor,
touching only the chunks it overlaps. Names: a checkpoint saved with a UCL
program already has logical names; one saved by plain ``ucp.save`` of a nested
state (``{"model": ..., "optim": ...}``) has its tensors' paths as names, which
are named again by the shared convention (:func:`ucp.formats.naming.split_tree`
over the saved state tree).

**Out**: :class:`ucp.CheckpointWriter` with a fragment map that says where each
piece goes: a tensor larger than the block size arrives in row blocks, each its
own fragment; with ``program`` + ``layout``, each block is cut further along the
shards of that layout (when they tile the tensor), so loading that layout reads
one fragment per shard. The state tree is the nested state (``model``, ``optim``,
``step`` ...) referring to logical names, so ``ucp.load`` gives it back.

>>> import os, tempfile, torch
>>> from ucp.spec import LogicalTensor
>>> path = os.path.join(tempfile.mkdtemp(), "c")
>>> w = UcpWriter(path, tensors=[LogicalTensor("w", (2,), "float32")])
>>> w.add("w", torch.ones(2)); w.set_state(TrainingState(step=3)); w.close()
>>> import ucp; ucp.load(path)
{'model': {'w': tensor([1., 1.])}, 'step': 3}
"""

from __future__ import annotations

import os
from functools import partial
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from ucp.errors import FormatError
from ucp.formats.base import Format, TensorInfo, TrainingState, blocks, register_format
from ucp.formats.naming import build_tree, split_tree
from ucp.geometry import Box, FlatRange, coverage_gaps
from ucp.layout import Layout
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

__all__ = ["UcpReader", "UcpWriter", "FORMAT"]

_TAGS = ("$tensor", "$tuple", "$dict", "$float", "$object")


@dataclass(frozen=True)
class _Ref:
    """A ``{"$tensor": key}`` leaf of a saved state tree."""

    key: str


def _decode(node: Any) -> Any:
    """A saved state tree as plain values, tensors as :class:`_Ref` (tags of docs/FORMAT.md section 5)."""
    if isinstance(node, list):
        return [_decode(v) for v in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        tag, body = next(iter(node.items()))
        if tag == "$tensor":
            return _Ref(body)
        if tag == "$tuple":
            return {"$tuple": [_decode(v) for v in body]}  # the tag naming.plain uses too
        if tag == "$dict":
            return {k if isinstance(k, str) else str(k): _decode(v) for k, v in body}
        if tag in ("$float", "$object"):
            return dict(node)  # JSON forms kept as they are (see naming.plain)
    return {k: _decode(v) for k, v in node.items()}


def _encode(node: Any) -> Any:
    """Plain JSON values as a state tree: dicts with ``$`` keys (other than a lone tag) go in ``$dict``."""
    if isinstance(node, list):
        return [_encode(v) for v in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1 and next(iter(node)) in ("$tensor", "$float", "$tuple"):
        return {k: _encode(v) for k, v in node.items()}
    if any(isinstance(k, str) and k.startswith("$") for k in node):
        return {"$dict": [[k, _encode(v)] for k, v in node.items()]}
    return {k: _encode(v) for k, v in node.items()}


class UcpReader:
    """A committed universal checkpoint, as logical tensors."""

    format = "ucp"

    def __init__(self, path: str, *, verify: bool = True, storage_options: dict | None = None) -> None:
        from ucp.reader import CheckpointReader

        self.path = os.fspath(path)
        self._reader = CheckpointReader(self.path, verify=verify, storage_options=storage_options)
        manifest = self._reader.manifest
        tree = manifest.states.get(min(manifest.states)) if manifest.states else {}
        tree = _decode(tree) if tree is not None else {}
        names, self._state = split_tree(
            tree if isinstance(tree, (dict, list, _Ref)) else {"state": tree}, lambda v: isinstance(v, _Ref)
        )
        self._names: dict[str, str] = {}
        if manifest.program is None:
            self._names = {name: ref.key for name, ref in names.items() if ref.key in manifest.tensors}
        named = set(self._names.values())
        for key in manifest.tensors:  # tensors the tree does not name keep their logical names
            if key not in named:
                self._names.setdefault(key, key)

    def tensors(self) -> Iterator[TensorInfo]:
        entries = self._reader.manifest.tensors
        for name, key in self._names.items():
            entry = entries[key]
            yield TensorInfo(name, entry.dtype, tuple(entry.shape), partial(self._reader.read_tensor, key))

    def state(self) -> TrainingState:
        return self._state

    @property
    def manifest(self):
        return self._reader.manifest

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> "UcpReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def detect(path: str) -> bool:
    if "://" in path:
        return True  # remote stores: only ucp reads them; opening says whether a manifest is there
    return os.path.isfile(os.path.join(path, "manifest.json"))


class UcpWriter:
    """Writes logical tensors (whole or in blocks) as one universal checkpoint."""

    format = "ucp"

    def __init__(
        self,
        path: str,
        *,
        tensors: Sequence[LogicalTensor],
        overwrite: bool = False,
        block_bytes: int | None = None,
        state: TrainingState | None = None,
        program: str | None = None,
        layout: Layout | str | None = None,
        storage_options: dict | None = None,
    ) -> None:
        from ucp.writer import CheckpointWriter

        self.path = os.fspath(path)
        lay = Layout.parse(layout) if isinstance(layout, str) else layout
        if (program is None) != (lay is None):
            raise ValueError("program and layout go together: the program says how each layout shards the tensors")
        logical = {t.name: LogicalTensor(t.name, tuple(t.shape), t.dtype) for t in tensors}
        bound = None
        if program is not None:
            from ucp.ucl.bind import load_program

            bound = load_program(program)  # text, a .ucl path, a preset name or reference
        tilings = _layout_tilings(bound, lay, logical) if bound is not None and lay is not None else {}
        self._keys: dict[str, dict[Box, str]] = {}
        specs: dict[str, TensorSpec] = {}
        for t in logical.values():
            parts = blocks(t.shape, t.dtype, block_bytes) if block_bytes else (Box.full(t.shape),)
            tiles = tilings.get(t.name, (Box.full(t.shape),))
            self._keys[t.name] = {}
            for i, part in enumerate(parts):
                key = t.name if len(parts) == 1 else f"{t.name}#{i}"
                pieces = tuple(
                    ShardPiece(t.name, overlap.relative_to(part), overlap)
                    for tile in tiles
                    if (overlap := _overlap(part, tile, t.shape)) is not None
                )
                specs[key] = TensorSpec(key, pieces)
                self._keys[t.name][part] = key
        self._names = list(logical)
        # The writer holds added tensors until their writes finish (up to 64 MiB in flight): flushing
        # every block keeps what it holds within the conversion's budget.
        self._flush_bytes = block_bytes
        self._unflushed = 0
        self._writer = CheckpointWriter(
            self.path,
            spec=FragmentMap(rank=0, logical=logical, tensors=specs),
            overwrite=overwrite,
            storage_options=storage_options,
            layout=lay,
            program=bound.record().to_dict() if bound is not None else None,
        )

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.add_region(name, Box.full(tuple(tensor.shape)), tensor)

    def add_region(self, name: str, region: Box, tensor: torch.Tensor) -> None:
        """Write one block of ``name`` (a box of ``blocks(...)``) as its own fragments."""
        keys = self._keys.get(name)
        if keys is None:
            raise KeyError(f"tensor {name!r} was not in the list this writer was opened with")
        key = keys.get(region)
        if key is None:
            raise ValueError(f"tensor {name!r}: {region} is not one of the blocks this writer planned")
        self._writer.add(key, tensor)
        self._unflushed += tensor.numel() * tensor.element_size()
        if self._flush_bytes is not None and self._unflushed >= self._flush_bytes:
            self._writer.flush()
            self._unflushed = 0

    def set_state(self, state: TrainingState) -> None:
        tree = build_tree(self._names, state, lambda n: {"$tensor": n})
        self._writer.set_state(_encode(tree))

    def close(self) -> None:
        self._writer.close()

    def abort(self) -> None:
        self._writer.abort("conversion aborted")


def _overlap(part: Box, tile: Box, shape: tuple[int, ...]) -> Box | None:
    if not shape or part.is_empty():  # 0-d, or no elements: the one block is the whole (empty) tensor
        return part if tile == Box.full(shape) or not shape else None
    return part.intersect(tile)


def _layout_tilings(program: Any, layout: Layout, logical: dict[str, LogicalTensor]) -> dict[str, tuple[Box, ...]]:
    """Per tensor, the distinct boxes the layout's ranks load, when they tile it exactly once.

    Checks the program against the tensors (a program that does not fit them is an error, not a guess);
    tensors whose shards are flat ranges or overlap keep one fragment per block.
    """
    from ucp.ucl.bind import spec_for_load

    regions: dict[str, set] = {}
    for rank in range(layout.world_size):
        fmap = spec_for_load(program, layout, rank, logical)
        for tspec in fmap.tensors.values():
            for piece in tspec.pieces:
                regions.setdefault(piece.logical, set()).add(piece.target)
    unmapped = [n for n, t in logical.items() if n not in regions and Box.full(t.shape).numel]  # empty: nothing to map
    unknown = [n for n in regions if n not in logical]
    if unmapped or unknown:
        problems = (
            [f"it does not map {len(unmapped)} tensor(s) of the source: {', '.join(unmapped[:8])}"] if unmapped else []
        ) + ([f"it maps tensors the source lacks: {', '.join(unknown[:8])}"] if unknown else [])
        raise FormatError(
            f"the UCL program does not describe this checkpoint at {layout}: "
            + "; ".join(problems)
            + "; fix the program or convert without --program/--layout"
        )
    out = {}
    for name, found in regions.items():
        if name not in logical or any(isinstance(r, FlatRange) for r in found):
            continue
        boxes = tuple(sorted(found, key=lambda b: b.offsets))
        if coverage_gaps(boxes, logical[name].shape) == (0, []):
            out[name] = boxes
    return out


FORMAT = register_format(
    Format(
        name="ucp",
        description="universal checkpoint (manifest.json + zarr v3 fragments); local paths or fsspec URLs",
        detect=detect,
        open_reader=UcpReader,
        open_writer=UcpWriter,
    )
)
