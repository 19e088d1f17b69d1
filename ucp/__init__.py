"""ucp: the Universal Checkpoint format and engine.

::

    import ucp
    ucp.save(state, "ckpt/step_100")
    state = ucp.load("ckpt/step_100")

The engine (torch, tensorstore) is imported on first use, so importing
``ucp.errors`` or ``ucp.layout`` stays cheap.
"""

from ucp.errors import (
    AsyncSaveError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    ChecksumError,
    CoverageError,
    FormatError,
    FormatVersionError,
    IncompleteCheckpointError,
    InvalidArgumentError,
    KeyMismatchError,
    LayoutError,
    ManifestError,
    NameConflictError,
    NotACheckpointError,
    PartialLoadWarning,
    ReplicaMismatchError,
    RestoreError,
    RestoreFallbackWarning,
    SaveTimeoutError,
    ShapeMismatchError,
    StorageURLError,
    TensorTooLargeError,
    TruncatedDataError,
    UcpError,
    UnsafeObjectError,
    UnsafePathError,
    UnsafePickleError,
    UnsupportedTensorError,
)
from ucp.geometry import Box, FlatRange
from ucp.layout import Layout
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

# public name -> module that defines it (imported lazily, PEP 562)
_LAZY = {
    "save": "ucp.api",
    "load": "ucp.api",
    "finalize": "ucp.api",
    "iter_tensors": "ucp.api",
    "read_tensor": "ucp.api",
    "SaveResult": "ucp.writer",
    "CheckpointWriter": "ucp.writer",
    "CheckpointReader": "ucp.reader",
    "Manifest": "ucp.manifest",
    "Fragment": "ucp.manifest",
    "TensorEntry": "ucp.manifest",
    "FORMAT_VERSION": "ucp.manifest",
    "verify": "ucp.verification",
    "VerifyReport": "ucp.verification",
    "describe": "ucp.summary",
    "CheckpointSummary": "ucp.summary",
    "UnsupportedDtypeError": "ucp.dtypes",
    "fragment_map_from_dtensors": "ucp.dtensor",
    "async_save": "ucp.async_saver",
    "AsyncSaver": "ucp.async_saver",
    "AsyncSaveHandle": "ucp.async_saver",
    "CheckpointManager": "ucp.manager",
    "SaveRecord": "ucp.manager",
    "EveryNSteps": "ucp.policies",
    "EveryTSeconds": "ucp.policies",
    "AnyOf": "ucp.policies",
    "KeepLast": "ucp.policies",
    "KeepEvery": "ucp.policies",
    "KeepAll": "ucp.policies",
    "KeepUnion": "ucp.policies",
    "convert": "ucp.conversion",
    "ConvertResult": "ucp.conversion",
    "diff": "ucp.comparison",
    "DiffReport": "ucp.comparison",
}


# The public API, stated once: the names a user types after `ucp.` (what `from ucp import *` gives and
# dir(ucp) lists). Subpackages (ucp.ucl, ucp.formats, ucp.stores, ...) are imported by their own names.
__all__ = [
    # saving and loading (ucp.api, ucp.async_saver, ucp.manager, ucp.policies)
    "save",
    "load",
    "finalize",
    "iter_tensors",
    "read_tensor",
    "async_save",
    "AsyncSaver",
    "AsyncSaveHandle",
    "CheckpointManager",
    "SaveRecord",
    "EveryNSteps",
    "EveryTSeconds",
    "AnyOf",
    "KeepLast",
    "KeepEvery",
    "KeepAll",
    "KeepUnion",
    # checkpoints as data (ucp.writer, ucp.reader, ucp.manifest)
    "SaveResult",
    "CheckpointWriter",
    "CheckpointReader",
    "Manifest",
    "Fragment",
    "TensorEntry",
    "FORMAT_VERSION",
    # checking, describing, converting and comparing checkpoints
    "verify",
    "VerifyReport",
    "describe",
    "CheckpointSummary",
    "convert",
    "ConvertResult",
    "diff",
    "DiffReport",
    # layouts and how local tensors map onto logical ones
    "Layout",
    "Box",
    "FlatRange",
    "FragmentMap",
    "LogicalTensor",
    "ShardPiece",
    "TensorSpec",
    "fragment_map_from_dtensors",
    # errors (ucp.errors): one root, UcpError; each also inherits the matching builtin
    "UcpError",
    "CheckpointNotFoundError",
    "NotACheckpointError",
    "IncompleteCheckpointError",
    "CheckpointExistsError",
    "ChecksumError",
    "TruncatedDataError",
    "FormatVersionError",
    "ManifestError",
    "ShapeMismatchError",
    "KeyMismatchError",
    "CoverageError",
    "LayoutError",
    "ReplicaMismatchError",
    "UnsafeObjectError",
    "UnsafePickleError",
    "UnsafePathError",
    "FormatError",
    "AsyncSaveError",
    "SaveTimeoutError",
    "TensorTooLargeError",
    "NameConflictError",
    "UnsupportedTensorError",
    "UnsupportedDtypeError",
    "InvalidArgumentError",
    "RestoreError",
    "StorageURLError",
    "RestoreFallbackWarning",
    "PartialLoadWarning",
]


def __getattr__(name: str):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ucp' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__():
    return list(__all__)
