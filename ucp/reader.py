"""Reading a checkpoint: any region of any logical tensor, touching only overlapping chunks.

The reader turns "fill this region of logical tensor X" into a load plan
(:func:`ucp.load_plan.plan_load`, pure geometry) and executes its read items
against the stored fragments. Whole fragments, and runs of a packed fragment's
bytes (a row block, a flat range: what a resharding load takes), are read straight
into their destinations in coalesced reads, each chunk they touch read whole; other
parts (column blocks) go chunk by chunk through a buffer along dim 0, with a few
chunks prefetched. Memory beyond the destination is bounded (a handful of chunks),
whatever the sizes of the fragments. Each chunk read is checked against its
recorded checksum::

    reader = CheckpointReader("ckpt/step_10")
    part = reader.read_tensor("fc.weight", Box((4, 0), (4, 3)))   # rows 4..7 only
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from ucp import checksum as _checksum
from ucp.commit import find_manifest, read_manifest
from ucp.dtypes import allocate, from_numpy, storage_dtype, to_numpy, torch_dtype
from ucp.errors import (
    ChecksumError,
    IncompleteCheckpointError,
    KeyMismatchError,
    ManifestError,
    ShapeMismatchError,
    TruncatedDataError,
)
from ucp.geometry import Box, FlatRange, Region, region_fits, region_shape
from ucp.load_plan import LoadPlan, LoadRequest, plan_load
from ucp.manifest import Fragment, Manifest, TensorEntry
from ucp.read_batches import ChunkPieces, Unit, coalesce, read_runs
from ucp.spec import LogicalTensor
from ucp.stores import Store, StoreOptions
from ucp.stores.pack_files import chunk_spans
from ucp.zarr_array import chunk_count, chunk_key

# Packed fragments at most this far apart (the writer's alignment padding) are read in one call.
_MAX_GAP = 4096

# The read buffer is a few chunks (StoreOptions.prefetch_chunks read ahead within one copy,
# + 2): enough to overlap I/O with copying, small next to a shard.


def _row_major_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _assign(target: torch.Tensor, source: np.ndarray, dtype: str) -> None:
    """``target[...] = source`` (same shape; ``source`` in the storage dtype).

    CPU tensors are filled by numpy on this thread: torch's ``copy_`` hands even small
    copies to its intra-op thread pool, which stalls badly when other processes keep the
    cores busy (measured: 512 copies of 200 KiB taking seconds instead of milliseconds).
    """
    if target.device.type == "cpu" and not target.requires_grad:
        np.copyto(to_numpy(target), source)
    else:
        target.copy_(from_numpy(source, dtype))


def _check_read(name: str, entry: TensorEntry, region: Region, dest: torch.Tensor) -> None:
    """A region inside the tensor, and a destination of the region's storage shape and the tensor's dtype."""
    if not region_fits(region, entry.shape):
        raise ShapeMismatchError(
            f"cannot read {region} of tensor {name!r}: it does not fit its shape {list(entry.shape)}"
        )
    if tuple(dest.shape) != region_shape(region) or dest.dtype != torch_dtype(entry.dtype):
        raise ShapeMismatchError(
            f"cannot read {region} of tensor {name!r} into a {str(dest.dtype).removeprefix('torch.')}"
            f"{list(dest.shape)} tensor; it needs {entry.dtype}{list(region_shape(region))}"
        )


def _cache_key(frag: Fragment, index: int) -> tuple[str, int, int]:
    """Chunk identity: packed fragments share their pack's key, so their offset tells them apart."""
    return (frag.key, -1 if frag.pack_offset is None else frag.pack_offset, index)


def _contiguous_part(
    frag: Fragment, src_box: Box, span: FlatRange | None, overlap: Box, target_view: torch.Tensor
) -> int | None:
    """Where the copy's elements start in a packed fragment's storage, when they are one run of it and
    the destination is contiguous CPU memory (then it is read straight in: :meth:`CheckpointReader._read_parts`).

    An overlap is one run of its fragment's row-major storage when every dimension after some
    ``k`` is whole and every one before ``k`` is a single index; None otherwise (a column block).
    """
    if frag.pack_offset is None or not overlap.ndim:
        return None
    if not (target_view.device.type == "cpu" and target_view.is_contiguous() and target_view.numel()):
        return None
    if isinstance(frag.region, Box):
        rel, outer, base = overlap.relative_to(frag.region), frag.region.sizes, 0
    else:
        assert span is not None, "a flat fragment's pieces have spans"
        rel, outer, base = overlap.relative_to(src_box), src_box.sizes, span.start
    k = len(outer) - 1
    while k > 0 and rel.sizes[k] == outer[k]:
        k -= 1
    if any(rel.sizes[d] != 1 for d in range(k)):
        return None
    return base + sum(o * s for o, s in zip(rel.offsets, _row_major_strides(outer)))


def _packed_chunk_start(frag: Fragment, index: int, itemsize: int) -> int:
    """Where chunk ``index`` of a packed fragment starts in its pack (chunks lie back to back, unpadded)."""
    assert frag.pack_offset is not None, "a packed fragment"
    shape = region_shape(frag.region)
    row = math.prod(shape[1:]) * itemsize if shape else itemsize
    return frag.pack_offset + index * frag.chunk_rows * row


class CheckpointReader:
    """A committed checkpoint opened for reading (manifest parsed and validated)."""

    def __init__(
        self,
        path: str,
        *,
        verify: bool = True,
        storage_options: dict | None = None,
        opened: tuple[Store, Manifest] | None = None,
        store_options: StoreOptions | None = None,
    ) -> None:
        """Open the checkpoint at ``path`` (``opened``: its store and manifest, when already read)."""
        self.path = str(path)
        if opened is not None:
            self.storage, self.manifest = opened
        else:
            self.storage = find_manifest(self.path, storage_options=storage_options, options=store_options)
            self.manifest = read_manifest(self.storage)
        self.options = self.storage.options
        self.verify = verify and self.manifest.checksum_algorithm is not None
        self._chunks: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
        self._verified: set[tuple[str, int, int]] = set()
        self._pack_extents: dict[str, int] = {}  # pack key -> bytes its fragments reach

    def close(self) -> None:
        """Drop buffers and I/O threads (the reader stays usable)."""
        self._chunks.clear()
        self.storage.close()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def logical(self) -> dict[str, LogicalTensor]:
        """Every logical tensor in the checkpoint."""
        heads = ((n, self.manifest.header(n)) for n in self.manifest.tensors)
        return {n: LogicalTensor(n, shape, dtype) for n, (dtype, shape) in heads}

    def entry(self, name: str) -> TensorEntry:
        """The manifest entry of logical tensor ``name`` (KeyMismatchError naming some that exist)."""
        try:
            return self.manifest.tensors[name]
        except KeyError:
            known = sorted(self.manifest.tensors)
            shown = ", ".join(map(repr, known[:10])) + (", ..." if len(known) > 10 else "")
            raise KeyMismatchError(
                f"no logical tensor {name!r} in {self.path}; it has {len(known)}: {shown or 'none'}"
            ) from None

    # -- public reads ----------------------------------------------------------
    def read_tensor(self, name: str, region: Region | None = None) -> torch.Tensor:
        """A new tensor holding ``region`` of logical tensor ``name`` (the whole tensor by default).

        A box gives a box-shaped tensor, a flat range a 1-d one.
        """
        entry = self.entry(name)
        region = Box.full(entry.shape) if region is None else region
        out = allocate(region_shape(region), entry.dtype, what=repr(name))
        self.read_into(name, region, out)
        return out

    def read_into(self, name: str, region: Region, dest: torch.Tensor) -> None:
        """Fill ``dest`` (shaped like the region's storage: box sizes, or 1-d) with ``region`` of ``name``."""
        entry = self.entry(name)
        self.execute(plan_load({name: entry}, (LoadRequest(name, region),)), (dest,))

    def read_many(self, reads: Sequence[tuple[str, Region, torch.Tensor]]) -> None:
        """:meth:`read_into` for many ``(name, region, dest)`` at once: one plan, so adjacent bytes of a
        pack are read together straight into their destinations."""
        if not reads:
            return
        entries = {name: self.entry(name) for name, _, _ in reads}
        plan = plan_load(entries, tuple(LoadRequest(name, region) for name, region, _ in reads))
        self.execute(plan, [dest for _, _, dest in reads])

    def execute(self, plan: LoadPlan, dests: Sequence[torch.Tensor]) -> None:
        """Carry out a load plan (:func:`ucp.load_plan.plan_load` over this checkpoint's manifest):
        ``dests[i]`` is filled with request ``i``'s region, shaped like its storage (box sizes, or 1-d).

        Every destination is checked before anything is read::

            plan = plan_load(reader.manifest, [LoadRequest("fc.weight", Box((4, 0), (4, 3)))])
            reader.execute(plan, [torch.empty(4, 3)])
        """
        if len(dests) != len(plan.requests):
            raise ShapeMismatchError(
                f"a load plan of {len(plan.requests)} requests needs as many destinations, got {len(dests)}"
            )
        entries = [self.entry(r.logical) for r in plan.requests]
        for request, entry, dest in zip(plan.requests, entries, dests):
            _check_read(request.logical, entry, request.region, dest)
        straight: list[tuple[TensorEntry, Fragment, torch.Tensor]] = []
        parts: list[tuple[TensorEntry, Fragment, int, np.ndarray]] = []
        single = len(plan.requests) == 1
        for item in plan.items:
            region, dest = plan.requests[item.request].region, dests[item.request]
            if isinstance(region, Box):
                target_view = dest[item.overlap.relative_to(region).slices()] if region.ndim else dest
            else:
                span = item.dst.span
                assert span is not None, "the pieces of a flat range have spans"
                block = dest.view(-1)[span.start : span.stop].view(item.dst.box.sizes)
                target_view = block[item.overlap.relative_to(item.dst.box).slices()]
            entry = entries[item.request]
            if self._reads_whole_fragment(item.fragment, item.src.box, item.src.span, item.overlap, target_view):
                straight.append((entry, item.fragment, target_view))  # read below, coalesced
                continue
            # A single read's part of a one-chunk small fragment comes from the store's cached pack
            # windows, which serve the next calls' small tensors of the pack too (one request, not one
            # each, on object stores); a batch's parts are coalesced into runs instead (read_many).
            windowed = single and self._is_small(item.fragment)
            start = (
                None
                if windowed
                else _contiguous_part(item.fragment, item.src.box, item.src.span, item.overlap, target_view)
            )
            if start is not None:  # a run of a packed fragment's bytes: read below, straight into the view
                parts.append((entry, item.fragment, start, to_numpy(target_view).reshape(-1).view(np.uint8)))
            else:
                self._copy(entry, item.fragment, item.src.box, item.src.span, item.overlap, target_view)
        self._chunks.clear()  # the buffer is per call: memory stays bounded across a whole load
        self._read_whole(straight)
        self._read_parts(parts)

    def _read_whole(self, items: list[tuple[TensorEntry, Fragment, torch.Tensor]]) -> None:
        """Whole fragments straight into their destinations; packed ones in coalesced runs (:mod:`ucp.read_batches`)."""
        units = []
        for entry, frag, view in items:
            if frag.pack_offset is None:
                self._read_straight(entry, frag, view)
                continue
            shape = region_shape(frag.region)
            flat = to_numpy(view).reshape(-1).view(np.uint8)
            for index, (a, b) in enumerate(chunk_spans(shape, flat.nbytes // max(1, view.numel()), frag.chunk_rows)):
                units.append(Unit(frag.key, frag.pack_offset + a, b - a, (entry.name, frag, index, [flat[a:b]])))
        runs = coalesce(units, max_bytes=self.options.slab_bytes, max_gap=_MAX_GAP)
        digest = _checksum.digest if self.verify else None

        def start_read(run: Any, outs: list[np.ndarray]) -> Any:
            name, frag = run.units[0].tag[:2]  # errors about the file name the run's first tensor
            what = f"tensor {name!r} (fragment {frag.key!r} of rank {frag.rank})"
            return self.storage.read_packed_into(f"data/{run.key}", run.start, outs, what=what, digest=digest)

        def check(unit: Unit, outs: list[np.ndarray], found: list[str | None]) -> None:
            name, frag, index, _ = unit.tag
            if self.verify and _cache_key(frag, index) not in self._verified:
                self._compare(name, frag, index, found[0])  # type: ignore[arg-type]  # verify: a digest

        try:
            read_runs(runs, start_read, lambda unit: unit.tag[3], check, in_flight=self.options.reads_at_once)
        except (TruncatedDataError, IncompleteCheckpointError):
            self._name_damage(runs, lambda unit: unit.tag[3], check, digest)
            raise

    def _read_parts(self, parts: list[tuple[TensorEntry, Fragment, int, np.ndarray]]) -> None:
        """Runs of packed fragments' bytes (``(entry, fragment, first element, destination bytes)``) read
        straight into their destinations, each chunk touched read whole and checked whole.

        A chunk's checksum covers all of it, so the bytes of a touched chunk that no destination
        wants are read too, into a scratch buffer that lives while its read is in flight, and the
        chunk is hashed piece by piece in order (:class:`ucp.read_batches.ChunkPieces`). Where two
        destinations want the same bytes, the chunk is read into scratch and copied out once checked.
        Scratch stays bounded: at most ``prefetch_chunks + 2`` runs of up to ``chunk_bytes`` (or one chunk)
        are in flight, the bound of the chunk buffer this replaces.
        """
        if not parts:
            return
        chunks: dict[tuple[str, int, int], ChunkPieces] = {}
        for entry, frag, first, dest in parts:
            assert frag.pack_offset is not None, "only packed fragments are read in parts"
            shape = region_shape(frag.region)
            itemsize = torch_dtype(entry.dtype).itemsize
            row = math.prod(shape[1:]) * itemsize
            step, total = frag.chunk_rows * row, shape[0] * row
            lo, hi = first * itemsize, first * itemsize + dest.nbytes
            for index in range(lo // step, (hi - 1) // step + 1):
                c0, c1 = index * step, min((index + 1) * step, total)
                key = _cache_key(frag, index)
                if key not in chunks:
                    chunks[key] = ChunkPieces(entry.name, frag, index, frag.pack_offset + c0, c1 - c0)
                a, b = max(lo, c0), min(hi, c1)
                chunks[key].want(a - c0, dest[a - lo : b - lo])
        units = [Unit(c.frag.key, c.offset, c.nbytes, c) for c in chunks.values()]
        runs = coalesce(units, max_bytes=self.options.chunk_bytes, max_gap=_MAX_GAP)

        def start_read(run: Any, outs: list[np.ndarray]) -> Any:
            first = run.units[0].tag
            what = f"tensor {first.name!r} (fragment {first.frag.key!r} of rank {first.frag.rank})"
            return self.storage.read_packed_into(f"data/{run.key}", run.start, outs, what=what)

        def check(unit: Unit, outs: list[np.ndarray], _: list[str | None]) -> None:
            chunk: ChunkPieces = unit.tag
            if self.verify:  # every chunk read here is hashed: these bytes were not checked before
                self._compare(chunk.name, chunk.frag, chunk.index, _digest_of(outs))
            chunk.copy_out(outs)

        try:
            read_runs(
                runs, start_read, lambda unit: unit.tag.arrays(), check, in_flight=self.options.prefetch_chunks + 2
            )
        except (TruncatedDataError, IncompleteCheckpointError):
            self._name_damage(runs, lambda unit: unit.tag.arrays(), check, None)
            raise

    def _name_damage(self, runs: list, arrays: Any, check: Any, digest: Any) -> None:
        """After a short read of a run: read its units one by one, so that the error names the tensor and bytes."""
        for run in runs:
            for unit in run.units:
                name, frag = (unit.tag.name, unit.tag.frag) if isinstance(unit.tag, ChunkPieces) else unit.tag[:2]
                what = f"tensor {name!r} (fragment {frag.key!r} of rank {frag.rank})"
                outs = arrays(unit)
                found = self.storage.read_packed_into(
                    f"data/{frag.key}", unit.offset, outs, what=what, digest=digest
                ).result()
                check(unit, outs, found)

    def iter_tensors(self, names: list[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Whole logical tensors, one at a time, in name order."""
        for name in names if names is not None else sorted(self.manifest.tensors):
            yield name, self.read_tensor(name)
            self._chunks.clear()

    def read_fragment(self, name: str, frag: Fragment) -> torch.Tensor:
        """One stored fragment of ``name`` whole, in its region's storage shape, checked against its
        checksums: what a peer holding the fragment's array serves regions of."""
        entry = self.entry(name)
        out = allocate(region_shape(frag.region), entry.dtype, what=repr(name))
        if self._is_small(frag):
            _assign(out, self._small_chunk(name, frag), entry.dtype)
        elif out.numel():
            self._read_straight(entry, frag, out)
        self._chunks.clear()
        return out

    def check_fragment(self, name: str, frag: Fragment) -> None:
        """Read every chunk of one fragment and check it (raises the first problem)."""
        for index in range(chunk_count(region_shape(frag.region), frag.chunk_rows)):
            self._chunk(name, frag, index, prefetch_to=index)
            self._chunks.pop(_cache_key(frag, index), None)

    # -- execution -------------------------------------------------------------
    def _copy(
        self,
        entry: TensorEntry,
        frag: Fragment,
        src_box: Box,
        span: FlatRange | None,
        overlap: Box,
        target_view: torch.Tensor,
    ) -> None:
        if self._reads_whole_fragment(frag, src_box, span, overlap, target_view):
            self._read_straight(entry, frag, target_view)
            return
        if isinstance(frag.region, Box):
            rel = overlap.relative_to(frag.region)
            strides = _row_major_strides(frag.region.sizes)
            base0 = 0
        else:
            assert span is not None, "a flat fragment's pieces have spans"
            rel = overlap.relative_to(src_box)
            strides = _row_major_strides(src_box.sizes)
            base0 = span.start
        sizes = rel.sizes
        itemsize = torch_dtype(entry.dtype).itemsize
        elems_per_chunk = frag.chunk_rows * (math.prod(region_shape(frag.region)[1:]) if frag.region.numel else 1)
        if not sizes:  # 0-d
            src = self._elements(entry.name, frag, 0, 1, elems_per_chunk)
            _assign(target_view, src.reshape(()), entry.dtype)
            return
        row_stride = strides[0]
        rows_per_slab = max(1, self.options.slab_bytes // max(1, row_stride * itemsize))
        for r0 in range(0, sizes[0], rows_per_slab):
            nrows = min(rows_per_slab, sizes[0] - r0)
            offsets = (rel.offsets[0] + r0,) + rel.offsets[1:]
            shape = (nrows,) + sizes[1:]
            base = base0 + sum(o * s for o, s in zip(offsets, strides))
            extent = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
            buf = self._elements(entry.name, frag, base, base + extent, elems_per_chunk)
            view = np.lib.stride_tricks.as_strided(buf, shape, tuple(s * buf.itemsize for s in strides))
            _assign(target_view[r0 : r0 + nrows], view, entry.dtype)

    def _reads_whole_fragment(
        self, frag: Fragment, src_box: Box, span: FlatRange | None, overlap: Box, target_view: torch.Tensor
    ) -> bool:
        """Whether the copy is a whole fragment into a contiguous CPU destination (read straight into it)."""
        if not overlap.ndim:
            return False
        if not (target_view.device.type == "cpu" and target_view.is_contiguous() and target_view.numel()):
            return False
        if isinstance(frag.region, Box):
            return overlap == frag.region
        assert span is not None, "a flat fragment's pieces have spans"
        return span.start == 0 and span.stop == frag.region.numel and overlap == src_box

    def _read_straight(self, entry: TensorEntry, frag: Fragment, target_view: torch.Tensor) -> None:
        """Read every chunk of a fragment straight into the destination, in parallel: no buffer, no copy."""
        shape = region_shape(frag.region)
        array = to_numpy(target_view).reshape(shape)
        what = f"tensor {entry.name!r} (fragment {frag.key!r} of rank {frag.rank})"
        rows = frag.chunk_rows
        dtype = storage_dtype(entry.dtype)
        itemsize = torch_dtype(entry.dtype).itemsize

        def start(i: int) -> Any:
            if frag.pack_offset is not None:
                return _then_first(
                    self.storage.read_packed_into(
                        f"data/{frag.key}",
                        _packed_chunk_start(frag, i, itemsize),
                        [array[i * rows : (i + 1) * rows]],
                        what=what,
                        digest=_checksum.digest if self.verify else None,
                    )
                )
            return self.storage.read_chunk_into(
                f"data/{frag.key}",
                shape,
                dtype,
                i,
                rows,
                array[i * rows : (i + 1) * rows],
                what=what,
                digest=_checksum.digest if self.verify else None,
            )

        # A bounded window of reads in flight: a fragment of a million chunks queues no more.
        count = chunk_count(shape, rows)
        in_flight = self.options.reads_at_once
        window = deque(start(i) for i in range(min(count, in_flight)))
        for index in range(count):
            found = window.popleft().result()
            if index + in_flight < count:
                window.append(start(index + in_flight))
            if self.verify and _cache_key(frag, index) not in self._verified:
                self._compare(entry.name, frag, index, found)

    def _elements(self, name: str, frag: Fragment, lo: int, hi: int, per_chunk: int) -> np.ndarray:
        """Storage elements ``[lo, hi)`` of a fragment as a flat array (a view when one chunk holds them)."""
        first, last = lo // per_chunk, (hi - 1) // per_chunk
        if first == last:
            chunk = self._chunk(name, frag, first, prefetch_to=last).reshape(-1)
            return chunk[lo - first * per_chunk : hi - first * per_chunk]
        parts = []
        for index in range(first, last + 1):
            chunk = self._chunk(name, frag, index, prefetch_to=last).reshape(-1)
            start = max(lo - index * per_chunk, 0)
            stop = min(hi - index * per_chunk, chunk.size)
            parts.append(chunk[start:stop])
        return np.concatenate(parts)

    def _is_small(self, frag: Fragment) -> bool:
        """A one-chunk fragment read whole as plain bytes (packed: through the store's pack window cache)."""
        return (
            frag.nbytes <= self.options.small_array_bytes
            and chunk_count(region_shape(frag.region), frag.chunk_rows) == 1
        )

    def _start_chunk(self, name: str, frag: Fragment, index: int) -> Any:
        """A future of chunk ``index`` of a fragment (its valid rows) as a new array."""
        what = f"tensor {name!r} (fragment {frag.key!r} of rank {frag.rank})"
        shape = region_shape(frag.region)
        dtype = storage_dtype(self.manifest.tensors[name].dtype)
        if frag.pack_offset is None:
            return self.storage.read_chunk(f"data/{frag.key}", shape, dtype, index, frag.chunk_rows, what=what)
        rows = min(frag.chunk_rows, shape[0] - index * frag.chunk_rows) if shape else 1
        out = allocate((rows,) + tuple(shape[1:]) if shape else (), self.manifest.tensors[name].dtype, what=what)
        array = to_numpy(out)
        start = _packed_chunk_start(frag, index, array.itemsize)
        return _then_value(self.storage.read_packed_into(f"data/{frag.key}", start, [array], what=what), array)

    def _chunk(self, name: str, frag: Fragment, index: int, *, prefetch_to: int) -> np.ndarray:
        if self._is_small(frag):
            return self._small_chunk(name, frag)
        prefetch = self.options.prefetch_chunks
        for ahead in range(index, min(prefetch_to, index + prefetch) + 1):
            if _cache_key(frag, ahead) not in self._chunks:
                self._chunks[_cache_key(frag, ahead)] = (False, self._start_chunk(name, frag, ahead))
        key = _cache_key(frag, index)
        ready, value = self._chunks[key]
        if not ready:
            value = value.result()
            if self.verify and key not in self._verified:
                self._check(name, frag, index, value)
            self._chunks[key] = (True, value)
        self._chunks.move_to_end(key)
        while len(self._chunks) > prefetch + 2:
            self._chunks.popitem(last=False)
        return value

    def _small_chunk(self, name: str, frag: Fragment) -> np.ndarray:
        """A one-chunk fragment read as a plain file (no tensorstore open; see ucp.stores.base)."""
        cached = self._chunks.get(_cache_key(frag, 0))
        if cached is not None and cached[0]:
            return cached[1]
        what = f"tensor {name!r} (fragment {frag.key!r} of rank {frag.rank})"
        dtype = storage_dtype(self.manifest.tensors[name].dtype)
        if frag.pack_offset is not None:
            value = self.storage.read_packed(
                f"data/{frag.key}",
                frag.pack_offset,
                region_shape(frag.region),
                dtype,
                what=what,
                extent=self.pack_extent(frag),
            )
        else:
            value = self.storage.read_small(f"data/{frag.key}", region_shape(frag.region), dtype, what=what)
        if self.verify and _cache_key(frag, 0) not in self._verified:
            self._check(name, frag, 0, value)
        self._chunks[_cache_key(frag, 0)] = (True, value)
        while len(self._chunks) > self.options.prefetch_chunks + 2:
            self._chunks.popitem(last=False)
        return value

    def pack_extent(self, frag: Fragment) -> int:
        """How many bytes of the pack holding ``frag`` its fragments reach: all a read of it may take."""
        if frag.key not in self._pack_extents:
            self._pack_extents.update(self.manifest.pack_extents(frag.rank))
        return self._pack_extents[frag.key]

    def _check(self, name: str, frag: Fragment, index: int, array: np.ndarray) -> None:
        self._compare(name, frag, index, _checksum.digest(np.ascontiguousarray(array)))

    def _compare(self, name: str, frag: Fragment, index: int, found: str) -> None:
        if index >= len(frag.checksums):
            raise ManifestError(f"tensor {name!r} fragment {frag.key!r}: no checksum recorded for chunk {index}")
        if found != frag.checksums[index]:
            where = self.storage.display("data", frag.key, self.storage_chunk_key(None, frag, index))
            if frag.pack_offset is not None:
                where += f" bytes {frag.pack_offset}..{frag.pack_offset + frag.nbytes}"
            raise ChecksumError(
                f"checksum mismatch in tensor {name!r}: file {where} (fragment {frag.key!r} of rank {frag.rank}) "
                f"has {self.manifest.checksum_algorithm} {found}, expected {frag.checksums[index]}; the file is "
                "corrupt - restore it from a replica or load an older checkpoint (verify=False skips the check)"
            )
        self._verified.add(_cache_key(frag, index))

    @staticmethod
    def storage_chunk_key(array: np.ndarray | None, frag: Fragment, index: int) -> str:
        return chunk_key((1,), 0) if frag.pack_offset is not None else chunk_key(region_shape(frag.region), index)


def _digest_of(pieces: list[np.ndarray]) -> str:
    """The checksum of the pieces' bytes back to back (one chunk read into several arrays)."""
    if len(pieces) == 1:
        return _checksum.digest(pieces[0])
    hasher = _checksum.hasher()
    for piece in pieces:
        hasher.update(piece)
    return hasher.hexdigest()


def _then_first(future: Any) -> Any:
    """A future of the first item of ``future``'s list."""
    from ucp.stores.base import _then

    return _then(future, lambda found: found[0])


def _then_value(future: Any, value: Any) -> Any:
    """A future of ``value`` once ``future`` is done (or of its exception)."""
    from ucp.stores.base import _then

    return _then(future, lambda _: value)
