"""The state a training loop checkpoints, as a plain nested dict, and back.

Shared by the loop, Lightning and Transformers integrations: model and
optimizer state dicts, an optional LR scheduler, the step, and the CPU RNG
state (so resumed runs draw the same random numbers).

Example::

    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> state = capture(model=model, optimizer=optimizer, step=7)
    >>> restore(state, model=model, optimizer=optimizer)
    7
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["capture", "restore"]


def capture(*, model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None, step: int,
            extra: dict | None = None, rng: bool = True) -> dict:
    """The checkpointable state. Tensors are shared with the model (no copy)."""
    state: dict[str, Any] = {"step": int(step), "model": model.state_dict()}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    if rng:
        state["rng"] = {"torch": torch.get_rng_state()}
    if extra:
        state["extra"] = dict(extra)
    return state


def restore(state: dict, *, model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None,
            rng: bool = True) -> int:
    """Load ``state`` (from :func:`capture`, saved and loaded by ucp) into the live objects; return its step."""
    model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])
    if rng and "rng" in state:
        torch.set_rng_state(state["rng"]["torch"].to(torch.uint8))
    return int(state["step"])
