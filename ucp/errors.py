"""The exception hierarchy: one root, each subclass also a matching builtin.

Callers who know nothing of ucp can still catch ``FileNotFoundError`` or
``ValueError``; callers who do can catch :class:`UcpError` for everything.

Example::

    try:
        ucp.load("ckpt/step_100")
    except ucp.ChecksumError as err:
        print("corrupt:", err)
"""

from __future__ import annotations

import pickle


class UcpError(Exception):
    """Root of every error this project raises on purpose."""


class CheckpointNotFoundError(UcpError, FileNotFoundError):
    """No checkpoint at the path (no committed manifest)."""


class IncompleteCheckpointError(UcpError, RuntimeError):
    """A save was started but never committed, or a fragment it lists is missing."""


class ChecksumError(UcpError, ValueError):
    """A fragment's bytes do not match the checksum recorded when it was written."""


class TruncatedDataError(UcpError, ValueError):
    """A file holds fewer bytes than the manifest says it must."""


class FormatVersionError(UcpError, ValueError):
    """The manifest's ``format_version`` is not one this reader understands."""


class ManifestError(UcpError, ValueError):
    """The manifest is not valid JSON or does not follow docs/FORMAT.md."""


class ShapeMismatchError(UcpError, ValueError):
    """A tensor in the checkpoint does not fit the tensor it is loaded into."""


class KeyMismatchError(UcpError, KeyError):
    """Keys missing from the checkpoint, or unexpected in it, under strict loading."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable
        return str(self.args[0]) if self.args else ""


class CoverageError(UcpError, ValueError):
    """Fragments leave elements of a logical tensor uncovered, or cover some twice."""


class LayoutError(UcpError, ValueError):
    """A parallel layout string or value is malformed or inconsistent."""


class ReplicaMismatchError(UcpError, ValueError):
    """Replicas that must hold equal values differ (check-equal policy)."""


class UnsafeObjectError(UcpError, TypeError):
    """Saving or loading an arbitrary Python object was not explicitly allowed."""


class UnsafePickleError(UnsafeObjectError, pickle.UnpicklingError):
    """A pickle names a global that could run code, or one not on the allow-list; nothing was executed."""


class FormatError(UcpError, ValueError):
    """A file is not in the format it claims (or is expected) to be in."""


class AsyncSaveError(UcpError, RuntimeError):
    """A background save failed; raised from its handle and from the next save."""


class SaveTimeoutError(UcpError, TimeoutError):
    """Waiting for an async save (or for staging space for one) took longer than the timeout given."""


class CheckpointExistsError(UcpError, FileExistsError):
    """A committed checkpoint is already at the path and ``overwrite`` was not given."""


class TensorTooLargeError(UcpError, MemoryError):
    """A tensor the manifest describes cannot be allocated in host memory."""


class NameConflictError(UcpError, ValueError):
    """Two things would land on one name: a tensor added twice, or a loaded tensor onto a state key."""


class UnsupportedTensorError(UcpError, TypeError):
    """A tensor without plain strided memory (sparse, nested, on the meta device) to save from or load into."""


class InvalidArgumentError(UcpError, ValueError, TypeError):
    """An argument of the API has a wrong type or an out-of-range value."""


class RestoreError(UcpError, RuntimeError):
    """CheckpointManager.restore could not restore a consistent state."""


class RestoreFallbackWarning(UserWarning):
    """CheckpointManager.restore skipped a damaged checkpoint (or recovered one); the message says which and why."""


class UnsafePathError(UcpError, PermissionError):
    """A file of a checkpoint resolves outside it (a symlink), is not a regular file, or is far
    larger than the manifest says; it was not read."""


class NotACheckpointError(CheckpointNotFoundError):
    """The path holds something other than a ucp checkpoint: another format, a plain file, a device."""


class StorageURLError(UcpError, ValueError):
    """A checkpoint path or URL that no storage backend can open (unknown protocol, missing package)."""


class PartialLoadWarning(UserWarning):
    """A load with ``strict=False`` left saved tensors unloaded; the message names them and how to load them."""
