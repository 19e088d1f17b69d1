"""DTensor placements -> fragment maps, so DTensor/FSDP2 state saves and loads with no spec.

For each mesh dimension, in order, a ``Shard(d)`` placement cuts dim ``d`` the
way DTensor does (``ceil(n / k)`` per shard, so trailing shards may be short
or empty), ``Replicate()`` makes the ranks along it replicas, and
``Partial`` is refused (reduce it first). ``_StridedShard`` (what FSDP2's
``fully_shard`` makes of a parameter that tensor parallelism already sharded)
takes its box from torch's own chunk metadata. Works on any mesh::

    mesh = init_device_mesh("cpu", (2, 2))
    w = distribute_tensor(torch.randn(5, 4), mesh, [Shard(0), Replicate()])
    fmap = fragment_map_from_dtensors({"model/w": w})
"""

from __future__ import annotations

from typing import Any

import torch

from ucp.dtypes import check_supported
from ucp.errors import UcpError
from ucp.geometry import Box
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec


def is_dtensor(value: Any) -> bool:
    return type(value).__name__ == "DTensor" and isinstance(value, torch.Tensor)


def dtensor_box(
    shape: tuple[int, ...], placements, mesh_shape: tuple[int, ...], coords: tuple[int, ...], *, key: str = "?"
) -> tuple[Box, int, int]:
    """(global box held locally, replica index, replica count) for one rank. Pure: no process group."""
    offsets, sizes = [0] * len(shape), list(shape)
    replica, replicas = 0, 1
    for mesh_dim, placement in enumerate(placements):
        k, c = mesh_shape[mesh_dim], coords[mesh_dim]
        if placement.is_shard():
            d = placement.dim % max(len(shape), 1)
            chunk = -(-sizes[d] // k) if sizes[d] else 0
            start = min(c * chunk, sizes[d])
            length = max(0, min(chunk, sizes[d] - start))
            offsets[d] += start
            sizes[d] = length
        elif placement.is_replicate():
            replica, replicas = replica * k + c, replicas * k
        else:
            raise UcpError(
                f"tensor {key!r} has placement {placement} on mesh dim {mesh_dim}; only Shard and Replicate can be "
                "saved - reduce it first (dtensor.redistribute(mesh, [Replicate()...]))"
            )
    return Box(tuple(offsets), tuple(sizes)), replica, replicas


def dtensor_spec(key: str, dt: Any, *, logical_name: str | None = None) -> tuple[LogicalTensor, TensorSpec]:
    """The logical tensor and this rank's spec for DTensor ``dt`` saved under ``key``."""
    name = logical_name or key
    mesh = dt.device_mesh
    coords = mesh.get_coordinate()
    if coords is None:
        raise UcpError(f"tensor {key!r}: this rank is not in the DTensor's device mesh")
    strided = [type(p).__name__ == "_StridedShard" for p in dt.placements]
    placements = dt.placements
    if any(strided):  # FSDP2 over tensor parallelism: its shard's box is torch's to compute
        from torch.distributed.tensor import Shard

        placements = [Shard(p.dim) if s else p for p, s in zip(dt.placements, strided, strict=True)]
    box, replica, replicas = dtensor_box(tuple(dt.shape), placements, tuple(mesh.shape), tuple(coords), key=key)
    if any(strided):
        (chunk,) = dt.__create_chunk_list__()
        box = Box(tuple(int(o) for o in chunk.offsets), tuple(int(n) for n in chunk.sizes))
    logical = LogicalTensor(name, tuple(dt.shape), check_supported(dt.dtype, key=key))
    piece = ShardPiece(name, Box((0,) * box.ndim, box.sizes), box)
    return logical, TensorSpec(key, (piece,), replica=replica, replicas=replicas)


def fragment_map_from_dtensors(tensors: dict[str, Any], *, rank: int | None = None) -> FragmentMap:
    """A FragmentMap for every DTensor in ``{key: tensor}`` (other values are skipped)."""
    import torch.distributed as dist

    logical, specs = {}, {}
    for key, value in tensors.items():
        if is_dtensor(value):
            lt, spec = dtensor_spec(key, value)
            logical[lt.name], specs[key] = lt, spec
    return FragmentMap(rank=dist.get_rank() if rank is None else rank, logical=logical, tensors=specs)
