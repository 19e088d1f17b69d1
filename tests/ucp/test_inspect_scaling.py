"""`ucp inspect` is linear in the size of the manifest (issue 8, item 16: a 4 MB manifest took 58 s).

No timed assertion: the same run describes a manifest and one 8 times larger, and the larger
must cost less than 3 times the linear 8x (a quadratic step costs ~64x there; it measured 54x).
CPU time of this process, best of a few runs with the garbage collector paused, so other processes
on the machine matter little.
"""

from __future__ import annotations

import gc
import json
import time

import torch

import ucp
from ucp.summary import describe


def _checkpoint_with_history(path, entries: int):
    # The step sits deeper than the history's entries and their lists, so a breadth-first search
    # for it visits every one of them first.
    ucp.save({"w": torch.ones(2), "trainer": {"loop": {"inner": {"state": {"step": 3}}}}}, path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["states"]["0"]["history"] = [{"loss": 0.5, "tags": ["a"]} for _ in range(entries)]
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def _cpu_seconds(path, runs: int) -> float:
    best = float("inf")
    gc.collect()
    gc.disable()  # the cyclic collector's passes grow with the heap: measure the algorithm, not them
    try:
        for _ in range(runs):
            start = time.process_time()
            summary = describe(path)
            best = min(best, time.process_time() - start)
    finally:
        gc.enable()
    assert summary.step == 3
    return best


def test_describe_grows_linearly_with_the_state_tree(tmp_path):
    small = _cpu_seconds(_checkpoint_with_history(tmp_path / "small", 20_000), runs=3)
    large = _cpu_seconds(_checkpoint_with_history(tmp_path / "large", 160_000), runs=2)  # 4.8 MB
    assert large < 3 * 8 * small, f"8x the manifest cost {large / small:.1f}x the time"
