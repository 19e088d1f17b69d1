"""Packs on a disk bypass the page cache (O_DIRECT through a bounce buffer): same bytes, same checksums.

The aligned middle of each chunk goes through an ``O_DIRECT`` descriptor, its unaligned edges
through the buffered one; a file system that refuses ``O_DIRECT`` gets the same bytes buffered,
a failing write fails the save with nothing committed, and a flipped byte is still refused.
"""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
import torch

import ucp
from ucp import checksum, file_io
from ucp.file_io import DIRECT_ALIGN, BounceBuffers, open_direct, write_hashed
from ucp.stores import StoreOptions
from ucp.stores.local import LocalStore
from ucp.stores.pack_files import chunk_spans


def _direct_fd(path) -> int:
    fd = open_direct(str(path))
    if fd is None:
        pytest.skip(f"{path.parent} refuses O_DIRECT")
    return fd


def _written(tmp_path, offset: int, data: np.ndarray, **direct) -> tuple[bytes, str]:
    path = tmp_path / "f"
    path.write_bytes(b"")
    fd = os.open(path, os.O_WRONLY)
    digest = checksum.hasher()
    try:
        kwargs = {}
        if direct:
            kwargs = {"direct_fd": _direct_fd(path), "bounce": BounceBuffers(2 * DIRECT_ALIGN)}
        try:
            assert write_hashed(fd, offset, data.data, digest=digest, piece_bytes=3000, **kwargs)
        finally:
            if kwargs:
                os.close(kwargs["direct_fd"])
    finally:
        os.close(fd)
    return path.read_bytes(), digest.hexdigest()


@pytest.mark.parametrize("offset", [0, 64, DIRECT_ALIGN - 1, DIRECT_ALIGN, 3 * DIRECT_ALIGN + 5])
@pytest.mark.parametrize("nbytes", [0, 1, 100, DIRECT_ALIGN, 2 * DIRECT_ALIGN + 3, 7 * DIRECT_ALIGN + 11])
@pytest.mark.parametrize("direct", [False, True])
def test_write_hashed_puts_every_byte_at_its_offset_and_hashes_them_in_order(tmp_path, offset, nbytes, direct):
    data = np.random.default_rng(nbytes + offset).integers(0, 256, nbytes, dtype=np.uint8)
    found, digest = _written(tmp_path, offset, data, **({"direct": True} if direct else {}))
    assert found[offset:] == data.tobytes() and found[:offset] == bytes(min(offset, len(found)))
    assert digest == checksum.digest(data)


def test_a_refused_direct_write_puts_the_same_bytes_through_the_page_cache(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"")
    fd, direct = os.open(path, os.O_WRONLY), _direct_fd(path)
    pwrite = os.pwrite

    def refusing(target, view, at):
        if target == direct:
            raise OSError(errno.EINVAL, "O_DIRECT refused")
        return pwrite(target, view, at)

    monkeypatch.setattr(file_io.os, "pwrite", refusing)
    data = np.arange(10 * DIRECT_ALIGN + 7, dtype=np.uint8)
    digest = checksum.hasher()
    try:
        accepted = write_hashed(fd, 5, data.data, digest=digest, direct_fd=direct, bounce=BounceBuffers(DIRECT_ALIGN))
    finally:
        os.close(fd)
        os.close(direct)
    assert accepted is False  # the caller stops trying O_DIRECT
    assert path.read_bytes() == bytes(5) + data.tobytes() and digest.hexdigest() == checksum.digest(data)


def _state() -> dict:
    gen = torch.Generator().manual_seed(1)
    return {"w": torch.randn(700, 33, generator=gen), "b": torch.randn(5, generator=gen).to(torch.bfloat16)}


OPTIONS = StoreOptions(chunk_bytes=16 << 10, write_piece_bytes=8 << 10)


def _spy_direct(monkeypatch) -> list[bool]:
    """Records, for every chunk written, whether it went through an O_DIRECT descriptor."""
    used: list[bool] = []
    real = file_io.write_hashed

    def spy(fd, offset, view, **kw):
        used.append(kw.get("direct_fd") is not None)
        return real(fd, offset, view, **kw)

    import ucp.stores.pack_files as pack_files

    monkeypatch.setattr(pack_files, "write_hashed", spy)
    return used


def test_an_unbuffered_save_records_the_checksums_of_the_bytes_on_disk_and_refuses_a_flipped_one(tmp_path, monkeypatch):
    if file_io.on_memory_fs(str(tmp_path)):
        pytest.skip("tmp_path is on a memory file system: packs are written buffered there")
    used = _spy_direct(monkeypatch)
    state = _state()
    ucp.save(state, tmp_path / "c", store_options=OPTIONS)
    if not any(used):
        pytest.skip("this file system refuses O_DIRECT")
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    frag = manifest["tensors"]["w"]["fragments"][0]
    pack = tmp_path / "c" / "data" / frag["key"] / "c.0"
    raw = pack.read_bytes()
    spans = chunk_spans((700, 33), 4, frag["chunk_rows"])
    assert len(spans) > 1
    got = [checksum.digest(raw[frag["pack_offset"] + a : frag["pack_offset"] + b]) for a, b in spans]
    assert got == frag["checksums"]  # computed in the I/O thread from the bounce buffer: the bytes on disk
    assert torch.equal(ucp.load(tmp_path / "c")["w"], state["w"])
    at = frag["pack_offset"] + spans[1][0] + DIRECT_ALIGN  # inside an aligned block of chunk 1
    with open(pack, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(ucp.ChecksumError, match=f"expected {frag['checksums'][1]}"):
        ucp.load(tmp_path / "c")


def test_a_failing_direct_write_fails_the_save_and_commits_nothing(tmp_path, monkeypatch):
    if file_io.on_memory_fs(str(tmp_path)):
        pytest.skip("tmp_path is on a memory file system: packs are written buffered there")
    opened: list[int] = []
    real_open = file_io.open_direct

    def tracking(path):
        fd = real_open(path)
        if fd is not None:
            opened.append(fd)
        return fd

    import ucp.stores.pack_files as pack_files

    monkeypatch.setattr(pack_files, "open_direct", tracking)
    pwrite = os.pwrite

    def failing(target, view, at):
        if target in opened:
            raise OSError(errno.EIO, "device error")
        return pwrite(target, view, at)

    monkeypatch.setattr(file_io.os, "pwrite", failing)
    with pytest.raises(OSError, match="device error"):
        ucp.save(_state(), tmp_path / "c", store_options=OPTIONS)
    if not opened:
        pytest.skip("this file system refuses O_DIRECT")
    assert not (tmp_path / "c" / "manifest.json").exists()
    with pytest.raises(ucp.UcpError):
        ucp.load(tmp_path / "c")


def test_memory_file_systems_and_the_option_off_write_through_the_page_cache(tmp_path):
    assert LocalStore(tmp_path, options=StoreOptions(unbuffered_packs=False))._bounce_buffers() is None
    if os.path.isdir("/dev/shm") and file_io.on_memory_fs("/dev/shm"):
        store = LocalStore(os.path.join("/dev/shm", f"ucp-test-{os.getpid()}-{tmp_path.name}"))
        try:
            assert store._bounce_buffers() is None
        finally:
            store.remove()
