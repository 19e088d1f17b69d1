"""DCP folders written by FSDP2 on gloo: read through DCP's storage layer, written back for any world size."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

import fsdp2_job
import ucp
from ucp.errors import FormatError, UnsafePickleError
from ucp.formats import get_format
from ucp.formats.dcp import DcpReader
from ucp.geometry import Box, FlatRange

# one worker runs this module: its session fixture (FSDP2 on 3 ranks) is built once (--dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fsdp2_dcp")]


def _reference(root):
    return torch.load(root / "full.pt", weights_only=True)


def test_fsdp2_checkpoint_reads_as_logical_tensors(fsdp2_dcp):
    ref = _reference(fsdp2_dcp)
    with DcpReader(fsdp2_dcp / "dcp") as reader:
        infos = {t.name: t for t in reader.tensors()}
        assert set(infos) == set(ref["tensors"])
        assert {"emb.weight", "buf", "emb.weight/exp_avg", "l2.weight/exp_avg_sq", "l1.bias/step"} <= set(infos)
        for name, tensor in ref["tensors"].items():
            assert torch.equal(infos[name].read(), tensor), name
        state = reader.state()
    assert state.step == 2 and state.extra["extra"] == {"epoch": 1}
    assert [g["params"] for g in state.param_groups] == [["emb.weight", "l1.weight"], ["l1.bias", "l2.weight"]]
    assert [(g["lr"], g["weight_decay"]) for g in state.param_groups] == [(1e-2, 1e-2), (2e-2, 0.0)]
    assert state.param_groups[0]["betas"] == {"$tuple": [0.9, 0.999]}  # a tuple, tagged in JSON


def test_region_reads_ask_only_for_the_chunks_they_overlap(fsdp2_dcp):
    ref = _reference(fsdp2_dcp)["tensors"]["emb.weight"]  # 7 rows on 3 ranks: chunks of 3, 3, 1 rows
    with DcpReader(fsdp2_dcp / "dcp") as reader:
        asked, through_dcp = [], []
        chunk_record = reader._chunk_record
        reader._chunk_record = lambda fqn, cbox: asked.append(cbox.offsets) or chunk_record(fqn, cbox)
        read_data = reader._storage.read_data
        reader._storage.read_data = lambda plan, sink: through_dcp.append(plan.items) or read_data(plan, sink)
        emb = next(t for t in reader.tensors() if t.name == "emb.weight")
        assert torch.equal(emb.read(Box((3, 1), (3, 2))), ref[3:6, 1:3])
        assert asked == [(3, 0)]
        asked.clear()
        assert torch.equal(emb.read(Box((2, 0), (5, 5))), ref[2:7])
        assert asked == [(0, 0), (3, 0), (6, 0)]
        assert torch.equal(emb.read(FlatRange(13, 31)), ref.reshape(-1)[13:31])
        assert through_dcp == []  # plain torch.save chunks: read straight from their records


def test_chunks_only_dcp_can_read_go_through_dcp(fsdp2_dcp, tmp_path):
    # A chunk with a stream transform (e.g. compression) or one that is not a plain torch.save'd tensor
    # is read by DCP's own FileSystemReader; the values are the same either way.
    ref = _reference(fsdp2_dcp)["tensors"]
    with DcpReader(fsdp2_dcp / "dcp") as reader:
        reader._locate = lambda fqn, cbox: None
        through_dcp = []
        read_data = reader._storage.read_data
        reader._storage.read_data = lambda plan, sink: through_dcp.append(plan.items) or read_data(plan, sink)
        compared = [info.name for info in reader.tensors() if info.name in ref
                    and torch.equal(info.read(Box.full(info.shape)), ref[info.name])]
        assert sorted(compared) == sorted(ref) and through_dcp


@pytest.mark.parametrize("world", [2, 1])
def test_written_dcp_loads_into_fsdp2_at_another_world_size(fsdp2_dcp, tmp_path, world):
    # FSDP2 (3 ranks) -> safetensors -> DCP (written here) -> FSDP2 on `world` ranks: every value survives.
    ucp.convert(fsdp2_dcp / "dcp", tmp_path / "st", dst_format="safetensors")
    ucp.convert(tmp_path / "st", tmp_path / "dcp", dst_format="dcp", memory_budget="4MiB")
    fsdp2_job.load(str(tmp_path / "dcp"), str(tmp_path / "loaded.pt"), world)
    ref, got = _reference(fsdp2_dcp), torch.load(tmp_path / "loaded.pt", weights_only=True)
    assert set(got["tensors"]) == set(ref["tensors"])
    for name, tensor in ref["tensors"].items():
        assert torch.equal(got["tensors"][name], tensor), name
    assert got["param_groups"] == ref["param_groups"]


def test_blocks_become_chunks_that_dcp_reassembles(tmp_path):
    import torch.distributed.checkpoint as dcp

    from ucp.formats.dcp import read_metadata

    big = torch.randn(50, 8)
    writer = get_format("dcp").open_writer(str(tmp_path / "dcp"), tensors=[ucp.LogicalTensor("big", (50, 8), "float32")],
                                           block_bytes=400)
    for box in (Box((0, 0), (12, 8)), Box((12, 0), (12, 8)), Box((24, 0), (26, 8))):
        writer.add_region("big", box, big[box.slices()])
    writer.set_state(ucp.formats.TrainingState())
    writer.close()
    chunks = read_metadata(str(tmp_path / "dcp")).state_dict_metadata["model.big"].chunks
    assert [tuple(c.offsets) for c in chunks] == [(0, 0), (12, 0), (24, 0)]
    state = {"model": {"big": torch.zeros(50, 8)}}
    dcp.load(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert torch.equal(state["model"]["big"], big)


def test_hostile_metadata_is_refused_and_nothing_runs(tmp_path, hostile):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(hostile))
    with pytest.raises(UnsafePickleError, match=r"\.metadata: the pickle calls posix\.system, which can run code; "
                                                r"refused \(nothing was executed\)"):
        DcpReader(folder)
    assert not hostile.path.exists()


def test_hostile_non_tensor_entry_is_refused_and_nothing_runs(tmp_path, hostile):
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(2), "evil": hostile}, checkpoint_id=str(tmp_path / "bad"), no_dist=True)
    assert not hostile.path.exists()
    with pytest.raises(UnsafePickleError, match=r"the pickle calls posix\.system, which can run code"):
        DcpReader(tmp_path / "bad")
    assert not hostile.path.exists()


def test_damaged_folders_say_what_is_wrong(fsdp2_dcp, tmp_path):
    import shutil

    bad = tmp_path / "trunc"
    shutil.copytree(fsdp2_dcp / "dcp", bad)
    data = bad / "__1_0.distcp"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(FormatError, match=r"needs bytes \d+\.\.\d+ of '__1_0\.distcp', which holds 100 \(truncated\)"):
        DcpReader(bad)
    (bad / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(FormatError, match=r"\.metadata cannot be read as DCP metadata .*damaged or truncated"):
        DcpReader(bad)
    os.remove(bad / ".metadata")
    with pytest.raises(FormatError, match="is not a DCP checkpoint: it has no .metadata"):
        DcpReader(bad)
