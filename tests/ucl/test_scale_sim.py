"""The scale simulator plans exactly the fragments the writer records, and runs end to end on a tiny model.

``ucp.fragment_plan.planned_fragments`` is what ``ucp/tools/bench/scale_sim.py`` counts at 16,384
ranks; here a real save (zero=1 flat buffers, replicated weights spread over dp, packs or not)
is compared with it, fragment by fragment.
"""

from __future__ import annotations

import pytest

from ucp import ucl
import ucp
import ucp.stores
import ucp.write_units
import ucp.writer
from ucp.tools.bench import scale_sim
from ucp.ucl.simulate import place
from ucp.fragment_plan import planned_fragments
from ucp.layout import Layout
from ucp.metadata_shards import GroupPlan
from ucp.spec import LogicalTensor


def manifest_logical(manifest) -> dict:
    return {n: LogicalTensor(n, e.shape, e.dtype) for n, e in manifest.tensors.items()}

PARAMS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=48, heads=4, kv_heads=4, vocab_size=50, vocab_multiple=4)


def _facts(fragments) -> list[tuple]:
    return sorted((name, str(f.region), f.nbytes, f.chunk_rows, len(f.checksums), f.pack_offset is None)
                  for name, f in fragments)


@pytest.mark.parametrize("pack", [True, False])
def test_planned_fragments_are_the_ones_the_writer_records(tmp_path, models, monkeypatch, pack):
    monkeypatch.setattr(ucp.write_units, "SPREAD_MIN_BYTES", 512)  # so the tiny weights spread over dp too
    pack_max = ucp.stores.DEFAULT_OPTIONS.pack_max_bytes if pack else 0
    options = ucp.stores.StoreOptions(pack_max_bytes=pack_max)
    program = ucl.load_program("megatron-gpt", **PARAMS)
    tensors = models.megatron(layers=2, hidden=32, heads=4, kv_heads=4, vocab=50, ffn=48)
    layout = Layout.parse("tp=2,pp=2,dp=2,zero=1")
    path = str(tmp_path / "c")
    fmaps, locals_ = place(program, layout, tensors)
    for rank, local in enumerate(locals_):
        ucp.save(local, path, spec=fmaps[rank], rank=rank, world_size=layout.world_size, store_options=options)
    ucp.finalize(path, world_size=layout.world_size)
    manifest = ucp.CheckpointReader(path).manifest
    spread = 0
    for rank, fmap in enumerate(fmaps):
        planned = planned_fragments(fmap, rank=rank, pack_max=pack_max)
        saved = [(n, f) for n, e in manifest.tensors.items() for f in e.fragments if f.rank == rank]
        assert _facts((n, f) for n, fl in planned.items() for f in fl) == _facts(saved), rank
        assert {f.key for _, fl in planned.items() for f in fl} == {f.key for _, f in saved}
        spread += sum(1 for spec in fmap.tensors.values() if spec.replicas > 1 for _ in spec.pieces)
    assert spread  # replicated pieces took part
    # The simulator's format-2 shard index never names fewer shards than the save's fragments fill.
    plan = GroupPlan(layout.world_size)
    holders = scale_sim.shard_holders(program, layout, manifest_logical(manifest))
    for name, entry in manifest.tensors.items():
        actual = {plan.group_of(f.rank) for f in entry.fragments}
        estimate = holders[name]
        assert (actual <= set(estimate)) if min(estimate) >= 0 else len(actual) <= len(estimate), name


def test_the_simulator_computes_every_rank_of_a_small_layout_and_plans_a_reshard_load():
    tiny = scale_sim.Scenario("tiny", PARAMS, "tp=2,pp=2,dp=2", "tp=2,pp=2,dp=1")
    row = scale_sim.run_scenario(tiny, 1, samples=8, load_samples=1)
    assert row["exact"] and row["sampled_ranks"] == 8 and row["world"] == 8
    assert row["fragments_per_rank_max"] <= row["run_fragments_per_rank_max"]
    assert row["load_ranks"] == 1 and row["load_overlaps_planned"] and row["load_copy_ops_max"] > 0
    assert "| tiny | tp=2,pp=2,dp=2,zero=1 | 8 (8) |" in scale_sim.markdown([row])
    v2 = row["format2"]  # groups of ceil(sqrt(8)) = 3 ranks; the loading rank (stage 1) reads groups 1 and 2
    assert (v2["groups"], v2["group_ranks"], v2["shards_read_max"]) == (3, 3, 2)
    assert v2["root_bytes"] < row["manifest_bytes"] and v2["read_bytes_max"] > v2["root_bytes"]


def test_the_simulator_refuses_unknown_scenarios(capsys):
    assert scale_sim.main(["--scenarios", "llama7b"]) == 2
    assert "scale_sim: unknown scenario or zero ['llama7b']" in capsys.readouterr().err
