"""The in-process memory store (``memory://``): fast tests, and host memory as a replica tier.

It is an :class:`~ucp.stores.fsspec_store.FsspecStore` over fsspec's memory
filesystem (one per process, shared by every ``memory://`` URL), whose commit
marker is created under a lock: the memory filesystem checks for an existing
file when it is opened and writes it when it is closed, so two threads could
both pass the check; the lock makes check-and-write one step. A whole-file read
hands back the bytes the filesystem holds, not a copy (host memory as a replica
tier holds blobs of gigabytes).

Example::

    store = MemoryStore("memory://ckpt")
    store.create_exclusive("manifest.json", b"{}")   # FileExistsError the second time
"""

from __future__ import annotations

import threading

from ucp.confined import relative_parts
from ucp.errors import UnsafePathError
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

    def read_file(self, rel: str, *, limit: int, allowed: str) -> bytes:
        # fsspec's info() scans every key of the process's memory filesystem and its size
        # and cat_file() each copy the file; getvalue() of the file it keeps does neither.
        relative_parts(rel, self.display(), verb="read")
        held = self.fs.store.get(self.fs._strip_protocol(self.path(rel)))
        if held is None:  # a directory, or nothing: as every fsspec store answers
            return super().read_file(rel, limit=limit, allowed=allowed)
        data = held.getvalue()
        if len(data) > limit:
            raise UnsafePathError(
                f"{self.display(rel)} is not a file of at most {limit} bytes (file, {len(data)} "
                f"bytes), the most that {allowed}; refusing to read it"
            )
        return data
