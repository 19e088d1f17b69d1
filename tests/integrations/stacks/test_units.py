"""The pieces the trainers share: launcher, checkpoint schema helpers, layout checks, DTensor boxes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ucp.integrations.launch import WorkerFailed, run
from ucp.integrations.llama.config import ConfigError, LlamaConfig
from ucp.integrations.stacks.common import Progress, TrainSettings, assemble, master_name
from ucp.integrations.stacks.jobs import build_trainer
from ucp.integrations.stacks.transition import compare_snapshots
from ucp.errors import LayoutError
from ucp.geometry import Box


def _raises(ctx):
    if ctx.rank == 1:
        raise KeyError("boom on rank one")
    import torch.distributed as dist

    dist.barrier()


def _dies(ctx):
    if ctx.rank == 0:
        os._exit(3)
    import torch.distributed as dist

    dist.barrier()


def _world(ctx, n):
    import torch.distributed as dist

    return dist.get_world_size() * n


def test_launcher_returns_rank_zeros_result_and_reports_failures():
    assert run(_world, world=3, args=(5,)) == 15
    with pytest.raises(WorkerFailed, match=r"(?s)rank 1 of 2 failed:.*KeyError: 'boom on rank one'"):
        run(_raises, world=2, timeout=60)
    with pytest.raises(WorkerFailed, match=r"^rank 0 of 2 died without a traceback \(exit code 3: killed or crashed\)"):
        run(_dies, world=2, timeout=60)


@pytest.mark.parametrize("stack,layout,message", [
    ("native", "tp=2,ep=2,dp=2", "the torch-native stack runs tp, pp, dp and cp (FSDP2 shards over dp x cp); "
     "got tp=2,dp=2,ep=2: use the Megatron-style stack for ep and vpp, DeepSpeed for ZeRO stages"),
    ("megatron", "tp=3", "tp=3 must divide kv_heads (4): each tp rank holds whole key/value groups"),
    ("megatron", "dp=2,ep=2", "ep=2 needs a mixture-of-experts model (num_experts > 0)"),
    ("megatron", "tp=2,pp=2,zero=3", "the Megatron-style stack runs zero 0-2 without virtual pipeline stages; "
     "got tp=2,pp=2,zero=3"),
    ("deepspeed", "tp=2,dp=2,zero=2", "the DeepSpeed stack runs data parallelism with ZeRO stage 1, 2 or 3 "
     "(dp=N,zero=S); got tp=2,dp=2,zero=2"),
    ("deepspeed", "dp=2", "the DeepSpeed stack runs data parallelism with ZeRO stage 1, 2 or 3 (dp=N,zero=S); "
     "got dp=2"),
])
def test_trainers_refuse_layouts_they_cannot_run_before_touching_a_process_group(stack, layout, message):
    with pytest.raises(LayoutError) as err:
        build_trainer(stack, LlamaConfig(), layout, TrainSettings(), rank=0)
    assert str(err.value) == message


def test_context_parallel_needs_equal_chunks():
    with pytest.raises(ConfigError, match=r"^cp=3 must divide seq_len \(16\): each cp rank holds an equal chunk$"):
        build_trainer("megatron", LlamaConfig(), "cp=3", TrainSettings(), rank=0)
    with pytest.raises(ConfigError, match=r"^global_batch \(2\) must be at least dp \(4\)$"):
        build_trainer("native", LlamaConfig(), "dp=4", TrainSettings(global_batch=2), rank=0)


def test_progress_round_trips_and_rng_is_per_rank():
    torch.manual_seed(7)
    tree = Progress(step=3, position=24).to_tree(rank=1, run={"stack": "native"})
    expected = torch.rand(3)
    assert Progress.from_tree(tree) == Progress(3, 24) and tree["run"] == {"stack": "native"}
    torch.manual_seed(99)
    Progress.restore_rng(tree, rank=1, seed=0)          # the same rank: its own stream
    assert torch.equal(torch.rand(3), expected)
    Progress.restore_rng(tree, rank=2, seed=0)          # a new rank: a fresh, deterministic stream
    first = torch.rand(3)
    Progress.restore_rng(tree, rank=2, seed=0)
    assert torch.equal(torch.rand(3), first) and not torch.equal(first, expected)


def test_masters_come_from_the_parameters_where_a_stack_kept_none():
    assert master_name("w", {"w": 0, "w/fp32": 0}) == "w/fp32"
    assert master_name("w", {"w": 0}) == "w"


def test_assemble_refuses_holes_and_disagreeing_replicas():
    shapes = {"w": ((2, 2), torch.float32)}
    row = torch.ones(1, 2)
    out = assemble([("w", Box((0, 0), (1, 2)), row), ("w", Box((1, 0), (1, 2)), 2 * row)], shapes)
    assert torch.equal(out["w"], torch.tensor([[1.0, 1.0], [2.0, 2.0]]))
    with pytest.raises(AssertionError, match=r"no rank holds all of \['w'\]"):
        assemble([("w", Box((0, 0), (1, 2)), row)], shapes)
    with pytest.raises(AssertionError, match="replicas of w"):
        assemble([("w", Box((0, 0), (2, 2)), torch.ones(2, 2)), ("w", Box((0, 0), (1, 2)), 3 * row)], shapes)


def test_compare_snapshots_is_bitwise_and_accepts_parameters_as_masters():
    saved = {"w": np.array([1.0, -0.0], dtype=np.float32), "w/exp_avg": np.zeros(2, dtype=np.float32)}
    same = {"w": saved["w"].copy(), "w/fp32": saved["w"].copy(), "w/exp_avg": np.zeros(2, dtype=np.float32)}
    assert compare_snapshots(saved, same) == []
    signed_zero = {"w": np.array([1.0, 0.0], dtype=np.float32)}   # equal as numbers, not as bits
    assert compare_snapshots(saved, signed_zero) == ["w"]
    assert compare_snapshots(saved, {"v": np.zeros(2, dtype=np.float32)}) == ["v"]


def _strided_boxes(ctx):
    """FSDP2 over TP shards with _StridedShard; each local shard must sit where dtensor_box says."""
    from ucp.integrations.native.parallelize import apply_fsdp, apply_tensor_parallel, build_mesh
    from ucp.integrations.llama.model import LlamaModel, init_weights
    from ucp.integrations.stacks.fragments import dtensor_box
    from ucp.layout import Layout

    layout = Layout.parse("tp=2,dp=2")
    mesh = build_mesh(layout)
    model = init_weights(LlamaModel(LlamaConfig(layers=1, vocab_size=61)))
    apply_tensor_parallel(model, mesh["tp"])
    apply_fsdp(model, mesh["dp_cp"], pipelined=False)
    wrong = []
    for name, param in model.named_parameters():
        box, local = dtensor_box(param), param.detach().to_local()
        full = param.detach().full_tensor()
        if tuple(local.shape) != box.sizes or not torch.equal(full[box.slices()], local):
            wrong.append(name)
    return wrong


@pytest.mark.slow
def test_dtensor_boxes_of_fsdp2_over_tensor_parallel_shards_are_where_the_data_is():
    assert run(_strided_boxes, world=4) == []
