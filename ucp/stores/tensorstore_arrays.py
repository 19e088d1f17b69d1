"""zarr v3 arrays written and read by tensorstore, for any store that can name a tensorstore kvstore.

tensorstore's ``zarr3`` driver is the reference writer the plain-file writers
are tested against, and the path of multi-chunk arrays on stores tensorstore
cannot reach itself (it cannot see fsspec filesystems): there a fragment goes
through a private tensorstore ``memory`` kvstore, and the store copies its keys
(``zarr.json``, the chunk files) across with ``after_write`` / ``before_read``.
Calls block; stores run them on their I/O threads.

Example::

    arrays = TensorstoreArrays(context, lambda rel: {"driver": "file", "path": f"/ckpt/{rel}/"}, display=str)
    arrays.write("data/r0/w", np.ones((4, 2), np.float32), dtype="float32", chunk_rows=2, attributes={})
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import tensorstore as ts

from ucp.errors import ManifestError, UcpError
from ucp.stores.errors import tensorstore_error
from ucp.zarr_array import array_metadata, chunk_key

# Opened arrays kept per store: reopening costs ~0.3 ms, holding one costs little.
_OPEN_ARRAYS = 256


class TensorstoreArrays:
    """Write whole arrays and read single chunks through tensorstore (blocking calls)."""

    def __init__(
        self,
        context: Any,
        kvstore: Callable[[str], dict],
        *,
        display: Callable[..., str],
        after_write: Callable[[str], None] | None = None,
        before_read: Callable[[str, str, int, str], None] | None = None,
        after_read: Callable[[str, str], None] | None = None,
    ) -> None:
        self.context = context
        self._kvstore = kvstore
        self._display = display
        self._after_write = after_write
        self._before_read = before_read
        self._after_read = after_read
        self._open: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def write(
        self,
        rel: str,
        array: np.ndarray,
        *,
        dtype: str,
        chunk_rows: int,
        attributes: dict,
        delete_existing: bool = False,
    ) -> None:
        spec = {
            "driver": "zarr3",
            "kvstore": self._kvstore(rel),
            "metadata": array_metadata(tuple(array.shape), dtype, chunk_rows, attributes),
            # Every chunk must exist: a missing chunk then always means damage.
            "store_data_equal_to_fill_value": True,
        }
        store = ts.open(spec, create=True, delete_existing=delete_existing, context=self.context).result()
        if array.size:
            store.write(array, can_reference_source_data_indefinitely=True).result()
        if self._after_write is not None:
            self._after_write(rel)

    def read_chunk(
        self,
        rel: str,
        shape: tuple[int, ...],
        dtype: str,
        index: int,
        chunk_rows: int,
        *,
        what: str,
        zarr_json_limit: int,
    ) -> np.ndarray:
        """The valid rows of chunk ``index`` (errors as a plain read of the file would raise)."""
        store = self._opened(rel, shape, dtype, what=what, zarr_json_limit=zarr_json_limit)
        name = chunk_key(shape, index)
        full = (chunk_rows * math.prod(max(1, s) for s in shape[1:]) if shape else 1) * store.dtype.numpy_dtype.itemsize
        if self._before_read is not None:
            self._before_read(rel, name, full, what)
        try:
            view = store if not shape else store[index * chunk_rows : min((index + 1) * chunk_rows, shape[0])]
            return view.read().result()
        except ValueError as err:
            if isinstance(err, UcpError):
                raise
            raise tensorstore_error(err, what, self._display(rel, name)) from None
        finally:
            if self._after_read is not None:
                self._after_read(rel, name)

    def forget(self) -> None:
        with self._lock:
            self._open.clear()

    def _opened(self, rel: str, shape: tuple[int, ...], dtype: str, *, what: str, zarr_json_limit: int) -> Any:
        with self._lock:
            store = self._open.get(rel)
        if store is not None:
            return store
        if self._before_read is not None:
            self._before_read(rel, "zarr.json", zarr_json_limit, what)
        spec = {"driver": "zarr3", "kvstore": self._kvstore(rel), "fill_missing_data_reads": False}
        try:
            store = ts.open(spec, open=True, read=True, context=self.context).result()
        except ValueError as err:
            raise tensorstore_error(err, what, self._display(rel)) from None
        found = (tuple(store.shape), store.dtype.name)
        if found != (tuple(shape), dtype):
            raise ManifestError(
                f"{what}: stored array {self._display(rel)} is {found[1]}{list(found[0])} "
                f"but the manifest says {dtype}{list(shape)}; the checkpoint is damaged"
            )
        with self._lock:
            self._open[rel] = store
            while len(self._open) > _OPEN_ARRAYS:
                self._open.popitem(last=False)
        return store
