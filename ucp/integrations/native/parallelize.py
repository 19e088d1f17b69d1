"""torchtitan-style parallelism for :class:`~ucp.integrations.llama.model.LlamaModel`, with torch's own APIs.

* tensor parallelism: ``parallelize_module`` with a Megatron-like plan (q/k/v,
  gate/up column-wise; the attention and MLP output projections row-wise; the
  embedding row-wise over the vocabulary; the output layer column-wise, gathered);
* data parallelism: FSDP2 ``fully_shard`` on every decoder layer and the root,
  over the ``dp_cp`` mesh dimension (context-parallel ranks hold the same samples'
  other tokens, so they shard parameters and reduce gradients with the dp ranks,
  as torchtitan does);
* pipeline parallelism: the stage is cut out of the full model with
  :func:`~ucp.integrations.llama.model.keep_stage` and driven by
  ``torch.distributed.pipelining``.

The device mesh is ``(pp, dp_cp, tp)``, row-major, so rank order is Megatron's
(tp fastest, then cp, dp, pp) and a :class:`~ucp.layout.Layout` names the same ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from ucp.integrations.llama.model import LlamaModel
from ucp.layout import Layout

__all__ = ["build_mesh", "cp_group", "tensor_parallel_plan", "apply_tensor_parallel", "apply_fsdp"]


def build_mesh(layout: Layout) -> DeviceMesh:
    """The ``(pp, dp_cp, tp)`` device mesh of ``layout`` (every rank calls it)."""
    return init_device_mesh("cpu", (layout.pp, layout.dp * layout.cp, layout.tp), mesh_dim_names=("pp", "dp_cp", "tp"))


def cp_group(layout: Layout, rank: int):
    """This rank's context-parallel group (every rank creates every group, in one order)."""
    mine = None
    for pp in range(layout.pp):
        for dp in range(layout.dp):
            for tp in range(layout.tp):
                members = [layout.rank_of(tp=tp, cp=c, dp=dp, pp=pp) for c in range(layout.cp)]
                group = dist.new_group(members)
                if rank in members:
                    mine = group
    return mine


def tensor_parallel_plan(model: LlamaModel) -> dict:
    """Module path -> ParallelStyle for the parts of ``model`` this stage holds.

    Experts of MoE layers are not split over tp here (FSDP shards them over dp);
    the Megatron-style stack splits them.
    """
    plan: dict = {}
    if model.embedding is not None:
        plan["embedding.word_embeddings"] = RowwiseParallel(input_layouts=Replicate())
    for index, layer in model.decoder.layers.items():
        prefix = f"decoder.layers.{index}"
        for name in ("linear_q", "linear_k", "linear_v"):
            plan[f"{prefix}.self_attention.{name}"] = ColwiseParallel()
        plan[f"{prefix}.self_attention.linear_proj"] = RowwiseParallel()
        if not hasattr(layer.mlp, "experts"):
            plan[f"{prefix}.mlp.gate"] = ColwiseParallel()
            plan[f"{prefix}.mlp.up"] = ColwiseParallel()
            plan[f"{prefix}.mlp.linear_fc2"] = RowwiseParallel()
    if model.output_layer is not None:
        plan["output_layer"] = ColwiseParallel(output_layouts=Replicate())
    return plan


def apply_tensor_parallel(model: LlamaModel, tp_mesh: DeviceMesh) -> None:
    cfg = model.cfg
    if cfg.heads % tp_mesh.size() or cfg.kv_heads % tp_mesh.size():
        raise ValueError(
            f"tp={tp_mesh.size()} must divide heads ({cfg.heads}) and kv_heads ({cfg.kv_heads}): "
            "each tensor-parallel rank computes whole attention heads"
        )
    parallelize_module(model, tp_mesh, tensor_parallel_plan(model))


def apply_fsdp(model: LlamaModel, dp_mesh: DeviceMesh, *, pipelined: bool,
               param_dtype: torch.dtype = torch.float32) -> None:
    """FSDP2 over ``dp_mesh``: each decoder layer its own unit, then the root.

    Gradients are reduced in float64 and summed, not averaged: every rank already
    divides its loss by the global token count, so the sum is the global mean's
    gradient whatever the dp size, and the float64 sum does not depend on the
    order ranks are added in (the fp32 result is the same for any dp).
    With pipelining the parameters stay gathered between micro-batches. ``param_dtype`` below
    fp32 is FSDP2's mixed precision: the sharded fp32 parameters are cast to it for compute.
    """
    compute = None if param_dtype == torch.float32 else param_dtype
    policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float64)
    units = [*model.decoder.layers.values(), model]
    for unit in units:
        fully_shard(unit, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=not pipelined)
    for unit in units:
        unit.set_gradient_divide_factor(1.0)
