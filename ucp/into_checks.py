"""Checking a state to load into against a checkpoint: keys, shapes, memory, DTensor targets.

:func:`ucp.load` with ``into=`` refuses a target that does not fit before any byte is read
(names of what is missing or unexpected, the shape wanted, how to fix it), and says which saved
tensors a non-strict load leaves out (:class:`~ucp.errors.PartialLoadWarning`)::

    >>> import torch
    >>> check_into("w", torch.empty(2, device="meta"))
    Traceback (most recent call last):
    ...
    ucp.errors.UnsupportedTensorError: cannot load 'w' into a tensor on the meta device (it has no memory); materialize it first (e.g. module.to_empty(device='cpu')) or load without into=
"""

from __future__ import annotations

import warnings

import torch

from ucp.dtensor import is_dtensor
from ucp.dtypes import dtype_name
from ucp.errors import KeyMismatchError, PartialLoadWarning, ShapeMismatchError, UnsupportedTensorError
from ucp.geometry import Box, FlatRange
from ucp.reader import CheckpointReader
from ucp.spec import FragmentMap, ShardPiece, TensorSpec


def check_into(key: str, tensor: torch.Tensor) -> None:
    """A tensor to load into must have memory the bytes can go to."""
    if tensor.device.type == "meta":
        raise UnsupportedTensorError(
            f"cannot load {key!r} into a tensor on the meta device (it has no memory); materialize it first "
            "(e.g. module.to_empty(device='cpu')) or load without into="
        )
    if tensor.is_nested or tensor.layout != torch.strided:
        kind = "nested" if tensor.is_nested else str(tensor.layout)
        raise UnsupportedTensorError(
            f"cannot load {key!r} into a sparse tensor ({kind}); load without into= and convert the result"
        )


def check_fits(reader, key, tspec, tensor, shape, dtype, *, exact: bool) -> None:
    check_into(key, tensor)
    got = (list(tensor.shape), dtype_name(tensor.dtype))
    fits = (
        tuple(tensor.shape) == tuple(shape)
        if exact
        else all(
            (
                isinstance(p.local, Box)
                and len(p.local.sizes) == tensor.dim()
                and Box.full(tuple(tensor.shape)).contains(p.local)
            )
            or (isinstance(p.local, FlatRange) and p.local.stop <= tensor.numel())
            for p in tspec.pieces
        )
    )
    if not fits or got[1] != dtype:
        raise ShapeMismatchError(
            f"cannot load {key!r}: the checkpoint has {dtype}{list(shape)} but the tensor to load into is "
            f"{got[1]}{got[0]}; pass a tensor of that shape and dtype, or load without into= and convert"
        )


def key_error(path: str, missing: list[str], unexpected: list[str]) -> KeyMismatchError:
    lines = [f"keys do not match checkpoint {path}:"]
    if missing:
        lines.append(
            f"  missing from the checkpoint ({len(missing)}): {', '.join(missing[:20])}"
            + (" ..." if len(missing) > 20 else "")
        )
    if unexpected:
        lines.append(
            f"  not expected by the target ({len(unexpected)}): {', '.join(unexpected[:20])}"
            + (" ..." if len(unexpected) > 20 else "")
        )
        lines.append(
            "  a fresh optimizer has no per-parameter state yet: put the optimizer itself in the state "
            "({'optim': opt}), not opt.state_dict()"
        )
    lines.append(
        "  strict=False loads the keys both have and adds the saved ones the target lacks "
        "(those under top-level keys it does not have are skipped with a warning)"
    )
    return KeyMismatchError("\n".join(lines))


def saved_extras(
    path: str, unexpected: list[str], places: dict[str, str], top: set | None, skipped_top: set | None
) -> dict[str, str]:
    """The saved tensors a non-strict load adds to ``into`` (under its top-level keys); warns about the rest.

    Each is keyed by its logical name, which the tree's references resolve to; the top-level
    keys of the rest go into ``skipped_top``.
    """
    where: dict[str, str] = {}
    for place, name in places.items():
        where.setdefault(name, place)
    extras = {n: n for n in unexpected if top is not None and where.get(n, n).split("/")[0] in top}
    skipped = [n for n in unexpected if n not in extras]
    if skipped_top is not None and top is not None:
        skipped_top.update(where.get(n, n).split("/")[0] for n in skipped)
    if skipped:
        shown = ", ".join(skipped[:10]) + (" ..." if len(skipped) > 10 else "")
        warnings.warn(
            f"strict=False: {len(skipped)} saved tensor(s) of {path} were not loaded, the target has no top-level key "
            f"for them: {shown}; add those keys to the state to load them, or load without into=",
            PartialLoadWarning,
            stacklevel=6,
        )
    return extras


def spec_for_into(reader: CheckpointReader, into: dict[str, torch.Tensor], strict: bool) -> FragmentMap:
    """A fragment map for an ``into`` state holding DTensors (plain tensors: whole logical tensors)."""
    from ucp.dtensor import dtensor_spec

    logical = reader.logical()
    missing = [k for k in into if k not in logical]
    unexpected = [n for n in logical if n not in into]
    if strict and (missing or unexpected):
        raise key_error(reader.path, missing, unexpected)
    specs, rank = {}, 0
    for key, tensor in into.items():
        if key not in logical:
            continue
        if is_dtensor(tensor):
            import torch.distributed as dist

            rank = dist.get_rank()
            check_into(key, tensor.to_local())  # type: ignore[attr-defined]  # is_dtensor: a DTensor, told by name
            lt, specs[key] = dtensor_spec(key, tensor)
            if (lt.shape, lt.dtype) != (logical[key].shape, logical[key].dtype):
                raise ShapeMismatchError(
                    f"cannot load {key!r}: the checkpoint has {logical[key].dtype}{list(logical[key].shape)} but the "
                    f"DTensor to load into is {lt.dtype}{list(lt.shape)}; pass a DTensor of that global shape and dtype"
                )
        else:
            check_fits(reader, key, None, tensor, logical[key].shape, logical[key].dtype, exact=True)
            box = Box.full(tuple(tensor.shape))
            specs[key] = TensorSpec(key, (ShardPiece(key, box, box),))
    return FragmentMap(rank=rank, logical=logical, tensors=specs)
