"""Two real processes on gloo: save under tp=2 with a process group, load under dp=2 (whole tensors)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.integrations.launch import free_port
from ucp import ucl
from ucp.ucl.simulate import place, scatter
from ucp.layout import Layout

PROGRAM = """ucl 1
param vocab_size
tensor emb -> emb
  split dim 0 over tp
  pad dim 0 to multiple of tp.size * 4
  size dim 0 = vocab_size
tensor qkv
  fuse dim 0
    part q weight 2
    part k
    part v
  split dim 0 over tp
tensor norm -> norm
  replicate policy check-equal
"""


def _tensors():
    g = torch.Generator().manual_seed(7)
    return {"emb": torch.randn(10, 4, generator=g), "q": torch.randn(8, 4, generator=g),
            "k": torch.randn(4, 4, generator=g), "v": torch.randn(4, 4, generator=g), "norm": torch.randn(4, generator=g)}


def _worker(rank: int, port: int, path: str, out: str) -> None:
    import ucp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        text = PROGRAM.replace("param vocab_size", "param vocab_size = 10")  # the engine takes program text
        _, locals_ = place(text, "tp=2", _tensors())
        ucp.save(locals_[rank], path, program=text, layout="tp=2", process_group=dist.group.WORLD)
        dist.barrier()
        target = Layout.parse("dp=2")
        logical = ucp.CheckpointReader(path).logical()
        fmap = ucl.spec_for_load(text, target, rank, logical)
        into = {k: torch.zeros(t.shape) for k, t in ucl.local_shapes(fmap).items()}
        ucp.load(path, into=into, program=text, layout=target, rank=rank)
        want = scatter(_tensors(), fmap)
        ok = into.keys() == want.keys() and all(torch.equal(into[k], want[k]) for k in want)
        with open(f"{out}/{rank}", "w") as fh:
            fh.write("ok" if ok else "mismatch")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_save_with_a_process_group_and_reload_under_another_layout(tmp_path):
    port = free_port()
    ctx = mp.start_processes(_worker, args=(port, str(tmp_path / "ckpt"), str(tmp_path)), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 180
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("workers did not finish in 180 s")
    assert [(tmp_path / str(r)).read_text() for r in range(2)] == ["ok", "ok"]
