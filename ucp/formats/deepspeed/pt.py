"""Reading and writing the ``.pt`` files of DeepSpeed and Megatron checkpoints, safely.

* :func:`load_pt` reads through the restricted unpickler (:mod:`ucp.unpickle`):
  tensors, containers and primitives; DeepSpeed's classes become inert
  stand-ins; nothing in the file runs. Zip-format files are memory-mapped, so
  a region read touches only the pages it needs.
* :func:`save_pt` is ``torch.save`` with one addition: a :class:`ForeignObject`
  (a DeepSpeed ``LossScaler`` read from the source, say) is pickled *by
  reference* again, exactly as DeepSpeed pickled it, without importing
  DeepSpeed. The bytes equal what ``torch.save`` writes for the real object.
* :class:`StreamingPtWriter` writes a ``torch.load``-able file whose tensors
  arrive one at a time and are written at once, so a file holding a whole
  model (DeepSpeed's ``mp_rank_00_model_states.pt``) costs no more memory than
  its largest tensor.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "optimizer_state.pt")
>>> save_pt({"loss_scaler": ForeignObject("deepspeed.runtime.fp16.loss_scaler.LossScaler",
...                                       state={"cur_scale": 1.0})}, path)
>>> load_pt(path)["loss_scaler"].state
{'cur_scale': 1.0}
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import sys
import types
from typing import Any

import torch

from ucp.errors import FormatError
from ucp.formats.deepspeed.plain import ForeignObject
from ucp.formats.tensor_geometry import check_loaded
from ucp.unpickle import torch_load

__all__ = ["load_pt", "load_pt_mapped", "save_pt", "StreamingPtWriter", "StoredTensor", "release_pages"]

_MADV_DONTNEED = 4  # Linux and macOS
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _libc() -> Any:
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def release_pages(view: torch.Tensor) -> None:
    """Let go of the resident pages under ``view``, a slice of a memory-mapped ``.pt`` tensor (only such:
    on ordinary memory this would zero it; :func:`load_pt_mapped` says which tensors are mapped).

    A mapped file's pages count toward the process's memory as long as they stay
    mapped; a conversion reads every byte once, so without this its peak memory
    would grow to the size of the checkpoint. The pages are clean and private
    (``torch.load(mmap=True)`` maps copy-on-write and nothing writes them), so the
    kernel drops them and a later read faults them in again from the file.
    """
    nbytes = view.numel() * view.element_size()
    if _LIBC is None or nbytes < _PAGE or view.device.type != "cpu":
        return
    start = view.data_ptr() // _PAGE * _PAGE
    stop = -(-(view.data_ptr() + nbytes) // _PAGE) * _PAGE
    _LIBC.madvise(start, stop - start, _MADV_DONTNEED)


def load_pt(path: str | os.PathLike, *, mmap: bool = True, allow: tuple = ()) -> Any:
    """The object in a ``.pt`` file, read restricted; tensors memory-mapped when the file allows it."""
    return load_pt_mapped(path, mmap=mmap, allow=allow)[0]


def load_pt_mapped(path: str | os.PathLike, *, mmap: bool = True, allow: tuple = ()) -> tuple[Any, bool]:
    """:func:`load_pt`, and whether its tensors are memory-mapped (only then may :func:`release_pages` touch them)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FormatError(f"{path} is missing")
    with open(path, "rb") as fh:
        # The legacy (pre zip) torch.save format cannot be mapped; it is read whole instead.
        mmap = mmap and fh.read(4) == b"PK\x03\x04"
    loaded = torch_load(path, unknown="stand-in", mmap=mmap, allow=allow)
    check_loaded(path, loaded, file_bytes=os.path.getsize(path))
    return loaded, mmap


class _ForeignClass:
    """Stands for the class ``origin`` in a pickle being written; one per class per pickler (memoized once)."""

    def __init__(self, origin: str) -> None:
        self.module, _, self.name = origin.rpartition(".")


class StoredTensor:
    """A tensor whose bytes a :class:`StreamingPtWriter` already wrote: its record key, dtype and shape."""

    def __init__(self, key: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.key, self.dtype, self.shape = key, dtype, tuple(shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class _StorageRef:
    def __init__(self, tensor: StoredTensor) -> None:
        self.tensor = tensor


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class _Pickler(pickle._Pickler):  # the Python pickler: its save() can be extended per object
    """Pickles :class:`ForeignObject` by reference and :class:`StoredTensor` as torch does a tensor."""

    def __init__(self, file: Any, protocol: int | None = None, **kwargs: Any) -> None:
        super().__init__(file, protocol, **kwargs)
        self._classes: dict[str, _ForeignClass] = {}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StorageRef):
            t = obj.tensor
            storage_type = getattr(torch, torch.storage._dtype_to_storage_type_map()[t.dtype])
            return ("storage", storage_type, t.key, "cpu", t.numel)
        return None

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if isinstance(obj, ForeignObject):
            return self._save_foreign(obj)
        if isinstance(obj, _ForeignClass):
            return self._save_class(obj)
        if isinstance(obj, StoredTensor):
            memo = self.memo.get(id(obj))
            if memo is not None:  # the same tensor again (tied weights): one storage, like torch.save
                self.write(self.get(memo[0]))
                return None
            args = (_StorageRef(obj), 0, obj.shape, _contiguous_strides(obj.shape), False, collections.OrderedDict())
            return self.save_reduce(torch._utils._rebuild_tensor_v2, args, obj=obj)
        return super().save(obj, save_persistent_id)

    def _save_class(self, cls: _ForeignClass) -> None:
        memo = self.memo.get(id(cls))
        if memo is not None:
            self.write(self.get(memo[0]))
            return
        encoding = "utf-8" if self.proto >= 3 else "ascii"
        self.write(pickle.GLOBAL + cls.module.encode(encoding) + b"\n" + cls.name.encode(encoding) + b"\n")
        self.memoize(cls)

    def _save_foreign(self, obj: ForeignObject) -> None:
        memo = self.memo.get(id(obj))
        if memo is not None:
            self.write(self.get(memo[0]))
            return
        if obj.kwargs:
            raise FormatError(f"cannot write {obj.origin} built with keyword arguments")
        # The same opcodes the C pickler writes for copyreg.__newobj__ (plain classes) or cls(*args) (enums).
        self.save(self._classes.setdefault(obj.origin, _ForeignClass(obj.origin)))
        self.save(tuple(obj.args))
        self.write(pickle.NEWOBJ if obj.new else pickle.REDUCE)
        self.memoize(obj)
        if obj.state is not None:
            self.save(obj.state)
            self.write(pickle.BUILD)


_PICKLE_MODULE = types.SimpleNamespace(Pickler=_Pickler, __name__="ucp.formats.deepspeed.pt")


def _has_foreign(obj: Any) -> bool:
    if isinstance(obj, ForeignObject):
        return True
    if isinstance(obj, dict):
        return any(_has_foreign(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_foreign(v) for v in obj)
    return False


def save_pt(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)``; :class:`ForeignObject` values are pickled as the classes they stand for."""
    if _has_foreign(obj):
        torch.save(obj, os.fspath(path), pickle_module=_PICKLE_MODULE)
    else:  # the C pickler: same bytes, faster
        torch.save(obj, os.fspath(path))


class StreamingPtWriter:
    """A ``torch.load``-able file written tensor by tensor: ``add`` writes bytes now, ``finish`` the structure.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "model_states.pt")
    >>> w = StreamingPtWriter(path)
    >>> ref = w.add(torch.arange(4.0))
    >>> w.finish({"module": {"w": ref}, "step": 3})
    >>> load_pt(path)["module"]["w"]
    tensor([0., 1., 2., 3.])
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._zip = torch._C.PyTorchFileWriter(self.path)
        self._count = 0
        self._done = False

    def add(self, tensor: torch.Tensor) -> StoredTensor:
        """Write ``tensor``'s bytes now; the returned handle stands for it in ``finish``'s object."""
        t = tensor.detach().to("cpu").contiguous()
        nbytes = t.numel() * t.element_size()
        if t.storage_offset() or t.untyped_storage().nbytes() != nbytes:  # a view: write only its own bytes
            t = t.clone()
        key = str(self._count)
        self._count += 1
        self._zip.write_record(f"data/{key}", t.untyped_storage() if nbytes else b"", nbytes)
        return StoredTensor(key, t.dtype, tuple(t.shape))

    def finish(self, obj: Any) -> None:
        """Pickle ``obj`` (with :class:`StoredTensor` handles where tensors go) and close the file."""
        buf = io.BytesIO()
        _Pickler(buf, protocol=2).dump(obj)
        data = buf.getvalue()
        self._zip.write_record("data.pkl", data, len(data))
        self._zip.write_record(".format_version", "1", 1)
        alignment = "64"
        self._zip.write_record(".storage_alignment", alignment, len(alignment))
        self._zip.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        self._zip.write_end_of_file()
        self._done = True

    def abort(self) -> None:
        if not self._done:
            try:
                self._zip.write_end_of_file()
            except RuntimeError:
                pass
            self._done = True
