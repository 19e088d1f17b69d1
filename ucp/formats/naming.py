"""Logical names from nested training state, and nested state back from logical names.

A torch.save file, a DCP checkpoint or a plain ``ucp.save`` holds a *tree*:
``{"model": {...}, "optimizer": {"state": ..., "param_groups": [...]}, "step": 7}``.
:func:`split_tree` names its tensors by the shared convention
(:mod:`ucp.formats.base`) and gathers the rest as :class:`TrainingState`;
:func:`build_tree` is its inverse, used by writers that store a tree.

* The model: the value under a model root (``model``, ``module``, ``state_dict``,
  ``model_state_dict``), or the top-level tensors when there is no such root.
  Names lose wrapper parts (leading ``module.``; ``_orig_mod.``,
  ``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.`` anywhere).
* The optimizer: a ``{"state", "param_groups"}`` dict under an optimizer root
  (``optimizer``, ``optim``, ``optimizer_state_dict``, ``optimizer_states`` ...),
  also in the flattened form of ``StateDictOptions(flatten_optimizer_state_dict=True)``.
  States become ``<param>/<state>``; integer parameter ids are named through the
  groups' ``param_names`` when present, and otherwise stay their numbers (a torch
  optimizer does not record names, and guessing them from the model is not safe).
* Any other tensor is named by its path joined with ``/`` (``ema/fc.weight``).
* Non-tensor values become plain JSON values: ``step`` (from ``step``,
  ``global_step`` or ``iteration``), the param groups with ``params`` as logical
  names, ``rng`` (top-level keys naming an RNG) and ``extra`` (every other
  top-level key). ``extra["$roots"]`` remembers the root keys found (and a
  wrapper around them, like the DCP recipe's ``{"app": {"model", "optim"}}``),
  so that a writer can give the tree back the same shape.

>>> import torch
>>> w = torch.ones(2)
>>> names, state = split_tree({"model": {"module.fc.weight": w},
...     "optimizer": {"state": {0: {"exp_avg": w}}, "param_groups": [{"lr": 0.1, "params": [0],
...     "param_names": ["module.fc.weight"]}]}, "step": 3})
>>> sorted(names), state.step, state.param_groups
(['fc.weight', 'fc.weight/exp_avg'], 3, ({'lr': 0.1, 'params': ['fc.weight']},))
"""

from __future__ import annotations

import base64
import math
from typing import Any, Callable

from ucp.errors import FormatError
from ucp.formats.base import TrainingState

__all__ = [
    "strip_wrappers",
    "split_tree",
    "build_tree",
    "plain",
    "unplain",
    "MODEL_ROOTS",
    "OPTIMIZER_ROOTS",
    "STEP_KEYS",
]

MODEL_ROOTS = ("model", "module", "state_dict", "model_state_dict", "model_state")
OPTIMIZER_ROOTS = ("optim", "optimizer", "optimizer_state_dict", "optimizer_states", "optim_state", "optimizers")
STEP_KEYS = ("step", "global_step", "iteration")
_WRAPPER_PARTS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})
_ROOTS = "$roots"
_OPT_VALUES = "$optimizer_values"


def strip_wrappers(name: str) -> str:
    """A parameter's name without the parts wrappers add (DDP, torch.compile, FSDP1, checkpointing).

    >>> strip_wrappers("module._orig_mod.layers.0._fsdp_wrapped_module.weight")
    'layers.0.weight'
    """
    parts = name.split(".")
    while len(parts) > 1 and parts[0] == "module":
        parts.pop(0)
    kept = [p for p in parts if p not in _WRAPPER_PARTS]
    return ".".join(kept) if kept else name


def _wrapper(tree: dict) -> Any:
    """The one top-level key whose dict holds the model/optimizer roots, when the top level has none."""

    def has_roots(node: Any) -> bool:
        return isinstance(node, dict) and any(
            isinstance(k, str) and (k in MODEL_ROOTS or k in OPTIMIZER_ROOTS) for k in node
        )

    if has_roots(tree):
        return None
    found = [k for k, v in tree.items() if has_roots(v)]
    if len(found) != 1 or set(tree[found[0]]) & (set(tree) - {found[0]}):
        return None
    return found[0]


def _is_optimizer(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    if "state" in value and "param_groups" in value:
        return True
    return bool(value) and all(isinstance(k, str) and k.startswith(("state.", "param_groups.")) for k in value)


def split_tree(tree: Any, is_tensor: Callable[[Any], bool] | None = None) -> tuple[dict[str, Any], TrainingState]:
    """``(logical name -> tensor leaf, TrainingState)`` of a nested state (see the module doc).

    ``is_tensor`` says which leaves are tensors (default: ``torch.Tensor``); leaves
    may be anything, e.g. lazy stand-ins that read bytes on demand. Raises
    :class:`~ucp.errors.FormatError` when two tensors would get the same name.
    """
    if is_tensor is None:
        import torch

        is_tensor = lambda v: isinstance(v, torch.Tensor)  # noqa: E731
    namer = _Namer(is_tensor)
    if is_tensor(tree):
        namer.add("tensor", tree, "the file")
        return namer.names, TrainingState()
    if isinstance(tree, (list, tuple)):
        tree = {str(i): v for i, v in enumerate(tree)}
    if not isinstance(tree, dict):
        raise FormatError(f"the checkpoint holds a {type(tree).__name__}, not tensors or a dict of them")
    roots: dict[str, Any] = {}
    wrapper = _wrapper(tree)
    if wrapper is not None:  # {"app": {"model": ..., "optim": ...}, ...}: the DCP recipe's Stateful wrapper
        roots["wrapper"], roots["outer"] = wrapper, [str(k) for k in tree if k != wrapper]
        tree = {**tree[wrapper], **{k: v for k, v in tree.items() if k != wrapper}}
    model_root = next((k for k in MODEL_ROOTS if isinstance(tree.get(k), dict) and not _is_optimizer(tree[k])), None)
    opt_root = next((k for k in tree if isinstance(k, str) and k in OPTIMIZER_ROOTS), None)
    optimizers: list[dict] = []
    if opt_root is not None:
        value = tree[opt_root]
        value = value if isinstance(value, (list, tuple)) else [value]
        if all(_is_optimizer(v) for v in value):
            optimizers = [_nested_optimizer(v) for v in value]
            roots["optimizer"] = opt_root
        else:
            opt_root = None
    step = None
    rng: dict = {}
    extra: dict = {}
    if model_root is not None:
        roots["model"] = model_root
        namer.model(tree[model_root], extra, model_root)
    for key, value in tree.items():
        skey = str(key)
        if key in (model_root, opt_root):
            continue
        if model_root is None and is_tensor(value):
            namer.add(strip_wrappers(skey), value, skey)
        elif is_tensor(value):  # a tensor beside the model root, not in it
            namer.add(skey, value, skey)
            roots.setdefault("top", []).append(skey)
        elif namer.contains_tensor(value):
            namer.nested(value, (skey,), extra)
        elif "rng" in skey.lower() or "random" in skey.lower():
            rng[skey] = plain(value)
        elif skey == "step" and isinstance(value, int) and not isinstance(value, bool):
            step = value  # build_tree writes it back under this key
        else:
            extra[skey] = plain(value)
    if model_root is None:
        roots["model"] = ""
    groups: list[dict] = []
    for optimizer in optimizers:
        groups.extend(namer.optimizer(optimizer, extra))
    if step is None:
        step = next((v for k in STEP_KEYS if isinstance(v := extra.get(k), int) and not isinstance(v, bool)), None)
    extra[_ROOTS] = roots
    return namer.names, TrainingState(step=step, param_groups=tuple(groups), rng=rng, extra=extra)


class _Namer:
    """Collects named tensor leaves, refusing two leaves with one name."""

    def __init__(self, is_tensor: Callable[[Any], bool]) -> None:
        self.is_tensor = is_tensor
        self.names: dict[str, Any] = {}
        self._where: dict[str, str] = {}

    def add(self, name: str, leaf: Any, where: str) -> None:
        if name in self.names:
            raise FormatError(
                f"two tensors get the logical name {name!r}: {self._where[name]!r} and {where!r} "
                "(a wrapper prefix stripped from one of them?); rename one before converting"
            )
        self.names[name] = leaf
        self._where[name] = where

    def contains_tensor(self, value: Any) -> bool:
        if self.is_tensor(value):
            return True
        if isinstance(value, dict):
            return any(self.contains_tensor(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return any(self.contains_tensor(v) for v in value)
        return False

    def model(self, value: dict, extra: dict, root: str) -> None:
        def walk(node: Any, path: tuple[str, ...]) -> None:
            if self.is_tensor(node):
                self.add(strip_wrappers(".".join(path)), node, "/".join((root,) + path))
            elif isinstance(node, dict):
                for k, v in node.items():
                    walk(v, path + (str(k),))
            else:  # e.g. a module's _extra_state
                extra.setdefault(f"{root}/", {})[".".join(path)] = plain(node)

        walk(value, ())

    def nested(self, value: Any, path: tuple[str, ...], extra: dict) -> None:
        if self.is_tensor(value):
            self.add("/".join(path), value, "/".join(path))
        elif isinstance(value, dict):
            for k, v in value.items():
                self.nested(v, path + (str(k),), extra)
        elif isinstance(value, (list, tuple)) and self.contains_tensor(value):
            for i, v in enumerate(value):
                self.nested(v, path + (str(i),), extra)
        else:
            extra["/".join(path)] = plain(value)

    def optimizer(self, optimizer: dict, extra: dict) -> list[dict]:
        """Name the states of one ``{"state", "param_groups"}`` dict; returns its groups."""
        ids: dict[Any, str] = {}
        groups = []
        for group in optimizer.get("param_groups") or []:
            params = list(group.get("params", []))
            names = group.get("param_names")
            if names is not None and len(names) == len(params):
                ids.update({p: strip_wrappers(str(n)) for p, n in zip(params, names, strict=True)})
            for p in params:
                ids.setdefault(p, strip_wrappers(p) if isinstance(p, str) else str(p))
            hyper = {str(k): plain(v) for k, v in group.items() if k not in ("params", "param_names")}
            groups.append({**hyper, "params": [ids[p] for p in params]})
        for pid, states in (optimizer.get("state") or {}).items():
            param = ids.get(pid, strip_wrappers(pid) if isinstance(pid, str) else str(pid))
            for sname, value in (states or {}).items():
                if self.is_tensor(value):
                    self.add(f"{param}/{sname}", value, f"optimizer state {pid!r}/{sname}")
                else:
                    extra.setdefault(_OPT_VALUES, {}).setdefault(param, {})[str(sname)] = plain(value)
        return groups


def _nested_optimizer(value: dict) -> dict:
    """The ``{"state": {param: {...}}, "param_groups": [...]}`` form of an optimizer state dict.

    Also undoes ``flatten_optimizer_state_dict=True`` (``state.<fqn>.<state>``,
    ``param_groups.<fqn>.<hyper-parameter>``): parameters with equal
    hyper-parameters share a group, in order of first appearance.
    """
    if "state" in value and "param_groups" in value:
        return value
    state: dict[str, dict] = {}
    hyper: dict[str, dict] = {}
    for key, v in value.items():
        kind, _, rest = key.partition(".")
        param, _, leaf = rest.rpartition(".")
        (state if kind == "state" else hyper).setdefault(param, {})[leaf] = v
    groups: list[dict] = []
    for param, hp in hyper.items():
        group = next((g for g in groups if {k: g[k] for k in g if k != "params"} == hp), None)
        if group is None:
            group = {**hp, "params": []}
            groups.append(group)
        group["params"].append(param)
    return {"state": state, "param_groups": groups}


def plain(value: Any) -> Any:
    """A JSON value for any non-tensor leaf; what JSON lacks is tagged (``$tuple``, ``$float``, ``$bytes``,
    ``$inert`` for a foreign object's record), so :func:`unplain` gives tuples, NaNs and bytes back.

    >>> plain({"betas": (0.9, 0.99), "nan": float("nan")})
    {'betas': {'$tuple': [0.9, 0.99]}, 'nan': {'$float': 'nan'}}
    """
    from ucp.unpickle import InertObject

    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {"$tuple": [plain(v) for v in value]}
    if isinstance(value, (list, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, InertObject):
        # getattr: a stand-in made by pickle's NEWOBJ skips __init__, so it may lack args and state
        return {
            "$inert": value.origin,
            "args": plain(list(getattr(value, "args", ()))),
            "state": plain(getattr(value, "state", None)),
        }
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch.Size
        return plain(value.tolist())
    if hasattr(value, "__dict__") and type(value).__name__ == "Namespace":
        return plain(vars(value))
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def unplain(value: Any) -> Any:
    """Undo :func:`plain`'s tags that have a Python value (tuples, non-finite floats, bytes); the rest stays JSON.

    >>> unplain({"x": {"$float": "inf"}, "b": {"$bytes": "AAE="}})
    {'x': inf, 'b': b'\\x00\\x01'}
    """
    if isinstance(value, list):
        return [unplain(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and "$float" in value:
            return float(value["$float"])
        if len(value) == 1 and "$bytes" in value:
            return base64.b64decode(value["$bytes"])
        if len(value) == 1 and "$tuple" in value:
            return tuple(unplain(v) for v in value["$tuple"])
        return {k: unplain(v) for k, v in value.items()}
    return value


def build_tree(
    names: list[str],
    state: TrainingState,
    leaf: Callable[[str], Any],
    *,
    model_root: str = "model",
    optimizer_root: str = "optim",
) -> dict:
    """The nested state ``split_tree`` reads back as ``names`` and ``state``.

    ``leaf(name)`` gives the value stored for each tensor (a tensor, a reference...).
    Root keys recorded by ``split_tree`` win over ``model_root``/``optimizer_root``;
    a model root of ``""`` puts model tensors at the top level.

    >>> build_tree(["w", "w/exp_avg"], TrainingState(step=2, param_groups=({"lr": 1.0, "params": ["w"]},)), str)
    {'model': {'w': 'w'}, 'optim': {'state': {'w': {'exp_avg': 'w/exp_avg'}}, 'param_groups': [{'lr': 1.0, 'params': ['w']}]}, 'step': 2}
    """
    roots = dict(state.extra.get(_ROOTS) or {})
    model_key = roots.get("model", model_root)
    opt_key = roots.get("optimizer", optimizer_root)
    params = {p for g in state.param_groups for p in g.get("params", [])}
    models = {n for n in names if "/" not in n}
    tree: dict = {}
    model: dict = tree if model_key == "" else {}
    opt_state: dict = {}
    top = set(roots.get("top", ()))
    for name in names:
        head, _, rest = name.partition("/")
        if name in top:
            tree[name] = leaf(name)
        elif not rest:
            model[name] = leaf(name)
        elif (head in params or head in models) and "/" not in rest:
            opt_state.setdefault(head, {})[rest] = leaf(name)
        else:
            node = tree
            parts = name.split("/")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = leaf(name)
    for param, values in (state.extra.get(_OPT_VALUES) or {}).items():
        opt_state.setdefault(param, {}).update(values)
    if model_key != "" and (model or not (opt_state or state.param_groups)):
        tree[model_key] = model
    if opt_state or state.param_groups or "optimizer" in roots:
        tree[opt_key] = {"state": opt_state, "param_groups": [dict(g) for g in state.param_groups]}
    for key, value in state.extra.items():
        if key in (_ROOTS, _OPT_VALUES):
            continue
        if key.endswith("/") and isinstance(value, dict):  # non-tensor entries of the model root
            target = tree.get(key[:-1], tree) if key[:-1] == model_key else tree.setdefault(key[:-1], {})
            target.update(value)
        elif "/" in key:
            node = tree
            parts = key.split("/")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        else:
            tree[key] = value
    tree.update(state.rng)
    if state.step is not None and not any(tree.get(k) == state.step for k in STEP_KEYS):
        tree["step"] = state.step
    if roots.get("wrapper") is not None:
        outer = {k: tree.pop(k) for k in roots.get("outer", ()) if k in tree}
        tree = {roots["wrapper"]: tree, **outer}
    return tree
