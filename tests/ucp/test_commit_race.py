"""The commit is atomic against a concurrent commit: overwrite=False holds even when saves race."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

import ucp
from ucp.async_saver import AsyncSaver
from ucp.writer import CheckpointWriter

REPO = Path(__file__).resolve().parents[2]

# Each process opens a writer on the same new paths (so every one passes the early check), waits at a
# file barrier until all have written their bytes, then commits: exactly one commit may win each path.
RACER = r"""
import os, sys, time, torch, ucp
from ucp.writer import CheckpointWriter
root, me, n, trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for trial in range(trials):
    writer = CheckpointWriter(f"{root}/c{trial}")
    writer.add("w", torch.full((1000,), float(me)))
    writer.set_state({"w": {"$tensor": "w"}, "who": me})
    writer.flush()
    open(f"{root}/ready-{trial}-{me}", "w").close()
    while sum(name.startswith(f"ready-{trial}-") for name in os.listdir(root)) < n:
        time.sleep(0.001)
    try:
        writer.close()
        print(trial, "committed", flush=True)
    except ucp.CheckpointExistsError as err:
        print(trial, "exists", err, flush=True)
"""


@pytest.mark.slow
def test_racing_saves_to_one_new_path_commit_exactly_once(tmp_path):
    n, trials = 3, 4
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), str(me), str(n), str(trials)], cwd=REPO,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for me in range(n)]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(out.splitlines())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for trial in range(trials):
        path = tmp_path / f"c{trial}"
        lines = [line for out in outputs for line in out if line.startswith(f"{trial} ")]
        winners = [me for me, out in enumerate(outputs) if f"{trial} committed" in out]
        assert len(winners) == 1, lines
        losers = [line for line in lines if " exists " in line]
        assert len(losers) == n - 1
        assert all(line == f"{trial} exists a checkpoint already exists at {path}; pass overwrite=True to replace it "
                   "or save to a new path" for line in losers)
        out = ucp.load(path)
        assert out["who"] == winners[0] and torch.equal(out["w"], torch.full((1000,), float(winners[0])))
        assert ucp.verify(path).ok
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("ready-")) == [
        f"c{t}" for t in range(trials)]  # the losers cleaned up after themselves


def test_a_checkpoint_committed_while_a_save_ran_is_not_replaced(tmp_path):
    path = tmp_path / "c"
    slow = CheckpointWriter(str(path))  # passes the early check: nothing is there yet
    slow.add("w", torch.zeros(4))
    ucp.save({"w": torch.ones(4)}, path)  # someone else commits meanwhile
    with pytest.raises(ucp.CheckpointExistsError, match="a checkpoint already exists at"):
        slow.close()
    assert torch.equal(ucp.load(path)["w"], torch.ones(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_overwrite_replaces_even_when_the_target_changed_meanwhile(tmp_path):
    path = tmp_path / "c"
    ucp.save({"w": torch.zeros(2)}, path)
    slow = CheckpointWriter(str(path), overwrite=True)
    slow.add("w", torch.full((2,), 2.0))
    ucp.save({"w": torch.ones(2)}, path, overwrite=True)
    slow.close()
    assert torch.equal(ucp.load(path)["w"], torch.full((2,), 2.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_a_directory_that_is_not_a_checkpoint_is_never_replaced(tmp_path):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(ucp.CheckpointExistsError) as err:
            ucp.save({"w": torch.ones(2)}, mine, overwrite=overwrite)
        assert str(err.value) == (
            f"{mine} is a directory that is not a checkpoint (it holds todo.txt); ucp never replaces one: "
            "remove it or save to a new path"
        )
    assert (mine / "todo.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty directory (tempfile.mkdtemp) is fine to save into
    ucp.save({"w": torch.ones(2)}, empty)
    assert torch.equal(ucp.load(empty)["w"], torch.ones(2))


# ----------------------------------------------------------------------------- marker stores, async


class AsyncGatedFS(MemoryFileSystem):
    """A real in-memory fsspec store whose writes from the async saver's thread wait for a gate."""

    protocol = "ucpasyncgate"
    store: dict = {}
    pseudo_dirs = [""]
    gate = threading.Event()

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        if threading.current_thread().name == "ucp-async-save":
            self.gate.wait(timeout=60)
        return super().pipe_file(path, value, mode=mode, **kwargs)


fsspec.register_implementation("ucpasyncgate", AsyncGatedFS, clobber=True)


def test_an_async_save_does_not_commit_over_a_checkpoint_made_while_it_ran():
    AsyncGatedFS.store.clear()
    AsyncGatedFS.gate.clear()
    path = "ucpasyncgate://run/c"
    try:
        handle = AsyncSaver().save({"w": torch.zeros(64, 64), "who": "async"}, path)
        ucp.save({"w": torch.ones(64, 64), "who": "sync"}, path)  # commits while the async save waits
    finally:
        AsyncGatedFS.gate.set()
    with pytest.raises(ucp.AsyncSaveError, match="CheckpointExistsError: a checkpoint already exists at "
                                                 "ucpasyncgate://run/c"):
        handle.wait(timeout=60)
    out = ucp.load(path)
    assert out["who"] == "sync" and torch.equal(out["w"], torch.ones(64, 64))
    assert ucp.verify(path).ok  # the async save's bytes went elsewhere: the committed ones are intact
    fs, root = fsspec.core.url_to_fs(path)
    manifest = json.loads(fs.cat_file(f"{root}/manifest.json"))
    keys = {f["key"] for t in manifest["tensors"].values() for f in t["fragments"]}
    assert all(fs.exists(f"{root}/data/{k}/zarr.json") for k in keys)
    assert fs.ls(f"{root}/data", detail=False) == [f"{root}/data/{keys.pop().split('/')[0]}"]  # the loser cleaned up


def test_racing_saves_to_one_new_marker_path_commit_once_and_keep_their_bytes_apart(tmp_path):
    path = f"memory://race-{tmp_path.name}/c"
    first, second = CheckpointWriter(path), CheckpointWriter(path)
    for writer, value in ((first, 1.0), (second, 2.0)):
        writer.add("w", torch.full((300, 300), value))  # large enough for its own array, not a pack
        writer.set_state({"w": {"$tensor": "w"}})
    first.close()
    with pytest.raises(ucp.CheckpointExistsError, match="a checkpoint already exists at memory://"):
        second.close()
    assert torch.equal(ucp.load(path)["w"], torch.full((300, 300), 1.0))
    assert ucp.verify(path).ok


def test_the_commit_lock_fallback_refuses_an_existing_target(tmp_path, monkeypatch):
    import ucp.atomic_rename as atomic

    monkeypatch.setattr(atomic, "_renameat2", lambda src, dst: False)  # as on a file system without it
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()  # empty: a plain rename would replace it
    with pytest.raises(FileExistsError):
        atomic.rename_noreplace(str(tmp_path / "a"), str(tmp_path / "b"))
    atomic.rename_noreplace(str(tmp_path / "a"), str(tmp_path / "c"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".b.ucp-commit-lock", ".c.ucp-commit-lock", "b", "c"]


def test_renameat2_refuses_an_existing_empty_directory(tmp_path):
    from ucp.atomic_rename import rename_noreplace

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(FileExistsError):
        rename_noreplace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no lock file: the kernel did it


def test_an_overwrite_on_a_marker_store_keeps_the_old_checkpoint_until_it_commits(tmp_path):
    path = f"memory://over-{tmp_path.name}/c"
    ucp.save({"w": torch.zeros(300, 300)}, path)
    writer = CheckpointWriter(path, overwrite=True)
    writer.add("w", torch.ones(300, 300))
    writer.set_state({"w": {"$tensor": "w"}})
    writer.flush()
    assert torch.equal(ucp.load(path)["w"], torch.zeros(300, 300))  # a crash now would leave this one
    writer.close()
    assert torch.equal(ucp.load(path)["w"], torch.ones(300, 300))
    fs, root = fsspec.core.url_to_fs(path)
    assert len(fs.ls(f"{root}/data", detail=False)) == 1  # the old arrays are gone after the commit
    assert ucp.verify(path).ok


def test_an_overwrite_on_a_marker_store_leaves_a_concurrent_overwrite_save_whole(tmp_path):
    from tests.ucp.overwrite_race import check_concurrent_overwrites

    check_concurrent_overwrites(f"memory://both-{tmp_path.name}/c")


def test_an_overwrite_removes_exactly_the_entries_the_replaced_manifest_names():
    from ucp.stores.occupancy import array_entries

    golden = REPO / "tests" / "ucp" / "golden"
    assert array_entries((golden / "manifest.json").read_bytes()) == {"r0"}
    # A format-2 root without a token: its shards under data/meta, its arrays under data/r<rank>.
    assert array_entries((golden / "sharded-root.json").read_bytes()) == {"meta", "r0", "r1", "r2", "r3", "r4"}
    root = json.loads((golden / "sharded-root.json").read_bytes())
    for shard in root["shards"]:
        shard["key"] = shard["key"].replace("data/", "data/5f2a0c1e9b7d/")
    assert array_entries(json.dumps(root).encode()) == {"5f2a0c1e9b7d"}
    hostile = {"format_version": 1, "tensors": {"w": {"fragments": [{"key": "../../elsewhere"}, {"key": "a/b"}]}}}
    assert array_entries(json.dumps(hostile).encode()) == {"a"}  # never a name that leaves data/
    assert array_entries(b"not json") == set() and array_entries(b'{"format_version": 2}') == set()
