"""FSDP2 on gloo, real processes: write a DCP checkpoint, or load one into a fresh FSDP2 model.

Used by the DCP format tests (spawned with torch.multiprocessing). The model's
dimensions do not divide by 3 (7 and 11 rows, 3 rows over 3 ranks), so FSDP2's
shards are uneven; the optimizer has two param groups with different
hyper-parameters and Adam state after two steps.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn as nn

from ucp.integrations.launch import free_port


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 5)
        self.l1 = nn.Linear(5, 3)
        self.l2 = nn.Linear(3, 11, bias=False)
        self.register_buffer("buf", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.tanh(self.l1(self.emb(x)))) + self.buf.sum()


def _setup(rank: int, world: int, port: int):
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = Tiny()
    fully_shard(model.l1)
    fully_shard(model)
    opt = torch.optim.AdamW([{"params": [model.emb.weight, model.l1.weight], "lr": 1e-2},
                             {"params": [model.l1.bias, model.l2.weight], "lr": 2e-2, "weight_decay": 0.0}])
    return model, opt


def _full(model, opt) -> dict:
    """Every tensor whole, by the logical names of the convention, plus the param groups."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:  # with cpu_offload, only rank 0 receives the whole state
        return {}
    out = {name: t.clone() for name, t in msd.items()}
    for param, states in osd["state"].items():
        for key, value in states.items():
            out[f"{param}/{key}"] = value.clone()
    groups = [{k: v for k, v in g.items() if k != "params"} | {"params": list(g["params"])}
              for g in osd["param_groups"]]
    return {"tensors": out, "param_groups": groups}


def _make(rank: int, world: int, port: int, root: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = _setup(rank, world, port)
    try:
        for _ in range(2):
            model(torch.arange(7)).sum().backward()
            opt.step()
            opt.zero_grad()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd, "step": 2, "extra": {"epoch": 1}}, checkpoint_id=f"{root}/dcp")
        full = _full(model, opt)
        if rank == 0:
            torch.save(full, f"{root}/full.pt")
    finally:
        dist.destroy_process_group()


def _load(rank: int, world: int, port: int, src: str, out: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, opt = _setup(rank, world, port)
    try:
        model(torch.arange(7)).sum().backward()  # create Adam state to load into
        opt.step()
        opt.zero_grad()
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=src)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        full = _full(model, opt)
        if rank == 0:
            torch.save(full, out)
    finally:
        dist.destroy_process_group()


def make(root: str, world: int = 3) -> None:
    """``root/dcp`` (DCP by FSDP2 on ``world`` ranks) and ``root/full.pt`` (the same state, whole)."""
    mp.spawn(_make, args=(world, free_port(), root), nprocs=world, join=True)


def load(src: str, out: str, world: int) -> None:
    """Load DCP ``src`` into a fresh FSDP2 model + optimizer on ``world`` ranks; write it whole to ``out``."""
    mp.spawn(_load, args=(world, free_port(), src, out), nprocs=world, join=True)
