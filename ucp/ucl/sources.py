"""Where the logical shapes a check runs against come from: a shapes file.

(The program's own declarations are :mod:`ucp.ucl.declared`; a real model is :mod:`ucp.ucl.model_check`;
a checkpoint is :func:`ucp.programs.read_against`, in the core, since the language reads no checkpoints.)
A shapes file is JSON ``{"name": {"shape": [..], "dtype": "float32"}}`` or ``{"name": [..]}``::

    >>> import json, tempfile
    >>> path = tempfile.mktemp(suffix=".json")
    >>> _ = open(path, "w").write(json.dumps({"w": [4, 2], "b": {"shape": [4], "dtype": "bfloat16"}}))
    >>> read_shapes(path)["b"]
    LogicalTensor(name='b', shape=(4,), dtype='bfloat16')
"""

from __future__ import annotations

import json
import os
import stat

from ucp.ucl.errors import UclError
from ucp.ucl.expr import MAX_INT
from ucp.spec import LogicalTensor

# A shapes file lists names and shapes: a manifest-sized file of 10^5 tensors is a few MB.
MAX_SHAPES_BYTES = 256 << 20


def read_shapes(path: str) -> dict[str, LogicalTensor]:
    """Logical tensors from a shapes JSON file; UclError names the file and what is wrong."""
    data = _read_json(path)
    if not isinstance(data, dict):
        raise UclError(f"{path}: expected an object of name -> shape")
    out = {}
    for name, value in data.items():
        if isinstance(value, dict):
            shape, dtype = value.get("shape"), value.get("dtype", "float32")
        else:
            shape, dtype = value, "float32"
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_INT for s in shape
        ):
            raise UclError(f"{path}: tensor {name!r}: expected a shape like [4, 8], got {_brief(shape)}")
        if not isinstance(dtype, str):
            raise UclError(f'{path}: tensor {name!r}: expected a dtype name like "float32", got {_brief(dtype)}')
        out[name] = LogicalTensor(name, tuple(shape), dtype)
    return out


def _read_json(path: str):
    try:
        info = os.stat(path)
    except OSError as err:
        raise UclError(f"shapes file {path!r} cannot be read: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UclError(f"shapes file {path!r} is not a regular file")
    if info.st_size > MAX_SHAPES_BYTES:
        raise UclError(f"shapes file {path!r} has {info.st_size} bytes, more than {MAX_SHAPES_BYTES}")
    with open(path, "rb") as fh:
        raw = fh.read(MAX_SHAPES_BYTES + 1)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise UclError(f"{path} is not a JSON text file (byte {err.start} is not UTF-8)") from None
    except json.JSONDecodeError as err:
        raise UclError(f"{path} is not valid JSON: {err}") from None
    except (RecursionError, ValueError) as err:  # nesting too deep; an integer of thousands of digits
        raise UclError(f"{path} cannot be read as a shapes file: {type(err).__name__}") from None


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
