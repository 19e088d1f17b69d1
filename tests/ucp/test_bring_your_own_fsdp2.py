"""A user's own FSDP2 + tensor-parallel model (no reference trainer): saved on 4 ranks, loaded on 2.

The recipe of docs/TRAINING.md, "Your own FSDP2 / DTensor model": the save takes the DTensor state
dicts, the load fresh objects (the optimizer has no state yet); no process group, spec or program.
"""

from __future__ import annotations

import pytest
import torch

import ucp
from ucp.integrations.launch import run


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))


def _full(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Every parameter and optimizer state entry as a whole tensor (a collective), as numpy arrays."""
    def whole(t):
        return (t.full_tensor() if type(t).__name__ == "DTensor" else t).detach().clone().numpy()

    out = {f"model/{n}": whole(p) for n, p in model.named_parameters()}
    for i, entry in opt.state_dict()["state"].items():
        out.update({f"optim/{i}/{k}": whole(v) for k, v in entry.items()})
    return out


def _save_fsdp2_over_tp(ctx, path: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import ucp

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = _mlp(0)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    placements = {type(p).__name__ for param in model.parameters() for p in param.placements}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    dp = mesh.get_coordinate()[0]
    for step in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + dp))
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    # Its DTensor state dicts (the objects themselves would do as well); no process_group: the world, as DCP.
    ucp.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 3}, path)
    full = _full(model, opt)
    dist.barrier()
    return {"full": full, "placements": sorted(placements)}


def _load_fsdp2(ctx, path: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import ucp

    model = _mlp(1)  # other weights: the load must replace every one
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.0)  # fresh: no state yet
    state = {"model": model, "optim": opt, "step": 0}
    ucp.load(path, into=state)
    ucp.save(state, path + "-again")  # the objects themselves, FSDP2 alone on 2 ranks; no process_group again
    group = opt.param_groups[0]
    return {"full": _full(model, opt), "step": state["step"], "lr": group["lr"], "wd": group["weight_decay"]}


@pytest.mark.slow
def test_fsdp2_over_tensor_parallel_saved_on_4_ranks_loads_on_2_with_fresh_objects(tmp_path):
    path = str(tmp_path / "ckpt")
    saved = run(_save_fsdp2_over_tp, world=4, args=(path,))
    assert "_StridedShard" in saved["placements"]  # FSDP2 on top of TP, the case ucp.dtensor refused
    loaded = run(_load_fsdp2, world=2, args=(path,))
    assert (loaded["step"], loaded["lr"], loaded["wd"]) == (3, 1e-2, 0.1)
    assert sorted(loaded["full"]) == sorted(saved["full"])
    assert saved["full"]["optim/0/step"] == 3
    for key, value in saved["full"].items():
        assert loaded["full"][key].tobytes() == value.tobytes(), key
    again = ucp.load(path + "-again")  # whole, in this process
    assert again["step"] == 3 and again["optim"]["state"][0]["step"] == 3
    assert again["model"]["0.weight"].numpy().tobytes() == saved["full"]["model/0.weight"].tobytes()
    assert again["optim"]["state"][3]["exp_avg_sq"].numpy().tobytes() == saved["full"]["optim/3/exp_avg_sq"].tobytes()
