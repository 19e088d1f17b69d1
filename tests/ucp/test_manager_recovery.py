"""CheckpointManager.restore never deletes a recoverable checkpoint and falls back past damaged ones."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

import ucp
from ucp.manager import CheckpointManager, step_dirname
from ucp.manifest import MANIFEST_NAME
from ucp.policies import KeepAll, KeepLast


def make_state(step: int) -> dict:
    return {"w": torch.full((64, 32), float(step)), "step": step}


def _interrupt_overwrite(manager: CheckpointManager, step: int, new_state: dict) -> tuple[Path, Path]:
    """The disk as a kill between the two renames of an overwrite leaves it (docs/FORMAT.md, section 6).

    The previous checkpoint sits in ``.step_N.ucp-staging-old-*``; the new one, complete with its
    manifest, in its staging directory; the step directory itself is gone.
    """
    root = Path(manager.directory)
    final = root / step_dirname(step)
    old = root / f".{step_dirname(step)}.ucp-staging-old-0123456789ab"
    new = root / f".{step_dirname(step)}.ucp-staging-ba9876543210"
    ucp.save(new_state, root / "elsewhere")
    os.rename(final, old)
    os.rename(root / "elsewhere", new)
    return old, new


def test_restore_recovers_the_checkpoint_an_interrupted_overwrite_moved_aside(tmp_path):
    manager = CheckpointManager(tmp_path, retention=KeepAll())
    manager.save(10, make_state(10))
    manager.save(20, make_state(20))
    old, new = _interrupt_overwrite(manager, 20, make_state(21))
    with pytest.raises(ucp.IncompleteCheckpointError, match="rename that directory back to recover it"):
        ucp.load(manager.path_for(20))
    state = make_state(0)
    with pytest.warns(ucp.RestoreFallbackWarning) as caught:
        assert manager.restore(into=state) == 20
    assert str(caught[0].message) == (
        f"recovered {manager.path_for(20)} from {old}, where an interrupted overwrite had moved it"
    )
    assert state["step"] == 20 and torch.equal(state["w"], make_state(20)["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000010", "step_00000020"]


def test_the_old_copy_is_swept_once_the_new_one_is_committed(tmp_path):
    manager = CheckpointManager(tmp_path, retention=KeepAll())
    manager.save(20, make_state(20))
    old = tmp_path / ".step_00000020.ucp-staging-old-0123456789ab"
    ucp.save(make_state(19), old)  # the kill came after the second rename: step 20 is the new copy
    assert manager.restore(into=make_state(0)) == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000020"]


def _corrupt_largest_chunk(path: Path) -> None:
    chunk = max((p for p in path.rglob("*") if p.is_file() and "data" in p.parts and p.name != "zarr.json"),
                key=lambda p: p.stat().st_size)
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))


def test_restore_falls_back_past_a_corrupt_checkpoint_and_says_so(tmp_path):
    manager = CheckpointManager(tmp_path, retention=KeepAll())  # verify=False: the default
    for step in (1, 2, 3):
        manager.save(step, make_state(step))
    _corrupt_largest_chunk(tmp_path / step_dirname(3))
    (tmp_path / step_dirname(2) / "data").rename(tmp_path / "gone")  # fragments missing
    state = make_state(0)
    with pytest.warns(ucp.RestoreFallbackWarning) as caught:
        assert manager.restore(into=state) == 1
    messages = [str(w.message) for w in caught]
    assert messages[0].startswith(f"skipped {manager.path_for(3)}: ChecksumError: ")
    assert messages[1].startswith(f"skipped {manager.path_for(2)}: IncompleteCheckpointError: ")
    assert state["step"] == 1 and torch.equal(state["w"], make_state(1)["w"])


def test_a_user_error_is_raised_not_taken_for_damage(tmp_path):
    manager = CheckpointManager(tmp_path, retention=KeepAll())
    manager.save(1, make_state(1))
    manager.save(2, make_state(2))
    with pytest.raises(ucp.ShapeMismatchError, match="cannot load 'w'"):
        manager.restore(into={"w": torch.zeros(3), "step": 0})


def test_a_fallback_that_cannot_restore_what_the_damaged_load_touched_is_refused(tmp_path):
    manager = CheckpointManager(tmp_path, retention=KeepAll())
    manager.save(1, {"w": torch.ones(4)})
    manager.save(2, {"w": torch.full((4,), 2.0), "extra": torch.full((64, 32), 2.0)})
    _corrupt_largest_chunk(tmp_path / step_dirname(2))
    into = {"w": torch.zeros(4), "extra": torch.zeros(64, 32)}
    with pytest.warns(ucp.RestoreFallbackWarning), pytest.raises(ucp.RestoreError) as err:
        manager.restore(into=into, strict=False)
    assert str(err.value) == (
        f"cannot restore consistently: {manager.path_for(2)} failed part-way and {manager.path_for(1)} does not hold "
        "'extra', which the failed load may have filled in part; re-initialize those tensors and restore with "
        "strict=True, or repair the newer checkpoint"
    )


class FlakyRemoveFS(MemoryFileSystem):
    """A real in-memory fsspec store where deleting a directory fails (files can still be deleted)."""

    protocol = "ucpflakyrm"
    store: dict = {}
    pseudo_dirs = [""]

    def rm(self, path, recursive=False, maxdepth=None):
        if self.isdir(path):
            raise OSError(errno.EIO, "Input/output error", path)
        return super().rm(path, recursive=recursive, maxdepth=maxdepth)


fsspec.register_implementation("ucpflakyrm", FlakyRemoveFS, clobber=True)


def test_retention_unmakes_a_checkpoint_before_deleting_its_bytes():
    FlakyRemoveFS.store.clear()
    manager = CheckpointManager("ucpflakyrm://run", retention=KeepLast(1))
    manager.save(1, make_state(1))
    manager.save(2, make_state(2))  # pruning step 1 fails part-way
    assert manager.steps() == [2]
    assert not FlakyRemoveFS().exists(f"/run/{step_dirname(1)}/{MANIFEST_NAME}")


def test_when_every_checkpoint_is_damaged_restore_says_so_instead_of_starting_over(tmp_path):
    manager = CheckpointManager(tmp_path, retention=KeepAll())
    for step in (1, 2):
        manager.save(step, make_state(step))
        _corrupt_largest_chunk(tmp_path / step_dirname(step))
    with pytest.warns(ucp.RestoreFallbackWarning), pytest.raises(ucp.RestoreError) as err:
        manager.restore(into=make_state(0))
    assert str(err.value) == (
        f"no checkpoint under {tmp_path} could be restored (every one is damaged: {manager.path_for(2)}, "
        f"{manager.path_for(1)}); repair or remove them to start over"
    )


def test_restore_brings_back_a_list_whose_length_changed(tmp_path):
    manager = CheckpointManager(tmp_path, retention=KeepAll())
    manager.save(1, {"w": torch.ones(2), "losses": [0.5, 0.25, 0.125], "seen": [{"a": 1}, {"b": 2}]})
    into = {"w": torch.zeros(2), "losses": [], "seen": [{"a": 0}, {"b": 0}, {"c": 0}]}
    assert manager.restore(into=into) == 1
    assert into["losses"] == [0.5, 0.25, 0.125] and into["seen"] == [{"a": 1}, {"b": 2}]
