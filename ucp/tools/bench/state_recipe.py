"""What the core benchmarks save, and how they make the next read cold (shared by the benches that
run in-process and those that start fresh processes, :mod:`ucp.tools.bench.cold_start`).

    >>> state = build_state(StateRecipe(size_gib=0.0001, large=2, small=4))
    >>> sorted(state)[:2], state_nbytes(state) > 0
    (['model/layers.0.weight', 'model/layers.1.weight'], True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

GIB = 1 << 30


@dataclass(frozen=True)
class StateRecipe:
    """Shape of the benchmark state: ``large`` matrices carry ~90% of the bytes, ``small`` vectors the rest.

    ``kind="adam"`` is a mixed-precision training state instead: the parameters of ``layers``
    transformer layers (hidden size from ``size_gib``) in bfloat16, with their float32 master
    copies and both Adam moments (14 bytes per parameter, 4 tensors per parameter).
    """

    size_gib: float = 1.0
    large: int = 8
    small: int = 512
    seed: int = 0
    kind: str = "matrices"
    layers: int = 11


def build_state(recipe: StateRecipe) -> dict[str, torch.Tensor]:
    """A flat state dict of about ``recipe.size_gib`` GiB, filled in place (no temporaries).

    Even-numbered tensors are float32, odd ones bfloat16, so both dtypes carry bytes.
    """
    total = int(recipe.size_gib * GIB)
    generator = torch.Generator().manual_seed(recipe.seed)
    if recipe.kind == "adam":
        return _adam_state(total, recipe.layers, generator)
    if recipe.kind != "matrices":
        raise ValueError(f"unknown state kind {recipe.kind!r}: 'matrices' or 'adam'")
    state: dict[str, torch.Tensor] = {}
    large_bytes = total * 9 // 10 // recipe.large
    for i in range(recipe.large):
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        cols = 4096
        rows = max(1, large_bytes // (cols * torch.empty((), dtype=dtype).element_size()))
        state[f"model/layers.{i}.weight"] = torch.empty(rows, cols, dtype=dtype).normal_(generator=generator)
    small_bytes = max(4, (total - large_bytes * recipe.large) // recipe.small)
    for i in range(recipe.small):
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        numel = max(1, small_bytes // torch.empty((), dtype=dtype).element_size())
        state[f"optim/vec.{i}"] = torch.empty(numel, dtype=dtype).normal_(generator=generator)
    return state


# A transformer layer's parameters, in units of the hidden size h: (rows, cols) or (rows,).
_LAYER = {
    "qkv.weight": (3, 1),
    "proj.weight": (1, 1),
    "fc1.weight": (4, 1),
    "fc2.weight": (1, 4),
    "ln1.weight": (1,),
    "ln2.weight": (1,),
    "fc1.bias": (4,),
    "proj.bias": (1,),
}


def _adam_state(total: int, layers: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """bf16 parameters + fp32 masters + exp_avg + exp_avg_sq of ``layers`` layers and an embedding."""
    # 14 bytes per parameter; a layer holds 12 h^2 + 7 h parameters, the embedding 4 h^2 (a 4h vocabulary).
    hidden = max(64, round((total / 14 / (12 * layers + 4)) ** 0.5 / 64) * 64)
    shapes = {"embed.weight": (4 * hidden, hidden), "final_norm.weight": (hidden,)}
    for i in range(layers):
        shapes.update({f"layers.{i}.{n}": tuple(d * hidden for d in s) for n, s in _LAYER.items()})
    state: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        state[f"model/{name}"] = torch.empty(shape, dtype=torch.bfloat16).normal_(generator=generator)
        for part in ("fp32", "exp_avg", "exp_avg_sq"):
            state[f"optim/{part}/{name}"] = torch.empty(shape, dtype=torch.float32).normal_(generator=generator)
    return state


def state_nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def drop_from_page_cache(path: Path, *, everything: bool = False) -> str:
    """Ask the kernel to forget cached pages of every file under ``path``; how it was done.

    ``posix_fadvise(DONTNEED)`` per file always (where the OS has it); with ``everything``
    the global ``/proc/sys/vm/drop_caches`` as well, when this process may write it (it
    empties the whole machine's cache: unkind on a shared machine, hence opt-in).
    """
    how = []
    if hasattr(os, "posix_fadvise"):
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for file in files:
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fdatasync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        how.append("posix_fadvise(DONTNEED) per file")
    try:
        if not everything:
            raise PermissionError
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("1\n")
        how.append("/proc/sys/vm/drop_caches")
    except OSError:
        pass  # not root, or a read-only /proc/sys (a container)
    return " + ".join(how) or "nothing (no posix_fadvise, no drop_caches)"
