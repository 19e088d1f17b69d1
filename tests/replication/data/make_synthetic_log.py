"""Writes synthetic-cluster.log, the input of the log-replay fixture (deterministic).

    python tests/replication/data/make_synthetic_log.py
    ucp logs analyze tests/replication/data/synthetic-cluster.log --year 2024 \
        --json tests/replication/data/synthetic-analysis.json --quiet

Eight nodes over two days: background noise, corrected DRAM ECC warnings (not fatal),
GPU failures (Xid 79) with a lemon node (gpu-03) and NCCL watchdog timeouts on the
other ranks after each one, InfiniBand link failures, a host OOM.
"""

import random
from datetime import datetime, timezone
from pathlib import Path

START = datetime(2024, 6, 3, tzinfo=timezone.utc).timestamp()
NODES = [f"gpu-{i:02d}" for i in range(1, 9)]


def stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


def main() -> None:
    rng = random.Random(7)
    lines: list[tuple[float, str, str]] = []
    for _ in range(400):  # normal operation
        node = rng.choice(NODES)
        lines.append((START + rng.uniform(0, 172800), node,
                      f"python[{rng.randint(1000, 9999)}]: step {rng.randint(1, 90000)} loss {rng.uniform(1, 3):.4f}"))
    failures = [(3 * 3600, "gpu-03"), (9 * 3600, "gpu-06"), (20 * 3600, "gpu-03"), (26 * 3600, "gpu-01"),
                (33 * 3600, "gpu-03"), (41 * 3600, "gpu-08"), (44 * 3600, "gpu-03")]
    for offset, node in failures:
        ts = START + offset
        for k in range(3):  # warnings in the hour before
            lines.append((ts - 3000 + 900 * k, node,
                          f"kernel: EDAC MC{k}: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#{k}_DIMM#0 "
                          f"(channel:{k} slot:0 page:0x{rng.randint(4096, 65535):x} offset:0x0)"))
        lines.append((ts, node, f"kernel: NVRM: Xid (PCI:0000:07:00): 79, pid={rng.randint(1000, 9999)}, "
                                "name=python3, GPU has fallen off the bus."))
        for other in NODES:
            if other != node:
                rank = NODES.index(other) * 8
                lines.append((ts + 600 + rng.uniform(0, 5), other,
                              f"python[{rng.randint(1000, 9999)}]: [rank{rank}]:[E{rng.randint(1000, 1231)}] "
                              f"ProcessGroupNCCL.cpp:1375] [PG 0 (default_pg) Rank {rank}] Watchdog caught collective "
                              "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                              "Timeout(ms)=600000) ran for 600031 milliseconds before timing out."))
    for offset, node in [(14 * 3600, "gpu-05"), (38 * 3600, "gpu-05")]:
        lines.append((START + offset, node, "kernel: mlx5_core 0000:3b:00.0 ib0: Link down"))
    lines.append((START + 30 * 3600, "gpu-02", "kernel: Out of memory: Killed process 4242 (python3) total-vm:98765432kB, "
                                               "anon-rss:87654321kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:4321kB "
                                               "oom_score_adj:0"))
    lines.sort()
    out = Path(__file__).with_name("synthetic-cluster.log")
    out.write_text("".join(f"{stamp(ts)} {node} {msg}\n" for ts, node, msg in lines), encoding="utf-8")


if __name__ == "__main__":
    main()
