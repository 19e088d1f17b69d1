"""A restore's sweep deletes only dead saves' staging directories, never another live process's save."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

import ucp
from ucp.manager import CheckpointManager
from ucp.stores.staging_owner import MARKER_PREFIX, owner_state, write_marker

# A second process saving into the same directory: it stops after writing its data,
# before its commit, until the test tells it to go on.
SAVING_ELSEWHERE = textwrap.dedent("""
    import sys, torch
    from ucp.writer import CheckpointWriter
    writer = CheckpointWriter(sys.argv[1])
    writer.add("w", torch.full((1000, 100), 7.0))
    writer.flush()
    print("written", flush=True)
    sys.stdin.readline()
    writer.close()
    print("committed", flush=True)
""")


def test_a_restore_leaves_a_save_running_in_another_process_alone(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(10, {"w": torch.arange(4.0), "step": 10})
    other = subprocess.Popen([sys.executable, "-c", SAVING_ELSEWHERE, str(manager.path_for(20))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert other.stdout.readline().strip() == "written"
        staging = [p for p in tmp_path.iterdir() if p.name.startswith(".step_00000020.ucp-staging-")]
        assert len(staging) == 1
        assert manager.restore(into={"w": torch.zeros(4), "step": 0}) == 10
        assert staging[0].is_dir()                      # the sweep saw a live owner
        out, _ = other.communicate("go\n", timeout=120)
    finally:
        other.kill()
    assert other.returncode == 0 and out.strip() == "committed"
    assert torch.equal(ucp.load(manager.path_for(20))["w"], torch.full((1000, 100), 7.0))
    # The committed checkpoint carries no owner marker.
    assert not [p for p in os.listdir(manager.path_for(20)) if p.startswith(MARKER_PREFIX)]


def _marker(staging, **owner) -> None:
    staging.mkdir()
    (staging / "data").mkdir()
    (staging / f"{MARKER_PREFIX}0123").write_text(json.dumps(owner))


def test_owner_states(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    write_marker(str(mine))
    assert owner_state(str(mine)) == "alive"

    reused = tmp_path / "reused"  # this pid, but another process's start time: a reused pid
    _marker(reused, host=socket.gethostname(), pid=os.getpid(), start="1")
    assert owner_state(str(reused)) == "dead"

    gone = tmp_path / "gone"
    _marker(gone, host=socket.gethostname(), pid=2**22 + 12345, start="1")
    assert owner_state(str(gone)) == "dead"

    foreign = tmp_path / "foreign"  # another host cannot be checked: kept until it goes stale
    _marker(foreign, host="another-host.example", pid=1, start="1")
    assert owner_state(str(foreign)) == "foreign"
    assert owner_state(str(foreign), foreign_stale_after_s=0.0) == "dead"

    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    (unreadable / f"{MARKER_PREFIX}x").write_bytes(b"\xff" * 10)
    assert owner_state(str(unreadable)) == "foreign"

    legacy = tmp_path / "legacy"  # a save from before markers: data and no marker
    legacy.mkdir()
    (legacy / "data").mkdir()
    assert owner_state(str(legacy)) == "dead"

    fresh = tmp_path / "fresh"  # just created, its marker not yet written
    fresh.mkdir()
    assert owner_state(str(fresh)) == "foreign"


@pytest.mark.parametrize("host", ["another-host.example", None])
def test_the_sweep_keeps_what_it_cannot_prove_dead(tmp_path, host):
    manager = CheckpointManager(tmp_path)
    manager.save(10, {"w": torch.arange(4.0), "step": 10})
    staging = tmp_path / ".step_00000020.ucp-staging-0123456789ab"
    _marker(staging, host=host or socket.gethostname(), pid=2**22 + 12345, start="1")
    swept = manager.sweep_stale_saves()
    assert (swept == []) == (host is not None)
    assert staging.is_dir() == (host is not None)
