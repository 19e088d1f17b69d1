"""Pick a part of a checkpoint's logical tensors: the model's weights, or everything under one root.

A training checkpoint holds the model and much more (optimizer moments, an EMA copy, RNG
tensors). Exporting for another tool usually wants one part under the names that tool expects,
so ``only`` chooses it by the shared naming convention (docs/CONVERT.md, "Logical names"):

* ``"model"``: the model's tensors. Their logical names are the model's own (``lm_head.weight``:
  readers already strip the ``model/`` root and wrapper prefixes), and nothing else is named
  without a ``/`` (optimizer state is ``<param>/<state>``, other tensors ``<root>/<path>``).
* any other word ``P``: the tensors named ``P/<rest>``, renamed ``<rest>`` (``ema`` turns
  ``ema/fc.weight`` into ``fc.weight``).

Asking for a part the checkpoint does not have is an error that lists the parts it has; it never
yields an empty selection.

>>> import torch
>>> from ucp.formats.base import TensorInfo
>>> infos = [TensorInfo(n, "float32", (1,), lambda r: torch.zeros(1))
...          for n in ("fc.weight", "fc.weight/exp_avg", "ema/fc.weight")]
>>> kept, left_out = select_tensors(infos, "model")
>>> [t.name for t in kept], left_out
(['fc.weight'], ('fc.weight/exp_avg', 'ema/fc.weight'))
>>> [t.name for t in select_tensors(infos, "ema")[0]]
['fc.weight']
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable

from ucp.errors import UcpError
from ucp.formats.base import TensorInfo

__all__ = ["select_tensors", "SelectionError", "MODEL_PART"]

MODEL_PART = "model"


class SelectionError(UcpError, ValueError):
    """``only`` names a part the checkpoint does not have."""


def select_tensors(
    infos: Iterable[TensorInfo], only: str | None, *, where: str = "the checkpoint"
) -> tuple[list[TensorInfo], tuple[str, ...]]:
    """``(kept tensors, renamed; names left out)`` for ``only`` (None keeps everything; see the module doc)."""
    infos = list(infos)
    if only is None:
        return infos, ()
    part = only.strip().rstrip("/")
    if not part or "/" in part:
        raise SelectionError(f"only={only!r}: name one part, {MODEL_PART!r} or a root such as 'ema'")
    kept: list[TensorInfo] = []
    left_out: list[str] = []
    for info in infos:
        if part == MODEL_PART and "/" not in info.name:
            kept.append(info)
        elif part != MODEL_PART and info.name.startswith(part + "/"):
            kept.append(dataclasses.replace(info, name=info.name[len(part) + 1 :]))
        else:
            left_out.append(info.name)
    if not kept:
        raise SelectionError(f"{where} has no tensors in part {part!r}; its parts: {parts_summary(infos)}")
    return kept, tuple(left_out)


def parts_summary(infos: Iterable[TensorInfo], limit: int = 8) -> str:
    """``model (21 tensors), ema (21 tensors), ...``: what ``only`` can name, largest first."""
    counts = Counter(MODEL_PART if "/" not in i.name else i.name.split("/", 1)[0] for i in infos)
    if not counts:
        return "none (no tensors)"
    ranked = counts.most_common()
    text = ", ".join(f"{name} ({n} tensor{'s' if n != 1 else ''})" for name, n in ranked[:limit])
    return text + (f", and {len(ranked) - limit} more" if len(ranked) > limit else "")
