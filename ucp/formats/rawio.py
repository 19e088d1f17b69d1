"""Tensor bytes at file offsets: what readers and writers of flat binary formats share.

safetensors files and the storage records of torch.save files hold each tensor
as raw little-endian, row-major bytes at an offset. These helpers read any box
of such a tensor (only the rows it spans, in bounded slabs) and write a tensor,
or a contiguous box of it, at its place - with plain ``os.pread``/``os.pwrite``,
no mmap, so a reader's memory is exactly what it returns.

>>> import os, tempfile, torch
>>> path = os.path.join(tempfile.mkdtemp(), "raw")
>>> with open(path, "wb") as fh:
...     write_at(fh.fileno(), 0, torch.arange(12.0))
48
>>> with open(path, "rb") as fh:
...     read_box(fh.fileno(), 0, (3, 4), "float32", Box((1, 1), (2, 2)), what="w")
tensor([[ 5.,  6.],
        [ 9., 10.]])
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from ucp.dtypes import allocate, to_numpy
from ucp.errors import TruncatedDataError
from ucp.geometry import Box

__all__ = ["read_box", "write_at", "flat_offset", "SLAB_BYTES", "WRITEBACK_BYTES"]

# Rows read at once when a box spans only part of each row (the rest of the row is discarded).
SLAB_BYTES = 32 << 20
# Writes at least this large start their writeback at once (see write_at).
WRITEBACK_BYTES = 4 << 20


def flat_offset(shape: tuple[int, ...], offsets: tuple[int, ...]) -> int:
    """Row-major element index of ``offsets`` in a ``shape`` tensor."""
    index = 0
    for size, offset in zip(shape, offsets, strict=True):
        index = index * size + offset
    return index


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    array = to_numpy(tensor.detach().to("cpu"))
    array = np.ascontiguousarray(array)
    return array.reshape(-1).view(np.uint8).data


def _pread_into(fd: int, offset: int, view: memoryview, what: str) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise TruncatedDataError(
                f"{what}: the file ends {len(view) - done} bytes before the tensor's data does "
                f"(needs bytes {offset}..{offset + len(view)}); the file is truncated - copy it again"
            )
        done += n


def write_at(fd: int, offset: int, tensor: torch.Tensor) -> int:
    """Write the tensor's row-major bytes at ``offset``; returns the bytes written.

    The kernel is asked to start writing them back right away (``POSIX_FADV_DONTNEED``
    starts writeback of dirty pages, and drops them once clean), so the final ``fsync``
    of the commit waits for the tail only, and converting does not fill the page cache.
    """
    view = _bytes_of(tensor)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    if len(view) >= WRITEBACK_BYTES and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, len(view), os.POSIX_FADV_DONTNEED)
    return len(view)


def read_box(
    fd: int, offset: int, shape: tuple[int, ...], dtype: str, box: Box, *, what: str, into: torch.Tensor | None = None
) -> torch.Tensor:
    """``box`` of the row-major ``shape`` tensor whose bytes start at ``offset`` in ``fd``.

    Into a new tensor, or into ``into`` (a tensor of the box's sizes and the dtype, possibly a strided
    view of a larger one: a contiguous run of the file then lands in it with no copy in between).
    """
    out = allocate(box.sizes, dtype, what=what) if into is None else into
    if box.is_empty() or not shape and not out.numel():
        return out
    itemsize = out.element_size()
    trailing = math.prod(shape[1:])
    row_bytes = trailing * itemsize
    if out.is_contiguous() and (not shape or _contiguous(shape, box)):
        start = flat_offset(shape, box.offsets) * itemsize if shape else 0
        _pread_into(fd, offset + start, to_numpy(out).reshape(-1).view(np.uint8).data, what)
        return out
    # Read whole rows of dim 0 in slabs and copy the box's part of them.
    rows = max(1, SLAB_BYTES // max(1, row_bytes))
    inner = tuple(slice(o, o + s) for o, s in zip(box.offsets[1:], box.sizes[1:], strict=True))
    for r0 in range(0, box.sizes[0], rows):
        n = min(rows, box.sizes[0] - r0)
        slab = allocate((n,) + tuple(shape[1:]), dtype, what=what)
        _pread_into(
            fd, offset + (box.offsets[0] + r0) * row_bytes, to_numpy(slab).reshape(-1).view(np.uint8).data, what
        )
        out[r0 : r0 + n] = slab[(slice(None),) + inner]
    return out


def _contiguous(shape: tuple[int, ...], box: Box) -> bool:
    """Whether a box is one run of the row-major flattening (size 1 in leading dims, full in trailing ones)."""
    dims = len(shape)
    k = next((d for d in range(dims) if box.sizes[d] != 1), dims)
    return all(box.sizes[d] == shape[d] and box.offsets[d] == 0 for d in range(k + 1, dims))
