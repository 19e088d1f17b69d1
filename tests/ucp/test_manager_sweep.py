"""A save killed before its commit leaves a staging directory; the next restore sweeps it."""

import os
import signal
import subprocess
import sys
import textwrap

import torch

import ucp
from ucp.manager import CheckpointManager

KILLED_MID_SAVE = textwrap.dedent("""
    import os, signal, sys, torch
    from ucp.writer import CheckpointWriter
    writer = CheckpointWriter(sys.argv[1])
    writer.add("w", torch.ones(1000, 100))
    writer.flush()
    os.kill(os.getpid(), signal.SIGKILL)   # dies before close(): nothing committed
""")


def test_restore_sweeps_what_a_killed_save_left(tmp_path):
    manager = CheckpointManager(tmp_path)
    state = {"w": torch.arange(4.0), "step": 10}
    manager.save(10, state)
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, str(manager.path_for(20))],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".step_00000020.ucp-staging-")]
    assert len(leftovers) == 1                    # the killed save's bytes, never a checkpoint
    (tmp_path / "notes.txt").write_text("mine")   # unrelated files are left alone

    into = {"w": torch.zeros(4), "step": 0}
    assert manager.restore(into=into) == 10
    assert torch.equal(into["w"], torch.arange(4.0)) and into["step"] == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "step_00000010"]
    assert manager.sweep_stale_saves() == []      # nothing left to sweep
    assert ucp.load(manager.path_for(10))["step"] == 10
