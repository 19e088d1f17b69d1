"""The floors under a save and a load: what the kernel's file paths cost next to a memory copy.

On one directory, interleaved and rotated, each repeat times (wall and CPU seconds of this
process) the same bytes moved by:

- ``copyto``: ``numpy.copyto`` into memory that already exists (the ``copy_`` peer);
- ``xxh3 memory`` / ``xxh3 cache``: hashing them from memory, and 1 MiB of them from cache as often;
- ``pwrite new``: 1 MiB ``pwrite`` calls into a new file (fresh pages); ``pwrite existing``: the
  same into that file's existing pages; ``pread``: 64 MiB ``preadv`` calls back into existing memory;
- ``write hashed`` / ``write hashed direct``: :func:`ucp.file_io.write_hashed`, ucp's pack write
  (each 1 MiB piece hashed right before it is written), through the page cache and with
  ``O_DIRECT`` through a bounce buffer (the latter only where the file system takes it).

Every write ends with an ``fsync``; ``pread`` reads what the page cache holds (on a disk, the
kernel's copy alone, not the device).

Run::

    python -m ucp.tools.bench.io_floor /dev/shm/floor --gib 1 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable

import numpy as np

from ucp import checksum
from ucp.file_io import BounceBuffers, on_memory_fs, open_direct, write_hashed

PIECE = 1 << 20
RUN = 64 << 20


def measure(directory: str, *, nbytes: int, repeats: int) -> dict:
    """Every case's wall and CPU seconds per repeat, on ``directory``."""
    os.makedirs(directory, exist_ok=True)
    src = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.ones_like(src)
    path = os.path.join(directory, f"io-floor-{os.getpid()}")
    small = src[: min(PIECE, nbytes)].copy()

    def pwrite(flags: int) -> None:
        fd = os.open(path, os.O_WRONLY | flags, 0o644)
        for at in range(0, nbytes, PIECE):
            os.pwrite(fd, src[at : at + PIECE].data, at)
        os.fsync(fd)
        os.close(fd)

    def pread() -> None:
        fd = os.open(path, os.O_RDONLY)
        for at in range(0, nbytes, RUN):
            os.preadv(fd, [dst[at : at + RUN].data], at)
        os.close(fd)

    def hashed(direct: bool) -> Callable[[], None]:
        def run() -> None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            dfd = open_direct(path) if direct else None
            digest = checksum.hasher()
            write_hashed(fd, 0, src.data, digest=digest, direct_fd=dfd, bounce=bounce if dfd is not None else None)
            os.fsync(fd)
            os.close(fd)
            if dfd is not None:
                os.close(dfd)

        return run

    bounce = BounceBuffers(PIECE)
    cases: dict[str, Callable[[], None]] = {
        "copyto": lambda: np.copyto(dst, src),
        "xxh3 memory": lambda: [checksum.digest(src[a : a + RUN]) for a in range(0, nbytes, RUN)] and None,
        "xxh3 cache": lambda: [checksum.digest(small) for _ in range(max(1, nbytes // PIECE))] and None,
        "pwrite new": lambda: pwrite(os.O_CREAT | os.O_TRUNC),
        "pwrite existing": lambda: pwrite(0),  # runs right after "pwrite new" (below)
        "pread": pread,
        "write hashed": hashed(False),
    }
    memory = on_memory_fs(directory)
    probe = os.path.join(directory, f"io-floor-probe-{os.getpid()}")
    open(probe, "wb").close()
    direct = open_direct(probe)
    os.unlink(probe)
    if direct is not None and not memory:
        os.close(direct)
        cases["write hashed direct"] = hashed(True)
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    order = [n for n in cases if n not in ("pwrite new", "pwrite existing", "pread")] + ["files"]
    try:
        for rep in range(repeats):
            for name in order[rep % len(order) :] + order[: rep % len(order)]:
                names = ["pwrite new", "pwrite existing", "pread"] if name == "files" else [name]
                for each in names:
                    cpu, start = time.process_time(), time.perf_counter()
                    cases[each]()
                    found[each].append((time.perf_counter() - start, time.process_time() - cpu))
    finally:
        bounce.close()
        if os.path.exists(path):
            os.unlink(path)
    return {"directory": directory, "memory_fs": memory, "bytes": nbytes, "repeats": found, "load": os.getloadavg()}


def summary(result: dict) -> list[dict]:
    """Per case: median (min, max) of wall and CPU seconds, and the medians over copyto's."""
    rows = []
    base = {k: statistics.median(v[k] for v in [dict(zip(("wall", "cpu"), r)) for r in result["repeats"]["copyto"]])
            for k in ("wall", "cpu")}
    for name, reps in result["repeats"].items():
        row: dict = {"case": name}
        for i, kind in enumerate(("wall", "cpu")):
            values = [r[i] for r in reps]
            row[kind] = (statistics.median(values), min(values), max(values))
            row[f"{kind}_x_copyto"] = row[kind][0] / base[kind] if base[kind] else None
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the raw repeats and the summary as JSON")
    args = parser.parse_args(argv)
    result = measure(args.directory, nbytes=max(PIECE, int(args.gib * (1 << 30))), repeats=args.repeats)
    rows = summary(result)
    if args.json:
        print(json.dumps({**result, "summary": rows}))
        return 0
    print(f"{args.directory} ({'memory' if result['memory_fs'] else 'disk'}), {args.gib} GiB, "
          f"median (min-max) of {args.repeats}, load average {result['load'][0]:.1f}")
    for row in rows:
        w, c = row["wall"], row["cpu"]
        print(f"{row['case']:20s} wall {w[0]:.3f} ({w[1]:.3f}-{w[2]:.3f}) x{row['wall_x_copyto']:.2f}   "
              f"cpu {c[0]:.3f} ({c[1]:.3f}-{c[2]:.3f}) x{row['cpu_x_copyto']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
