"""S3 (and S3-compatible object stores) through s3fs: ``s3://bucket/prefix``.

A :class:`~ucp.stores.fsspec_store.FsspecStore` whose commit marker is an
S3 conditional put (``If-None-Match: *``): the store itself refuses a second
manifest, so two concurrent saves to one path never both commit. Listings are
never cached: other processes (other ranks, other jobs) write the same bucket.

Example::

    store = S3Store("s3://bucket/ckpt/step_5", storage_options={"endpoint_url": "http://127.0.0.1:9000"})
    store.create_exclusive("manifest.json", b"{}")   # FileExistsError when one exists
"""

from __future__ import annotations

from ucp.stores.fsspec_store import FsspecStore
from ucp.stores.options import StoreOptions


class S3Store(FsspecStore):
    """A prefix of an S3 bucket."""

    def __init__(self, url: str, *, storage_options: dict | None = None, options: StoreOptions | None = None) -> None:
        storage_options = {"use_listings_cache": False, **(storage_options or {})}
        super().__init__(url, storage_options=storage_options, options=options)

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        # s3fs turns the store's 412 Precondition Failed into FileExistsError.
        self.fs.pipe_file(self.path(rel), data, mode="create")
        return True
