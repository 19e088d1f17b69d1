"""Nested training state <-> a JSON tree plus ``/``-joined tensor keys.

A state is what a user hands to ``torch.save``: dicts (any hashable primitive
keys, e.g. the int parameter ids of an optimizer), lists, tuples, tensors and
JSON-able scalars. :func:`flatten_state` splits it into

* ``tensors``: ``{key: tensor}`` where the key is the path of the tensor in the
  state, components joined by ``/`` (``"optimizer/state/0/exp_avg"``), and
* ``tree``: the state as JSON, each tensor replaced by ``{"$tensor": key}``.

Tied tensors (same storage, offset, shape and stride) are kept once: the later
occurrence refers to the first key, so loading restores them shared::

    >>> import torch
    >>> w = torch.ones(2)
    >>> flat = flatten_state({"a": w, "b": w, "step": 3})
    >>> flat.tree
    {'a': {'$tensor': 'a'}, 'b': {'$tensor': 'a'}, 'step': 3}
    >>> list(flat.tensors)
    ['a']
"""

from __future__ import annotations

import base64
import math
import pickle
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ucp.errors import ManifestError, UnsafeObjectError

_TAGS = ("$tensor", "$tuple", "$dict", "$float", "$object")


@dataclass(frozen=True)
class FlatState:
    """A state split into its JSON tree and its tensors by key."""

    tree: Any
    tensors: dict[str, torch.Tensor]


def _tie_id(tensor: torch.Tensor) -> tuple:
    if type(tensor).__name__ == "DTensor":  # ties are between local shards
        tensor = tensor.to_local()
    return (tensor.device.type, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
            tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def flatten_state(state: Any, *, allow_objects: bool = False) -> FlatState:
    """Split ``state`` into a JSON tree and ``{key: tensor}`` (see module doc)."""
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        key = "/".join(path)
        if isinstance(value, torch.Tensor):
            if key in tensors:
                raise ManifestError(f"two tensors map to the same key {key!r}; rename one of the dict keys")
            tie = _tie_id(value) if value.numel() else None
            if tie is not None and tie in seen:
                return {"$tensor": seen[tie]}
            if tie is not None:
                seen[tie] = key
            tensors[key] = value
            return {"$tensor": key}
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, dict):
            plain = all(isinstance(k, str) and not k.startswith("$") for k in value)
            if plain:
                return {k: walk(v, path + (k,)) for k, v in value.items()}
            items = []
            for k, v in value.items():
                if not (k is None or isinstance(k, (str, int, float, bool))):
                    raise UnsafeObjectError(f"dict key {k!r} at {key or '<root>'!r} is not a str, int, float, bool or None")
                items.append([k, walk(v, path + (str(k),))])
            return {"$dict": items}
        if isinstance(value, list):
            return [walk(v, path + (str(i),)) for i, v in enumerate(value)]
        if isinstance(value, tuple) and type(value) in (tuple, torch.Size):
            return {"$tuple": [walk(v, path + (str(i),)) for i, v in enumerate(value)]}
        if not allow_objects:
            raise UnsafeObjectError(
                f"value at {key or '<root>'!r} is a {type(value).__module__}.{type(value).__qualname__}, "
                "which is not JSON; pass allow_objects=True to save (and load) it pickled"
            )
        return {"$object": base64.b64encode(pickle.dumps(value)).decode("ascii")}

    tree = walk(state, ())
    return FlatState(tree=tree, tensors=tensors)


def unflatten_state(
    tree: Any,
    resolve: Callable[[str], Any],
    *,
    allow_objects: bool = False,
    missing: object = None,
) -> Any:
    """Rebuild a state from its JSON tree; ``resolve(key)`` gives each tensor.

    ``resolve`` may return ``missing`` (a sentinel) to drop that entry.
    """

    def walk(node: Any, path: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(v, path + (str(i),)) for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        tag = next((t for t in _TAGS if t in node), None) if len(node) == 1 else None
        if tag is None:
            out = {}
            for k, v in node.items():
                value = walk(v, path + (k,))
                if value is not missing or missing is None:
                    out[k] = value
            return out
        body = node[tag]
        if tag == "$tensor":
            return resolve(body)
        if tag == "$tuple":
            return tuple(walk(v, path + (str(i),)) for i, v in enumerate(body))
        if tag == "$float":
            return float(body)
        if tag == "$dict":
            out = {}
            for k, v in body:
                value = walk(v, path + (str(k),))
                if value is not missing or missing is None:
                    out[k] = value
            return out
        if not allow_objects:
            raise UnsafeObjectError(
                f"checkpoint holds a pickled Python object at {'/'.join(path) or '<root>'!r}; "
                "pass allow_objects=True to load it (only for checkpoints you trust)"
            )
        return pickle.loads(base64.b64decode(body))

    return walk(tree, ())


def tensor_refs(tree: Any) -> list[str]:
    """Every tensor key the tree refers to, in order (tied keys repeat)."""
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, dict):
            if len(node) == 1 and "$tensor" in node:
                out.append(node["$tensor"])
            elif len(node) == 1 and "$dict" in node:
                for _, v in node["$dict"]:
                    walk(v)
            elif len(node) == 1 and "$object" in node:
                return
            else:
                for v in node.values():
                    walk(v)

    walk(tree)
    return out


def nest(flat: dict[str, Any]) -> dict:
    """``{"a/b": x}`` -> ``{"a": {"b": x}}`` (keys split on ``/``)."""
    out: dict = {}
    for key, value in flat.items():
        node = out
        parts = key.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def set_path(root: dict, key: str, value: Any) -> None:
    """Put ``value`` at ``key`` (``/``-joined) in a nested dict, creating dicts as needed."""
    node = root
    parts = key.split("/")
    for part in parts[:-1]:
        nxt = node.get(part) if isinstance(node, dict) else None
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[parts[-1]] = value
