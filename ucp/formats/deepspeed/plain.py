"""The non-tensor content of DeepSpeed and Megatron ``.pt`` files as plain JSON, and back, exactly.

A DeepSpeed checkpoint's metadata is Python objects: tuples (``betas``),
``OrderedDict`` s and ``torch.Size`` s (``param_shapes``), dicts keyed by ints
(optimizer ``state``), DeepSpeed's own classes (``LossScaler``,
``ZeroStageEnum``, which the restricted unpickler turns into inert stand-ins),
``argparse.Namespace`` (Megatron's ``args``), numpy arrays (RNG states).
:func:`to_plain` turns such a tree into JSON values with tagged objects (one
member whose name starts with ``@``; not ``$``, so that they never meet the
tags of a ucp manifest's state tree, docs/FORMAT.md section 5, when stored
there) so nothing is lost, and :func:`from_plain` turns it back into the same Python values, DeepSpeed's classes as
:class:`ForeignObject` records that :mod:`ucp.formats.deepspeed.pt` pickles by
reference again (the class is never imported here).

Tags: ``@tuple``, ``@odict``, ``@dict`` (non-string keys), ``@size``,
``@float`` (nan/inf), ``@namespace``, ``@ndarray``, ``@npscalar``, ``@bytes``,
``@set``, ``@dtype``, ``@device``, ``@foreign``, ``@tensor`` (a reference to
a logical tensor, given by the caller) and ``@ref``: the n-th container met
(in depth-first order) met again. Pickles keep object identity (the one
``betas`` tuple that two param groups share is written once), so the plain
form keeps it too, and writing it back gives the same bytes.

>>> import collections
>>> plain = to_plain({"betas": (0.9, 0.999), "shapes": collections.OrderedDict(w=torch.Size([2, 3]))})
>>> plain
{'betas': {'@tuple': [0.9, 0.999]}, 'shapes': {'@odict': [['w', {'@size': [2, 3]}]]}}
>>> from_plain(plain)
{'betas': (0.9, 0.999), 'shapes': OrderedDict([('w', torch.Size([2, 3]))])}
"""

from __future__ import annotations

import argparse
import base64
import collections
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ucp.errors import FormatError
from ucp.unpickle import InertObject

__all__ = ["ForeignObject", "to_plain", "from_plain", "foreign_of"]


@dataclass(frozen=True, eq=False)
class ForeignObject:
    """An object of a class this library never imports (``origin`` = ``module.Name``), as data.

    ``new``: the pickle built it with ``NEWOBJ`` (``cls.__new__`` + ``__setstate__``,
    plain classes) rather than by calling ``cls(*args)`` (enums).
    """

    origin: str
    new: bool = True
    args: tuple = ()
    state: Any = None
    kwargs: dict = field(default_factory=dict)


def foreign_of(obj: InertObject) -> ForeignObject:
    """The record of an inert stand-in: how the pickle made it, with what."""
    return ForeignObject(obj.origin, not obj.called, tuple(obj.args), obj.state, dict(obj.kwargs))


_CONTAINERS = (tuple, list, dict, argparse.Namespace, InertObject)


def to_plain(obj: Any, *, tensor: Callable[[torch.Tensor, str], str] | None = None) -> Any:
    """``obj`` as JSON values (see the module doc); ``tensor(t, path)`` names each tensor met."""
    return _to_plain(obj, tensor, "", {})


def _to_plain(obj: Any, tensor: Callable[[torch.Tensor, str], str] | None, where: str, seen: dict[int, int]) -> Any:
    if isinstance(obj, _CONTAINERS) and not (isinstance(obj, tuple) and not obj):
        if id(obj) in seen:
            return {"@ref": seen[id(obj)]}
        seen[id(obj)] = len(seen)
    if isinstance(obj, np.generic):  # before float: np.float64 is a float
        return {"@npscalar": {"dtype": obj.dtype.str, "data": base64.b64encode(obj.tobytes()).decode()}}
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"@float": repr(obj)}
    if isinstance(obj, torch.Tensor):
        if tensor is None:
            raise FormatError(f"unexpected tensor at {where or 'the top'} of a state that holds none")
        return {"@tensor": tensor(obj, where)}
    sub = lambda value, key: _to_plain(value, tensor, f"{where}/{key}" if where else str(key), seen)  # noqa: E731
    if isinstance(obj, torch.Size):
        return {"@size": [int(s) for s in obj]}
    if isinstance(obj, tuple):
        return {"@tuple": [sub(v, i) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [sub(v, i) for i, v in enumerate(obj)]
    if isinstance(obj, collections.OrderedDict):
        return {"@odict": [[sub(k, "key"), sub(v, k)] for k, v in obj.items()]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("@") for k in obj):
            return {k: sub(v, k) for k, v in obj.items()}
        return {"@dict": [[sub(k, "key"), sub(v, k)] for k, v in obj.items()]}
    if isinstance(obj, argparse.Namespace):
        return {"@namespace": {k: sub(v, k) for k, v in vars(obj).items()}}
    if isinstance(obj, InertObject):
        rec = foreign_of(obj)
        return {
            "@foreign": {
                "class": rec.origin,
                "new": rec.new,
                "args": [sub(a, i) for i, a in enumerate(rec.args)],
                "kwargs": {k: sub(v, k) for k, v in rec.kwargs.items()},
                "state": sub(rec.state, "state"),
            }
        }
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise FormatError(f"a numpy array of Python objects at {where} cannot be read as data")
        return {
            "@ndarray": {
                "dtype": obj.dtype.str,
                "shape": list(obj.shape),
                "data": base64.b64encode(np.ascontiguousarray(obj).tobytes()).decode(),
            }
        }
    if isinstance(obj, (bytes, bytearray)):
        return {"@bytes": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, (set, frozenset)):
        return {"@set": [sub(v, i) for i, v in enumerate(sorted(obj, key=repr))]}
    if isinstance(obj, torch.dtype):
        return {"@dtype": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"@device": str(obj)}
    raise FormatError(f"{type(obj).__module__}.{type(obj).__qualname__} at {where or 'the top'} is not plain data")


def from_plain(data: Any, *, tensor: Callable[[Any], Any] | None = None) -> Any:
    """Inverse of :func:`to_plain`; ``tensor(ref)`` resolves ``@tensor`` references (what to_plain's namer gave)."""
    return _from_plain(data, tensor, [])


_BUILDING = object()
_CONTAINER_TAGS = frozenset({"@tuple", "@odict", "@dict", "@size", "@namespace", "@foreign"})


def _from_plain(data: Any, tensor: Callable[[Any], Any] | None, built: list) -> Any:
    if not isinstance(data, (list, dict)):
        return data
    back = lambda value: _from_plain(value, tensor, built)  # noqa: E731
    tag, value = next(iter(data.items())) if isinstance(data, dict) and len(data) == 1 else (None, None)
    if tag == "@ref":
        if not isinstance(value, int) or not 0 <= value < len(built) or built[value] is _BUILDING:
            raise FormatError(f"bad reference {{'@ref': {value!r}}} in a DeepSpeed state")
        return built[value]
    container = isinstance(data, list) or tag is None or not tag.startswith("@") or tag in _CONTAINER_TAGS
    container = container and not (tag in ("@tuple", "@size") and not value)  # to_plain skips empty tuples too
    if container:
        slot = len(built)
        built.append(_BUILDING)
    if isinstance(data, list):
        result: Any = [back(v) for v in data]
    elif tag is not None and tag.startswith("@"):
        result = _untag(tag, value, back, tensor)
    else:
        result = {k: back(v) for k, v in data.items()}
    if container:
        built[slot] = result
    return result


def _untag(tag: str, value: Any, back: Callable[[Any], Any], tensor: Callable[[Any], Any] | None) -> Any:
    if tag == "@tuple":
        return tuple(back(v) for v in value)
    if tag == "@size":
        return torch.Size(value)
    if tag == "@odict":
        return collections.OrderedDict((back(k), back(v)) for k, v in value)
    if tag == "@dict":
        return {back(k): back(v) for k, v in value}
    if tag == "@float":
        return float(value)
    if tag == "@namespace":
        return argparse.Namespace(**{k: back(v) for k, v in value.items()})
    if tag == "@foreign":
        return ForeignObject(
            value["class"],
            bool(value["new"]),
            tuple(back(a) for a in value["args"]),
            back(value["state"]),
            {k: back(v) for k, v in value["kwargs"].items()},
        )
    if tag == "@ndarray":
        raw = base64.b64decode(value["data"])
        return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
    if tag == "@npscalar":
        return np.frombuffer(base64.b64decode(value["data"]), dtype=np.dtype(value["dtype"]))[0]
    if tag == "@bytes":
        return base64.b64decode(value)
    if tag == "@set":
        return {back(v) for v in value}
    if tag == "@dtype":
        return getattr(torch, value)
    if tag == "@device":
        return torch.device(value)
    if tag == "@tensor":
        if tensor is None:
            raise FormatError(f"the state refers to tensor {value!r} but no tensors were given")
        return tensor(value)
    raise FormatError(f"unknown tag {tag!r} in a DeepSpeed state (written by a newer ucp?)")
