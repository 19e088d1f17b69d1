"""An async save still in flight when the program ends is finished, or its failure is loud (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ucp

REPO = Path(__file__).resolve().parents[2]

STATE = "g = torch.Generator().manual_seed(0); state = {'w': torch.randn(2048, 2048, generator=g), 'step': 7}"

CHILDREN = {
    "function": f"import sys, torch, ucp\n{STATE}\nucp.async_save(state, sys.argv[1])\nprint('returned', flush=True)\n",
    "manager": (
        f"import sys, os, torch\nfrom ucp.manager import CheckpointManager\n{STATE}\n"
        "manager = CheckpointManager(os.path.dirname(sys.argv[1]), async_save=True)\n"
        "manager.save(7, state)\nprint('returned', flush=True)\n"
    ),
}


def _run(code: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=240)


def _expected() -> torch.Tensor:
    return torch.randn(2048, 2048, generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(CHILDREN))
def test_a_program_that_ends_without_wait_still_commits(tmp_path, how):
    path = tmp_path / "run" / "step_00000007"
    proc = _run(CHILDREN[how], path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "returned\n"
    out = ucp.load(path)
    assert out["step"] == 7 and torch.equal(out["w"], _expected())


FAILING = r"""
import errno, sys, torch, fsspec, ucp
from fsspec.implementations.memory import MemoryFileSystem

class FullDisk(MemoryFileSystem):
    protocol = "ucpexitfull"
    store = {}
    pseudo_dirs = [""]
    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        if "/data/" in path:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return super().pipe_file(path, value, mode=mode, **kwargs)

fsspec.register_implementation("ucpexitfull", FullDisk, clobber=True)
ucp.async_save({"w": torch.ones(1000)}, "ucpexitfull://run/c")
print("returned", flush=True)
"""


@pytest.mark.slow
def test_a_failure_nobody_waited_for_fails_the_program_loudly(tmp_path):
    proc = _run(FAILING, tmp_path / "unused")
    assert proc.stdout == "returned\n"
    assert proc.returncode == 1
    assert ("ucp: the async save to ucpexitfull://run/c failed and nobody waited for it: AsyncSaveError: async save "
            "to ucpexitfull://run/c failed: OSError: [Errno 28] No space left on device") in proc.stderr
