"""Pointing ucp at something that is not a ucp checkpoint says what it is and what to run (issue 8, item 13);
"a save was started but never committed" is kept for what a ucp save really left behind."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch

import ucp
from ucp.formats.base import Format, _REGISTRY
from ucp.tools.cli import main as ucp_main


def _fake_reader(path, **_):
    from ucp.errors import FormatError
    raise FormatError(f"the fake reader opened {path}")


@pytest.fixture()
def fake_format(monkeypatch):
    """A registered format that recognises directories holding `fake.marker` and files named `*.fake`
    (the real DCP/DeepSpeed/HF readers register the same way; this keeps the test about the message)."""
    def detect(path: str) -> bool:
        return path.endswith(".fake") or os.path.isfile(os.path.join(path, "fake.marker"))

    fmt = Format("fake", "Fake Framework checkpoint", detect, _fake_reader)
    monkeypatch.setitem(_REGISTRY, "fake", fmt)
    return fmt


def _expect(path, error, message, capsys, foreign=False):
    """The same error from ucp.load, ucp.verify, ucp.describe; `ucp inspect`/`ucp verify` exit 2 with it.

    For a checkpoint of another known format the CLI shows that format through its own reader instead
    (`ucp inspect model.safetensors` works), so there only the API calls must refuse."""
    for call in (ucp.load, ucp.verify, ucp.describe):
        with pytest.raises(error) as err:
            call(path)
        assert type(err.value) is error and str(err.value) == message
    if foreign:
        assert ucp_main(["inspect", str(path)]) == 2
        assert capsys.readouterr().err.strip() == f"ucp inspect: error: the fake reader opened {path}"
        return
    assert ucp_main(["inspect", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"ucp inspect: error: {message}"
    assert ucp_main(["verify", str(path), "--json"]) == 2
    assert json.loads(capsys.readouterr().out) == {"path": str(path), "ok": False, "error": "not-a-checkpoint",
                                                   "message": message}


def test_a_folder_of_another_format_names_it_and_the_conversion(tmp_path, fake_format, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "fake.marker").write_text("x")
    (folder / "weights.bin").write_bytes(b"\0" * 8)
    _expect(folder, ucp.NotACheckpointError,
            f"{folder} is a Fake Framework checkpoint (format 'fake'), not a ucp checkpoint; convert it with: "
            f"ucp convert {folder} NEW_PATH", capsys, foreign=True)


def test_a_file_of_another_format_names_it_and_the_conversion(tmp_path, fake_format, capsys):
    file = tmp_path / "model.fake"
    file.write_bytes(b"\0" * 8)
    _expect(file, ucp.NotACheckpointError,
            f"{file} is a Fake Framework checkpoint (format 'fake'), not a ucp checkpoint; convert it with: "
            f"ucp convert {file} NEW_PATH", capsys, foreign=True)


def test_a_plain_file(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("hello")
    _expect(file, ucp.NotACheckpointError,
            f"{file} is a file, not a ucp checkpoint (a directory with manifest.json), and no known format "
            f"recognises it; if it is a checkpoint of another format, name the format: ucp convert --from FORMAT "
            f"{file} NEW_PATH", capsys)


def test_an_empty_directory(tmp_path, capsys):
    folder = tmp_path / "empty"
    folder.mkdir()
    _expect(folder, ucp.NotACheckpointError, f"{folder} is an empty directory, not a checkpoint (no manifest.json)",
            capsys)


def test_a_directory_of_something_else(tmp_path, capsys):
    folder = tmp_path / "stuff"
    folder.mkdir()
    for name in ("a.txt", "b.bin"):
        (folder / name).write_text("x")
    _expect(folder, ucp.NotACheckpointError,
            f"{folder} is not a ucp checkpoint (no manifest.json; it holds a.txt, b.bin) and no known format "
            "recognises it", capsys)


def test_a_device(capsys):
    _expect(Path("/dev/zero"), ucp.NotACheckpointError,
            "/dev/zero is a character device, not a ucp checkpoint (a directory with manifest.json)", capsys)


def test_a_fifo_is_named_without_blocking(tmp_path, fake_format):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    box: dict = {}

    def work():
        try:
            ucp.load(fifo)
        except Exception as err:  # noqa: BLE001 - handed to the test
            box["error"] = err

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not thread.is_alive(), "ucp.load blocked on a FIFO"
    assert str(box["error"]) == f"{fifo} is a FIFO, not a ucp checkpoint (a directory with manifest.json)"


def test_nothing_there(tmp_path, capsys):
    _expect(tmp_path / "nothing", ucp.CheckpointNotFoundError,
            f"no checkpoint at {tmp_path / 'nothing'} (no manifest.json); check the path", capsys)


def test_what_a_ucp_save_left_is_still_an_uncommitted_save(tmp_path, capsys):
    path = tmp_path / "c"
    ucp.save({"w": torch.ones(2)}, path)
    (path / "manifest.json").unlink()  # data/ without a manifest: a save that never committed
    message = (f"{path} has no committed manifest.json: a save was started but never committed (crashed or still "
               "running); load an older checkpoint")
    _expect(path, ucp.IncompleteCheckpointError, message, capsys)
    staging = tmp_path / ".d.ucp-staging-0123456789ab"
    staging.mkdir()  # a killed save of `d` that never reached its rename
    with pytest.raises(ucp.IncompleteCheckpointError, match="a save was started but never committed"):
        ucp.load(tmp_path / "d")


@pytest.mark.parametrize("url, message", [
    ("foo://x", "cannot open foo://x: Protocol not known: foo; give a local path or an fsspec URL whose backend is "
                "installed (memory://, file://, s3:// with s3fs, ...)"),
    ("", "'' is not a checkpoint path; give a directory or an fsspec URL"),
    ("a\0b", "'a\\x00b' is not a checkpoint path; give a directory or an fsspec URL"),
])
def test_a_url_no_backend_opens_is_a_clear_error(url, message, capsys):
    for call in (ucp.load, ucp.verify, ucp.describe):
        with pytest.raises(ucp.StorageURLError) as err:
            call(url)
        assert str(err.value) == message and isinstance(err.value, ValueError)
    with pytest.raises(ucp.StorageURLError):
        ucp.save({"w": torch.ones(1)}, url)
    assert ucp_main(["inspect", url]) == 2
    assert capsys.readouterr().err.strip() == f"ucp inspect: error: {message}"
    assert ucp_main(["verify", url, "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "StorageURLError"


def test_the_core_names_a_foreign_format_in_a_process_that_never_imported_the_formats(tmp_path):
    """The core imports no format module; it asks the registry through ucp.format_hook, which loads the
    built-in formats when it must word this error (docs/ARCHITECTURE.md)."""
    import subprocess
    import sys

    probe = ("import sys, torch, ucp; torch.save({'w': torch.ones(2)}, sys.argv[1])\n"
             "assert 'ucp.formats' not in sys.modules\n"
             "try:\n    ucp.load(sys.argv[1])\nexcept ucp.NotACheckpointError as err:\n    print(err)\n")
    file = tmp_path / "model.pt"
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", probe, str(file)], cwd=repo, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(repo)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(f"{file} is a ")
    assert out.stdout.strip().endswith(f"(format 'torch'), not a ucp checkpoint; convert it with: "
                                       f"ucp convert {file} NEW_PATH")
