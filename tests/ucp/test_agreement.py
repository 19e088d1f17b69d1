"""Every rank learns the first failing rank's message, without an all-gather (4 real processes on gloo).

One spawn runs every scenario in sequence (process start-up dominates the cost). In the
workers ``all_gather_object`` raises: the save and restore paths must not gather W objects
on every rank.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.integrations.launch import free_port
import ucp
from tests.ucp.test_distributed_failures import _expect
from ucp.agreement import Agreement, Failure, agree, first_failure
from ucp.manager import CheckpointManager
from ucp.policies import KeepAll
from ucp.sharding import split_fragment_map
from ucp.spec import LogicalTensor

WORLD = 4


def _no_all_gather(*args, **kwargs):
    raise AssertionError("all_gather_object: every rank would receive W objects")


def _first_failure(rank: int) -> None:
    # Ranks 1 and 3 fail with different messages: everyone hears rank 1's.
    message = {1: "OSError: disk full on rank 1", 3: "KeyError: 'layer 7'"}.get(rank)
    assert first_failure(message) == Failure(1, "OSError: disk full on rank 1")
    assert first_failure(None) is None
    assert first_failure("" if rank == 0 else None) is None  # an empty message is no failure, as before
    # A subgroup of global ranks 1, 2, 3: group ranks, and the broadcast comes from global rank 2.
    sub = dist.new_group([1, 2, 3], backend="gloo")
    if rank >= 1:
        group_rank = rank - 1
        message = f"failed in group rank {group_rank}" if group_rank >= 1 else None
        assert first_failure(message, group=sub) == Failure(1, "failed in group rank 1")
        assert first_failure(None, group=sub) is None
    dist.destroy_process_group(sub)


def _agree(rank: int) -> None:
    # Rank 1 has a problem, rank 3 is fatal: two different ranks' messages reach everyone.
    seen = agree({1: "ChecksumError: bad chunk", 3: "TypeError: wrong into"}.get(rank), fatal=rank == 3)
    assert seen == Agreement(Failure(1, "ChecksumError: bad chunk"), Failure(3, "TypeError: wrong into"))
    # Ranks 2 and 3 are fatal: the first fatal rank is also the first failure.
    seen = agree(f"E{rank}" if rank >= 2 else None, fatal=rank >= 2)
    assert seen == Agreement(Failure(2, "E2"), Failure(2, "E2"))
    assert agree(None) == Agreement(None, None)


def _save_fails_on_first_rank(rank: int, root: str) -> None:
    """ucp.save: ranks 1 and 3 have invalid states; ranks 0 and 2 name rank 1, fast."""
    state = {"w": torch.ones(2)}
    if rank == 1:
        state = {"w": torch.empty(2, device="meta")}
    elif rank == 3:
        state = {"w": torch.eye(2).to_sparse()}
    started = time.monotonic()
    save = lambda: ucp.save(state, f"{root}/bad", process_group=dist.group.WORLD)  # noqa: E731
    if rank == 1:
        _expect(save, ucp.UnsupportedTensorError, "tensor 'w' is on the meta device and has no data; materialize "
                "it (e.g. module.to_empty(device='cpu'), then initialize or load it) before saving")
    elif rank == 3:
        _expect(save, ucp.UnsupportedTensorError, "tensor 'w' is sparse (torch.sparse_coo), which the checkpoint "
                "format cannot store; save tensor.to_dense() (or its indices and values as separate tensors)")
    else:
        _expect(save, ucp.UcpError, "save failed on rank 1: UnsupportedTensorError: tensor 'w' is on the meta "
                "device and has no data; materialize it (e.g. module.to_empty(device='cpu'), then initialize or "
                "load it) before saving")
    assert time.monotonic() - started < 10  # failed fast, not at the process group timeout
    assert not Path(root, "bad").exists()


def _restore(rank: int, root: str) -> None:
    """The manager: damage on ranks 1 and 3 falls back with rank 1's message; a caller's error on them is fatal."""
    spec = split_fragment_map({"w": LogicalTensor("w", (8, 3), "float32")}, rank=rank, world_size=WORLD)
    manager = CheckpointManager(f"{root}/mgr", process_group=dist.group.WORLD, retention=KeepAll(),
                                save_options={"spec": spec})
    for step in (1, 2):
        manager.save(step, {"w": torch.full((2, 3), float(step)), "step": step})
    if rank in (1, 3):  # each damages the chunk it alone reads back, differently: rank 1 flips, rank 3 truncates
        chunk = next(p for p in Path(manager.path_for(2), "data", f"r{rank}").rglob("c*") if p.is_file())
        data = chunk.read_bytes()
        chunk.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:] if rank == 1 else data[:4])  # 'w' is bytes 0..24
    dist.barrier()
    into = {"w": torch.zeros(2, 3), "step": 0}
    with pytest.warns(ucp.RestoreFallbackWarning) as caught:
        step = manager.restore(into=into, spec=spec)
    assert step == 1 and into["step"] == 1 and torch.equal(into["w"], torch.ones(2, 3))
    messages = [str(w.message) for w in caught if issubclass(w.category, ucp.RestoreFallbackWarning)]
    assert len(messages) == 1 and messages[0].startswith(f"skipped {manager.path_for(2)}: ChecksumError: "), messages
    assert "/data/r1/" in messages[0] and "/data/r3/" not in messages[0], messages  # rank 1's, on every rank
    if rank == 3:  # its own damage is real, and it heard rank 1's instead
        with pytest.raises(ucp.TruncatedDataError, match=r"\(bytes 0\.\.24 wanted, 4 found\)"):
            ucp.load(manager.path_for(2), spec=spec)
    assert messages[0].endswith("(on rank 1)") == (rank != 1), messages

    # Ranks 1 and 3 pass an `into` the checkpoint does not fit (the caller's error): every rank raises.
    wrong = {1: {"w": torch.zeros(2, 3), "step": 0, "extra": torch.zeros(1)},
             3: {"w": torch.zeros(2, 3), "step": 0, "other": torch.zeros(1)}}.get(rank, into)
    def mismatch(key: str) -> str:
        return (f"keys do not match checkpoint {manager.path_for(2)}:\n  not expected by the target (1): {key}\n"
                "  a fresh optimizer has no per-parameter state yet: put the optimizer itself in the state "
                "({'optim': opt}), not opt.state_dict()\n"
                "  strict=False loads the keys both have and adds the saved ones the target lacks "
                "(those under top-level keys it does not have are skipped with a warning)")
    if rank in (1, 3):
        _expect(lambda: manager.restore(into=wrong, spec=spec), ucp.KeyMismatchError,
                mismatch("extra" if rank == 1 else "other"))
    else:
        _expect(lambda: manager.restore(into=wrong, spec=spec), ucp.RestoreError,
                f"restore failed on rank 1: KeyMismatchError: {mismatch('extra')}")
    dist.barrier()


def _worker(rank: int, port: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=30))
    dist.all_gather_object = _no_all_gather
    try:
        _first_failure(rank)
        _agree(rank)
        _save_fails_on_first_rank(rank, root)
        _restore(rank, root)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_every_rank_learns_the_first_failure(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    assert sorted(p.name for p in (tmp_path / "mgr").iterdir()) == ["step_00000001", "step_00000002"]
