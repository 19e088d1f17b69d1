"""End to end with real DeepSpeed: train and save, convert with ours, load ours with DeepSpeed's load_universal.

One small case (ZeRO-2, bf16 weights with fp32 masters, two param groups, a
frozen parameter, buffers, a tied embedding, dp=2, torch's AdamW: nothing to
compile) is generated afresh by ucp/tools/fixtures/gen_deepspeed.py, converted by
our reader and ``deepspeed-universal`` writer, compared with DeepSpeed's own
``ds_to_universal`` output, and loaded by a fresh DeepSpeed engine with
``"checkpoint": {"load_universal": true}``: its fp32 partitions, Adam moments,
step and weights must equal the saved ones.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch

from ucp.integrations.launch import WITH_DEEPSPEED, run
from tests.ucp.formats.deepspeed_helpers import convert
from ucp.formats.deepspeed.pt import load_pt

pytestmark = pytest.mark.slow


def _load_worker(ctx, case, root: str, out: str) -> None:
    """One rank, started by integrations.launch: it joins the rank to the launcher's gloo group, tears
    the group down, and ends the process without an interpreter teardown (a spawned rank's teardown
    destroyed C++ objects whose threads DeepSpeed and gloo still ran: SIGABRT, "terminate called
    without an active exception", under load)."""
    import torch.distributed as dist

    from ucp.integrations.deepspeed.trainer import import_deepspeed
    from ucp.tools.fixtures.gen_deepspeed import _build, _config, _param_groups

    deepspeed = import_deepspeed()  # without DeepSpeed's compiled shared-memory all-reduce: gloo communicates
    deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=120))  # joins the launcher's group
    torch.manual_seed(99)  # different initial weights: everything must come from the checkpoint
    model = _build(case)
    for p in model.parameters():
        p.data.normal_()
    groups = _param_groups(model, case)
    optimizer = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.01)
    config = {**_config(case), "checkpoint": {"load_universal": True}}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    engine.load_checkpoint(root)
    inner = engine.optimizer.optimizer
    states = [inner.state[g["params"][0]] for g in inner.param_groups]
    torch.save({"fp32": [t.detach().clone() for t in engine.optimizer.single_partition_of_fp32_groups],
                "exp_avg": [s["exp_avg"].clone() for s in states], "step": [float(s["step"]) for s in states],
                "global_steps": engine.global_steps,
                "module": {k: v.detach().clone() for k, v in engine.module.state_dict().items()}},
               os.path.join(out, f"rank{ctx.rank}.pt"))
    dist.barrier()


def test_deepspeed_loads_our_universal_checkpoint(tmp_path):
    from ucp.tools.fixtures.gen_deepspeed import CASES, generate

    case = CASES["zero2-bf16-dp2"]
    root = generate(case, str(tmp_path), universal=True)
    source = os.path.join(root, "global_step3")
    theirs = os.path.join(root, "global_step3_universal")
    ours_root = tmp_path / "ours"
    convert(source, ours_root / "global_step3_universal")
    for dirpath, _, files in os.walk(os.path.join(theirs, "zero")):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), theirs)
            a, b = load_pt(os.path.join(theirs, rel)), load_pt(ours_root / "global_step3_universal" / rel)
            a, b = (x["param"] if isinstance(x, dict) and "param" in x else x for x in (a, b))
            if isinstance(a, torch.Tensor):
                assert a.dtype == b.dtype and torch.equal(a, b), rel
    run(_load_worker, world=case.dp, args=(case, str(ours_root), str(tmp_path)), preload=WITH_DEEPSPEED, timeout=600)
    saved_module = load_pt(os.path.join(source, "mp_rank_00_model_states.pt"))["module"]
    for rank in range(case.dp):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        saved = load_pt(os.path.join(source, f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"))
        saved = saved["optimizer_state_dict"]
        for g, fp32 in enumerate(saved["single_partition_of_fp32_groups"]):
            assert torch.equal(got["fp32"][g][:fp32.numel()], fp32), (rank, g)
            exp_avg = saved["base_optimizer_state"]["state"][g]["exp_avg"]
            assert torch.equal(got["exp_avg"][g][:fp32.numel()], exp_avg[:fp32.numel()]), (rank, g)
        assert got["step"] == [3.0, 3.0] and got["global_steps"] == 3
        for name, tensor in saved_module.items():
            if name not in ("pos_scale", "seen", "blocks.0.norm.weight"):  # DeepSpeed restores only trained weights
                assert torch.equal(got["module"][name], tensor), (rank, name)
