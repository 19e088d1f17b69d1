"""Measure the extra peak RSS of one save in this (fresh) process; print JSON.

Run by the benchmark as ``python -m ucp.tools.bench.rss_probe METHOD SIZE_GIB DIR``.
The state is built in place (no temporaries), so the peak RSS (``ru_maxrss``)
right after building it is the baseline; the extra peak of the save is the
growth of ``ru_maxrss`` over that, cross-checked by sampling RSS with psutil
every few milliseconds (the larger of the two is reported).
"""

from __future__ import annotations

import gc
import json
import resource
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import psutil


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main(argv: list[str]) -> int:
    from ucp.tools.bench.core_bench import METHODS
    from ucp.tools.bench.state_recipe import StateRecipe, build_state, state_nbytes

    method, size_gib, directory = argv[0], float(argv[1]), Path(argv[2])
    state = build_state(StateRecipe(size_gib=size_gib))
    # Warm the method's imports and code paths on a tiny state so their one-time
    # memory (modules, thread pools) is not charged to the save.
    work = Path(tempfile.mkdtemp(prefix="ucp-rss-", dir=directory))
    try:
        METHODS[method].save(build_state(StateRecipe(size_gib=0.001, large=1, small=2)), work / "warm")
        gc.collect()
        process = psutil.Process()
        base_rss = process.memory_info().rss
        base_max = _maxrss_bytes()
        peak = [base_rss]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.002):
                peak[0] = max(peak[0], process.memory_info().rss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        METHODS[method].save(state, work / "run")
        stop.set()
        sampler.join()
        extra = max(_maxrss_bytes() - base_max, peak[0] - base_rss, 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    nbytes = state_nbytes(state)
    print(json.dumps({"method": method, "state_bytes": nbytes, "extra_bytes": extra, "extra_fraction": extra / nbytes}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
