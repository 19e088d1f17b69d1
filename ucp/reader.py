"""Reading a checkpoint: any region of any logical tensor, touching only overlapping chunks.

The reader turns "fill this region of logical tensor X" into copy operations
with :func:`ucp.geometry.plan_overlaps` (pure geometry) and executes them
against the stored fragments, chunk by chunk along dim 0, with a few chunks
prefetched. Memory beyond the destination is a bounded buffer (a handful of
chunks), whatever the sizes of the fragments. Each chunk read is checked
against its recorded checksum once per reader::

    reader = CheckpointReader("ckpt/step_10")
    part = reader.read_tensor("fc.weight", Box((4, 0), (4, 3)))   # rows 4..7 only
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Any, Iterator

import numpy as np
import torch

from ucp import checksum as _checksum
from ucp.commit import find_manifest, read_manifest
from ucp.dtypes import allocate, from_numpy, storage_dtype, to_numpy, torch_dtype
from ucp.errors import ChecksumError, KeyMismatchError, ManifestError, ShapeMismatchError
from ucp.geometry import Box, FlatRange, Region, plan_overlaps, region_fits, region_shape
from ucp.manifest import Fragment, Manifest, TensorEntry
from ucp.spec import LogicalTensor
from ucp.storage import SMALL_ARRAY_BYTES, Storage, chunk_count

# Chunks read ahead within one copy: enough to overlap I/O with copying, few enough that
# the read buffer (PREFETCH_CHUNKS + 1 chunks of ~32 MiB) stays small next to a shard.
PREFETCH_CHUNKS = 2
# Chunk reads of one fragment in flight at once when it is read straight into its destination.
READS_IN_FLIGHT = 8
SLAB_BYTES = 64 << 20
# Local chunk files are read with plain reads (tensorstore's reader costs several copies of
# each chunk in peak memory); False reads them through tensorstore like remote ones.
DIRECT_LOCAL_READS = True


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
        raise ShapeMismatchError(f"cannot read {region} of tensor {name!r}: it does not fit its shape "
                                 f"{list(entry.shape)}")
    if tuple(dest.shape) != region_shape(region) or dest.dtype != torch_dtype(entry.dtype):
        raise ShapeMismatchError(
            f"cannot read {region} of tensor {name!r} into a {str(dest.dtype).removeprefix('torch.')}"
            f"{list(dest.shape)} tensor; it needs {entry.dtype}{list(region_shape(region))}"
        )


def _cache_key(frag: Fragment, index: int) -> tuple[str, int]:
    """Chunk identity: packed fragments share their pack's key, so their offset tells them apart."""
    return (frag.key, index if frag.pack_offset is None else -1 - frag.pack_offset)


class CheckpointReader:
    """A committed checkpoint opened for reading (manifest parsed and validated)."""

    def __init__(self, path: str, *, verify: bool = True, storage_options: dict | None = None,
                 opened: tuple[Storage, Manifest] | None = None) -> None:
        """Open the checkpoint at ``path`` (``opened``: its storage and manifest, when already read)."""
        self.path = str(path)
        self.storage, self.manifest = opened or (None, None)
        if self.storage is None:
            self.storage = find_manifest(self.path, storage_options=storage_options)
            self.manifest = read_manifest(self.storage)
        self.verify = verify and self.manifest.checksum_algorithm is not None
        self._stores: dict[str, Any] = {}
        self._chunks: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._verified: set[tuple[str, int]] = set()
        self._pack_extents: dict[str, int] | None = None  # pack key -> bytes its fragments reach

    def close(self) -> None:
        """Drop buffers and I/O threads (the reader stays usable)."""
        self._chunks.clear()
        self._stores.clear()
        self.storage.close()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def logical(self) -> dict[str, LogicalTensor]:
        """Every logical tensor in the checkpoint."""
        return {n: LogicalTensor(n, t.shape, t.dtype) for n, t in self.manifest.tensors.items()}

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
        _check_read(name, entry, region, dest)
        frags = entry.fragments
        dest_flat = dest.view(-1) if isinstance(region, FlatRange) else None
        for op in plan_overlaps([f.region for f in frags], region, entry.shape):
            frag = frags[op.source]
            if isinstance(region, Box):
                target_view = dest[op.overlap.relative_to(region).slices()] if region.ndim else dest
            else:
                span = op.dst.span
                block = dest_flat[span.start : span.stop].view(op.dst.box.sizes)
                target_view = block[op.overlap.relative_to(op.dst.box).slices()]
            self._copy(entry, frag, op.src.box, op.src.span, op.overlap, target_view)
        self._chunks.clear()  # the buffer is per call: memory stays bounded across a whole load

    def iter_tensors(self, names: list[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Whole logical tensors, one at a time, in name order."""
        for name in names if names is not None else sorted(self.manifest.tensors):
            yield name, self.read_tensor(name)
            self._chunks.clear()
            self._stores.pop(name, None)

    def check_fragment(self, name: str, frag: Fragment) -> None:
        """Read every chunk of one fragment and check it (raises the first problem)."""
        for index in range(chunk_count(region_shape(frag.region), frag.chunk_rows)):
            self._chunk(name, frag, index, prefetch_to=index)
            self._chunks.pop((frag.key, index), None)

    # -- execution -------------------------------------------------------------
    def _copy(self, entry: TensorEntry, frag: Fragment, src_box: Box, span: FlatRange | None,
              overlap: Box, target_view: torch.Tensor) -> None:
        if self._reads_whole_fragment(frag, src_box, span, overlap, target_view):
            self._read_straight(entry, frag, target_view)
            return
        if isinstance(frag.region, Box):
            rel = overlap.relative_to(frag.region)
            strides = _row_major_strides(frag.region.sizes)
            base0 = 0
        else:
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
        rows_per_slab = max(1, SLAB_BYTES // max(1, row_stride * itemsize))
        for r0 in range(0, sizes[0], rows_per_slab):
            nrows = min(rows_per_slab, sizes[0] - r0)
            offsets = (rel.offsets[0] + r0,) + rel.offsets[1:]
            shape = (nrows,) + sizes[1:]
            base = base0 + sum(o * s for o, s in zip(offsets, strides))
            extent = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
            buf = self._elements(entry.name, frag, base, base + extent, elems_per_chunk)
            view = np.lib.stride_tricks.as_strided(buf, shape, tuple(s * buf.itemsize for s in strides))
            _assign(target_view[r0 : r0 + nrows], view, entry.dtype)

    def _reads_whole_fragment(self, frag: Fragment, src_box: Box, span: FlatRange | None, overlap: Box,
                              target_view: torch.Tensor) -> bool:
        """Whether the copy is a whole local fragment into a contiguous CPU destination."""
        if not (self.storage.local and DIRECT_LOCAL_READS and frag.pack_offset is None and overlap.ndim):
            return False
        if not (target_view.device.type == "cpu" and target_view.is_contiguous() and target_view.numel()):
            return False
        if isinstance(frag.region, Box):
            return overlap == frag.region
        return span.start == 0 and span.stop == frag.region.numel and overlap == src_box

    def _read_straight(self, entry: TensorEntry, frag: Fragment, target_view: torch.Tensor) -> None:
        """Read every chunk of a fragment straight into the destination, in parallel: no buffer, no copy."""
        shape = region_shape(frag.region)
        array = to_numpy(target_view).reshape(shape)
        what = f"tensor {entry.name!r} (fragment {frag.key!r} of rank {frag.rank})"
        rows = frag.chunk_rows

        def start(i: int) -> Any:
            return self.storage.read_chunk_into(f"data/{frag.key}", shape, i, rows, array[i * rows : (i + 1) * rows],
                                                what=what, digest=_checksum.digest if self.verify else None)

        # A bounded window of reads in flight: a fragment of a million chunks queues no more.
        count = chunk_count(shape, rows)
        window = deque(start(i) for i in range(min(count, READS_IN_FLIGHT)))
        for index in range(count):
            found = window.popleft().result()
            if index + READS_IN_FLIGHT < count:
                window.append(start(index + READS_IN_FLIGHT))
            if self.verify and (frag.key, index) not in self._verified:
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

    def _store(self, name: str, frag: Fragment) -> Any:
        store = self._stores.get(frag.key)
        if store is None:
            what = f"tensor {name!r} (fragment {frag.key!r} of rank {frag.rank})"
            store = self.storage.open_array(f"data/{frag.key}", what=what)
            entry = self.manifest.tensors[name]
            expected = (region_shape(frag.region), storage_dtype(entry.dtype))
            found = (tuple(store.shape), store.dtype.name)
            if found != expected:
                raise ManifestError(
                    f"{what}: stored array {self.storage.display('data', frag.key)} is {found[1]}{list(found[0])} "
                    f"but the manifest says {expected[1]}{list(expected[0])}; the checkpoint is damaged"
                )
            if len(self._stores) > 256:
                self._stores.clear()
            self._stores[frag.key] = store
        return store

    def _chunk(self, name: str, frag: Fragment, index: int, *, prefetch_to: int) -> np.ndarray:
        if frag.pack_offset is not None or (
            frag.nbytes <= SMALL_ARRAY_BYTES and chunk_count(region_shape(frag.region), frag.chunk_rows) == 1
        ):
            return self._small_chunk(name, frag)
        what = f"tensor {name!r} (fragment {frag.key!r} of rank {frag.rank})"
        rel = f"data/{frag.key}"
        shape = region_shape(frag.region)
        if self.storage.local and DIRECT_LOCAL_READS:
            # Uncompressed chunks of local files are read straight into a numpy buffer by a
            # few threads: no tensorstore open per fragment, and no intermediate copies.
            dtype = storage_dtype(self.manifest.tensors[name].dtype)
            start = lambda i: self.storage.read_chunk_direct(rel, shape, dtype, i, frag.chunk_rows, what=what)  # noqa: E731
        else:
            store = self._store(name, frag)
            start = lambda i: self.storage.read_chunk(rel, store, i, frag.chunk_rows, what=what)  # noqa: E731
        for ahead in range(index, min(prefetch_to, index + PREFETCH_CHUNKS) + 1):
            if (frag.key, ahead) not in self._chunks:
                self._chunks[(frag.key, ahead)] = (False, start(ahead))
        ready, value = self._chunks[(frag.key, index)]
        if not ready:
            value = self.storage.wait_chunk(value, rel, index, shape, what=what)
            if self.verify and (frag.key, index) not in self._verified:
                self._check(name, frag, index, value)
            self._chunks[(frag.key, index)] = (True, value)
        self._chunks.move_to_end((frag.key, index))
        while len(self._chunks) > PREFETCH_CHUNKS + 2:
            self._chunks.popitem(last=False)
        return value

    def _small_chunk(self, name: str, frag: Fragment) -> np.ndarray:
        """A one-chunk fragment read as a plain file (no tensorstore open; see ucp.storage)."""
        cached = self._chunks.get(_cache_key(frag, 0))
        if cached is not None and cached[0]:
            return cached[1]
        what = f"tensor {name!r} (fragment {frag.key!r} of rank {frag.rank})"
        dtype = storage_dtype(self.manifest.tensors[name].dtype)
        if frag.pack_offset is not None:
            value = self.storage.read_packed(f"data/{frag.key}", frag.pack_offset, region_shape(frag.region), dtype,
                                             what=what, extent=self.pack_extent(frag.key))
        else:
            value = self.storage.read_small(f"data/{frag.key}", region_shape(frag.region), dtype, what=what)
        if self.verify and _cache_key(frag, 0) not in self._verified:
            self._check(name, frag, 0, value)
        self._chunks[_cache_key(frag, 0)] = (True, value)
        while len(self._chunks) > PREFETCH_CHUNKS + 2:
            self._chunks.popitem(last=False)
        return value

    def pack_extent(self, key: str) -> int:
        """How many bytes of pack ``key`` the manifest's fragments reach: all a read of it may take."""
        if self._pack_extents is None:
            extents: dict[str, int] = {}
            for entry in self.manifest.tensors.values():
                for f in entry.fragments:
                    if f.pack_offset is not None:
                        extents[f.key] = max(extents.get(f.key, 0), f.pack_offset + f.nbytes)
            self._pack_extents = extents
        return self._pack_extents[key]

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
    def storage_chunk_key(array: np.ndarray, frag: Fragment, index: int) -> str:
        from ucp.storage import chunk_key

        return chunk_key((0,) if frag.pack_offset is not None else region_shape(frag.region), index)
