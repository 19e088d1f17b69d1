"""Compiled fragment maps kept per process: a run saves and loads the same program for the same layout again and again.

Compiling a program for a rank (:func:`ucp.ucl.compiler.compile_load` / ``compile_save``)
matches every rule against every tensor name; a preset such as ``megatron-gpt`` took a
fifth of a small rank's warm load (docs/BENCHMARKS.md, zero=1). The map depends only on
its inputs, so it is kept under a key made of *all* of them: the program's text and file
name, the parameter values, the layout, the rank, and every tensor's name, shape and dtype
(the checkpoint's logical tensors for a load; the rank's local tensors, and the logical
shapes given, for a save). Another layout, rank, shape, dtype or program is another key.
Inputs that cannot be made a key (an unhashable value) are compiled every time.

A hit returns a copy of the map's dicts, so a caller that changes its map changes no one else's::

    fmap = compiled(compile_load, program, layout, rank, logical, params=params)
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Any, Callable

from ucp.layout import Layout
from ucp.ucl.program import Program

__all__ = ["compiled", "clear"]

_MAX = 64  # maps kept (least recently used dropped first): a job's few programs x layouts x ranks
_maps: OrderedDict[tuple, Any] = OrderedDict()
_lock = threading.Lock()


def _frozen(value: Any) -> Any:
    """``value`` as a hashable key part (lists as tuples, dicts as sorted item tuples); TypeError if it cannot be."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    hash(value)
    return (type(value).__name__, value)  # 1 and 1.0 and True are different parameter values


def _tensors_key(tensors: dict | None) -> tuple | None:
    """Name, shape and dtype of every tensor, in the given order (the map's order follows it)."""
    if tensors is None:
        return None
    out = []
    for name, t in tensors.items():
        shape, dtype = (t.shape, t.dtype) if hasattr(t, "shape") else (t[0], t[1])
        out.append((str(name), tuple(int(s) for s in shape), str(dtype)))
    return tuple(out)


def _key(
    compile_fn: Callable, program: Program, layout: Layout, rank: int, tensors: dict, params: Any, extra: dict
) -> tuple:
    return (
        compile_fn.__module__,
        compile_fn.__qualname__,
        program.filename,
        program.source,
        _frozen(params or {}),
        _frozen(dataclasses.asdict(layout)),
        int(rank),
        _tensors_key(tensors),
        tuple(sorted((k, _tensors_key(v)) for k, v in extra.items())),
    )


def _copy(fmap: Any) -> Any:
    return dataclasses.replace(fmap, logical=dict(fmap.logical), tensors=dict(fmap.tensors), local=dict(fmap.local))


def compiled(
    compile_fn: Callable,
    program: Program,
    layout: Layout,
    rank: int,
    tensors: dict,
    *,
    params: Any = None,
    **extra: Any,
) -> Any:
    """``compile_fn(program, layout, rank, tensors, params=params, **extra)``, kept per process (see the module doc).

    ``extra`` values are dicts of tensors (a save's logical ``shapes``) or None. Errors are not kept:
    a failing compile raises again each time.
    """
    try:
        key = _key(compile_fn, program, layout, rank, tensors, params, extra)
    except (TypeError, ValueError, AttributeError, IndexError):
        return compile_fn(program, layout, rank, tensors, params=params, **extra)
    with _lock:
        hit = _maps.get(key)
        if hit is not None:
            _maps.move_to_end(key)
    if hit is not None:
        return _copy(hit)
    fmap = compile_fn(program, layout, rank, tensors, params=params, **extra)
    with _lock:
        _maps[key] = _copy(fmap)
        while len(_maps) > _MAX:
            _maps.popitem(last=False)
    return fmap


def clear() -> None:
    """Forget every kept map."""
    with _lock:
        _maps.clear()
