"""ucp.file_io.write_atomic: a failure or a kill part-way leaves the old file whole and no temporary file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ucp import file_io
from ucp.file_io import write_atomic

OLD, NEW = b"old contents\n", b"n" * (1 << 20)
ROOT = Path(__file__).resolve().parents[2]  # the repository: the child imports this ucp


def _half_then(fail):
    """A write_all that writes half of the first buffer, then calls ``fail()``."""
    def write_all(fd, view):
        os.write(fd, view[: view.nbytes // 2])
        fail()
    return write_all


@pytest.fixture(params=["unnamed", "named"])
def way(request, monkeypatch):
    """Both ways the bytes are staged: an O_TMPFILE (Linux) and a named temporary file (elsewhere)."""
    if request.param == "named":
        monkeypatch.setattr(file_io, "_write_unnamed", lambda *args: False)
    elif not getattr(os, "O_TMPFILE", 0):
        pytest.skip("no O_TMPFILE on this system")
    return request.param


def test_replaces_the_file_and_leaves_nothing_else(tmp_path, way):
    target = tmp_path / "state.json"
    target.write_bytes(OLD)
    write_atomic(target, NEW)
    assert target.read_bytes() == NEW and os.listdir(tmp_path) == ["state.json"]
    write_atomic(tmp_path / "fresh", memoryview(b"abc"), durable=False)
    assert (tmp_path / "fresh").read_bytes() == b"abc" and sorted(os.listdir(tmp_path)) == ["fresh", "state.json"]


def test_an_exception_mid_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch, way):
    target = tmp_path / "state.json"
    target.write_bytes(OLD)

    def fail():
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(file_io, "write_all", _half_then(fail))
    with pytest.raises(OSError, match="No space left on device"):
        write_atomic(target, NEW)
    assert target.read_bytes() == OLD and os.listdir(tmp_path) == ["state.json"]


def test_a_failed_rename_removes_the_temporary(tmp_path, monkeypatch, way):
    target = tmp_path / "state.json"
    target.write_bytes(OLD)

    def replace(*args, **kwargs):
        raise KeyboardInterrupt  # BaseException too: an interrupt never leaves a temporary file

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, NEW)
    assert target.read_bytes() == OLD and os.listdir(tmp_path) == ["state.json"]


_KILLED_CHILD = """
import os, sys, time
from ucp import file_io
def stall(fd, view):
    os.write(fd, view[: view.nbytes // 2])
    print("writing", flush=True)
    time.sleep(60)
file_io.write_all = stall
file_io.write_atomic(sys.argv[1], b"n" * (1 << 20))
"""


def test_a_kill_mid_write_keeps_the_old_file_and_no_temporary(tmp_path):
    if not getattr(os, "O_TMPFILE", 0):
        pytest.skip("no O_TMPFILE on this system: a killed writer leaves its hidden .tmp file")
    target = tmp_path / "state.json"
    target.write_bytes(OLD)
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(target)], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout.readline() == b"writing\n"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert target.read_bytes() == OLD and os.listdir(tmp_path) == ["state.json"]
