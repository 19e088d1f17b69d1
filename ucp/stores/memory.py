"""The in-process memory store (``memory://``): fast tests, and host memory as a replica tier.

It is an :class:`~ucp.stores.fsspec_store.FsspecStore` over fsspec's memory
filesystem (one per process, shared by every ``memory://`` URL), whose commit
marker is created under a lock: the memory filesystem checks for an existing
file when it is opened and writes it when it is closed, so two threads could
both pass the check; the lock makes check-and-write one step.

Example::

    store = MemoryStore("memory://ckpt")
    store.create_exclusive("manifest.json", b"{}")   # FileExistsError the second time
"""

from __future__ import annotations

import threading

from ucp.stores.fsspec_store import FsspecStore


class MemoryStore(FsspecStore):
    """A root in this process's fsspec memory filesystem."""

    # One lock for every instance: they all share the one memory filesystem.
    _exclusive = threading.Lock()

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        path = self.path(rel)
        with self._exclusive:
            if self.fs.exists(path):
                raise FileExistsError(path)
            self.fs.pipe_file(path, data)
        return True
