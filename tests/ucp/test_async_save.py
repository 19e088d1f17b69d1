"""Async save: the staging pool (ring, budget, reuse) and AsyncSaver against real checkpoints."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
from pathlib import Path

import fsspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from fsspec.implementations.memory import MemoryFileSystem

from ucp.integrations.launch import free_port
import ucp
import ucp.async_saver
import ucp.state
from ucp.async_saver import AsyncSaveHandle, AsyncSaver
from ucp.errors import AsyncSaveError
from ucp.staging_pool import ALIGN, StagingPool, staged_nbytes

# ----------------------------------------------------------------------------- staging pool


def test_pool_reuses_the_same_memory_for_the_same_sizes() -> None:
    pool = StagingPool(budget_bytes=1 << 20)
    tensors = [torch.randn(100), torch.randn(7, 3).to(torch.bfloat16), torch.arange(5)]
    addresses = []
    for _ in range(3):
        pool.reserve(sum(staged_nbytes(t) for t in tensors))
        blocks = [pool.stage(t) for t in tensors]
        for block, t in zip(blocks, tensors):
            assert torch.equal(block.tensor, t) and block.tensor.dtype == t.dtype
        addresses.append([b.tensor.data_ptr() for b in blocks])
        for block in blocks:
            pool.release(block)
    assert addresses[0] == addresses[1] == addresses[2]
    assert pool.stats().arena_allocations == 1
    assert all(a % ALIGN == 0 for a in addresses[0])


def test_pool_capacity_is_the_state_size_capped_by_the_budget() -> None:
    pool = StagingPool(budget_bytes=4096)
    assert pool.reserve(1000) == 1000
    assert pool.reserve(800) == 1000  # never shrinks: the next save reuses it
    assert pool.reserve(10**9) == 4096
    assert pool.stats().arena_allocations == 2


def test_pool_ring_wraps_around_and_waits_for_space() -> None:
    pool = StagingPool(budget_bytes=4 * 256)
    pool.reserve(4 * 256)
    a, b, c = (pool.stage(torch.zeros(64)) for _ in range(3))  # 256 bytes each
    assert (a.start, b.start, c.start) == (0, 256, 512)
    with pytest.raises(ucp.errors.SaveTimeoutError, match="no staging space for 512 bytes within 0.05 s"):
        pool.stage(torch.zeros(128), timeout=0.05)
    pool.release(a)
    d = pool.stage(torch.zeros(64))
    assert d.start == 768  # the tail first, then around
    e = pool.stage(torch.zeros(64))
    assert e.start == 0
    pool.release(c)  # out of order: space is reclaimed only when older blocks are back
    assert pool.stats().in_use_bytes == 3 * 256
    with pytest.raises(TimeoutError):
        pool.stage(torch.zeros(64), timeout=0.05)
    pool.release(b)
    assert pool.stage(torch.zeros(128)).start == 256


def test_pool_streams_more_than_its_budget_without_exceeding_it() -> None:
    budget = 64 * 1024
    pool = StagingPool(budget_bytes=budget)
    tensors = [torch.full((1000 + 37 * i,), float(i)) for i in range(60)]  # ~0.5 MB in all
    assert sum(staged_nbytes(t) for t in tensors) > 5 * budget
    pool.reserve(sum(staged_nbytes(t) for t in tensors))
    handoff: list = []
    ready = threading.Condition()
    received: list[float] = []

    def consumer() -> None:
        for _ in tensors:
            with ready:
                ready.wait_for(lambda: handoff)
                block = handoff.pop(0)
            received.append(float(block.tensor[0]))
            pool.release(block)

    thread = threading.Thread(target=consumer)
    thread.start()
    for t in tensors:
        block = pool.stage(t)
        with ready:
            handoff.append(block)
            ready.notify()
    thread.join(timeout=30)
    assert received == [float(i) for i in range(60)]
    stats = pool.stats()
    assert stats.capacity_bytes == budget
    assert stats.peak_in_use_bytes <= budget
    assert stats.in_use_bytes == 0


def test_pool_rejects_what_can_never_fit_and_wakes_waiters_on_interrupt() -> None:
    pool = StagingPool(budget_bytes=1024)
    pool.reserve(1024)
    with pytest.raises(ValueError, match="tensor of 4032 bytes does not fit a staging arena of 1024 bytes"):
        pool.stage(torch.zeros(1000))
    pool.stage(torch.zeros(200))
    errors: list[BaseException] = []

    def wait_for_space() -> None:
        try:
            pool.stage(torch.zeros(200))
        except AsyncSaveError as err:
            errors.append(err)

    waiter = threading.Thread(target=wait_for_space)
    waiter.start()
    pool.interrupt(OSError("disk full"))
    waiter.join(timeout=10)
    assert len(errors) == 1 and "staging interrupted: disk full" in str(errors[0])
    assert isinstance(errors[0].__cause__, OSError)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(min_value=1, max_value=300), st.integers(min_value=0, max_value=3)),
             min_size=1, max_size=60),
    st.integers(min_value=1, max_value=16),
)
def test_pool_live_blocks_never_overlap(ops: list[tuple[int, int]], capacity_lines: int) -> None:
    # Stage tensors of random sizes, releasing random live blocks (out of order too) whenever
    # the ring is full; every live block must keep its own bytes and stay inside the arena.
    capacity = capacity_lines * 256
    pool = StagingPool(budget_bytes=capacity)
    pool.reserve(capacity)
    live: list[tuple[object, float]] = []
    for i, (numel, pick) in enumerate(ops):
        tensor = torch.full((numel,), float(i))
        if not pool.fits(tensor):
            continue
        while True:
            try:
                block = pool.stage(tensor, timeout=0)
                break
            except TimeoutError:
                old, value = live.pop(pick % len(live))
                assert torch.all(old.tensor == value)
                pool.release(old)
        live.append((block, float(i)))
        spans = sorted((b.start, b.end) for b, _ in live)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        assert spans[0][0] >= 0 and spans[-1][1] <= capacity
        assert pool.stats().in_use_bytes == sum(b.end - b.start for b, _ in live) <= capacity
    for block, value in live:
        assert torch.all(block.tensor == value)


def test_pool_budget_must_be_sane() -> None:
    with pytest.raises(ValueError, match="staging budget must be an integer of at least 64 bytes, got 10"):
        StagingPool(budget_bytes=10)


# ----------------------------------------------------------------------------- real filesystems
# Two small fsspec filesystems, real implementations of the fsspec protocol (in memory), that
# let a test hold the background writer at its first store write, or make that write fail
# the way a full disk does. Each keeps its own store so tests never see each other's files.


class GatedMemoryFS(MemoryFileSystem):
    protocol = "ucpgated"
    store: dict = {}
    pseudo_dirs = [""]
    gate = threading.Event()
    log: list[str] = []

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        self.gate.wait(timeout=60)
        self.log.append(path)
        return super().pipe_file(path, value, mode=mode, **kwargs)


class FullDiskMemoryFS(MemoryFileSystem):
    protocol = "ucpfull"
    store: dict = {}
    pseudo_dirs = [""]
    full = True

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        if self.full and "/data/" in path:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return super().pipe_file(path, value, mode=mode, **kwargs)


fsspec.register_implementation("ucpgated", GatedMemoryFS, clobber=True)
fsspec.register_implementation("ucpfull", FullDiskMemoryFS, clobber=True)


@pytest.fixture
def gate():
    GatedMemoryFS.store.clear()
    GatedMemoryFS.log.clear()
    GatedMemoryFS.gate.clear()
    yield GatedMemoryFS.gate
    GatedMemoryFS.gate.set()  # never leave a writer hanging


def make_state(n_small: int = 100, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "emb": torch.randn(50, 8, generator=g).to(torch.bfloat16)},
        "optim": {"state": {i: {"m": torch.randn(17, generator=g)} for i in range(n_small)}, "lr": 0.01},
        "step": 7,
        "rng": torch.arange(5, dtype=torch.int64),
    }


def assert_same_state(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.uint8) if a.numel() else a, b.view(torch.uint8) if b.numel() else b)
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            assert_same_state(a[k], b[k])
    else:
        assert a == b


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_async_save_equals_sync_save_bitwise(tmp_path: Path) -> None:
    state = make_state()
    ucp.save(state, tmp_path / "sync")
    saver = AsyncSaver()
    handle = saver.save(state, tmp_path / "async")
    assert isinstance(handle, AsyncSaveHandle)
    handle.wait(timeout=60)
    assert handle.done() and handle.exception() is None
    assert handle.blocking_seconds > 0 and handle.background_seconds is not None
    sync_files, async_files = files_of(tmp_path / "sync"), files_of(tmp_path / "async")
    manifests = [json.loads(f.pop("manifest.json")) for f in (sync_files, async_files)]
    for m in manifests:
        m.pop("created")
    assert manifests[0] == manifests[1]
    assert sync_files == async_files  # every zarr array, metadata and chunk, byte for byte
    assert_same_state(ucp.load(tmp_path / "async"), state)


UCL = "ucl 1\ntensor w -> w\n  split dim 0 over tp\ntensor b -> b\n  replicate over tp\n"


def test_async_save_with_a_ucl_program_equals_the_sync_save(tmp_path: Path) -> None:
    # The async path opens its writer the way ucp.save does: same spec, layout, program, parts.
    full_w, b = torch.arange(24.0).view(8, 3), torch.ones(3)
    saver = AsyncSaver()
    for rank in range(2):  # tp=2, each rank without a process group, then finalize
        local = {"w": full_w[rank * 4 : rank * 4 + 4].clone(), "b": b.clone(), "step": 9}
        ucp.save(local, tmp_path / "sync", program=UCL, layout="tp=2", rank=rank, world_size=2)
        saver.save(local, tmp_path / "async", program=UCL, layout="tp=2", rank=rank, world_size=2).wait(timeout=60)
    for name in ("sync", "async"):
        ucp.finalize(tmp_path / name, world_size=2)
    sync_files, async_files = files_of(tmp_path / "sync"), files_of(tmp_path / "async")
    manifests = [json.loads(f.pop("manifest.json")) for f in (sync_files, async_files)]
    for m in manifests:
        m.pop("created")
    assert manifests[0] == manifests[1] and manifests[0]["program"]["text"] == UCL
    assert sync_files == async_files
    out = ucp.load(tmp_path / "async", program=UCL, layout="tp=4", rank=3)
    assert torch.equal(out["w"], full_w[6:8]) and out["step"] == 9


def test_staging_buffers_are_reused_across_saves(tmp_path: Path) -> None:
    class RecordingPool(StagingPool):
        def __init__(self, **kw) -> None:
            super().__init__(**kw)
            self.pointers: list[int] = []

        def stage(self, tensor, **kw):
            block = super().stage(tensor, **kw)
            self.pointers.append(block.tensor.data_ptr())
            return block

    saver = AsyncSaver()
    saver.pool = RecordingPool(budget_bytes=1 << 20)
    state = make_state(n_small=10)
    runs = []
    for i in range(3):
        with torch.no_grad():
            state["model"]["w"].add_(1.0)
        saver.save(state, tmp_path / f"s{i}").wait()
        runs.append(saver.pool.pointers[:])
        saver.pool.pointers.clear()
        assert_same_state(ucp.load(tmp_path / f"s{i}"), state)
    assert len(runs[0]) == len(ucp.state.flatten_state(state).tensors)
    assert runs[0] == runs[1] == runs[2]
    assert saver.stats().arena_allocations == 1


def test_a_state_larger_than_the_budget_streams_within_it(tmp_path: Path) -> None:
    budget = 16 * 1024
    state = make_state(n_small=200)  # ~ 30 KB of vectors, 8 KB and 800 B matrices ...
    state["model"]["huge"] = torch.randn(10_000)  # ... and one tensor larger than the whole budget
    total = sum(staged_nbytes(t) for t in ucp.state.flatten_state(state).tensors.values())
    assert total > 3 * budget
    saver = AsyncSaver(staging_budget=budget)
    handle = saver.save(state, tmp_path / "c")
    expected = {k: v.clone() for k, v in state["model"].items()}
    with torch.no_grad():
        state["model"]["huge"].zero_()  # written from the caller's tensor before save() returned
    handle.wait(timeout=60)
    stats = saver.stats()
    assert stats.capacity_bytes == budget
    assert 0 < stats.peak_in_use_bytes <= budget
    loaded = ucp.load(tmp_path / "c")
    assert_same_state(loaded["model"], expected)
    assert_same_state(loaded["optim"], state["optim"])


def test_mutating_the_state_after_return_does_not_leak_into_the_checkpoint(gate) -> None:
    state = make_state(n_small=100)  # more tensors than the writer keeps in flight
    expected = {"model": {k: v.clone() for k, v in state["model"].items()},
                "optim": {"state": {i: {"m": s["m"].clone()} for i, s in state["optim"]["state"].items()}}}
    saver = AsyncSaver()
    handle = saver.save(state, "ucpgated://run/step_1")
    assert not handle.done()  # the writer is held at its first store write
    with torch.no_grad():
        for tensor in ucp.state.flatten_state(state).tensors.values():
            tensor.fill_(-1)
    state["step"] = 8
    state["optim"]["lr"] = 1.0
    gate.set()
    handle.wait(timeout=60)
    loaded = ucp.load("ucpgated://run/step_1")
    assert loaded["step"] == 7 and loaded["optim"]["lr"] == 0.01
    assert_same_state(loaded["model"], expected["model"])
    assert_same_state(loaded["optim"]["state"], expected["optim"]["state"])


def test_a_new_save_waits_for_the_one_in_flight(gate) -> None:
    saver = AsyncSaver()
    first = saver.save(make_state(n_small=3), "ucpgated://run/a")
    second: list[AsyncSaveHandle] = []
    starter = threading.Thread(target=lambda: second.append(saver.save(make_state(n_small=3), "ucpgated://run/b")))
    starter.start()
    starter.join(timeout=0.2)
    assert starter.is_alive() and not first.done()  # blocked behind the first save
    gate.set()
    starter.join(timeout=60)
    second[0].wait(timeout=60)
    assert first.done()
    writes = [p for p in GatedMemoryFS.log if "/data/" in p]
    last_a = max(i for i, p in enumerate(writes) if "/run/a/" in p)
    first_b = min(i for i, p in enumerate(writes) if "/run/b/" in p)
    assert last_a < first_b


def test_a_background_failure_surfaces_from_the_handle_and_the_next_save(tmp_path: Path) -> None:
    FullDiskMemoryFS.store.clear()
    FullDiskMemoryFS.full = True
    saver = AsyncSaver()
    handle = saver.save(make_state(n_small=3), "ucpfull://ckpt/step_1")  # returns: the snapshot worked
    with pytest.raises(AsyncSaveError, match="async save to ucpfull://ckpt/step_1 failed: OSError: .*No space left") as err:
        handle.wait(timeout=60)
    assert isinstance(err.value.__cause__, OSError) and err.value.__cause__.errno == errno.ENOSPC
    assert isinstance(handle.exception(), AsyncSaveError)  # asked again, still there
    with pytest.raises(AsyncSaveError, match="the previous async save failed") as again:
        saver.save(make_state(), tmp_path / "next")
    assert isinstance(again.value.__cause__, AsyncSaveError)
    assert not (tmp_path / "next").exists()  # the failing call saved nothing
    assert not FullDiskMemoryFS().exists("ckpt/step_1/manifest.json")  # nothing was committed
    FullDiskMemoryFS.full = False
    saver.save(make_state(), tmp_path / "next").wait(timeout=60)  # reported once, then the saver works
    assert ucp.load(tmp_path / "next")["step"] == 7


def test_a_failure_is_raised_by_the_next_save_even_if_the_handle_was_dropped(tmp_path: Path) -> None:
    FullDiskMemoryFS.store.clear()
    FullDiskMemoryFS.full = True
    saver = AsyncSaver()
    saver.save(make_state(n_small=3), "ucpfull://ckpt/step_2")
    with pytest.raises(AsyncSaveError, match="No space left on device"):
        saver.wait(timeout=60)
    saver.wait()  # already reported


def test_bad_input_is_refused_in_the_callers_thread(tmp_path: Path) -> None:
    saver = AsyncSaver()
    with pytest.raises(ucp.UnsafeObjectError, match="not JSON; pass allow_objects=True"):
        saver.save({"w": torch.ones(2), "obj": object()}, tmp_path / "a")
    ucp.save({"w": torch.ones(2)}, tmp_path / "b")
    with pytest.raises(ucp.CheckpointExistsError, match="a checkpoint already exists"):
        saver.save({"w": torch.ones(2)}, tmp_path / "b")
    saver.wait()  # nothing was started, nothing to report


def test_module_level_async_save(tmp_path: Path) -> None:
    import ucp.async_saver as module

    assert callable(ucp.async_save) and ucp.async_save is module.async_save  # the function, whatever was imported
    handle = ucp.async_save({"w": torch.arange(4.0), "step": 1}, tmp_path / "m")
    handle.wait(timeout=60)
    assert module.default_saver() is module.default_saver()
    assert torch.equal(ucp.load(tmp_path / "m")["w"], torch.arange(4.0))


# ----------------------------------------------------------------------------- two real processes
_WORKER = r"""
import sys, torch, torch.distributed as dist
from ucp.async_saver import AsyncSaver
from ucp.geometry import Box
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

rank, port, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
try:
    ckpt_group = dist.new_group(backend="gloo")  # dedicated to checkpointing
    full = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    local = full[4 * rank : 4 * rank + 4].clone()
    spec = FragmentMap(
        rank=rank,
        logical={"fc.weight": LogicalTensor("fc.weight", (8, 3), "float32")},
        tensors={"model/fc.weight": TensorSpec(
            key="model/fc.weight",
            pieces=(ShardPiece("fc.weight", local=Box((0, 0), (4, 3)), target=Box((4 * rank, 0), (4, 3))),),
        )},
    )
    saver = AsyncSaver()
    handle = saver.save({"model": {"fc.weight": local}, "step": 5}, path, process_group=ckpt_group, spec=spec)
    local.fill_(-1)  # training goes on: the snapshot is taken
    grad = torch.ones(3) * (rank + 1)
    dist.all_reduce(grad)  # a training collective on the default group, while the save runs
    assert grad.tolist() == [3.0, 3.0, 3.0]
    handle.wait(timeout=60)
    dist.barrier()
    print("ok", rank, handle.blocking_seconds >= 0)
finally:
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_distributed_async_save_on_a_dedicated_group(tmp_path: Path) -> None:
    port = free_port()
    path = str(tmp_path / "dist")
    repo = Path(__file__).resolve().parents[2]
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, str(rank), str(port), path], cwd=repo,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            outputs.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for code, _out, err in outputs:
        assert code == 0, err[-3000:]
    assert sorted(o[1].split()[1] for o in outputs) == ["0", "1"]
    # each rank wrote only its own rows; together they tile the logical tensor
    assert torch.equal(ucp.read_tensor(path, "fc.weight"), torch.arange(24, dtype=torch.float32).view(8, 3))
    assert ucp.load(path)["step"] == 5


def test_waiting_past_the_timeout_raises_a_ucp_timeout_error_and_loses_nothing(tmp_path):
    handle = ucp.async_saver.AsyncSaveHandle(tmp_path / "c")  # a save whose writer has not finished yet
    with pytest.raises(ucp.SaveTimeoutError, match=f"async save to {tmp_path / 'c'} still running after 0.01 s"):
        handle.wait(timeout=0.01)
    assert isinstance(ucp.SaveTimeoutError("x"), TimeoutError)  # code catching the builtin still works
    handle._finish(None)
    handle.wait(timeout=0.01)  # finished: no error
