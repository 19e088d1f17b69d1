"""CheckpointManager with real saves in temporary directories."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from ucp.integrations.launch import free_port
import ucp
from ucp.errors import AsyncSaveError
from ucp.manager import CheckpointManager, SaveRecord, step_dirname
from ucp.manifest import MANIFEST_NAME
from ucp.policies import EveryNSteps, KeepAll, KeepEvery, KeepLast, KeepUnion


def make_state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(8, 4, generator=g), "b": torch.randn(4, generator=g).to(torch.bfloat16)},
        "optim": {"step": seed, "lr": 0.1},
    }


def dirs(manager: CheckpointManager) -> list[str]:
    return sorted(p.name for p in Path(manager.directory).iterdir() if not p.name.startswith("."))


def test_step_dirname() -> None:
    assert step_dirname(100) == "step_00000100"
    assert step_dirname(123456789) == "step_123456789"
    with pytest.raises(ValueError, match="step must be a non-negative integer, got -1"):
        step_dirname(-1)


def test_bad_construction_is_refused_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"world_size=4 needs a process_group .*new_group\(backend='gloo'\)"):
        CheckpointManager(tmp_path, world_size=4)
    with pytest.raises(TypeError, match=r"save_policy KeepAll\(\) has no should_save method"):
        CheckpointManager(tmp_path, save_policy=KeepAll())
    with pytest.raises(TypeError, match=r"retention EveryNSteps\(n=1\) has no keep method"):
        CheckpointManager(tmp_path, retention=EveryNSteps(1))


def test_maybe_save_follows_the_policy_and_names_dirs_by_step(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpt", save_policy=EveryNSteps(3), retention=KeepAll())
    saved = [manager.maybe_save(step, make_state(step)) for step in range(1, 8)]
    assert saved == [None, None, str(tmp_path / "ckpt/step_00000003"), None, None, str(tmp_path / "ckpt/step_00000006"), None]
    assert manager.steps() == [3, 6]
    assert [r.step for r in manager.records] == [3, 6]
    assert all(isinstance(r, SaveRecord) and not r.asynchronous and r.background_seconds == 0.0
               and r.blocking_seconds > 0 for r in manager.records)


def test_the_save_policy_is_asked_every_step(tmp_path: Path) -> None:
    class Adaptive:
        """Interval doubles after each save, the way an ETTR-driven policy moves it."""

        def __init__(self) -> None:
            self.interval, self.last, self.asked = 1, 0, []

        def should_save(self, *, step: int, seconds_since_save: float) -> bool:
            self.asked.append(step)
            assert seconds_since_save >= 0
            if step - self.last >= self.interval:
                self.last, self.interval = step, self.interval * 2
                return True
            return False

    policy = Adaptive()
    manager = CheckpointManager(tmp_path, save_policy=policy, retention=KeepAll())
    for step in range(1, 16):
        manager.maybe_save(step, make_state())
    assert policy.asked == list(range(1, 16))
    assert manager.steps() == [1, 3, 7, 15]


@pytest.mark.parametrize(
    ("retention", "kept"),
    [
        (KeepLast(2), [5, 6]),
        (KeepUnion(KeepLast(1), KeepEvery(3)), [3, 6]),
        (KeepEvery(4), [4, 6]),  # 6 is not a multiple of 4 but it is the newest
    ],
)
def test_retention_after_each_commit(tmp_path: Path, retention, kept: list[int]) -> None:
    manager = CheckpointManager(tmp_path, save_policy=EveryNSteps(1), retention=retention)
    for step in range(1, 7):
        manager.maybe_save(step, make_state(step))
    assert manager.steps() == kept


def test_retention_never_deletes_the_newest_nor_an_uncommitted_save(tmp_path: Path) -> None:
    class KeepNothing:
        def keep(self, steps):
            return set()

    manager = CheckpointManager(tmp_path, retention=KeepNothing())
    (tmp_path / step_dirname(1)).mkdir()  # a save in progress (no manifest yet)
    (tmp_path / step_dirname(1) / "data").mkdir()
    for step in (2, 3, 4):
        manager.save(step, make_state(step))
    assert manager.steps() == [4]
    assert dirs(manager) == ["step_00000001", "step_00000004"]


def test_latest_skips_missing_and_corrupt_manifests(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, retention=KeepAll())
    assert manager.latest() is None
    for step in (10, 20, 30):
        manager.save(step, make_state(step))
    (tmp_path / step_dirname(40)).mkdir()  # crashed before commit: no manifest
    (tmp_path / step_dirname(30) / MANIFEST_NAME).write_text('{"format_version": 1, "tensors": {')
    manifest20 = tmp_path / step_dirname(20) / MANIFEST_NAME
    manifest20.write_text(manifest20.read_text().replace('"world_size"', '"world_sighs"'))
    assert manager.steps() == [10, 20, 30]
    assert manager.latest() == str(tmp_path / "step_00000010")
    assert manager.latest_step() == 10


def test_latest_with_verify_skips_a_corrupt_fragment(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, retention=KeepAll())
    manager.save(1, make_state(1))
    manager.save(2, make_state(2))
    chunk = max((p for p in (tmp_path / step_dirname(2)).rglob("*") if p.is_file() and "data" in p.parts
                 and p.name != "zarr.json"), key=lambda p: p.stat().st_size)
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    assert manager.latest() == str(tmp_path / "step_00000002")  # the manifest alone looks fine
    assert manager.latest(verify=True) == str(tmp_path / "step_00000001")


def test_restore_loads_the_latest_in_place(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, save_policy=EveryNSteps(5), retention=KeepLast(2))
    state = make_state(0)
    assert manager.restore(into=state) is None
    for step in range(1, 11):
        with torch.no_grad():
            state["model"]["w"].add_(1.0)
        state["optim"]["step"] = step
        manager.maybe_save(step, state)
    expected_w = state["model"]["w"].clone()
    w_ptr = state["model"]["w"].data_ptr()
    fresh = make_state(99)
    fresh_ptr = fresh["model"]["w"].data_ptr()
    assert manager.restore(into=fresh) == 10
    assert fresh["model"]["w"].data_ptr() == fresh_ptr  # in place
    assert torch.equal(fresh["model"]["w"], expected_w)
    assert fresh["optim"]["step"] == 10
    assert w_ptr == state["model"]["w"].data_ptr()


def test_restore_finds_committed_checkpoints_under_any_name_by_their_step(tmp_path: Path) -> None:
    """A job restarted on a directory the README's ucp.save filled must not start over from step 0."""
    ucp.save({"w": torch.full((2,), 100.0), "step": 100}, tmp_path / "step_100")
    ucp.save({"w": torch.full((2,), 50.0), "train": {"global_step": 50}}, tmp_path / "mid")
    manager = CheckpointManager(tmp_path, retention=KeepLast(1))
    manager.save(60, {"w": torch.full((2,), 60.0), "step": 60})
    assert manager.checkpoints() == [(50, str(tmp_path / "mid")), (60, str(tmp_path / step_dirname(60))),
                                     (100, str(tmp_path / "step_100"))]
    assert manager.latest() == str(tmp_path / "step_100") and manager.latest_step() == 100
    into = {"w": torch.zeros(2), "step": 0}
    assert manager.restore(into=into) == 100 and into["step"] == 100 and torch.equal(into["w"], torch.full((2,), 100.0))
    manager.save(101, into)
    assert dirs(manager) == ["mid", step_dirname(101), "step_100"]  # retention prunes only its own names


def test_a_committed_checkpoint_whose_step_is_unknown_is_refused_not_ignored(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(3, {"w": torch.ones(2)})
    ucp.save({"w": torch.ones(2)}, tmp_path / "final")
    with pytest.raises(ucp.RestoreError) as err:
        manager.restore(into={"w": torch.zeros(2)})
    assert str(err.value) == (
        f"{tmp_path / 'final'} is a committed checkpoint without a step in its state (no 'step', 'global_step' or "
        "'iteration'), so the manager cannot order it; rename it step_NNNNNNNN (zero-padded), save a 'step' in its "
        "state, or move it out of the directory"
    )
    (tmp_path / "final" / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ucp.RestoreError, match=r"^.*final holds a checkpoint whose manifest cannot be read \(ManifestError"):
        manager.latest()


def test_async_manager_records_both_costs_and_prunes_after_commit(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, save_policy=EveryNSteps(2), retention=KeepLast(1), async_save=True)
    state = make_state(0)
    for step in range(1, 7):
        state["optim"]["step"] = step
        manager.maybe_save(step, state)
    manager.wait()
    assert manager.steps() == [6]
    records = manager.records
    assert [r.step for r in records] == [2, 4, 6]
    assert all(r.asynchronous and r.blocking_seconds > 0 and r.background_seconds >= 0 for r in records)
    loaded = ucp.load(manager.latest())
    assert loaded["optim"]["step"] == 6


class FullDiskMemoryFS(MemoryFileSystem):
    """A real (in-memory) fsspec filesystem whose fragment writes fail like a full disk."""

    protocol = "ucpmgrfull"
    store: dict = {}
    pseudo_dirs = [""]
    full = False

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        if self.full and "/data/" in path:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return super().pipe_file(path, value, mode=mode, **kwargs)


fsspec.register_implementation("ucpmgrfull", FullDiskMemoryFS, clobber=True)


def test_async_manager_on_fsspec_raises_a_background_failure_once() -> None:
    FullDiskMemoryFS.store.clear()
    FullDiskMemoryFS.full = False
    manager = CheckpointManager("ucpmgrfull://run", save_policy=EveryNSteps(1), retention=KeepLast(1), async_save=True)
    manager.maybe_save(1, make_state(1))
    manager.wait()
    FullDiskMemoryFS.full = True
    assert manager.maybe_save(2, make_state(2)) == "ucpmgrfull://run/step_00000002"
    with pytest.raises(AsyncSaveError, match="No space left on device"):
        manager.wait()
    manager.wait()  # reported once
    assert manager.steps() == [1]  # the failed save committed nothing and retention kept step 1
    FullDiskMemoryFS.full = False
    manager.maybe_save(3, make_state(3))
    manager.wait()
    assert manager.steps() == [3]
    assert [r.step for r in manager.records] == [1, 3]
    state = make_state(0)
    assert manager.restore(into=state) == 3
    assert state["optim"]["step"] == 3


def test_invalid_state_is_refused_before_anything_runs(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, async_save=True, retention=KeepAll())
    with pytest.raises(ucp.UnsafeObjectError):
        manager.save(2, {"model": {"w": torch.zeros(2)}, "x": object()})
    manager.wait()
    assert manager.steps() == []


def test_a_damaged_step_is_replaced_when_training_reaches_it_again(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, save_policy=EveryNSteps(2), retention=KeepAll())
    state = make_state(0)
    for step in (2, 4):
        state["optim"]["step"] = step
        manager.save(step, state)
    (tmp_path / step_dirname(4) / MANIFEST_NAME).write_text("not json")
    with pytest.warns(ucp.RestoreFallbackWarning, match=f"skipped {tmp_path / step_dirname(4)}: ManifestError: "):
        assert manager.restore(into=state) == 2
    state["optim"]["step"] = 4
    assert manager.maybe_save(4, state) == str(tmp_path / "step_00000004")
    assert manager.latest_step() == 4 and ucp.load(manager.latest())["optim"]["step"] == 4


_WORKER = r"""
import sys, torch, torch.distributed as dist
from ucp.manager import CheckpointManager
from ucp.policies import EveryNSteps, KeepLast

rank, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
try:
    group = dist.new_group(backend="gloo")  # dedicated to checkpointing
    manager = CheckpointManager(directory, process_group=group, save_policy=EveryNSteps(2),
                                retention=KeepLast(1), async_save=True)
    state = {"w": torch.zeros(6), "step": 0}
    assert manager.restore(into=state) is None
    for step in range(1, 6):
        state["w"] += 1  # replicated on both ranks, like a DDP model
        state["step"] = step
        manager.maybe_save(step, state)
    manager.wait()
    dist.barrier()
    fresh = {"w": torch.full((6,), -1.0), "step": -1}
    assert manager.restore(into=fresh) == 4, manager.steps()
    assert fresh["step"] == 4 and fresh["w"].tolist() == [4.0] * 6
    assert manager.steps() == [4]
    assert [r.step for r in manager.records] == [2, 4]
    print("ok", rank)
finally:
    dist.destroy_process_group()
"""


def _run_two_ranks(worker: str, directory: Path) -> list[str]:
    """Run ``worker`` as ranks 0 and 1 of a gloo job on a free port; their standard outputs, each exit 0."""
    port = free_port()
    repo = Path(__file__).resolve().parents[2]
    procs = [
        subprocess.Popen([sys.executable, "-c", worker, str(rank), str(port), str(directory)], cwd=repo,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    try:
        results = [proc.communicate(timeout=120) + (proc.returncode,) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for _, err, code in results:
        assert code == 0, err[-3000:]
    return [out for out, _, _ in results]


@pytest.mark.slow
def test_two_ranks_save_async_prune_on_rank0_and_agree_on_restore(tmp_path: Path) -> None:
    for out in _run_two_ranks(_WORKER, tmp_path / "run"):
        assert out.startswith("ok")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["step_00000004"]


_WORLD_WORKER = """
import os, sys, warnings, torch, torch.distributed as dist
from pathlib import Path
from ucp.manager import CheckpointManager
from ucp.policies import EveryNSteps, KeepAll

rank, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
try:
    manager = CheckpointManager(directory, save_policy=EveryNSteps(2), retention=KeepAll())  # no process_group
    state = {"w": torch.zeros(6), f"own{rank}": torch.zeros(4), "step": 0}
    for step in range(1, 5):
        state["w"] += 1
        state[f"own{rank}"] += rank + 1
        state["step"] = step
        manager.maybe_save(step, state)
    dist.barrier()
    if rank == 0:  # damage what only rank 0 reads in the newest checkpoint
        chunk = Path(directory, "step_00000004", "data", "r0", "pack-000000", "c.0")
        data = bytearray(chunk.read_bytes()); data[0] ^= 0xFF; chunk.write_bytes(bytes(data))
    dist.barrier()
    fresh = {"w": torch.zeros(6), f"own{rank}": torch.zeros(4), "step": -1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = manager.restore(into=fresh, strict=False)
    print("restored", got, fresh["step"], flush=True)
finally:
    dist.destroy_process_group()
# No interpreter teardown, as the launcher's ranks: C++ worker threads (gloo's or tensorstore's) can still
# be joinable when a teardown destroys them, and the process aborts after its work is done ("terminate
# called without an active exception": once in a full suite run).
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_without_a_process_group_the_managers_of_all_ranks_agree_on_the_world(tmp_path: Path) -> None:
    """With torch.distributed initialized and no group given, the manager is the job's, as ucp.save is:
    rank 0 cannot read the newest checkpoint, so every rank restores the one before (before this, rank 0
    fell back alone and rank 1 found nothing: two ranks resumed from different steps)."""
    for out in _run_two_ranks(_WORLD_WORKER, tmp_path / "run"):
        assert out.strip() == "restored 2 2"
