"""The zero=1 scenario of ucp/tools/bench/ucl_reshard.py: its state, checked against the UCL preset, and a smoke run."""

import json
import math
import os

import pytest
import torch

from ucp import ucl
from ucp.integrations.llama.model import logical_shapes
from ucp.integrations.megatron.sharding import local_shards
from ucp.tools.bench import ucl_reshard
from ucp.tools.bench.megatron_state import (
    STATES, check_layout, flat_ranges, logical_values, model_for, rank_state, state_bytes,
)
from ucp.tools.bench.zero1_reshard import _program
from ucp.geometry import Box
from ucp.layout import Layout
from ucp.spec import LogicalTensor


def test_values_of_a_box_are_the_slice_of_the_whole_tensor(monkeypatch):
    monkeypatch.setattr("ucp.tools.bench.megatron_state._SLAB", 7)  # several slabs, one cut mid-box
    whole = logical_values("w/exp_avg", (5, 6, 4), Box.full((5, 6, 4)))
    part = logical_values("w/exp_avg", (5, 6, 4), Box((1, 2, 1), (4, 3, 2)))
    assert torch.equal(part, whole[1:5, 2:5, 1:3])
    assert not torch.equal(whole, logical_values("w/fp32", (5, 6, 4), Box.full((5, 6, 4))))
    assert whole.abs().max() <= 1.0 and whole.unique().numel() > 100


@pytest.mark.parametrize("gib", [0.001, 0.05, 2.0])
def test_model_for_reaches_the_size_without_much_more(gib):
    cfg = model_for(gib, tp=2)
    optimizer = state_bytes(cfg)["optimizer"]
    assert gib * 2**30 <= optimizer <= 1.3 * gib * 2**30
    assert cfg.vocab_size % (2 * 128) == 0 and cfg.kv_heads % 2 == 0


@pytest.mark.parametrize("layout", ["tp=2,dp=4,zero=1", "tp=2,dp=3,zero=1", "tp=1,dp=3,zero=1"])
def test_parts_tile_the_buffer_and_match_the_preset(layout):
    cfg = model_for(0.002, tp=2)
    lay = Layout.parse(layout)
    shards = local_shards(cfg, lay, 0)
    total = sum(math.prod(s.shape) for s in shards.values())
    covered = []
    for dp_rank in range(lay.dp):
        part, ranges = flat_ranges(shards, lay.dp, dp_rank)
        assert part * lay.dp >= total > part * (lay.dp - 1)
        covered += [(dp_rank * part + at, length) for _, _, at, length in ranges]
    at = 0
    for start, length in covered:  # contiguous, in order, no gap and no overlap
        assert start == at
        at += length
    assert at == total
    # the shapes the shipped megatron-gpt preset says each rank holds are the ones built here
    logical = {n: LogicalTensor(n, s, "float32") for n, s in logical_shapes(cfg).items()}
    logical |= {f"{n}/{s}": LogicalTensor(f"{n}/{s}", t.shape, "float32") for n, t in logical.items() for s in STATES}
    for rank in range(lay.world_size):
        params, flats = rank_state(cfg, lay, rank)
        fmap = ucl.spec_for_load(_program(cfg), lay, rank, logical)
        want = {k: tuple(t.shape) for k, t in ucl.local_shapes(fmap).items()}
        have = {f"model/{k}": tuple(t.shape) for k, t in params.items()} | {
            f"optim/{s}/dense": tuple(f.shape) for s, f in flats.items()}
        assert have == want


def test_only_tp_by_dp_with_the_distributed_optimizer():
    with pytest.raises(ValueError, match=r"^layout tp=2,pp=2,dp=2,zero=1: the zero=1 benchmark models tp x dp "
                                         r"with zero=1 only \(pp, cp and ep 1\), e.g. tp=2,dp=4,zero=1$"):
        check_layout(Layout.parse("tp=2,pp=2,dp=2,zero=1"))


def test_cli_refuses_another_layout(capsys):
    assert ucl_reshard.main(["--zero1", "--target", "tp=2,dp=2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "ucl_reshard: layout tp=2,dp=2: the zero=1 benchmark models tp x dp with zero=1 only (pp, cp and ep 1), "
        "e.g. tp=2,dp=4,zero=1")


@pytest.mark.slow
def test_zero1_smoke_4_to_2(tmp_path, capsys):
    argv = ["--zero1", "--gib", "0.005", "--source", "tp=2,dp=2,zero=1", "--target", "tp=2,dp=1,zero=1",
            "--repeats", "2", "--dir", str(tmp_path), "--json"]
    assert ucl_reshard.main(argv) == 0
    [report] = json.loads(capsys.readouterr().out)
    assert report["identical"] and report["optimizer_gib"] >= 0.005
    for system in ("ucp", "dcp"):
        s = report["systems"][system]
        assert s["correct"], system
        assert s["fragments"] > s["optimizer_fragments"] > 0 and s["metadata_bytes"] > 0
        assert s["disk_bytes"] >= report["state_gib"] * 2**30
        for key in ("save_seconds", "load_seconds", "save_peak_rss_gib", "load_peak_rss_gib"):
            assert s[key] > 0, (system, key)
        for key in ("save_seconds", "load_seconds"):  # saves repeat too, interleaved: median (min-max)
            assert 0 < s[f"{key}_min"] <= s[key] <= s[f"{key}_max"], (system, key)
    assert set(report["ratios"]) == {"fragments", "metadata_bytes", "save_seconds", "load_seconds",
                                     "save_peak_rss_gib", "load_peak_rss_gib", "disk_bytes"}
    assert list(tmp_path.iterdir()) == []  # the work directory is removed


def test_metadata_bytes_count_the_manifest_and_its_shards(tmp_path):
    import torch.distributed.checkpoint as dcp

    import ucp
    from ucp.tools.bench.zero1_reshard import metadata_summary

    ucp.save({"w/exp_avg": torch.ones(4), "w": torch.ones(2)}, tmp_path / "u")
    dcp.save({"optimizer.state.exp_avg.w": torch.ones(4), "model.w": torch.ones(2)}, checkpoint_id=tmp_path / "d")
    before = metadata_summary(str(tmp_path / "u"), str(tmp_path / "d"))
    assert before["ucp"]["metadata_bytes"] == (tmp_path / "u" / "manifest.json").stat().st_size
    assert before["dcp"]["metadata_bytes"] == (tmp_path / "d" / ".metadata").stat().st_size
    assert (before["ucp"]["fragments"], before["ucp"]["optimizer_fragments"]) == (2, 1)
    assert (before["dcp"]["fragments"], before["dcp"]["optimizer_fragments"]) == (2, 1)
    shard = tmp_path / "u" / "data" / "5f2a" / "meta" / "g00000.json"  # where format 2 puts its shards
    shard.parent.mkdir(parents=True)
    shard.write_text("{}" * 50)
    assert metadata_summary(str(tmp_path / "u"), str(tmp_path / "d"))["ucp"]["metadata_bytes"] == \
        before["ucp"]["metadata_bytes"] + 100


def test_cli_refuses_unknown_store_options(capsys):
    assert ucl_reshard.main(["--zero1", "--store-options", "packs=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ucl_reshard: store option 'packs=0' is not NAME=VALUE with a known NAME (chunk_bytes, ")


def test_the_profile_hook_writes_one_stats_file_per_run_and_is_off_by_default(tmp_path, monkeypatch):
    import pstats

    from ucp.tools.bench.zero1_reshard import _profiled

    ran = []
    monkeypatch.delenv("UCP_BENCH_PROFILE", raising=False)
    plain = lambda: ran.append(1)  # noqa: E731
    assert _profiled(plain, "save-ucp-0") is plain
    monkeypatch.setenv("UCP_BENCH_PROFILE", str(tmp_path / "prof"))
    _profiled(plain, "save-ucp-0")()
    assert ran == [1] and sorted(os.listdir(tmp_path / "prof")) == ["save-ucp-0-r0.prof"]
    assert pstats.Stats(str(tmp_path / "prof" / "save-ucp-0-r0.prof")).total_calls > 0
