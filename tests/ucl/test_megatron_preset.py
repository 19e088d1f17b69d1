"""megatron-gpt preset edges: tied embeddings with the distributed optimizer, and the layouts Megatron refuses.

Tied embeddings (tie_embeddings=1, pp > 1): the last stage's output_layer.weight is a copy of the
first stage's embedding, so it and its optimizer states are replicas of the embedding's, saved once.
With the distributed optimizer (zero >= 1) those states live at different offsets of different flat
buffers on the first and the last stage; the references below are built independently of the
compiler's flat code: the flat buffer must be the concatenation of the states that the
non-distributed optimizer (zero=0) keeps beside each parameter, cut into dp partitions.
"""

from __future__ import annotations

import re

import pytest
import torch

from ucp import ucl
import ucp.ucl.check  # noqa: F401 - loads the submodule the tests call as ucl.check
from ucp.ucl.simulate import gather, place
from ucp.layout import Layout
from ucp.spec import LogicalTensor

PARAMS = dict(num_layers=4, hidden_size=16, ffn_hidden_size=16, heads=8, kv_heads=4, vocab_size=50, vocab_multiple=4,
              tie_embeddings=1)
EMB = "embedding.word_embeddings.weight"


def _tensors(models):
    return models.megatron(layers=4, hidden=16, heads=8, kv_heads=4, vocab=50, ffn=16, tie=1)


def _natural(key: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def test_tied_output_layer_is_a_padded_copy_of_the_embedding_on_the_last_stage(models):
    tensors = _tensors(models)
    layout = Layout.parse("tp=2,pp=2,dp=2,zero=1")
    fmaps, locals_ = place("megatron-gpt", layout, tensors, params=PARAMS)
    assert not any(n.startswith("output_layer") for f in fmaps for n in f.logical)  # one logical tensor
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        if c.pp != 1:
            assert "model/output_layer.weight" not in locals_[rank]
            continue
        out = locals_[rank]["model/output_layer.weight"]
        # vocab 50 padded to a multiple of tp*4 = 8: 56 rows, 28 per tp rank, padding never saved
        rows = range(28 * c.tp, min(28 * (c.tp + 1), 50))
        assert out.shape == (28, 16) and torch.equal(out[: len(rows)], tensors[EMB][rows.start : rows.stop])
        spec = fmaps[rank].tensors["model/output_layer.weight"]
        # replicas: 2 dp ranks x {first stage's embedding, this copy}; the first stage holds the even indices
        assert (spec.replica, spec.replicas) == (2 * c.dp + 1, 4)


@pytest.mark.parametrize("state", ["fp32", "exp_avg", "exp_avg_sq"])
def test_last_stage_flat_buffer_holds_the_tied_states_and_the_first_stage_saves_them(models, state):
    tensors = _tensors(models)
    dist = Layout.parse("tp=2,pp=2,dp=2,zero=1")
    beside = Layout.parse("tp=2,pp=2,dp=2,zero=0")
    fmaps, locals_ = place("megatron-gpt", dist, tensors, params=PARAMS)
    _, ref_locals = place("megatron-gpt", beside, tensors, params=PARAMS)
    meta = {n: LogicalTensor(n, tuple(t.shape), "float32") for n, t in tensors.items()}
    tied_loads = 0
    for rank in range(dist.world_size):
        c = dist.coords(rank)
        ref = ref_locals[rank]
        prefix = f"optim/{state}/"
        members = sorted((k for k in ref if k.startswith(prefix + "model/")), key=_natural)
        flat = torch.cat([ref[k].reshape(-1) for k in members])
        flat = torch.cat([flat, torch.zeros((-flat.numel()) % dist.dp)])
        chunk = flat.numel() // dist.dp
        buffer = locals_[rank][f"optim/{state}/dense"]
        assert torch.equal(buffer, flat[c.dp * chunk : (c.dp + 1) * chunk]), rank
        # saved once: the first stage writes the embedding's states; the last stage loads them too
        saved = {p.logical for p in fmaps[rank].tensors[f"optim/{state}/dense"].pieces}
        loaded = {p.logical for p in ucl.spec_for_load("megatron-gpt", dist, rank, meta, params=PARAMS)
                  .tensors[f"optim/{state}/dense"].pieces}
        if c.pp == 1:
            assert f"{EMB}/{state}" not in saved
            tied_loads += f"{EMB}/{state}" in loaded
        else:  # (layer norms, replicated over tp, are left out of the saves of tp ranks > 0)
            assert (f"{EMB}/{state}" in saved) == (f"{EMB}/{state}" in loaded)
    assert tied_loads >= 2  # each tp rank's last stage loads the tied states from its dp partitions
    back = gather(fmaps, locals_)
    assert torch.equal(back[f"{EMB}/{state}"], tensors[f"{EMB}/{state}"])


@pytest.mark.parametrize("a,b", [
    ("tp=2,pp=2,dp=2,zero=1", "tp=1,pp=3,vpp=2,dp=2,zero=2"),   # distributed optimizer on both sides
    ("tp=4,pp=3,dp=2,zero=2", "tp=2,pp=2,dp=3,zero=0"),          # to states beside the parameters
    ("tp=2,pp=2,cp=2,dp=2,zero=1", "dp=2,zero=1"),               # to pp=1: no second copy at all
])
def test_tied_embeddings_with_the_distributed_optimizer_round_trip_bitwise(models, a, b):
    models.check_pair("megatron-gpt", Layout.parse(a), Layout.parse(b), _tensors(models), PARAMS)


def test_checker_accepts_tied_embeddings_with_the_distributed_optimizer(models):
    meta = {n: LogicalTensor(n, tuple(t.shape), "float32") for n, t in _tensors(models).items()}
    report = ucl.check.check_program("megatron-gpt", "tp=2,pp=3,dp=2,zero=1", meta, params=PARAMS)
    assert report.ok and report.ranks == 12, report.findings
    assert [w.message.split(": ", 1)[1] for w in report.warnings] == [  # these test tensors have no step counter
        "rule 'optim/step' matched nothing on any rank of tp=2,pp=3,dp=2,zero=1"]


KV_RULE = ("megatron-gpt.ucl:36: Megatron requires num_query_groups ({kv}) to be divisible by the tensor parallel "
           "size ({tp}): each tp rank holds whole key/value groups, none is replicated across tp ranks")
LAYOUT_REFUSALS = [
    # (heads, kv_heads, experts, layout, the checker's finding or None when Megatron accepts the layout)
    (8, 2, 0, "tp=4", KV_RULE.format(kv=2, tp=4)),
    (8, 1, 0, "tp=2,dp=2", KV_RULE.format(kv=1, tp=2)),
    (6, 3, 0, "tp=2", KV_RULE.format(kv=3, tp=2)),        # uneven groups: Megatron does not split them either
    (8, 3, 0, "tp=1", "megatron-gpt.ucl:35: Megatron requires num_attention_heads (8) to be a multiple of "
                      "num_query_groups (3)"),
    (8, 4, 4, "dp=3,ep=3", "megatron-gpt.ucl:37: Megatron requires num_moe_experts (4) to be divisible by the "
                           "expert parallel size (3)"),
    (8, 4, 0, "tp=4", None),                              # tp == kv_heads: one group per rank
    (8, 2, 0, "tp=2,pp=2", None),
    (8, 1, 0, "tp=1,dp=2", None),                         # multi-query attention
]


@pytest.mark.parametrize("heads,kv,experts,layout,finding", LAYOUT_REFUSALS,
                         ids=[f"h{h},kv{k},e{e},{lay}" for h, k, e, lay, _ in LAYOUT_REFUSALS])
def test_layouts_megatron_refuses_are_reported_with_its_rule(models, heads, kv, experts, layout, finding):
    params = dict(num_layers=2, hidden_size=heads * 2, ffn_hidden_size=8, heads=heads, kv_heads=kv, vocab_size=50,
                  vocab_multiple=4, num_experts=experts)
    tensors = models.megatron(layers=2, hidden=heads * 2, heads=heads, kv_heads=kv, vocab=50, ffn=8, experts=experts,
                              states=("exp_avg",))
    meta = {n: LogicalTensor(n, tuple(t.shape), "float32") for n, t in tensors.items()}
    report = ucl.check.check_program("megatron-gpt", layout, meta, params=params)
    if finding is None:
        assert report.ok, report.findings
        return
    assert [(f.kind, f.message) for f in report.findings] == [("layout", finding)]
    lay = Layout.parse(layout)
    message = f"{lay} is not a layout this program supports: {finding}"
    with pytest.raises(ucl.UclError) as load_err:
        ucl.spec_for_load("megatron-gpt", lay, 0, meta, params=params)
    assert str(load_err.value) == message
    with pytest.raises(ucl.UclError) as save_err:  # saving refuses too, whatever the rank holds
        ucl.spec_for_save("megatron-gpt", lay, 0, {"model/decoder.final_layernorm.weight": ((heads * 2,), "float32")},
                          params=params)
    assert str(save_err.value) == message
