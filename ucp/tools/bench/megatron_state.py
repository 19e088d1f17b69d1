"""A Megatron distributed-optimizer (zero=1) state for benchmarks, built without UCL, and its DCP form.

One rank of a ``tp x dp`` Megatron run with ``--use-distributed-optimizer`` holds

* its tensor-parallel shard of every parameter (bf16, the same on every dp rank), and
* for each optimizer state (fp32 master weights, Adam ``exp_avg`` and ``exp_avg_sq``) one
  contiguous part of a flat buffer: its local parameters laid end to end (natural order of
  their keys, as the megatron-gpt preset's ``flat`` rule and ``ucp.integrations.megatron``
  do), padded to a multiple of dp and cut into dp equal parts, so the parts split
  tensors mid-row.

Every element has a fixed value, a function of its logical tensor's name and its index
there (:func:`logical_values`), so any rank of any layout can build its own shards, and
check what a load gave it, without ever holding a whole tensor. The local geometry comes
from ``ucp.integrations.megatron.sharding`` (the stack's own statement in Python), not from
the UCL preset, so a benchmark that saves with UCL and checks against these values
checks the preset too.

torch.distributed.checkpoint (DCP) has no flat-range sharding. :func:`dcp_state` gives it
what Megatron-core's own ``torch_dist`` checkpoints give it for the distributed optimizer
(``fully_sharded_model_space``): a parameter whose tp shard has shape ``[x, y]`` inside a
``[X, Y]`` tensor becomes a ``[X // x, Y // y, x * y]`` tensor, and a rank's part of it is
a 1-d chunk of the last axis; parameters are DTensors over a ``(dp, tp)`` mesh.

    >>> cfg = model_for(0.001, tp=2)
    >>> params, flats = rank_state(cfg, Layout.parse("tp=2,dp=4,zero=1"), 5)
    >>> sorted(flats) == sorted(STATES)
    True
"""

from __future__ import annotations

import math
import re
import zlib

import torch

from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.llama.model import logical_shapes
from ucp.integrations.megatron.sharding import LocalShard, local_shards
from ucp.geometry import Box
from ucp.layout import Layout

__all__ = ["STATES", "model_for", "state_bytes", "logical_values", "local_tensor", "buffer_keys", "flat_ranges",
           "local_params", "flat_part", "rank_state", "zero_state", "dcp_state", "drop_replicas",
           "check_layout"]

STATES = ("fp32", "exp_avg", "exp_avg_sq")
VOCAB_MULTIPLE = 128  # Megatron's make-vocab-size-divisible-by default
_SLAB = 1 << 20  # elements computed at once (bounds the int64 temporaries)


def check_layout(layout: Layout) -> Layout:
    """The layouts this state models: tp x dp with the distributed optimizer (ValueError otherwise)."""
    if layout.pp != 1 or layout.cp != 1 or layout.ep != 1 or layout.zero != 1:
        raise ValueError(f"layout {layout}: the zero=1 benchmark models tp x dp with zero=1 only "
                         "(pp, cp and ep 1), e.g. tp=2,dp=4,zero=1")
    return layout


def _params_per_layer(hidden: int, heads: int, kv_heads: int, ffn: int) -> int:
    head = hidden // heads
    return (heads + 2 * kv_heads) * head * hidden + hidden * hidden + 3 * ffn * hidden + 2 * hidden


def model_for(gib: float, *, tp: int) -> LlamaConfig:
    """A Llama-like model whose optimizer state (fp32 masters and two Adam moments) is >= ``gib`` GiB.

    Hidden 2048 (16 heads, 4 key/value groups, SwiGLU ffn 5632) where the size allows, smaller
    powers of two below; whole layers first, then the vocabulary (a multiple of
    ``tp * 128``, so nothing is padded) fills the rest."""
    need = math.ceil(gib * 2**30 / 12)  # parameters: 3 fp32 states of 4 bytes each
    step = tp * VOCAB_MULTIPLE
    hidden = 2048
    while hidden > 64 and _params_per_layer(hidden, 16, 4, hidden * 11 // 4) + 2 * step * hidden > need:
        hidden //= 2
    ffn = hidden * 11 // 4
    per_layer = _params_per_layer(hidden, 16, 4, ffn)
    layers = max(1, (need - 2 * step * hidden) // per_layer)
    vocab = max(step, -(-max(0, need - layers * per_layer) // (2 * hidden * step)) * step)
    return LlamaConfig(vocab_size=vocab, hidden=hidden, layers=layers, heads=16, kv_heads=4, ffn=ffn,
                       vocab_multiple=VOCAB_MULTIPLE)


def state_bytes(cfg: LlamaConfig) -> dict[str, int]:
    """Logical bytes of the checkpoint: ``params`` (bf16) and ``optimizer`` (3 fp32 states)."""
    count = sum(math.prod(s) for s in logical_shapes(cfg).values())
    return {"params": 2 * count, "optimizer": 4 * len(STATES) * count}


def logical_values(name: str, shape: tuple[int, ...], box: Box) -> torch.Tensor:
    """The fp32 values of ``box`` of logical tensor ``name`` (of ``shape``): exact, in [-1, 1).

    A multiplicative hash of the element's row-major index, seeded by the name, so a
    misplaced element (wrong tensor, row, offset or state) is caught. Computed in slabs
    of rows, so the temporaries stay small whatever the box."""
    seed = zlib.crc32(name.encode())
    out = torch.empty(box.sizes, dtype=torch.float32)
    if out.numel() == 0:
        return out
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    row = math.prod(box.sizes[1:])
    rows = max(1, _SLAB // max(row, 1))
    for lo in range(0, box.sizes[0], rows):
        n = min(rows, box.sizes[0] - lo)
        index = torch.zeros((n, *box.sizes[1:]), dtype=torch.int64)
        for d in range(len(shape)):
            start = box.offsets[d] + (lo if d == 0 else 0)
            axis = torch.arange(start, start + (n if d == 0 else box.sizes[d]), dtype=torch.int64) * strides[d]
            index += axis.view([-1 if k == d else 1 for k in range(len(shape))])
        # < 2**24 after the modulus, so the float32 below is exact
        hashed = ((index + seed) * 2654435761) % 16777213
        out[lo:lo + n] = hashed.to(torch.float32) / 2**23 - 1.0
    return out


def local_tensor(shard: LocalShard, shapes: dict[str, tuple[int, ...]], suffix: str = "") -> torch.Tensor:
    """A local tensor (fp32) from the logical values its pieces hold (``suffix``: ``/exp_avg`` ...)."""
    out = torch.zeros(shard.shape, dtype=torch.float32)
    for p in shard.pieces:
        out[p.local.slices()] = logical_values(p.logical + suffix, shapes[p.logical], p.target)
    return out


def _natural(key: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def buffer_keys(shards: dict[str, LocalShard]) -> list[str]:
    """Local parameter keys in flat-buffer order: natural order of ``model/<key>`` (no experts here)."""
    return sorted(shards, key=lambda k: _natural(f"model/{k}"))


def flat_ranges(shards: dict[str, LocalShard], dp: int, dp_rank: int) -> tuple[int, list[tuple[str, int, int, int]]]:
    """``(part_size, [(key, start in the key's flat tensor, start in the part, length), ...])``.

    The buffer is padded to a multiple of dp and cut into dp equal parts; the list holds
    every member that overlaps part ``dp_rank``, in buffer order."""
    keys = buffer_keys(shards)
    sizes = [math.prod(shards[k].shape) for k in keys]
    part = -(-sum(sizes) // dp)
    lo, hi = dp_rank * part, (dp_rank + 1) * part
    out, at = [], 0
    for key, size in zip(keys, sizes):
        a, b = max(lo, at), min(hi, at + size)
        if a < b:
            out.append((key, a - at, a - lo, b - a))
        at += size
    return part, out


def local_params(cfg: LlamaConfig, layout: Layout, rank: int) -> dict[str, torch.Tensor]:
    """Local key -> this rank's bf16 parameter shard."""
    shards, shapes = local_shards(cfg, check_layout(layout), rank), logical_shapes(cfg)
    return {k: local_tensor(s, shapes).to(torch.bfloat16) for k, s in shards.items()}


def flat_part(cfg: LlamaConfig, layout: Layout, rank: int, state: str) -> torch.Tensor:
    """This rank's fp32 part of the flat buffer of optimizer state ``state`` (padding zero)."""
    shards, shapes = local_shards(cfg, check_layout(layout), rank), logical_shapes(cfg)
    part, ranges = flat_ranges(shards, layout.dp, layout.coords(rank).dp)
    flat = torch.zeros(part, dtype=torch.float32)
    for key, start, at, length in ranges:
        flat[at:at + length] = local_tensor(shards[key], shapes, f"/{state}").view(-1)[start:start + length]
    return flat


def rank_state(cfg: LlamaConfig, layout: Layout, rank: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(params, flats)``: local key -> bf16 parameter, and state -> this rank's fp32 part."""
    return local_params(cfg, layout, rank), {s: flat_part(cfg, layout, rank, s) for s in STATES}


def zero_state(cfg: LlamaConfig, layout: Layout, rank: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Zeros shaped like :func:`rank_state` (what a loading rank allocates)."""
    shards = local_shards(cfg, check_layout(layout), rank)
    part, _ = flat_ranges(shards, layout.dp, layout.coords(rank).dp)
    return ({k: torch.zeros(s.shape, dtype=torch.bfloat16) for k, s in shards.items()},
            {s: torch.zeros(part, dtype=torch.float32) for s in STATES})


# ----------------------------------------------------------------------------- the DCP form

# Megatron-core's tensor-parallel dimension of each local parameter (ColumnParallelLinear and the
# vocabulary-parallel embedding split dim 0, RowParallelLinear dim 1; norms are replicated).
_TP_DIM = {"word_embeddings.weight": 0, "output_layer.weight": 0, "linear_qkv.weight": 0, "linear_fc1.weight": 0,
           "linear_proj.weight": 1, "linear_fc2.weight": 1}


def _tp_dim(key: str) -> int | None:
    return next((d for suffix, d in _TP_DIM.items() if key.endswith(suffix)), None)


def _flattened(local: tuple[int, ...], dim: int | None, tp: int, tp_rank: int) -> tuple[tuple, tuple]:
    """Megatron's nd-flattened form: (global shape, offset of this tp shard's row) for a local shape."""
    grid = tuple(tp if d == dim else 1 for d in range(len(local)))
    cell = tuple(tp_rank if d == dim else 0 for d in range(len(local)))
    return grid + (math.prod(local),), cell


def _flat_sharded_tensor(chunk: torch.Tensor, shape: tuple, offset: tuple, rank: int):
    """A ShardedTensor with one local 1-d chunk at ``offset`` of the nd-flattened ``shape``.

    Like Megatron-core, the global metadata lists the local chunk's whole row for this rank and
    the other rows as held elsewhere: DCP plans saves and loads from the local chunks only, and
    this keeps ShardedTensor's own checks (no overlap, full cover) satisfied without a collective."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

    world = torch.distributed.get_world_size()
    view = chunk.view((1,) * (len(shape) - 1) + (-1,))
    local = Shard(view, ShardMetadata(list(offset), list(view.shape), f"rank:{rank}/cpu"))
    rows = []
    for cell in _grid(shape[:-1]):
        holder = rank if cell == tuple(offset[:-1]) else (rank + 1) % world
        rows.append(ShardMetadata(list(cell) + [0], [1] * (len(shape) - 1) + [shape[-1]], f"rank:{holder}/cpu"))
    meta = ShardedTensorMetadata(rows, torch.Size(shape), TensorProperties(dtype=chunk.dtype))
    return ShardedTensor._init_from_local_shards_and_global_metadata([local], sharded_tensor_metadata=meta)


def _grid(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    cells = [()]
    for n in shape:
        cells = [c + (i,) for c in cells for i in range(n)]
    return cells


def dcp_state(cfg: LlamaConfig, layout: Layout, rank: int, params: dict[str, torch.Tensor],
              flats: dict[str, torch.Tensor], mesh) -> dict:
    """The same tensors for ``dcp.save``/``dcp.load``, sharing memory with ``params`` and ``flats``.

    ``model.<key>``: a DTensor over ``mesh`` (dims dp, tp; Replicate over dp, Shard over tp or
    Replicate); ``optimizer.state.<state>.<key>``: the nd-flattened ShardedTensor of this rank's
    part of ``key`` (absent where the part holds none of it). A norm replicated over tp is
    saved by tp rank 0 only (Megatron marks the others as replicas); every rank loads it."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    c = layout.coords(rank)
    shards = local_shards(cfg, layout, rank)
    out: dict = {}
    for key, tensor in params.items():
        dim = _tp_dim(key)
        shape = list(tensor.shape)
        if dim is not None:
            shape[dim] *= layout.tp
        placement = Replicate() if dim is None else Shard(dim)
        out[f"model.{key}"] = DTensor.from_local(tensor, mesh, [Replicate(), placement], run_check=False,
                                                 shape=torch.Size(shape), stride=tuple(_strides(shape)))
    _, ranges = flat_ranges(shards, layout.dp, c.dp)
    for state, flat in flats.items():
        for key, start, at, length in ranges:
            dim = _tp_dim(key)
            shape, cell = _flattened(shards[key].shape, dim, layout.tp, c.tp)
            out[f"optimizer.state.{state}.{key}"] = _flat_sharded_tensor(flat[at:at + length], shape,
                                                                         cell + (start,), rank)
    return out


def drop_replicas(state: dict, layout: Layout, rank: int) -> dict:
    """``state`` without the optimizer chunks of tp-replicated norms on tp ranks > 0 (for a save)."""
    if layout.coords(rank).tp == 0:
        return state
    return {k: v for k, v in state.items() if not (k.startswith("optimizer.") and _tp_dim(k) is None)}


def _strides(shape: list[int]) -> list[int]:
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]
