"""Checksums: the one-shot digest equals the streamed one, and hashing lets the I/O threads run."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import xxhash

from ucp import checksum


def test_digest_is_xxh3_64_of_the_bytes():
    data = np.arange(1 << 16, dtype=np.uint32)
    assert checksum.digest(data) == xxhash.xxh3_64_hexdigest(data.tobytes())
    assert checksum.digest(b"") == xxhash.xxh3_64_hexdigest(b"")
    h = checksum.hasher()
    h.update(data[:100])
    h.update(data[100:])
    assert h.hexdigest() == checksum.digest(data)


def test_digest_releases_the_gil():
    # Loads hash every byte in the I/O threads while the main thread plans and copies: a digest
    # that held the GIL (xxhash's one-shot functions do) would stop all of them for its duration.
    # With a long switch interval, another thread can run during the digest only if it lets go.
    data = np.ones(64 << 20, dtype=np.uint8)
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0002)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    ticker = threading.Thread(target=tick)
    try:
        ticker.start()
        time.sleep(0.01)
        start = time.perf_counter()
        checksum.digest(data)
        stop_at = time.perf_counter()
    finally:
        stop.set()
        ticker.join()
        sys.setswitchinterval(interval)
    assert any(start < t < stop_at for t in ticks)
