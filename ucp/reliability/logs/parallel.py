"""Running the scans on Dask: a local cluster, or a dask.distributed scheduler somewhere else.

:func:`ucp.reliability.logs.analyze.analyze_logs` takes a ``run(partitions, scan,
progress=...)`` function; :func:`dask_runner` makes one that maps the scans
over a Dask cluster and hands the results back in partition order. Since the
partitions and the merge do not depend on the number of workers, any number
of workers gives the report one process gives (tested).

Workers read the log files themselves: with ``scheduler=`` the paths must
name the same files on every worker (a shared file system).

Example::

    run = dask_runner(workers=8)                           # a local cluster of 8 processes
    run = dask_runner(scheduler="tcp://10.0.0.5:8786")     # an existing cluster
    result = analyze_logs(["/logs/2024-06/"], run=run)
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ucp.reliability.logs.errors import LogInputError
from ucp.reliability.logs.scan import Partition

# Below this much input a cluster costs more to start (seconds) than it saves.
SMALL_INPUT_BYTES = 64 << 20


def partition_bytes(partition: Partition) -> int:
    """Bytes a partition covers (its range, or the file size; 0 for stdin)."""
    if partition.end is not None:
        return partition.end - partition.start
    try:
        return os.path.getsize(partition.path) if partition.path != "-" else 0
    except OSError:
        return 0


def choose_workers(partitions: list[Partition], requested: int | None) -> int:
    """Workers to use: ``requested``, or (None) as many CPUs as there are partitions, 1 for small inputs."""
    if requested is not None:
        return requested
    if len(partitions) < 2 or sum(map(partition_bytes, partitions)) < SMALL_INPUT_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, len(partitions)))


def dask_runner(*, workers: int | None = None, scheduler: str | None = None,
                connect_timeout_s: float = 30.0) -> Callable:
    """A ``run(partitions, scan, progress=None)`` for :func:`~ucp.reliability.logs.analyze.analyze_logs`.

    ``scheduler``: address of a running dask.distributed scheduler (given up on after
    ``connect_timeout_s``). Otherwise a
    local cluster of ``workers`` processes (one thread each: the scan is
    pure Python) is started for the run and closed after it; with one worker
    (or ``workers=None`` on a small input) the scans run in this process.
    """
    def run(partitions: list[Partition], scan, *, progress=None) -> list:
        n = choose_workers(partitions, workers)
        if scheduler is None and n <= 1:
            return run_in_process(partitions, scan, progress=progress)
        try:
            from dask.distributed import Client, LocalCluster, as_completed
        except ImportError as err:  # the `logs` extra (in `all`) installs it
            raise LogInputError("parallel analysis needs dask[distributed]: pip install 'ucp-middleware[logs]'") \
                from err
        cluster = None
        try:
            if scheduler is not None:
                client = Client(scheduler, timeout=f"{connect_timeout_s}s")
            else:
                cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=40)
                client = Client(cluster)
        except OSError as err:
            raise LogInputError(f"cannot reach the Dask scheduler {scheduler!r}: {err}") from err
        try:
            futures = client.map(scan, partitions, pure=False)
            done = []
            for i, future in enumerate(as_completed(futures), start=1):
                done.append(future.result())
                if progress is not None:
                    progress(i, len(partitions))
            return sorted(done, key=lambda s: s.partition.index)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()

    return run


def run_in_process(partitions: list[Partition], scan, *, progress=None) -> list:
    """Run the scans one after the other in this process (the default of ``analyze_logs``)."""
    out = []
    for i, part in enumerate(partitions, start=1):
        out.append(scan(part))
        if progress is not None:
            progress(i, len(partitions))
    return out
