"""Reading boxes of a row-major tensor at a file offset: a new tensor, or into a (strided) view."""

from __future__ import annotations

import os

import torch
from hypothesis import given, settings, strategies as st

from ucp.formats.rawio import read_box
from ucp.geometry import Box


@st.composite
def _tensor_and_box(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    offsets = tuple(draw(st.integers(0, s - 1)) for s in shape)
    sizes = tuple(draw(st.integers(1, s - o)) for s, o in zip(shape, offsets))
    return shape, Box(offsets, sizes), draw(st.integers(0, 9))


@settings(max_examples=60, deadline=None)
@given(_tensor_and_box())
def test_a_box_read_equals_the_slice_into_a_new_tensor_or_a_view(tmp_path_factory, case):
    shape, box, pad = case
    data = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    path = tmp_path_factory.mktemp("raw") / "t.bin"
    path.write_bytes(b"\xff" * pad * 4 + data.numpy().tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        want = data[box.slices()]
        assert torch.equal(read_box(fd, pad * 4, shape, "float32", box, what="t"), want)
        # into a view of a larger tensor (strided when the box is narrower than the host's rows)
        host = torch.full((box.sizes[0] + 2,) + tuple(s + 1 for s in box.sizes[1:]), -1.0)
        view = host[(slice(1, 1 + box.sizes[0]),) + tuple(slice(0, s) for s in box.sizes[1:])]
        assert read_box(fd, pad * 4, shape, "float32", box, what="t", into=view) is view
        assert torch.equal(view, want)
        assert (host[0] == -1).all() and (host[-1] == -1).all()  # nothing written outside the view
    finally:
        os.close(fd)
