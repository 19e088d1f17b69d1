"""Move tensors by fragment maps in memory: scatter logical tensors to ranks, gather them back.

The reference executor for tests and for checking a program without an engine
or processes: exactly what a save followed by a load does, minus the disk::

    >>> import torch
    >>> fmaps, locals_ = place("ucl 1\\ntensor w -> w\\n  split dim 0 over tp\\n", "tp=2", {"w": torch.arange(4.)})
    >>> locals_[1]["w"]
    tensor([2., 3.])
    >>> gather(fmaps, locals_)["w"]
    tensor([0., 1., 2., 3.])
"""

from __future__ import annotations

from typing import Sequence

import torch

from ucp.ucl.compiler import BoundFragmentMap
from ucp.errors import CoverageError, ReplicaMismatchError
from ucp.geometry import Box

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
}


def _views(local: torch.Tensor, logical: torch.Tensor, piece):
    if isinstance(piece.local, Box):
        return local[piece.local.slices()], _target_view(logical, piece)
    run = local.reshape(-1)[piece.local.start : piece.local.stop]
    if isinstance(piece.target, Box):  # a flat run holding a box in row-major order
        run = run.view(piece.target.sizes)
    return run, _target_view(logical, piece)


def _target_view(logical: torch.Tensor, piece) -> torch.Tensor:
    if isinstance(piece.target, Box):
        return logical[piece.target.slices()]
    return logical.reshape(-1)[piece.target.start : piece.target.stop]


def scatter(logical: dict[str, torch.Tensor], fmap: BoundFragmentMap, *, fill: float = 0.0) -> dict[str, torch.Tensor]:
    """The local tensors of ``fmap``'s rank, filled from ``logical``; unnamed parts (padding) get ``fill``."""
    out = {}
    for key, lt in fmap.local.items():
        tensor = torch.full(lt.shape, fill, dtype=_DTYPES.get(lt.dtype, torch.float32))
        for piece in fmap.tensors[key].pieces:
            dst, src = _views(tensor, logical[piece.logical], piece)
            dst.copy_(src)
        out[key] = tensor
    return out


def gather(fmaps: Sequence[BoundFragmentMap], locals_: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Logical tensors rebuilt from every rank's local tensors.

    Raises CoverageError when an element is missing or written by two
    non-replica pieces, ReplicaMismatchError when replicas disagree.
    """
    shapes = {}
    for fmap in fmaps:
        for name, lt in fmap.logical.items():
            shapes[name] = lt
    out = {n: torch.zeros(lt.shape, dtype=_DTYPES.get(lt.dtype, torch.float32)) for n, lt in shapes.items()}
    count = {n: torch.zeros(lt.shape, dtype=torch.int32) for n, lt in shapes.items()}
    replicas: list[tuple] = []
    for fmap, tensors in zip(fmaps, locals_, strict=True):
        for key, spec in fmap.tensors.items():
            for piece in spec.pieces:
                src, dst = _views(tensors[key], out[piece.logical], piece)
                if spec.replica == 0:
                    dst.copy_(src)
                    _, c = _views(tensors[key], count[piece.logical], piece)
                    c += 1
                else:
                    replicas.append((fmap.rank, key, piece, src))
    for name, c in count.items():
        if int(c.min()) < 1 or int(c.max()) > 1:
            raise CoverageError(
                f"logical tensor {name!r}: {int((c == 0).sum())} element(s) uncovered, "
                f"{int((c > 1).sum())} covered more than once"
            )
    for rank, key, piece, src in replicas:
        dst = _target_view(out[piece.logical], piece)
        if not torch.equal(src, dst):
            raise ReplicaMismatchError(f"rank {rank} {key!r}: replica of {piece.logical!r} {piece.target} differs")
    return out


def place(program, layout, tensors: dict[str, torch.Tensor], *, params: dict | None = None):
    """Every rank's fragment map and local tensors for ``layout``, filled from logical ``tensors``.

    Compiles both directions and insists they agree: the load-direction map
    (from the logical shapes) must equal the save-direction map computed from
    the local shapes it produced. Returns ``(fmaps, locals)``, one per rank.
    """
    from ucp.ucl.bind import load_program, spec_for_load, spec_for_save
    from ucp.ucl.errors import UclError
    from ucp.layout import Layout
    from ucp.spec import LogicalTensor

    bound = load_program(program, **(params or {}))
    lay = layout if isinstance(layout, Layout) else Layout.parse(str(layout))
    meta = {n: LogicalTensor(n, tuple(t.shape), str(t.dtype).replace("torch.", "")) for n, t in tensors.items()}
    fmaps, locals_ = [], []
    for rank in range(lay.world_size):
        loaded = spec_for_load(bound, lay, rank, meta)
        local = scatter(tensors, loaded)
        saved = spec_for_save(
            bound, lay, rank, {k: (tuple(v.shape), str(v.dtype)) for k, v in local.items()}, shapes=meta
        )
        diff = [k for k in loaded.tensors if not _agree(saved.tensors.get(k), loaded.tensors[k])]
        if diff or set(saved.tensors) != set(loaded.tensors):
            raise UclError(f"rank {rank} of {lay}: save and load directions disagree on {diff[:3]}")
        fmaps.append(saved)
        locals_.append(local)
    return fmaps, locals_


def _agree(saved, loaded) -> bool:
    """A save map may leave out pieces another rank saves (replicated members of a flat buffer)."""
    if saved is None:
        return False
    same = (saved.key, saved.replica, saved.replicas, saved.policy) == (
        loaded.key,
        loaded.replica,
        loaded.replicas,
        loaded.policy,
    )
    return same and set(saved.pieces) <= set(loaded.pieces)
