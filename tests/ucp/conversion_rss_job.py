"""Child process of the memory test: convert once, report peak RSS above the baseline as JSON.

    python conversion_rss_job.py SRC DST FORMAT BUDGET WARMUP_SRC WARMUP_DST

The warm-up conversion (a tiny checkpoint of the same formats) loads every code
path first, so the baseline counts the interpreter, torch and the libraries;
then the kernel's peak-RSS counter is reset (``/proc/self/clear_refs``) and the
real conversion runs.
"""

from __future__ import annotations

import json
import re
import sys


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"{field}:\s+(\d+) kB", fh.read()).group(1)) * 1024


def main(argv: list[str]) -> None:
    src, dst, fmt, budget, warm_src, warm_dst = argv
    import ucp

    ucp.convert(warm_src, warm_dst, dst_format=fmt, memory_budget=budget)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS
    baseline = _status("VmRSS")
    result = ucp.convert(src, dst, dst_format=fmt, memory_budget=budget)
    print(json.dumps({"baseline": baseline, "peak": _status("VmHWM"), "largest": result.largest_tensor,
                      "bytes": result.bytes, "budget": result.memory_budget}))


if __name__ == "__main__":
    main(sys.argv[1:])
