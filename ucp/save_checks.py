"""What a save refuses before it writes anything: tensors without plain memory, dtypes, maps that do not fit.

:func:`ucp.api.open_writer` runs these on every rank before the first collective of a
distributed save, so a bad tensor on one rank fails every rank with its cause instead
of leaving the healthy ranks waiting in a collective the bad one never joins. The
writer runs the same checks on each tensor it is handed directly.

    >>> import torch
    >>> check_tensor(torch.ones(2), key="w")
    'float32'
    >>> check_tensor(torch.empty(2, device="meta"), key="w")
    Traceback (most recent call last):
    ...
    ucp.errors.UnsupportedTensorError: tensor 'w' is on the meta device and has no data; materialize it (e.g. module.to_empty(device='cpu'), then initialize or load it) before saving
"""

from __future__ import annotations

import torch

from ucp.dtypes import check_supported, dtype_name
from ucp.errors import LayoutError, ShapeMismatchError, UcpError, UnsupportedTensorError
from ucp.geometry import Box
from ucp.spec import FragmentMap, LogicalTensor, TensorSpec

__all__ = ["check_tensor", "check_tensors", "check_pieces", "check_spec_fit", "check_average", "local_tensor"]


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of a DTensor, else the tensor itself."""
    # A DTensor, told by name (no torch.distributed import).
    return tensor.to_local() if type(tensor).__name__ == "DTensor" else tensor  # type: ignore[attr-defined]


def check_tensor(tensor: torch.Tensor, *, key: str) -> str:
    """The dtype name of a tensor the format can store, or the error that says why it cannot."""
    local = local_tensor(tensor)
    if local.is_nested:
        raise UnsupportedTensorError(
            f"tensor {key!r} is a nested (ragged) tensor, which the checkpoint format cannot store; save its "
            "components (tensor.unbind()) as separate tensors"
        )
    if local.layout != torch.strided:
        kind = "sparse" if "sparse" in str(local.layout) else "not a plain strided tensor"
        raise UnsupportedTensorError(
            f"tensor {key!r} is {kind} ({local.layout}), which the checkpoint format cannot store; save "
            "tensor.to_dense() (or its indices and values as separate tensors)"
        )
    if local.device.type == "meta":
        raise UnsupportedTensorError(
            f"tensor {key!r} is on the meta device and has no data; materialize it (e.g. "
            "module.to_empty(device='cpu'), then initialize or load it) before saving"
        )
    return check_supported(local.dtype, key=key)


def check_tensors(tensors: dict[str, torch.Tensor]) -> None:
    """:func:`check_tensor` for every tensor of a flattened state."""
    for key, tensor in tensors.items():
        check_tensor(tensor, key=key)


def check_pieces(key: str, tensor: torch.Tensor, tspec: TensorSpec, logical: dict[str, LogicalTensor]) -> None:
    """Every piece of ``tspec`` names a known logical tensor of the tensor's dtype and fits in the tensor."""
    name = dtype_name(tensor.dtype)
    for piece in tspec.pieces:
        lt = logical.get(piece.logical)
        if lt is None:
            raise LayoutError(f"tensor {key!r} maps onto unknown logical tensor {piece.logical!r}")
        if lt.dtype != name:
            raise ShapeMismatchError(
                f"tensor {key!r} is {name} but its spec maps it onto {piece.logical!r} of dtype {lt.dtype}; "
                f"convert the tensor (tensor.to(torch.{lt.dtype})) or fix the spec"
            )
        region = piece.local
        if isinstance(region, Box):
            if region.ndim != tensor.dim() or not Box.full(tuple(tensor.shape)).contains(region):
                raise ShapeMismatchError(
                    f"tensor {key!r} has shape {list(tensor.shape)}, which does not contain the spec's local box "
                    f"{region}; fix the spec or pass the right tensor"
                )
        elif region.stop > tensor.numel():
            raise ShapeMismatchError(
                f"tensor {key!r} has {tensor.numel()} elements, fewer than the spec's local range {region}; "
                "fix the spec"
            )


def check_average(key: str, tspec: TensorSpec, world_size: int) -> None:
    """Policy ``average`` all-reduces over the whole group, so its replicas must be the whole group."""
    if tspec.replicas > 1 and tspec.policy == "average" and tspec.replicas != world_size:
        raise UcpError(
            f"tensor {key!r}: policy 'average' needs its replicas to be the whole process group "
            f"({tspec.replicas} replicas, {world_size} ranks); average it yourself or use 'check-equal'"
        )


def check_spec_fit(
    tensors: dict[str, torch.Tensor], spec: FragmentMap | None, *, world_size: int, distributed: bool
) -> None:
    """The fragment map is valid and fits every tensor it maps (DTensors map themselves)."""
    if spec is None:
        return
    spec.validate()
    for key, tensor in tensors.items():
        tspec = spec.tensors.get(key)
        if tspec is None or type(tensor).__name__ == "DTensor":
            continue
        check_pieces(key, tensor, tspec, spec.logical)
        if distributed:
            check_average(key, tspec, world_size)
