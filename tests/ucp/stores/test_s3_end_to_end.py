"""ucp.save / ucp.load / ucp.verify / CheckpointManager on ``s3://`` against a real S3 API (moto's server
on localhost): whole loads, a reshard load, refused and allowed overwrites, corruption found, retention."""

from __future__ import annotations

import fsspec
import pytest
import torch

import ucp
from ucp.manager import CheckpointManager
from ucp.policies import EveryNSteps, KeepLast
from ucp.sharding import local_shapes, split_fragment_map
from ucp.spec import LogicalTensor
from ucp.stores import StoreOptions

# Small chunks, so the 40x6 matrix is a multi-chunk array (through tensorstore and s3fs) while the
# vectors go into a pack.
OPTIONS = StoreOptions(chunk_bytes=256)
LOGICAL = {"w": LogicalTensor("w", (40, 6), "float32"), "b": LogicalTensor("b", (9,), "bfloat16")}


def _full() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(240, dtype=torch.float32).view(40, 6),
            "b": torch.arange(9, dtype=torch.float32).to(torch.bfloat16)}


def _part(full: torch.Tensor, spec, shape) -> torch.Tensor:
    out = torch.zeros(shape, dtype=full.dtype)
    for piece in spec.pieces:
        out[piece.local.slices()] = full[piece.target.slices()]
    return out


def test_save_load_verify_and_overwrite(s3):
    bucket, so = s3
    url = f"{bucket}/run/step_1"
    state = {"model": _full(), "step": 1, "lr": 0.5}
    assert ucp.save(state, url, storage_options=so, store_options=OPTIONS).committed
    loaded = ucp.load(url, storage_options=so)
    assert loaded["step"] == 1 and loaded["lr"] == 0.5
    for key, tensor in state["model"].items():
        assert torch.equal(loaded["model"][key], tensor)
    part = ucp.CheckpointReader(url, storage_options=so).read_tensor("model/w", ucp.Box((3, 1), (30, 4)))
    assert torch.equal(part, state["model"]["w"][3:33, 1:5])
    assert ucp.verify(url, storage_options=so).ok

    with pytest.raises(ucp.CheckpointExistsError) as err:
        ucp.save({"other": torch.ones(2)}, url, storage_options=so)
    assert str(err.value) == (f"a checkpoint already exists at {url}; pass overwrite=True to replace it or save to "
                              "a new path")
    assert torch.equal(ucp.load(url, storage_options=so)["model"]["w"], state["model"]["w"])  # untouched

    ucp.save({"other": torch.ones(2), "step": 2}, url, storage_options=so, overwrite=True)
    replaced = ucp.load(url, storage_options=so)
    assert sorted(replaced) == ["other", "step"] and torch.equal(replaced["other"], torch.ones(2))
    fs = fsspec.filesystem("s3", **so)
    keys = fs.find(url)
    assert len({k.split("/data/")[1].split("/")[0] for k in keys if "/data/" in k}) == 1  # old arrays removed


def test_corruption_on_s3_is_found_by_load_and_verify(s3):
    bucket, so = s3
    url = f"{bucket}/bad"
    ucp.save({"w": _full()["w"]}, url, storage_options=so, store_options=OPTIONS)
    fs = fsspec.filesystem("s3", **so)
    chunk = sorted(k for k in fs.find(url) if k.endswith("/c.0"))[0]  # the rank's pack (format 3)
    data = bytearray(fs.cat_file(chunk))
    data[5] ^= 0x40
    fs.pipe_file(chunk, bytes(data))
    with pytest.raises(ucp.ChecksumError, match=r"^checksum mismatch in tensor 'w': file s3://"):
        ucp.load(url, storage_options=so)
    report = ucp.verify(url, storage_options=so)
    assert not report.ok and [p.kind for p in report.problems] == ["ChecksumError"]


def test_reshard_load_from_s3(s3):
    bucket, so = s3
    url = f"{bucket}/sharded"
    full = _full()
    for rank in range(2):  # two ranks save without a process group, then one finalizes
        fmap = split_fragment_map(LOGICAL, rank=rank, world_size=2, dim=0)
        shapes = local_shapes(fmap)
        local = {k: _part(full[k], fmap.tensors[k], shapes[k]) for k in LOGICAL}
        ucp.save({**local, "step": 7}, url, spec=fmap, rank=rank, world_size=2, storage_options=so,
                 store_options=OPTIONS)
    ucp.finalize(url, world_size=2, storage_options=so)
    for rank in range(3):  # loaded by three ranks, each reading only its overlap
        fmap = split_fragment_map(LOGICAL, rank=rank, world_size=3, dim=0)
        out = ucp.load(url, spec=fmap, storage_options=so)
        shapes = local_shapes(fmap)
        assert out["step"] == 7
        for key in LOGICAL:
            assert torch.equal(out[key], _part(full[key], fmap.tensors[key], shapes[key])), (rank, key)


def test_checkpoint_manager_on_s3(s3):
    bucket, so = s3
    directory = f"{bucket}/managed"
    manager = CheckpointManager(directory, save_policy=EveryNSteps(1), retention=KeepLast(2),
                                save_options={"storage_options": so, "store_options": OPTIONS})
    state = {"w": torch.zeros(40, 6), "step": 0}
    for step in range(1, 5):
        state["w"].fill_(float(step))
        state["step"] = step
        assert manager.maybe_save(step, state) == f"{directory}/step_{step:08d}"
    assert manager.steps() == [3, 4]
    assert manager.latest(verify=True) == f"{directory}/step_00000004"
    into = {"w": torch.empty(40, 6), "step": -1}
    assert CheckpointManager(directory, save_options={"storage_options": so}).restore(into=into) == 4
    assert into["step"] == 4 and torch.equal(into["w"], torch.full((40, 6), 4.0))


def test_an_overwrite_leaves_a_concurrent_overwrite_save_whole(s3):
    from tests.ucp.overwrite_race import check_concurrent_overwrites

    bucket, so = s3
    check_concurrent_overwrites(f"{bucket}/run/step_1", so)
