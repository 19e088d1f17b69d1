"""A bad tensor or a failure on one rank fails every rank, fast, with the cause (2 real processes on gloo).

Without that, the healthy ranks wait in a collective the failing rank never joins. The process
group's timeout is short, so a hang shows up as a timeout error, and the join has a deadline.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.integrations.launch import free_port
import ucp
from ucp.geometry import Box
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.writer import CheckpointWriter

WORLD = 2


def _expect(fn, cls, text):
    try:
        fn()
    except cls as err:
        assert str(err) == text, f"{type(err).__name__}: {err}"
    else:
        raise AssertionError(f"expected {cls.__name__}: {text}")


def _row_spec(rank: int, rows: int = 2) -> FragmentMap:
    """Rank r holds rows [2r, 2r+2) of a [4, 3] logical tensor; ``rows`` is what this rank claims to hold."""
    start = 2 * rank if rows == 2 else 4 - rows  # a wrong claim still fits the logical tensor
    return FragmentMap(rank=rank, logical={"w": LogicalTensor("w", (4, 3), "float32")}, tensors={
        "w": TensorSpec("w", (ShardPiece("w", Box((0, 0), (rows, 3)), Box((start, 0), (rows, 3))),)),
    })


def _scenarios(rank: int, root: str) -> None:
    group = dist.group.WORLD
    other = 1 - rank

    def on_rank1(bad, good):
        return bad if rank == 1 else good

    cases = [
        ("sparse", {"w": on_rank1(torch.eye(2).to_sparse(), torch.eye(2))}, None,
         ucp.UnsupportedTensorError, "tensor 'w' is sparse (torch.sparse_coo), which the checkpoint format cannot "
         "store; save tensor.to_dense() (or its indices and values as separate tensors)"),
        ("meta", {"w": on_rank1(torch.empty(2, device="meta"), torch.ones(2))}, None,
         ucp.UnsupportedTensorError, "tensor 'w' is on the meta device and has no data; materialize it (e.g. "
         "module.to_empty(device='cpu'), then initialize or load it) before saving"),
        ("spec", {"w": torch.ones(2, 3)}, _row_spec(rank, on_rank1(3, 2)),
         ucp.ShapeMismatchError, "tensor 'w' has shape [2, 3], which does not contain the spec's local box "
         "[0:3, 0:3]; fix the spec or pass the right tensor"),
        ("dtype", {"w": torch.ones(2, 3, dtype=on_rank1(torch.float16, torch.float32))}, _row_spec(rank, 2),
         ucp.ShapeMismatchError, "tensor 'w' is float16 but its spec maps it onto 'w' of dtype float32; convert "
         "the tensor (tensor.to(torch.float32)) or fix the spec"),
    ]
    for name, state, spec, cls, text in cases:
        started = time.monotonic()
        if rank == 1:
            _expect(lambda s=state, n=name, p=spec: ucp.save(s, f"{root}/{n}", spec=p, process_group=group), cls, text)
        else:
            _expect(lambda s=state, n=name, p=spec: ucp.save(s, f"{root}/{n}", spec=p, process_group=group), ucp.UcpError,
                    f"save failed on rank 1: {cls.__name__}: {text}")
        assert time.monotonic() - started < 10, name  # failed fast, not at the process group timeout

    def raising_spec(local):
        if rank == 1:
            raise KeyError("no such layer")
        return None
    if rank == 1:
        _expect(lambda: ucp.save({"w": torch.ones(2)}, f"{root}/callable", spec=raising_spec, process_group=group),
                KeyError, "'no such layer'")
    else:
        _expect(lambda: ucp.save({"w": torch.ones(2)}, f"{root}/callable", spec=raising_spec, process_group=group),
                ucp.UcpError, "save failed on rank 1: KeyError: 'no such layer'")

    # A failure after the writers opened: the failing rank aborts while the other closes.
    for aborting in (0, 1):
        writer = CheckpointWriter(f"{root}/late{aborting}", process_group=group)
        writer.add("w", torch.ones(2))
        if rank == aborting:
            writer.abort("OSError: disk full")
        else:
            _expect(writer.close, ucp.UcpError, f"save failed on rank {other}: OSError: disk full")
    dist.barrier()


def _restore_falls_back_together(rank: int, root: str) -> None:
    """Only rank 1 reads the damaged bytes of step 2; both ranks must restore step 1, and say so."""
    import warnings
    from pathlib import Path

    from ucp.manager import CheckpointManager
    from ucp.policies import KeepAll

    spec = _row_spec(rank)
    manager = CheckpointManager(f"{root}/mgr", process_group=dist.group.WORLD, retention=KeepAll(),
                                save_options={"spec": spec})
    for step in (1, 2):
        manager.save(step, {"w": torch.full((2, 3), float(step)), "step": step})
    if rank == 1:
        chunk = next(p for p in Path(manager.path_for(2), "data", "r1").rglob("c*") if p.is_file())
        raw = bytearray(chunk.read_bytes())
        raw[0] ^= 0xFF
        chunk.write_bytes(bytes(raw))
    dist.barrier()
    into = {"w": torch.zeros(2, 3), "step": 0}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert manager.restore(into=into, spec=spec) == 1
    assert into["step"] == 1 and torch.equal(into["w"], torch.ones(2, 3))
    messages = [str(w.message) for w in caught if issubclass(w.category, ucp.RestoreFallbackWarning)]
    assert len(messages) == 1 and messages[0].startswith(f"skipped {manager.path_for(2)}: ChecksumError: "), messages
    assert messages[0].endswith("(on rank 1)") == (rank == 0), messages
    dist.barrier()


def _worker(rank: int, port: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=20))
    try:
        _scenarios(rank, root)
        _restore_falls_back_together(rank, root)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_one_bad_rank_fails_every_rank_fast(tmp_path):
    context = mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=False)
    deadline = time.monotonic() + 240
    try:
        while not context.join(timeout=5):
            assert time.monotonic() < deadline, "the ranks hung"
    finally:
        for proc in context.processes:
            if proc.is_alive():
                proc.kill()
    assert os.listdir(tmp_path) == ["mgr"]  # the failed saves committed nothing, left no staging behind
