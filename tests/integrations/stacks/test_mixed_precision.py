"""bf16 mixed precision: masters come from fp32 only, bitwise; a checkpoint without them is refused.

(The layout transitions in bf16 are rows of test_transitions.py.)
"""

from __future__ import annotations

import pytest
import torch

from ucp.integrations.launch import WITH_DEEPSPEED, run
from ucp.integrations.llama.config import ConfigError, LlamaConfig
from ucp.integrations.stacks.common import MissingMastersError, TrainSettings

BF16 = TrainSettings(precision="bf16")
CFG = LlamaConfig(layers=2)


def test_precision_is_fp32_or_bf16():
    assert TrainSettings().param_dtype == torch.float32 and not TrainSettings().mixed
    assert BF16.param_dtype == torch.bfloat16 and BF16.mixed
    with pytest.raises(ConfigError) as err:
        TrainSettings(precision="fp16")
    assert str(err.value) == "unknown precision 'fp16': expected one of fp32, bf16"


def _bf16_only_checkpoint(path: str) -> None:
    """What a bf16 export without optimizer masters looks like: bf16 parameters, fp32 moments."""
    from ucp.integrations.llama.model import build_model
    from ucp.writer import CheckpointWriter

    writer = CheckpointWriter(path)
    for name, param in build_model(CFG).state_dict().items():
        writer.add(name, param.to(torch.bfloat16))
        for state in ("exp_avg", "exp_avg_sq"):
            writer.add(f"{name}/{state}", torch.zeros_like(param))
    writer.set_state({"step": 1, "data": {"position": 8}})
    writer.close()


def _load_refusals(ctx, path: str) -> dict:
    from ucp.integrations.stacks.jobs import build_trainer

    _bf16_only_checkpoint(path)
    out = {}
    for stack, layout, settings in (("megatron", "dp=1,zero=1", BF16), ("megatron", "dp=1", TrainSettings()),
                                    ("native", "dp=1", BF16), ("deepspeed", "dp=1,zero=2", BF16)):
        trainer = build_trainer(stack, CFG, layout, settings, rank=0, init=False)
        try:
            trainer.load(path)
            out[f"{stack} {layout} {settings.precision}"] = "loaded"
        except MissingMastersError as err:
            out[f"{stack} {layout} {settings.precision}"] = str(err)
    # the hot path hands loaded tensors over directly: the trainer refuses them too
    trainer = build_trainer("megatron", CFG, "dp=1,zero=1", BF16, rank=0, init=False)
    into = {f"model/{k}": p.detach().clone() for k, p in trainer.params.items()}
    try:
        trainer.load_tensors(into, {"step": 1, "data": {"position": 8}}, has_masters=False)
        out["load_tensors"] = "loaded"
    except MissingMastersError as err:
        out["load_tensors"] = str(err)
    return out


@pytest.mark.slow
def test_a_checkpoint_without_fp32_masters_is_refused_by_every_stack(tmp_path):
    path = str(tmp_path / "bf16_only")
    got = run(_load_refusals, world=1, args=(path,), preload=WITH_DEEPSPEED)
    message = (f"checkpoint {path} holds 'decoder.final_layernorm.weight' as bfloat16 and no fp32 master "
               "'decoder.final_layernorm.weight/fp32' (21 parameter(s) like it): rebuilding fp32 masters from "
               "bfloat16 values would lose precision; load a checkpoint saved with its masters (every ucp trainer "
               "saves them in bf16 mode)")
    assert got == {"megatron dp=1,zero=1 bf16": message, "megatron dp=1 fp32": message,
                   "native dp=1 bf16": message, "deepspeed dp=1,zero=2 bf16": message,
                   "load_tensors": "the checkpoint holds 'model/decoder.final_layernorm.weight' as bfloat16 and no "
                                   "fp32 masters (15 tensor(s) like it): rebuilding fp32 masters from them would "
                                   "lose precision"}


def _masters_from_fp32_run(ctx, path: str) -> dict:
    import ucp
    from ucp.integrations.stacks.jobs import build_trainer

    fp32 = build_trainer("megatron", CFG, "dp=1", TrainSettings(), rank=0)
    fp32.train_step()
    fp32.save(path)
    want = {k: ucp.read_tensor(path, k) for k in ucp.CheckpointReader(path).logical() if "/" not in k}
    out = {}
    for stack, layout in (("megatron", "dp=1,zero=1"), ("megatron", "dp=1"), ("native", "dp=1"),
                          ("deepspeed", "dp=1,zero=1")):
        trainer = build_trainer(stack, CFG, layout, BF16, rank=0, init=False)
        trainer.load(path)
        snap = trainer.logical_snapshot()
        out[f"{stack} {layout}"] = sorted(
            n for n, w in want.items()
            if not (torch.equal(snap[f"{n}/fp32"], w) and snap[n].dtype == torch.bfloat16
                    and torch.equal(snap[n], w.to(torch.bfloat16))))
    return out


@pytest.mark.slow
def test_a_bf16_run_takes_an_fp32_runs_parameters_as_its_masters_bit_for_bit(tmp_path):
    got = run(_masters_from_fp32_run, world=1, args=(str(tmp_path / "fp32"),), preload=WITH_DEEPSPEED)
    assert got == {"megatron dp=1,zero=1": [], "megatron dp=1": [], "native dp=1": [], "deepspeed dp=1,zero=1": []}


def _params_from_bf16_run(ctx, path: str) -> dict:
    import ucp
    from ucp.integrations.stacks.jobs import build_trainer

    bf16 = build_trainer("megatron", CFG, "dp=1,zero=1", BF16, rank=0)
    bf16.train_step()
    bf16.save(path)
    masters = {k.removesuffix("/fp32"): ucp.read_tensor(path, k) for k in ucp.CheckpointReader(path).logical()
               if k.endswith("/fp32")}
    out = {}
    for stack, layout in (("megatron", "dp=1,zero=1"), ("megatron", "dp=1"), ("native", "dp=1"),
                          ("deepspeed", "dp=1,zero=1"), ("deepspeed", "dp=1,zero=3")):
        trainer = build_trainer(stack, CFG, layout, TrainSettings(), rank=0, init=False)
        trainer.load(path)
        snap = trainer.logical_snapshot()
        out[f"{stack} {layout}"] = sorted(n for n, m in masters.items() if not torch.equal(snap[n], m))
    return out


@pytest.mark.slow
def test_an_fp32_run_takes_a_bf16_runs_masters_as_its_parameters(tmp_path):
    got = run(_params_from_bf16_run, world=1, args=(str(tmp_path / "bf16"),), preload=WITH_DEEPSPEED)
    assert got == {"megatron dp=1,zero=1": [], "megatron dp=1": [], "native dp=1": [], "deepspeed dp=1,zero=1": [],
                   "deepspeed dp=1,zero=3": []}
