"""Stateful objects in a state tree: modules, optimizers, schedulers, data loaders.

Anything with ``state_dict()`` and ``load_state_dict()`` may sit in the state
given to :func:`ucp.save` and :func:`ucp.load` (``into=``). A save captures its
``state_dict()`` at that moment, so a loop that saves the same tree again and
again never writes stale state. A load prepares each object first (a fresh
``torch.optim`` optimizer gets the per-parameter state the checkpoint holds, as
``torch.distributed.checkpoint.state_dict.set_state_dict`` does), fills the
tensors of its ``state_dict()`` in place, puts the saved non-tensor values
(``step``, ``lr``) into that dictionary and hands it to ``load_state_dict``::

    state = {"model": model, "optim": opt, "step": 0}
    ucp.save(state, "ckpt/7")
    ucp.load("ckpt/7", into=state)        # model, opt (moments, step) and state["step"] restored

A state dict that came back from an earlier ``state_dict()`` call is a snapshot:
pass the object itself to keep it current.
"""

from __future__ import annotations

from typing import Any

import torch

from ucp.state_schema import MAX_DEPTH


def is_stateful(value: Any) -> bool:
    """Whether ``value`` saves through ``state_dict()`` and loads through ``load_state_dict()``.

    >>> is_stateful(torch.nn.Linear(1, 1)), is_stateful({"w": 1})
    (True, False)
    """
    if isinstance(value, (dict, list, tuple, torch.Tensor, type)):
        return False
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


class LoadTargets:
    """The state to load into, with each stateful object replaced by its (prepared) ``state_dict()``.

    ``tree`` is what the loader fills (its tensors are the objects' own); :meth:`finish`
    puts the loaded non-tensor values into ``into`` and each state dict, then calls
    ``load_state_dict``. ``saved`` is the checkpoint's state tree with tensors as placeholders
    (it says which optimizer state exists).
    """

    def __init__(self, into: Any, saved: Any) -> None:
        self.into = into
        self._dicts: dict[int, tuple[Any, Any]] = {}  # id(object) -> (object, its state dict)
        self.tree = self._walk(into, saved)

    def _walk(self, node: Any, saved: Any) -> Any:
        if is_stateful(node):
            if id(node) not in self._dicts:
                if isinstance(node, torch.optim.Optimizer):
                    create_optimizer_state(node, _saved_state_ids(saved))
                self._dicts[id(node)] = (node, node.state_dict())
            return self._dicts[id(node)][1]
        if isinstance(node, dict):
            return {k: self._walk(v, _child(saved, k)) for k, v in node.items()}
        if isinstance(node, (list, tuple)) and type(node) in (list, tuple):
            return type(node)(self._walk(v, _child(saved, i)) for i, v in enumerate(node))
        return node

    def finish(self, loaded: Any) -> None:
        """Merge the non-tensor values of ``loaded`` in place, then ``load_state_dict`` every object."""
        self._merge(self.into, loaded)
        for obj, state in self._dicts.values():
            obj.load_state_dict(state)

    def _merge(self, into: Any, loaded: Any) -> None:
        if is_stateful(into):
            into = self._dicts[id(into)][1]
        if isinstance(into, dict) and isinstance(loaded, dict):
            for key, value in loaded.items():
                self._merge_keyed(into, key, value)
        elif isinstance(into, list) and isinstance(loaded, list):
            # The saved list may be longer or shorter (a history that grew): it is what was saved.
            for i, value in enumerate(loaded):
                if i >= len(into):
                    into.append(value)
                else:
                    self._merge_at(into, i, into[i], value)
            if not any(isinstance(v, torch.Tensor) or is_stateful(v) for v in into[len(loaded) :]):
                del into[len(loaded) :]

    def _merge_keyed(self, into: dict, key: Any, value: Any) -> None:
        """Merge ``value`` at ``key``, or below the ``/``-joined keys of ``into`` that stand for its entries.

        A dict keyed by paths (``{"model/w": t}``, as a flat state dict is) names the same tensors
        as the nested one the checkpoint holds: the loaded subtree is merged entry by entry under
        those keys, so ``into`` never gets a second, nested copy of what it already holds.
        """
        if key not in into and isinstance(value, dict) and isinstance(key, str):
            prefix = key + "/"
            if any(isinstance(k, str) and k.startswith(prefix) for k in into):
                for sub, subvalue in value.items():
                    self._merge_keyed(into, f"{prefix}{sub}", subvalue)
                return
        self._merge_at(into, key, into.get(key), value)

    def _merge_at(self, into: Any, key: Any, current: Any, value: Any) -> None:
        if is_stateful(current) or (isinstance(current, (dict, list)) and isinstance(value, type(current))):
            self._merge(current, value)
        elif not isinstance(current, torch.Tensor):
            into[key] = value


def create_optimizer_state(opt: torch.optim.Optimizer, wanted: set[int]) -> None:
    """Create the per-parameter state of the parameters (by index) in ``wanted`` that have none yet.

    A fresh optimizer creates its state on its first ``step()``; loading needs it before
    (its tensors are filled in place, DTensor shards included). As in
    ``torch.distributed.checkpoint.state_dict._init_optim_state``: one ``step()`` with zero
    gradients at learning rate 0, for those parameters only; the others' gradients and the
    learning rates are put back. The values created are overwritten by the load.
    """
    params = [p for group in opt.param_groups for p in group["params"]]
    lacking = {i for i in wanted if 0 <= i < len(params) and not opt.state.get(params[i])}
    if not lacking:
        return
    grads = [p.grad for p in params]
    lrs = [group.get("lr") for group in opt.param_groups]
    try:
        for i, p in enumerate(params):
            p.grad = torch.zeros_like(p) if i in lacking else None
        for group, lr in zip(opt.param_groups, lrs, strict=True):
            if lr is not None:
                group["lr"] = torch.zeros_like(lr) if isinstance(lr, torch.Tensor) else 0.0
        opt.step()
    finally:
        for group, lr in zip(opt.param_groups, lrs, strict=True):
            if lr is not None:
                group["lr"] = lr
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad


def _child(saved: Any, key: Any) -> Any:
    if isinstance(saved, dict):
        return saved.get(key, saved.get(str(key)) if not isinstance(key, str) else None)
    if isinstance(saved, (list, tuple)) and isinstance(key, int) and key < len(saved):
        return saved[key]
    return None


def _saved_state_ids(saved: Any) -> set[int]:
    """Parameter indices with saved optimizer state (an optimizer's ``state`` dict in the checkpoint)."""
    state = saved.get("state") if isinstance(saved, dict) else None
    if not isinstance(state, dict):
        return set()
    return {k for k, v in state.items() if isinstance(k, int) and not isinstance(k, bool) and v}


def skeleton(tree: Any, depth: int = 0) -> Any:
    """A saved JSON state tree as plain containers (``$dict`` keys restored), leaves as they are.

    >>> skeleton({"state": {"$dict": [[0, {"step": {"$tensor": "s"}}]]}})
    {'state': {0: {'step': {'$tensor': 's'}}}}
    """
    if depth > MAX_DEPTH:
        return None  # loading refuses such a tree with its position
    if isinstance(tree, list):
        return [skeleton(v, depth + 1) for v in tree]
    if not isinstance(tree, dict):
        return tree
    body = tree.get("$dict") if len(tree) == 1 else None
    if isinstance(body, list):
        return {
            item[0]: skeleton(item[1], depth + 1)
            for item in body
            if isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int, float, bool, type(None)))
        }
    if len(tree) == 1 and isinstance(tree.get("$tuple"), list):
        return [skeleton(v, depth + 1) for v in tree["$tuple"]]
    return {k: skeleton(v, depth + 1) for k, v in tree.items()}
