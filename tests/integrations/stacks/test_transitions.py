"""Layout changes across the three stacks, proven by loss curves and bit-for-bit tensors.

Each case trains 3 steps under layout A (real processes on gloo), saves a universal
checkpoint, resumes under layout B and trains 10 more steps. Every step's loss must
match the uninterrupted single-process run within 1e-4 relative (fp32), and the
logical parameters and optimizer states right after the load must equal the saved
ones bitwise (and the saved ones the checkpoint's).
"""

from __future__ import annotations

import functools

import pytest

from ucp.integrations.stacks.common import TrainSettings
from ucp.integrations.stacks.transition import Transition, reference_run, run_transition

MOE = "num_experts=4"

TRANSITIONS = [
    Transition("8->4 ranks, pp 2->1", ("megatron", "tp=2,pp=2,dp=2,zero=1"), ("megatron", "tp=2,dp=2,zero=1")),
    Transition("4->8 ranks", ("native", "tp=2,dp=2"), ("native", "tp=2,pp=2,dp=2")),
    Transition("2->3 ranks, uneven FSDP2 shards and batch", ("native", "dp=2"), ("native", "dp=3")),
    Transition("tp 2->4", ("megatron", "tp=2,dp=2"), ("megatron", "tp=4")),
    Transition("pp 2->1 (torch pipelining)", ("native", "pp=2,dp=2"), ("native", "dp=2")),
    Transition("ZeRO on->off", ("megatron", "dp=2,zero=1"), ("megatron", "tp=2,dp=2")),
    Transition("uneven dp, distributed optimizer 3->2", ("megatron", "dp=3,zero=1"), ("megatron", "dp=2,zero=1")),
    Transition("ep 2->4 (MoE)", ("megatron", "dp=2,ep=2,zero=1"), ("megatron", "dp=4,ep=4,zero=1"), model=MOE),
    Transition("cp 2->1", ("megatron", "tp=2,cp=2,zero=1"), ("megatron", "tp=2")),
    Transition("FSDP2 -> Megatron style", ("native", "dp=4"), ("megatron", "tp=2,pp=2")),
    Transition("DeepSpeed ZeRO-2 dp=4 -> ZeRO-3 dp=2", ("deepspeed", "dp=4,zero=2"), ("deepspeed", "dp=2,zero=3")),
    Transition("Megatron style -> DeepSpeed ZeRO-1", ("megatron", "tp=2,pp=2"), ("deepspeed", "dp=3,zero=1")),
    Transition("DeepSpeed ZeRO-3 -> torch-native TP x CP", ("deepspeed", "dp=2,zero=3"), ("native", "tp=2,cp=2")),
    Transition("torch-native TP x PP x CP -> DeepSpeed", ("native", "tp=2,pp=2,cp=2"), ("deepspeed", "dp=2,zero=2")),
    Transition("MoE on torch-native FSDP2 -> Megatron ep=2", ("native", "dp=2"), ("megatron", "tp=2,dp=2,ep=2,zero=1"),
               model=MOE),
    Transition("native DeepSpeed ZeRO-2 checkpoint (ucp's reader) -> Megatron style", ("deepspeed", "dp=4,zero=2"),
               ("megatron", "tp=2,pp=2,zero=1"), native_deepspeed=True),
]

SETTINGS = TrainSettings()


@functools.cache
def _reference(model: str, steps: int) -> tuple[float, ...]:
    return tuple(reference_run(model, SETTINGS, steps))


@pytest.mark.slow
@pytest.mark.parametrize("transition", TRANSITIONS, ids=[t.name for t in TRANSITIONS])
def test_transition(transition: Transition, tmp_path):
    reference = list(_reference(transition.model, transition.steps_before + transition.steps_after))
    result = run_transition(transition, tmp_path, settings=SETTINGS, reference=reference)
    assert sorted(result.losses) == list(range(1, 14))
    assert result.worst_relative < 1e-4, (str(transition), result.relative_errors)
    assert not result.mismatches, (str(transition), result.mismatches[:10])
    # every logical tensor was compared: parameters and both Adam moments at least
    assert result.saved_tensors >= 3 * 39 and result.loaded_tensors >= 3 * 39
