"""ucp: the Universal Checkpoint format and engine.

::

    import ucp
    ucp.save(state, "ckpt/step_100")
    state = ucp.load("ckpt/step_100")

The engine (torch, tensorstore) is imported on first use, so importing
``ucp.errors`` or ``ucp.layout`` stays cheap.
"""

from ucp.errors import *  # noqa: F403
from ucp.errors import UcpError  # noqa: F401
from ucp.geometry import Box, FlatRange  # noqa: F401
from ucp.layout import Layout  # noqa: F401
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec  # noqa: F401

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


def __getattr__(name: str):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ucp' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
