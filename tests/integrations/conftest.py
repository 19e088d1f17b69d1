"""Run the tiny training jobs next to these tests as real subprocesses (and kill them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class Jobs:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}

    def run(self, script: str, *argv: str, timeout: float = 180) -> str:
        done = subprocess.run(
            [sys.executable, str(HERE / script), *argv],
            capture_output=True, text=True, env=self.env, timeout=timeout,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def run_until(self, script: str, *argv: str, line: str, timeout: float = 180) -> None:
        """Start the job, SIGKILL it right after it prints ``line``."""
        child = subprocess.Popen(
            [sys.executable, str(HERE / script), *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=self.env,
        )
        try:
            for got in child.stdout:
                if got.strip() == line:
                    break
            else:
                pytest.fail(f"{script} ended without printing {line!r}")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=timeout)
        assert child.returncode == -signal.SIGKILL


@pytest.fixture(scope="session")
def jobs() -> Jobs:
    return Jobs()


def assert_same_state(a, b, where: str = "state") -> None:
    """Equal nested states: tensors bit-identical, everything else ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}/{index}")
    else:
        assert a == b, where


@pytest.fixture
def same_state():
    return assert_same_state


def committed_steps(directory: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in directory.glob("step_*") if (p / "manifest.json").is_file())


@pytest.fixture
def committed():
    return committed_steps


@pytest.fixture
def world_of_one():
    """This process as a world of one: a gloo group over an in-memory store, so collectives run for
    real with the process as its own only peer."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
