"""The compiler on real shapes: each construct against an explicit torch reference of what a rank holds."""

from __future__ import annotations

import pytest
import torch

from ucp import ucl
import ucp.ucl.check  # noqa: F401 - loads the submodule the tests call as ucl.check
from ucp.ucl.simulate import gather, place, scatter
from ucp.geometry import Box, FlatRange, split_evenly
from ucp.layout import Layout
from ucp.spec import LogicalTensor


def meta(tensors):
    return {n: LogicalTensor(n, tuple(t.shape), "float32") for n, t in tensors.items()}


def local_of(program, layout, rank, tensors, params=None):
    fmap = ucl.spec_for_load(program, layout, rank, meta(tensors), params=params)
    return fmap, scatter(tensors, fmap)


def roundtrip(program, layout, tensors, params=None):
    fmaps, locals_ = place(program, layout, tensors, params=params)
    back = gather(fmaps, locals_)
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert torch.equal(back[name], t), name
    return fmaps, locals_


SPLITS = """ucl 1
tensor col.weight -> col.weight
  split dim 0 over tp
tensor row.weight -> row.weight
  split dim 1 over tp
tensor deep.weight -> deep.weight
  split dim 2 over tp, cp
tensor odd.weight -> odd.weight
  split dim 0 over tp
  size dim 0 = odd_rows
param odd_rows
"""


@pytest.mark.parametrize("layout", ["tp=2", "tp=3,dp=2", "tp=4,cp=2"])
def test_column_row_and_any_dim_splits_including_uneven(layout):
    torch.manual_seed(0)
    t = {"col.weight": torch.randn(12, 5), "row.weight": torch.randn(5, 12), "deep.weight": torch.randn(2, 3, 24),
         "odd.weight": torch.randn(10, 3)}
    lay = Layout.parse(layout)
    fmaps, locals_ = roundtrip(SPLITS, lay, t, params={"odd_rows": 10})
    for rank, local in enumerate(locals_):
        c = lay.coords(rank)
        assert torch.equal(local["col.weight"], t["col.weight"].chunk(lay.tp)[c.tp])
        assert torch.equal(local["row.weight"], t["row.weight"].chunk(lay.tp, dim=1)[c.tp])
        assert torch.equal(local["deep.weight"], t["deep.weight"].chunk(lay.tp * lay.cp, dim=2)[c.tp * lay.cp + c.cp])
        off, n = split_evenly(10, lay.tp, c.tp)  # uneven: 10 rows over 3 or 4 ranks
        assert torch.equal(local["odd.weight"], t["odd.weight"][off : off + n])
        spec = fmaps[rank].tensors["col.weight"]
        assert (spec.replica, spec.replicas) == (c.cp * lay.dp + c.dp, lay.dp * lay.cp)


def test_uneven_split_without_a_declared_size_is_caught_by_the_checker():
    # Each rank alone is self-consistent (rank 2 of 10 rows over tp=3 holds 3 rows: "9 rows");
    # only all ranks together show the disagreement.
    report = ucl.check.check_program("ucl 1\ntensor odd.weight -> odd.weight\n  split dim 0 over tp\n", "tp=3",
                                     {"odd.weight": LogicalTensor("odd.weight", (10, 3), "float32")})
    assert [f.message for f in report.findings] == [
        "rank 0: local shapes imply 'odd.weight' (12, 3), the checkpoint has (10, 3) (declare 'size dim D = ...')",
        "rank 1: local shapes imply 'odd.weight' (9, 3), the checkpoint has (10, 3) (declare 'size dim D = ...')",
        "rank 2: local shapes imply 'odd.weight' (9, 3), the checkpoint has (10, 3) (declare 'size dim D = ...')",
    ]


def test_a_local_shape_that_contradicts_the_declared_size_is_an_error():
    with pytest.raises(ucl.UclError, match=r"local tensor 'odd.weight' has shape \(4, 3\), but logical shape"):
        ucl.spec_for_save("ucl 1\ntensor odd.weight -> odd.weight\n  split dim 0 over tp\n  size dim 0 = 10\n",
                          "tp=3", 2, {"odd.weight": ((4, 3), "float32")})  # rank 2 of 10 rows holds 3


@pytest.mark.parametrize("policy", ["check-equal", "take-first", "average"])
def test_replication_over_tp_cp_dp_with_policy(policy):
    src = f"ucl 1\ntensor norm.weight -> norm.weight\n  replicate over tp, cp, dp policy {policy}\n"
    lay = Layout.parse("tp=2,cp=2,dp=3")
    specs = [ucl.spec_for_save(src, lay, r, {"norm.weight": ((8,), "float32")}).tensors["norm.weight"]
             for r in range(lay.world_size)]
    assert {s.policy for s in specs} == {policy}
    assert {s.replicas for s in specs} == {12}
    assert sorted(s.replica for s in specs) == list(range(12))


def test_replicating_over_too_few_groups_is_found_by_the_checker():
    src = "ucl 1\ntensor norm.weight -> norm.weight\n  replicate over dp\n"
    report = ucl.check.check_program(src, "tp=2,dp=2", {"norm.weight": LogicalTensor("norm.weight", (8,), "float32")})
    kinds = {f.kind for f in report.findings}
    assert "overlap" in kinds and not report.ok


QKV = """ucl 1
param heads
param kv_heads
tensor qkv.weight
  fuse dim 0 groups kv_heads
    part q.weight weight heads // kv_heads
    part k.weight weight 1
    part v.weight weight 1
  split dim 0 over tp
tensor qkv_blocks.weight
  fuse dim 0
    part qb.weight weight heads
    part kb.weight weight kv_heads
    part vb.weight weight kv_heads
  split dim 0 over tp
tensor fc1.weight
  fuse dim 0
    part gate.weight
    part up.weight
  split dim 0 over tp
"""


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fused_gqa_qkv_interleaved_and_blocked_and_swiglu(tp):
    heads, kv, hd, hidden = 8, 4, 2, 6
    torch.manual_seed(tp)
    q, k, v = torch.randn(heads * hd, hidden), torch.randn(kv * hd, hidden), torch.randn(kv * hd, hidden)
    gate, up = torch.randn(12, hidden), torch.randn(12, hidden)
    t = {"q.weight": q, "k.weight": k, "v.weight": v, "qb.weight": q.clone(), "kb.weight": k.clone(),
         "vb.weight": v.clone(), "gate.weight": gate, "up.weight": up}
    _, locals_ = roundtrip(QKV, f"tp={tp}", t, params={"heads": heads, "kv_heads": kv})
    per_group = heads // kv
    for rank, local in enumerate(locals_):
        # Megatron: for each kv group on this rank, [its query heads; its k head; its v head]
        groups = range(rank * kv // tp, (rank + 1) * kv // tp)
        expect = torch.cat([torch.cat([q[g * per_group * hd : (g + 1) * per_group * hd], k[g * hd : (g + 1) * hd],
                                       v[g * hd : (g + 1) * hd]]) for g in groups])
        assert torch.equal(local["qkv.weight"], expect)
        # blocked: [q_t; k_t; v_t]
        blocked = torch.cat([q.chunk(tp)[rank], k.chunk(tp)[rank], v.chunk(tp)[rank]])
        assert torch.equal(local["qkv_blocks.weight"], blocked)
        assert torch.equal(local["fc1.weight"], torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]]))


VOCAB = """ucl 1
param vocab_size
tensor emb.weight -> emb.weight
  split dim 0 over tp
  pad dim 0 to multiple of tp.size * 4
  size dim 0 = vocab_size
"""


@pytest.mark.parametrize("tp,local_rows", [(1, 52), (2, 28), (4, 16)])
def test_vocab_padding_is_saved_stripped_and_repadded(tp, local_rows):
    emb = torch.randn(50, 3)
    fmaps, locals_ = roundtrip(VOCAB, f"tp={tp}", {"emb.weight": emb}, params={"vocab_size": 50})
    padded = torch.cat([emb, torch.zeros(-(-50 // (4 * tp)) * 4 * tp - 50, 3)])
    for rank, local in enumerate(locals_):
        assert local["emb.weight"].shape == (local_rows, 3)
        assert torch.equal(local["emb.weight"], padded.chunk(tp)[rank])
        assert fmaps[rank].local["emb.weight"].shape == (local_rows, 3)
        assert ucl.local_shapes(fmaps[rank])["emb.weight"].shape == (local_rows, 3)
    assert fmaps[0].logical["emb.weight"].shape == (50, 3)


def test_padding_needs_the_true_size_to_save():
    src = "ucl 1\ntensor emb -> emb\n  split dim 0 over tp\n  pad dim 0 to multiple of 8\n"
    with pytest.raises(ucl.UclError, match=r"<ucl>:2: dim 0 is padded, so its true size must be declared to save"):
        ucl.spec_for_save(src, "tp=2", 0, {"emb": ((4, 3), "float32")})


PIPE = """ucl 1
param num_layers
param stage_layers_list = []
let stage = v * pp.size + pp.rank
tensor model{v?}/layers.{i}.w -> layers.{stage_start(stage) + i}.w
  where v < vpp.size and i < stage_layers(stage)
tensor model{v?}/emb -> emb
  where v < vpp.size and v == 0 and pp.rank == 0
tensor model{v?}/head -> emb
  where v < vpp.size and v == vpp.size - 1 and pp.rank == pp.size - 1 and pp.size > 1
"""


@pytest.mark.parametrize("layout,stages,expect", [
    ("pp=2", [], [[0, 1, 2], [3, 4, 5]]),
    ("pp=3", [1, 3, 2], [[0], [1, 2, 3], [4, 5]]),
    ("pp=2,vpp=3", [], [[0, 2, 4], [1, 3, 5]]),  # chunk v of rank p holds layer v * pp + p
])
def test_pipeline_stage_renames_uniform_uneven_and_virtual(layout, stages, expect):
    t = {f"layers.{i}.w": torch.full((2,), float(i)) for i in range(6)}
    t["emb"] = torch.randn(3, 2)
    fmaps, locals_ = roundtrip(PIPE, layout, t, params={"num_layers": 6, "stage_layers_list": stages})
    for rank, local in enumerate(locals_):
        got = sorted(int(v[0]) for k, v in local.items() if k.endswith(".w"))
        assert got == expect[rank]
    lay = Layout.parse(layout)
    if lay.vpp > 1:
        assert "model1/layers.0.w" in locals_[0] and "model0/layers.0.w" in locals_[0]
    else:
        assert "model/layers.0.w" in locals_[0]
    # the tied embedding: first and last stage are the two replicas of one logical tensor
    first, last = fmaps[0].tensors["model/emb" if lay.vpp == 1 else "model0/emb"], fmaps[-1].tensors[
        "model/head" if lay.vpp == 1 else f"model{lay.vpp - 1}/head"]
    assert (first.replica, first.replicas, last.replica, last.replicas) == (0, 2, 1, 2)


EXPERTS = """ucl 1
param num_experts
tensor experts.{e}.w -> experts.{e + ep.rank * (num_experts // ep.size)}.w
  where e < num_experts // ep.size
"""


@pytest.mark.parametrize("layout", ["dp=4,ep=1", "dp=4,ep=2", "dp=4,ep=4"])
def test_expert_index_renames_with_experts_per_rank_changing(layout):
    t = {f"experts.{e}.w": torch.full((3,), float(e)) for e in range(8)}
    fmaps, locals_ = roundtrip(EXPERTS, layout, t, params={"num_experts": 8})
    lay = Layout.parse(layout)
    per = 8 // lay.ep
    for rank, local in enumerate(locals_):
        c = lay.coords(rank)
        assert len(local) == per
        assert [int(local[f"experts.{e}.w"][0]) for e in range(per)] == [e + c.ep * per for e in range(per)]
        spec = fmaps[rank].tensors["experts.0.w"]
        assert (spec.replica, spec.replicas) == (c.edp, lay.dp // lay.ep)


def _deepspeed_reference_partition(tensors, dp, rank, align=2):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    total = -(-flat.numel() // (align * dp)) * align * dp
    flat = torch.cat([flat, torch.zeros(total - flat.numel())])
    return flat.chunk(dp)[rank]


FLAT = """ucl 1
param states = [exp_avg, exp_avg_sq]
tensor model/{name*} -> {name}
flat optim/{s:states}/flat -> {name}/{s}
  members model/*
  partition over dp pad to multiple of 2 * dp.size
"""


@pytest.mark.parametrize("dp", [1, 2, 3, 4])
def test_zero_flat_partitions_of_every_state_at_arbitrary_offsets(dp):
    torch.manual_seed(dp)
    shapes = {"a": (5, 3), "b": (7,), "c": (2, 2, 3)}
    t = {n: torch.randn(s) for n, s in shapes.items()}
    for n, s in shapes.items():
        t[f"{n}/exp_avg"], t[f"{n}/exp_avg_sq"] = torch.randn(s), torch.randn(s)
    fmaps, locals_ = roundtrip(FLAT, f"dp={dp},zero=1", t)
    for rank, local in enumerate(locals_):
        for s in ("exp_avg", "exp_avg_sq"):
            ref = _deepspeed_reference_partition([t[f"{n}/{s}"] for n in sorted(shapes)], dp, rank)
            assert torch.equal(local[f"optim/{s}/flat"], ref)
        assert all(isinstance(p.local, FlatRange) for p in fmaps[rank].tensors["optim/exp_avg/flat"].pieces)


ZERO_TP = """ucl 1
param states = [fp32, momentum_buffer]
tensor col -> col
  split dim 0 over tp
tensor row -> row
  split dim 1 over tp
tensor norm -> norm
flat optim/{s:states} -> {name}/{s}
  members *
  partition over dp
  align 4
"""


@pytest.mark.parametrize("layout", ["tp=2,dp=2", "tp=2,dp=3,cp=2", "tp=4,dp=2"])
def test_flat_partitions_of_tp_shards_with_alignment_for_sgd_momentum(layout):
    torch.manual_seed(1)
    shapes = {"col": (8, 6), "row": (6, 8), "norm": (6,)}
    t = {n: torch.randn(s) for n, s in shapes.items()}
    for n, s in shapes.items():
        t[f"{n}/fp32"], t[f"{n}/momentum_buffer"] = torch.randn(s), torch.randn(s)
    lay = Layout.parse(layout)
    fmaps, locals_ = roundtrip(ZERO_TP, lay, t)
    for rank, local in enumerate(locals_):
        c = lay.coords(rank)
        # reference: the rank's TP shards, flattened in member order with 4-element alignment, cut in dp parts
        shards = {"col": t["col/momentum_buffer"].chunk(lay.tp)[c.tp],
                  "norm": t["norm/momentum_buffer"], "row": t["row/momentum_buffer"].chunk(lay.tp, dim=1)[c.tp]}
        parts, pos = [], 0
        for name in ("col", "norm", "row"):
            pad = -pos % 4
            parts += [torch.zeros(pad), shards[name].reshape(-1)]
            pos += pad + shards[name].numel()
        flat = torch.cat(parts)
        flat = torch.cat([flat, torch.zeros(-flat.numel() % lay.dp)])
        chunk = flat.chunk(lay.dp)[c.dp]
        got = local["optim/momentum_buffer"]
        mask = torch.zeros_like(got, dtype=torch.bool)
        for p in fmaps[rank].tensors["optim/momentum_buffer"].pieces:
            mask[p.local.start : p.local.stop] = True
        assert torch.equal(got[mask], chunk[mask])
        spec = fmaps[rank].tensors["optim/fp32"]
        assert spec.replicas == lay.cp  # identical across context-parallel ranks only


FACTORED = """ucl 1
tensor w -> w
  split dim 0 over tp
also opt/row/{key} -> {name}/exp_avg_sq_row
also opt/step/{key} -> {name}/step scalar
tensor opt/col/w -> w/exp_avg_sq_col
"""


def test_adafactor_like_factored_states_and_scalar_steps():
    t = {"w": torch.randn(8, 4), "w/exp_avg_sq_row": torch.randn(8), "w/exp_avg_sq_col": torch.randn(4),
         "w/step": torch.tensor(7.0)}
    # the row factor (one value per row) follows the row split; the column factor is replicated
    fmaps, locals_ = roundtrip(FACTORED.replace("also opt/row/{key} -> {name}/exp_avg_sq_row\n", "")
                               + "tensor opt/row/w -> w/exp_avg_sq_row\n  split dim 0 over tp\n", "tp=2,dp=2", t)
    assert torch.equal(locals_[1]["opt/row/w"], t["w/exp_avg_sq_row"][4:])
    assert torch.equal(locals_[1]["opt/col/w"], t["w/exp_avg_sq_col"])
    step = fmaps[3].tensors["opt/step/w"]
    assert locals_[3]["opt/step/w"].shape == () and (step.replica, step.replicas) == (3, 4)


def test_save_errors_name_the_tensor_and_rule():
    with pytest.raises(ucl.UclError, match=r"no rule maps local tensor 'extra' on rank 0 of tp=2"):
        ucl.spec_for_save("ucl 1\ntensor w -> w\n", "tp=2", 0, {"w": ((2,), "float32"), "extra": ((1,), "float32")})
    with pytest.raises(ucl.UclError, match=r"rules at lines \[2\] match but their 'where' is false"):
        ucl.spec_for_save("ucl 1\ntensor w -> w\n  where pp.rank == 1\n", "pp=2", 0, {"w": ((2,), "float32")})
    with pytest.raises(ucl.UclError, match=r"'heads' has no value"):
        ucl.spec_for_save(QKV, "tp=2", 0, {"qkv.weight": ((8, 2), "float32")}, params={"kv_heads": 2})


def test_checker_reports_rules_that_match_nothing_and_passes_good_programs():
    lt = {"w": LogicalTensor("w", (8, 4), "float32")}
    report = ucl.check.check_program("ucl 1\ntensor w -> w\n  split dim 0 over tp\ntensor ghost -> ghost\n", "tp=2,pp=2,dp=2", lt)
    assert report.ok and [(f.kind, f.message) for f in report.warnings] == [
        ("unused-rule", "<ucl>:4: rule 'ghost' matched nothing on any rank of tp=2,pp=2,dp=2")]
    off = ucl.check.check_program("ucl 1\ntensor w -> w\ntensor ghost -> ghost\n  where zero.stage == 3\n", "dp=2", lt)
    assert off.ok and not off.warnings  # switched off for this layout: not worth a warning
    good = ucl.check.check_program("ucl 1\ntensor w -> w\n  split dim 0 over tp\n", "tp=2,pp=2,dp=2", lt)
    assert good.ok and good.ranks == 8


def test_a_box_piece_is_exactly_the_rank_region():
    fmap = ucl.spec_for_load(SPLITS, "tp=2", 1, {"row.weight": LogicalTensor("row.weight", (5, 12), "float32")},
                             params={"odd_rows": 1})
    (piece,) = fmap.tensors["row.weight"].pieces
    assert (piece.local, piece.target) == (Box((0, 0), (5, 6)), Box((0, 6), (5, 6)))
