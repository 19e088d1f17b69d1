"""Fault injection: a process saving in a loop is killed with SIGKILL at random instants.

Every committed checkpoint must load bit-exact; the one being written when the
kill landed must be cleanly rejected (never loaded as complete).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ucp

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys, torch, ucp
root = sys.argv[1]
def state(i):
    g = torch.Generator().manual_seed(i)
    return {"big": [torch.randn(256, 1024, generator=g) for _ in range(6)],
            "small": {str(k): torch.randn(16, generator=g) for k in range(100)}, "step": i}
print("ready", flush=True)
i = 0
while True:
    ucp.save(state(i), f"{root}/step_{i:04d}")
    print("saved", i, flush=True)
    i += 1
"""


def _expected(i: int) -> dict:
    g = torch.Generator().manual_seed(i)
    return {"big": [torch.randn(256, 1024, generator=g) for _ in range(6)],
            "small": {str(k): torch.randn(16, generator=g) for k in range(100)}, "step": i}


@pytest.mark.slow
def test_sigkill_never_damages_committed_checkpoints(tmp_path):
    rng = random.Random(1234)
    committed_total = rejected = 0
    for attempt in range(4):
        root = tmp_path / f"run{attempt}"
        root.mkdir()
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(root)], cwd=REPO, stdout=subprocess.PIPE,
                                 text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            assert child.stdout.readline().strip() == "ready"
            assert child.stdout.readline().startswith("saved 0")  # at least one previous checkpoint
            time.sleep(rng.uniform(0.0, 0.4))
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(timeout=30)
        steps = sorted({int(p.name.split("_")[1].split(".")[0]) for p in root.iterdir() if "step_" in p.name})
        for i in steps:
            path = root / f"step_{i:04d}"
            if (path / "manifest.json").exists():
                out = ucp.load(path)
                expected = _expected(i)
                assert out["step"] == i
                assert all(torch.equal(a, b) for a, b in zip(out["big"], expected["big"]))
                assert all(torch.equal(out["small"][k], expected["small"][k]) for k in expected["small"])
                assert ucp.verify(path).ok
                committed_total += 1
            else:
                assert i == steps[-1], "only the save in flight may be uncommitted"
                rejected += 1
                with pytest.raises((ucp.IncompleteCheckpointError, ucp.CheckpointNotFoundError)):
                    ucp.load(path)
    print("committed", committed_total, "rejected", rejected)
    assert committed_total >= 4
