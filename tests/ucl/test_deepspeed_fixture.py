"""The deepspeed-zero preset against real DeepSpeed ZeRO-1/2/3 partitions (tests/../shared fixtures).

DeepSpeed's own universal checkpoint (``ds_to_universal``) gives the whole
fp32 / exp_avg / exp_avg_sq of every parameter; placing those with the preset
on rank r of dp=2 must give exactly the flat partitions DeepSpeed wrote for
rank r. The .pt files are read with a restricted unpickler: tensors and
containers only, DeepSpeed's own classes become inert stand-ins; deepspeed is
never imported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ucp import ucl
from ucp.ucl.simulate import scatter
from ucp.layout import Layout
from ucp.unpickle import torch_load
from ucp.spec import LogicalTensor

FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "deepspeed"


def restricted_load(path: Path):
    """DeepSpeed's own classes (LossScaler, ZeroStageEnum) come back as inert stand-ins."""
    return torch_load(path, unknown="stand-in")


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_flat_partitions_equal_deepspeeds_for_every_rank_and_state(stage):
    root = FIXTURES / f"zero{stage}-dp2"
    shapes_file = next((root / "global_step3").glob("*model_states.pt"))
    order_shapes = restricted_load(shapes_file)["param_shapes"][0]  # OrderedDict name -> Size, model order
    names = list(order_shapes)
    logical = {}
    for name in names:
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            full = restricted_load(root / "global_step3_universal" / "zero" / name / f"{state}.pt")
            full = full["param"] if isinstance(full, dict) else full  # {"param": t, "cat_dim": 0} or a bare tensor
            logical[f"{name}/{state}"] = full.reshape(order_shapes[name]).float()
        logical[name] = logical[f"{name}/fp32"]  # fp32 training: the parameters are the master weights
    meta = {n: LogicalTensor(n, tuple(t.shape), "float32") for n, t in logical.items()}
    for rank in range(2):
        fmap = ucl.spec_for_load("deepspeed-zero", Layout(dp=2, zero=stage), rank, meta, params={"order": names})
        local = scatter(logical, fmap)
        optim = restricted_load(root / "global_step3" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
        osd = optim["optimizer_state_dict"]
        if stage == 3:
            fp32, adam = osd["fp32_flat_groups"][0], osd["optimizer_state_dict"]["state"][0]
            assert torch.equal(local["module/flat_param"], fp32.detach())
        else:
            fp32, adam = osd["single_partition_of_fp32_groups"][0], osd["base_optimizer_state"]["state"][0]
        assert local["optim/fp32/group0"].shape == fp32.shape
        assert torch.equal(local["optim/fp32/group0"], fp32.detach())
        assert torch.equal(local["optim/exp_avg/group0"], adam["exp_avg"])
        assert torch.equal(local["optim/exp_avg_sq/group0"], adam["exp_avg_sq"])


def test_natural_order_differs_from_the_model_order_so_the_order_matters():
    # Without `order`, members are flattened in natural name order - not DeepSpeed's.
    shapes = {"emb.weight": (4, 2), "blocks.0.fc1.weight": (2, 2)}
    meta = {n: LogicalTensor(n, s, "float32") for n, s in shapes.items()}
    meta.update({f"{n}/fp32": LogicalTensor(f"{n}/fp32", s, "float32") for n, s in shapes.items()})
    natural = ucl.spec_for_load("deepspeed-zero", "dp=1,zero=1", 0, meta)
    ordered = ucl.spec_for_load("deepspeed-zero", "dp=1,zero=1", 0, meta, params={"order": ["emb.weight", "blocks.0.fc1.weight"]})
    first = lambda fmap: fmap.tensors["optim/fp32/group0"].pieces[0].logical  # noqa: E731
    assert (first(natural), first(ordered)) == ("blocks.0.fc1.weight/fp32", "emb.weight/fp32")
