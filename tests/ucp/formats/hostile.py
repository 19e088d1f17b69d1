"""Hand-built hostile checkpoint files: torch.save archives whose pickle states any tensor geometry.

``write_pt(path, {"w": Record("0", offset=-2, shape=(2,), stride=(1,))}, {"0": bytes})`` writes a
zip archive exactly as torch.save lays it out, whose ``data.pkl`` rebuilds each tensor with the
stated storage key, offset, shape and stride (whatever they are): the geometry a reader must check.
"""

from __future__ import annotations

import collections
import io
import pickle
import sys
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Record:
    """A tensor of the pickle: which storage record, at which offset (elements), with which shape/stride."""

    key: str
    offset: int
    shape: tuple
    stride: tuple
    dtype: torch.dtype = torch.float32
    storage_numel: int | None = None  # what the pickle claims; default: the record's size


class _Ref:
    def __init__(self, record: Record, numel: int) -> None:
        self.record, self.numel = record, numel


class _Tensor:
    def __init__(self, record: Record, numel: int) -> None:
        self.record, self.numel = record, numel

    def __reduce__(self):
        r = self.record
        return (torch._utils._rebuild_tensor_v2,
                (_Ref(r, self.numel), r.offset, r.shape, r.stride, False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Ref):
            storage = getattr(torch, torch.storage._dtype_to_storage_type_map()[obj.record.dtype])
            return ("storage", storage, obj.record.key, "cpu", obj.numel)
        return None


def pickle_bytes(tree) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(tree)
    return buf.getvalue()


def write_archive(path, data_pkl: bytes, records: dict[str, bytes]) -> None:
    """A torch.save zip archive holding ``data_pkl`` and the storage ``records`` (any bytes)."""
    writer = torch._C.PyTorchFileWriter(str(path))
    for key, data in records.items():
        writer.write_record(f"data/{key}", data, len(data))
    writer.write_record("data.pkl", data_pkl, len(data_pkl))
    writer.write_record(".format_version", "1", 1)
    writer.write_record("byteorder", sys.byteorder, len(sys.byteorder))
    writer.write_end_of_file()


def write_pt(path, tensors: dict[str, Record], records: dict[str, bytes], *, extra: dict | None = None) -> None:
    """A torch.save archive whose pickle holds ``{name: tensor}`` (and ``extra``) with the records' bytes."""
    tree = {}
    for name, r in tensors.items():
        numel = r.storage_numel if r.storage_numel is not None else len(records.get(r.key, b"")) // r.dtype.itemsize
        tree[name] = _Tensor(r, numel)
    tree.update(extra or {})
    write_archive(path, pickle_bytes(tree), records)


def floats(*values: float) -> bytes:
    return torch.tensor(values, dtype=torch.float32).numpy().tobytes()


def archive_bytes(tensors: dict[str, Record] | Record, records: dict[str, bytes]) -> bytes:
    """The bytes of a torch.save archive holding one tensor (a Record) or a dict of them."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "a.pt")
        if isinstance(tensors, Record):
            numel = len(records.get(tensors.key, b"")) // tensors.dtype.itemsize
            write_archive(path, pickle_bytes(_Tensor(tensors, numel)), records)
        else:
            write_pt(path, tensors, records)
        with open(path, "rb") as fh:
            return fh.read()


def write_dcp(folder, chunks: dict[str, tuple[tuple, bytes]], *, planner_data: dict | None = None,
              dtype: torch.dtype = torch.float32) -> None:
    """A DCP folder as FileSystemWriter lays it out: each ``fqn -> (shape, chunk archive bytes)`` one whole-tensor
    chunk, back to back in ``__0_0.distcp``, and ``.metadata`` pickled with DCP's own classes."""
    import os

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                       TensorProperties, TensorStorageMetadata)

    os.makedirs(folder, exist_ok=True)
    entries, storage, blob = {}, {}, b""
    for fqn, (shape, data) in chunks.items():
        offsets = torch.Size([0] * len(shape))
        entries[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(shape),
                                             [ChunkStorageMetadata(offsets, torch.Size(shape))])
        storage[MetadataIndex(fqn, offsets)] = _StorageInfo("__0_0.distcp", len(blob), len(data))
        blob += data
    with open(os.path.join(folder, "__0_0.distcp"), "wb") as fh:
        fh.write(blob)
    metadata = Metadata(state_dict_metadata=entries, storage_data=storage,
                        planner_data=planner_data if planner_data is not None else {k: (k,) for k in chunks})
    with open(os.path.join(folder, ".metadata"), "wb") as fh:
        pickle.dump(metadata, fh)
