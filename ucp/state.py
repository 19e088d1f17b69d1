"""Nested training state <-> a JSON tree plus ``/``-joined tensor keys.

A state is what a user hands to ``torch.save``: dicts (any hashable primitive
keys, e.g. the int parameter ids of an optimizer), lists, tuples, tensors and
JSON-able scalars, and objects with ``state_dict()``/``load_state_dict()``
(:mod:`ucp.stateful`), which stand for their ``state_dict()`` at the time of the call. :func:`flatten_state` splits it into

* ``tensors``: ``{key: tensor}`` where the key is the path of the tensor in the
  state, components joined by ``/`` (``"optimizer/state/0/exp_avg"``), and
* ``tree``: the state as JSON, each tensor replaced by ``{"$tensor": key}``.

Tied tensors (same storage, offset, shape and stride) are kept once: the later
occurrence refers to the first key, so loading restores them shared. ``ties``
remembers which keys were folded, so a caller whose fragment map sends them to
different logical tensors can keep them apart (``tie_group=``): folding must
never remove a logical tensor::

    >>> import torch
    >>> w = torch.ones(2)
    >>> flat = flatten_state({"a": w, "b": w, "step": 3})
    >>> flat.tree
    {'a': {'$tensor': 'a'}, 'b': {'$tensor': 'a'}, 'step': 3}
    >>> list(flat.tensors), flat.ties
    (['a'], {'b': 'a'})
"""

from __future__ import annotations

import base64
import binascii
import math
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import torch

from ucp.errors import ManifestError, NameConflictError, UnsafeObjectError, UnsafePickleError
from ucp.state_schema import MAX_DEPTH
from ucp.stateful import is_stateful

_TAGS = ("$tensor", "$tuple", "$dict", "$float", "$object")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@dataclass(frozen=True)
class FlatState:
    """A state split into its JSON tree and its tensors by key; ``ties`` maps a folded key to the kept one."""

    tree: Any
    tensors: dict[str, torch.Tensor]
    ties: dict[str, str] = field(default_factory=dict)


def _tie_id(tensor: torch.Tensor) -> tuple | None:
    if type(tensor).__name__ == "DTensor":  # ties are between local shards
        tensor = tensor.to_local()  # type: ignore[attr-defined]  # a DTensor, told by name (no torch.distributed import)
    if not tensor.numel() or tensor.layout != torch.strided or tensor.is_nested or tensor.device.type == "meta":
        return None  # no memory to share (refused later, with its own message, if it is saved)
    return (
        tensor.device.type,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def _show(path: tuple[str, ...]) -> str:
    text = "/".join(path) or "<root>"
    return text if len(text) <= 60 else text[:60] + "..."


def flatten_state(
    state: Any, *, allow_objects: Any = False, tie_group: Callable[[str], Hashable] | None = None
) -> FlatState:
    """Split ``state`` into a JSON tree and ``{key: tensor}`` (see module doc).

    ``allow_objects`` (True, or an allow-list as on load) pickles values that are not JSON;
    with ``tie_group``, tied keys are folded only when ``tie_group(key)`` is equal too.
    """
    return _flatten(state, objects="pickle" if allow_objects else "refuse", tie_group=tie_group)


def state_tensors(state: Any) -> dict[str, torch.Tensor]:
    """The tensors of ``state`` by key, ties folded as :func:`flatten_state` does; other values are ignored.

    >>> import threading
    >>> list(state_tensors({"w": torch.ones(1), "lock": threading.Lock()}))
    ['w']
    """
    return _flatten(state, objects="skip", tie_group=None).tensors


def _flatten(state: Any, *, objects: str, tie_group: Callable[[str], Hashable] | None) -> FlatState:
    tensors: dict[str, torch.Tensor] = {}
    ties: dict[str, str] = {}
    seen: dict[tuple, str] = {}

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        if len(path) > MAX_DEPTH:
            raise UnsafeObjectError(f"state is nested deeper than {MAX_DEPTH} levels at {_show(path)!r}; flatten it")
        key = "/".join(path)
        if isinstance(value, torch.Tensor):
            if key in tensors:
                raise NameConflictError(f"two tensors map to the same key {key!r}; rename one of the dict keys")
            tie = _tie_id(value)
            if tie is not None and tie_group is not None:
                tie = (tie, tie_group(key))
            if tie is not None and tie in seen:
                ties[key] = seen[tie]
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
                    raise UnsafeObjectError(
                        f"dict key {k!r} at {key or '<root>'!r} is not a str, int, float, bool or None"
                    )
                items.append([k, walk(v, path + (str(k),))])
            return {"$dict": items}
        if isinstance(value, list):
            return [walk(v, path + (str(i),)) for i, v in enumerate(value)]
        if isinstance(value, tuple) and type(value) in (tuple, torch.Size):
            return {"$tuple": [walk(v, path + (str(i),)) for i, v in enumerate(value)]}
        if is_stateful(value):  # a module, optimizer, scheduler...: its state now, not a stale copy
            return walk(value.state_dict(), path)
        if objects == "skip":
            return None
        if objects == "refuse":
            raise UnsafeObjectError(
                f"value at {key or '<root>'!r} is a {type(value).__module__}.{type(value).__qualname__}, "
                "which is not JSON; pass allow_objects=True to save (and load) it pickled"
            )
        return {"$object": base64.b64encode(pickle.dumps(value)).decode("ascii")}

    tree = walk(state, ())
    return FlatState(tree=tree, tensors=tensors, ties=ties)


def allowed_globals(allow_objects: Any) -> tuple | None:
    """What ``allow_objects`` lets a load unpickle: None (nothing), or extra globals beyond the safe list.

    ``True`` means the restricted unpickler's plain data types only; an iterable adds its
    ``"module.Class"`` strings or classes (a single string counts as one name).
    """
    if allow_objects is None or allow_objects is False:
        return None
    if allow_objects is True:
        return ()
    if isinstance(allow_objects, str):
        return (allow_objects,)
    try:
        return tuple(allow_objects)
    except TypeError:
        from ucp.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"allow_objects must be True, False or an iterable of 'module.Class' names or classes, "
            f"got {allow_objects!r}"
        ) from None


def unflatten_state(
    tree: Any,
    resolve: Callable[[str, str], Any],
    *,
    allow_objects: Any = False,
    missing: object = None,
    source: str = "the checkpoint",
) -> Any:
    """Rebuild a state from its JSON tree; ``resolve(key, path)`` gives the tensor of each reference.

    ``path`` is the ``/``-joined position of the reference (it differs from ``key`` for a tie).
    ``resolve`` may return ``missing`` (a sentinel) to leave that entry out of its dict or list.
    ``allow_objects`` is as for :func:`allowed_globals`; pickled objects are read with the
    restricted unpickler (:mod:`ucp.unpickle`). A malformed tree raises ManifestError naming ``source``.
    """
    allow = allowed_globals(allow_objects)

    def bad(path: tuple[str, ...], what: str) -> ManifestError:  # ``what`` says where with "{at}"
        return ManifestError(f"state tree of {source}: " + what.replace("{at}", f"at {_show(path)!r}"))

    def keep(value: Any) -> bool:
        return missing is None or value is not missing

    def walk(node: Any, path: tuple[str, ...]) -> Any:
        if len(path) > MAX_DEPTH:
            raise bad(path, f"nested deeper than {MAX_DEPTH} levels {{at}}")
        if isinstance(node, list):
            return [v for v in (walk(v, path + (str(i),)) for i, v in enumerate(node)) if keep(v)]
        if not isinstance(node, dict):
            return node
        if len(node) != 1 or not next(iter(node)).startswith("$"):
            return {k: v for k, v in ((k, walk(v, path + (k,))) for k, v in node.items()) if keep(v)}
        tag, body = next(iter(node.items()))
        if tag == "$tensor":
            if not isinstance(body, str):
                raise bad(path, "bad $tensor {at}: expected a tensor key (a string)")
            return resolve(body, "/".join(path))
        if tag == "$tuple":
            if not isinstance(body, list):
                raise bad(path, "bad $tuple {at}: expected a list")
            return tuple(v for v in (walk(v, path + (str(i),)) for i, v in enumerate(body)) if keep(v))
        if tag == "$float":
            if body not in _NON_FINITE:
                raise bad(path, f'bad {node!r} {{at}}: expected "nan", "inf" or "-inf"')
            return _NON_FINITE[body]
        if tag == "$dict":
            if not isinstance(body, list) or not all(
                isinstance(item, list)
                and len(item) == 2
                and (item[0] is None or isinstance(item[0], (str, int, float, bool)))
                for item in body
            ):
                raise bad(path, "bad $dict {at}: expected a list of [key, value] pairs")
            out = {}
            for k, v in body:
                value = walk(v, path + (str(k),))
                if keep(value):
                    out[k] = value
            return out
        if tag == "$object":
            return _unpickle(body, path, allow, bad)
        raise bad(path, f"unknown tag {tag!r} {{at}} (a newer format?)")

    return walk(tree, ())


def _unpickle(body: Any, path: tuple[str, ...], allow: tuple | None, bad: Callable) -> Any:
    from ucp import unpickle

    if allow is None:
        raise UnsafeObjectError(
            f"checkpoint holds a pickled Python object at {_show(path)!r}; pass allow_objects=True to load it with "
            "the restricted unpickler (plain data types only), or allow_objects=['module.Class', ...] to allow more"
        )
    try:
        data = base64.b64decode(body, validate=True) if isinstance(body, str) else None
    except (binascii.Error, ValueError):
        data = None
    if data is None:
        raise bad(path, "bad $object {at}: not base64 of a pickle")
    try:
        return unpickle.loads(data, allow=allow, unknown="refuse")
    except UnsafePickleError as err:
        raise UnsafePickleError(f"cannot load the pickled object at {_show(path)!r}: {err}") from None
    except Exception as err:  # noqa: BLE001 - any failure of a damaged pickle is the same damage
        raise bad(path, f"bad $object {{at}}: not a readable pickle ({type(err).__name__}: {err})") from None


def assemble_state(tree: Any, tensors: dict[str, Any], *, whole: bool, allow_objects: Any, source: str) -> Any:
    """The loaded state: the saved tree with its tensor references resolved, plus the tensors it does not place.

    A reference resolves to the tensor loaded for its own position, else for the key it names
    (a tie); one that resolves to nothing is left out (its data was mapped elsewhere). A whole
    load adds each logical tensor the tree does not place at the top level under its full
    name (logical names are flat: ``w`` and ``w/fp32`` are two tensors); a load by spec or into
    nests its keys by ``/`` (they are paths of a local state). Nothing is ever replaced
    (docs/FORMAT.md, "Loading a whole checkpoint").

    >>> tree = {"module": {"w": {"$tensor": "module/w"}}, "step": 3}
    >>> assemble_state(tree, {"w": 1, "w/fp32": 2}, whole=True, allow_objects=False, source="c")
    {'module': {}, 'step': 3, 'w': 1, 'w/fp32': 2}
    """
    placed: set[str] = set()
    missing = object()

    def resolve(key: str, at: str) -> Any:
        pick = at if at in tensors else key
        if pick in tensors:
            placed.add(pick)
            return tensors[pick]
        return missing

    state = (
        {}
        if tree is None
        else unflatten_state(tree, resolve, allow_objects=allow_objects, missing=missing, source=source)
    )
    unplaced = [key for key in tensors if key not in placed]
    if unplaced and not isinstance(state, dict):
        shown = ", ".join(map(repr, unplaced[:5])) + (" ..." if len(unplaced) > 5 else "")
        raise NameConflictError(
            f"cannot load {source}: its state tree is a {type(state).__name__}, which has no place for the tensors "
            f"it does not refer to ({shown}); read them with ucp.iter_tensors or ucp.read_tensor, or load with a spec"
        )
    for key in unplaced:
        if not whole:
            set_path(state, key, tensors[key])
        elif key in state:
            raise NameConflictError(
                f"cannot load {source} whole: logical tensor {key!r} would replace the state's top-level key "
                f"{key!r}; read the tensors with ucp.iter_tensors or ucp.read_tensor, or load with a spec"
            )
        else:
            state[key] = tensors[key]
    return state


def tensor_refs(tree: Any) -> list[str]:
    """Every tensor key the tree refers to, in order (tied keys repeat)."""
    return list(tensor_places(tree).values())


def tensor_places(tree: Any) -> dict[str, str]:
    """``/``-joined position -> tensor key of every reference in the tree, in order.

    >>> tensor_places({"model": {"w": {"$tensor": "w"}}, "n": [{"$tensor": "n0"}]})
    {'model/w': 'w', 'n/0': 'n0'}
    """
    out: dict[str, str] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if len(path) > MAX_DEPTH:
            return  # unflatten_state refuses such a tree with its position
        if isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (str(i),))
        elif isinstance(node, dict):
            if len(node) == 1 and "$tensor" in node:
                if isinstance(node["$tensor"], str):
                    out["/".join(path)] = node["$tensor"]
            elif len(node) == 1 and "$dict" in node and isinstance(node["$dict"], list):
                for item in node["$dict"]:
                    if isinstance(item, list) and len(item) == 2:
                        walk(item[1], path + (str(item[0]),))
            elif len(node) == 1 and "$tuple" in node and isinstance(node["$tuple"], list):
                for i, v in enumerate(node["$tuple"]):
                    walk(v, path + (str(i),))
            elif len(node) == 1 and "$object" in node:
                return
            else:
                for k, v in node.items():
                    walk(v, path + (k,))

    walk(tree, ())
    return out


def top_level_keys(tree: Any) -> set | None:
    """The keys of the dict a tree loads as, or None when it loads as something else (a list, a scalar)."""
    if tree is None:
        return set()
    if not isinstance(tree, dict):
        return None
    if len(tree) == 1 and "$dict" in tree and isinstance(tree["$dict"], list):
        return {item[0] for item in tree["$dict"] if isinstance(item, list) and len(item) == 2}
    if len(tree) == 1 and next(iter(tree)).startswith("$"):
        return None  # a tensor, tuple, float or object
    return set(tree)


def set_path(root: dict, key: str, value: Any) -> None:
    """Put ``value`` at ``key`` (``/``-joined) in a nested dict, creating dicts as needed.

    Never replaces what is there: NameConflictError when ``key`` or one of its prefixes
    is already taken by something else.

    >>> state = {"a": {}}
    >>> set_path(state, "a/b", 1); state
    {'a': {'b': 1}}
    >>> set_path(state, "a/b/c", 2)
    Traceback (most recent call last):
    ...
    ucp.errors.NameConflictError: cannot place 'a/b/c' in the loaded state: 'a/b' is already a int; load with into= or read the tensors with ucp.read_tensor
    """
    node = root
    parts = key.split("/")
    for i, part in enumerate(parts[:-1]):
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise _taken(key, "/".join(parts[: i + 1]), nxt)
        node = nxt
    if parts[-1] in node:
        raise _taken(key, key, node[parts[-1]])
    node[parts[-1]] = value


def _taken(key: str, where: str, there: Any) -> NameConflictError:
    kind = "tensor" if isinstance(there, torch.Tensor) else type(there).__name__
    return NameConflictError(
        f"cannot place {key!r} in the loaded state: {where!r} is already a {kind}; load with into= or read the "
        "tensors with ucp.read_tensor"
    )
