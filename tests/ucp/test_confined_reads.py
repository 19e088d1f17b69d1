"""Reads stay inside the checkpoint and within what the manifest says: no symlink escapes, no FIFOs or
devices, no unbounded reads, no absurd chunking, a bounded queue of chunk reads (issue 8, items 10-11)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import tracemalloc
from pathlib import Path

import pytest
import torch

import ucp
import ucp.manifest
from ucp.stores import LocalStore, StoreOptions
from ucp.tools.cli import main as ucp_main

W = torch.arange(48.0).view(12, 4)


# Each read path: a fragment in a pack (the default for small tensors), a one-chunk array read as
# a plain file, and a multi-chunk array (4 rows per chunk: 3 chunks) read chunk by chunk straight
# into the destination.
IO = {
    "packed": StoreOptions(),
    "plain-file": StoreOptions(pack_max_bytes=0),
    "direct": StoreOptions(pack_max_bytes=0, small_array_bytes=-1, chunk_bytes=64),
}


@pytest.fixture(params=list(IO))
def io_path(request):
    return request.param


def _chunk(path: Path, name: str = "w") -> Path:
    frag = json.loads((path / "manifest.json").read_text())["tensors"][name]["fragments"][0]
    ndim = 1 if "pack_offset" in frag else 2
    return path / "data" / frag["key"] / ".".join(["c"] + ["0"] * ndim)


def _what(path: Path, name: str = "w") -> str:
    frag = json.loads((path / "manifest.json").read_text())["tensors"][name]["fragments"][0]
    return f"tensor {name!r} (fragment {frag['key']!r} of rank 0)"


def _load_in_thread(path, timeout: float = 60.0, store_options: StoreOptions | None = None):
    """``ucp.load(path)`` on a thread: (finished, result or exception). A read blocked on a FIFO would hang."""
    box: dict = {}

    def work():
        try:
            box["value"] = ucp.load(path, store_options=store_options)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box["value"] = err

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), box.get("value")


def test_a_symlink_out_of_the_checkpoint_is_refused(tmp_path, io_path):
    path = tmp_path / "c"
    ucp.save({"w": W}, path, store_options=IO[io_path])
    chunk = _chunk(path)
    outside = tmp_path / "elsewhere" / chunk.name
    outside.parent.mkdir()
    shutil.copy(chunk, outside)  # the same bytes: a checksum cannot tell
    chunk.unlink()
    chunk.symlink_to(outside)
    with pytest.raises(ucp.UnsafePathError) as err:
        ucp.load(path, store_options=IO[io_path])
    assert str(err.value) == (
        f"{_what(path)}: {chunk} resolves to {outside}, outside the checkpoint {path}; refusing to read it - "
        "replace the link with the file itself"
    )
    assert isinstance(err.value, PermissionError)
    report = ucp.verify(path)
    assert not report.ok and [p.kind for p in report.problems] == ["UnsafePathError"]


def test_a_symlinked_directory_out_of_the_checkpoint_is_refused(tmp_path):
    path = tmp_path / "c"
    ucp.save({"w": W}, path)
    shutil.move(path / "data", tmp_path / "data-elsewhere")
    (path / "data").symlink_to(tmp_path / "data-elsewhere")
    with pytest.raises(ucp.UnsafePathError, match="outside the checkpoint"):
        ucp.load(path)


def test_links_that_stay_inside_the_checkpoint_are_followed(tmp_path, io_path):
    path = tmp_path / "c"
    ucp.save({"w": W}, path, store_options=IO[io_path])
    chunk = _chunk(path)
    moved = path / "moved"
    shutil.move(chunk, moved)
    chunk.symlink_to(os.path.relpath(moved, chunk.parent))
    assert torch.equal(ucp.load(path, store_options=IO[io_path])["w"], W)
    linked = tmp_path / "latest"  # the root itself may be a link (ckpt/latest -> step_100)
    linked.symlink_to(path)
    assert torch.equal(ucp.load(linked, store_options=IO[io_path])["w"], W)


def test_a_manifest_linked_from_outside_is_refused(tmp_path):
    path = tmp_path / "c"
    ucp.save({"w": W}, path)
    outside = tmp_path / "manifest-elsewhere.json"
    shutil.move(path / "manifest.json", outside)
    (path / "manifest.json").symlink_to(outside)
    with pytest.raises(ucp.UnsafePathError, match=f"^{path / 'manifest.json'} resolves to {outside}, outside"):
        ucp.load(path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_chunk_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, io_path, kind):
    path = tmp_path / "c"
    ucp.save({"w": W}, path, store_options=IO[io_path])
    chunk = _chunk(path)
    chunk.unlink()
    if kind == "fifo":
        os.mkfifo(chunk)
    elif kind == "dev-zero":
        chunk.symlink_to("/dev/zero")
    else:
        chunk.mkdir()
    finished, result = _load_in_thread(path, store_options=IO[io_path])
    if not finished:  # release the reader blocked on the FIFO, then fail
        os.close(os.open(chunk, os.O_WRONLY | os.O_NONBLOCK))
    assert finished, "ucp.load blocked on a FIFO"
    assert isinstance(result, ucp.UnsafePathError), result
    described = {"fifo": "a FIFO", "dev-zero": "a character device", "directory": "a directory"}[kind]
    assert str(result) == (
        f"{_what(path)}: {chunk} is {described}, not a regular file; refusing to read it - the checkpoint is "
        "damaged (restore the file or load an older checkpoint)"
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_manifest_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    path = tmp_path / "c"
    ucp.save({"w": W}, path)
    manifest = path / "manifest.json"
    manifest.unlink()
    if kind == "fifo":
        os.mkfifo(manifest)
    else:
        manifest.symlink_to("/dev/zero")
    finished, result = _load_in_thread(path)
    if not finished:
        os.close(os.open(manifest, os.O_WRONLY | os.O_NONBLOCK))
    assert finished, "ucp.load blocked on the manifest"
    assert isinstance(result, ucp.UnsafePathError), result
    assert str(result).startswith(f"{manifest} is {'a FIFO' if kind == 'fifo' else 'a character device'}, not a "
                                  "regular file; refusing to read it")
    assert ucp_main(["verify", str(path), "--json"]) == 1


def _peak_bytes(fn) -> tuple[int, object]:
    tracemalloc.start()
    try:
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - returned for the test to check
            result = err
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def test_a_huge_sparse_chunk_is_refused_before_it_is_read(tmp_path, io_path):
    path = tmp_path / "c"
    ucp.save({"w": W}, path, store_options=IO[io_path])
    chunk = _chunk(path)
    with open(chunk, "r+b") as fh:
        fh.truncate(512 << 20)  # sparse: costs no disk, but a reader that reads it all holds 512 MiB
    peak, result = _peak_bytes(lambda: ucp.load(path, verify=False, store_options=IO[io_path]))
    assert peak < 32 << 20, f"the read held {peak} bytes"
    if io_path == "packed":  # a load reads only the fragment's bytes of the pack, which are intact
        assert torch.equal(result["w"], W)
    else:
        assert isinstance(result, ucp.TruncatedDataError), result
    peak, report = _peak_bytes(lambda: ucp.verify(path))
    assert peak < 32 << 20, f"verify held {peak} bytes"
    assert [(p.tensor, p.kind) for p in report.problems] == [("w", "TruncatedDataError")]


def test_a_manifest_over_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "c"
    ucp.save({"w": W}, path)
    monkeypatch.setattr(ucp.manifest, "MAX_MANIFEST_BYTES", 1 << 20)
    with open(path / "manifest.json", "r+b") as fh:
        fh.truncate(256 << 20)
    peak, result = _peak_bytes(lambda: ucp.load(path))
    assert isinstance(result, ucp.UnsafePathError), result
    assert str(result) == (
        f"{path / 'manifest.json'} holds {256 << 20} bytes, more than the {1 << 20} that a manifest may hold "
        "(ucp.manifest.MAX_MANIFEST_BYTES); refusing to read it - the checkpoint is damaged"
    )
    assert peak < 32 << 20


def test_absurd_chunking_is_refused(tmp_path):
    path = tmp_path / "c"
    ucp.save({"v": torch.zeros(1 << 18)}, path, store_options=StoreOptions(pack_max_bytes=0))  # 1 MiB: one chunk
    manifest = json.loads((path / "manifest.json").read_text())
    frag = manifest["tensors"]["v"]["fragments"][0]
    frag["chunk_rows"] = 1  # 262144 chunk files of 4 bytes, each a read
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ucp.ManifestError) as err:
        ucp.load(path)
    assert str(err.value) == (
        f"{path / 'manifest.json'}: tensor 'v' fragment {frag['key']!r}: chunk_rows 1 cuts 1048576 bytes into "
        "262144 chunks; a fragment of more than 4096 chunks needs chunks of 65536 bytes or more on average"
    )


def count_in_flight(monkeypatch, cls, name: str) -> dict:
    """A spy on ``cls.name`` (a method returning a future): counts calls and the most in flight, changes nothing."""
    started = getattr(cls, name)
    live = {"now": 0, "most": 0, "calls": 0}
    lock = threading.Lock()

    def counting(self, *args, **kwargs):
        future = started(self, *args, **kwargs)
        with lock:
            live["now"] += 1
            live["calls"] += 1
            live["most"] = max(live["most"], live["now"])

        def done(_):
            with lock:
                live["now"] -= 1

        future.add_done_callback(done)
        return future

    monkeypatch.setattr(cls, name, counting)
    return live


def test_chunk_reads_in_flight_are_bounded(tmp_path, monkeypatch):
    options = StoreOptions(pack_max_bytes=0, small_array_bytes=-1, chunk_bytes=16)  # 1000 chunks of one row
    path = tmp_path / "c"
    big = torch.arange(4000.0).view(1000, 4)
    ucp.save({"w": big}, path, store_options=options)
    live = count_in_flight(monkeypatch, LocalStore, "read_chunk_into")
    assert torch.equal(ucp.load(path, store_options=options)["w"], big)
    assert live["most"] <= options.reads_at_once
