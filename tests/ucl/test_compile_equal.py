"""Faster compiles give the same maps: against every rank evaluated alone, and against maps pinned before.

The compiler finds the ranks that hold the same pieces as a local tensor by evaluating its rule
on the other ranks of a dimension, once per distinct value of the rank variables the rule reads
(:func:`ucp.ucl.replicas._rank_names`). The straightforward reference evaluates every rank on its
own: patching ``_rank_names`` to name every rank variable gives each rank its own group. Both
must compile identical maps (pieces, replicas, key order) on every rank of MoE (``ep > 1``),
ZeRO-1, tied-embedding, interleaved and context-parallel layouts.

``golden/compiled_maps.json`` pins a digest of every map of those layouts, made by the compiler
before its planning was sped up; regenerate it only after an intended change of the maps, with
``UCP_REGEN_GOLDEN=1`` (``ucp ucl compile`` prints a map for comparison).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from ucp import ucl
import ucp.ucl.replicas  # noqa: F401 - loads the submodule the tests patch as ucl.replicas
from ucp.ucl.bind import local_shapes, spec_for_load, spec_for_save
from ucp.ucl.declared import declared_logical
from ucp.layout import Layout

GOLDEN = Path(__file__).resolve().parent / "golden" / "compiled_maps.json"
MOE = dict(num_layers=4, hidden_size=64, ffn_hidden_size=96, heads=8, kv_heads=2, vocab_size=100, num_experts=4)
TIED = dict(num_layers=4, hidden_size=64, ffn_hidden_size=96, heads=8, kv_heads=2, vocab_size=100, tie_embeddings=1)
CASES = {
    "moe tp=2,pp=2,dp=4,ep=2": (MOE, "tp=2,pp=2,dp=4,ep=2"),
    "moe tp=2,pp=2,dp=4,ep=2,zero=1": (MOE, "tp=2,pp=2,dp=4,ep=2,zero=1"),
    "moe pp=2,dp=4,ep=4,vpp=2,zero=1": (MOE, "pp=2,dp=4,ep=4,vpp=2,zero=1"),
    "moe tp=2,cp=2,dp=2,ep=2,zero=1": (MOE, "tp=2,cp=2,dp=2,ep=2,zero=1"),
    "tied tp=2,pp=2,dp=2": (TIED, "tp=2,pp=2,dp=2"),
    "tied tp=2,pp=2,dp=2,zero=1": (TIED, "tp=2,pp=2,dp=2,zero=1"),
}
EVERY_RANK = tuple(sorted(f"{g}.rank" for g in ("tp", "cp", "dp", "pp", "ep", "edp")))


def _maps(params: dict, layout: str) -> dict[str, str]:
    """``rank/direction`` -> the map as JSON (key order kept: the writer numbers fragments in it)."""
    program = ucl.load_program("megatron-gpt", **params)
    lay = Layout.parse(layout)
    logical = declared_logical(program, lay)
    out = {}
    for rank in range(lay.world_size):
        load = spec_for_load(program, lay, rank, logical)
        local = {k: (t.shape, t.dtype) for k, t in local_shapes(load).items()}
        save = spec_for_save(program, lay, rank, local, shapes=logical)
        out[f"{rank}/load"] = json.dumps(load.to_dict())
        out[f"{rank}/save"] = json.dumps(save.to_dict())
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_grouping_ranks_by_the_variables_a_rule_reads_compiles_the_maps_of_every_rank_alone(case, monkeypatch):
    params, layout = CASES[case]
    fast = _maps(params, layout)
    monkeypatch.setattr(ucl.replicas, "_rank_names", lambda rules, program: EVERY_RANK)
    alone = _maps(params, layout)
    assert [k for k in fast if fast[k] != alone[k]] == []
    replicated = [t["replicas"] for m in fast.values() for t in json.loads(m)["tensors"].values()]
    assert max(replicated) > 1  # replicas were found, not just one holder everywhere


def test_compiled_maps_are_the_pinned_ones():
    digests = {case: {k: hashlib.sha256(v.encode()).hexdigest()[:16] for k, v in _maps(*CASES[case]).items()}
               for case in CASES}
    if os.environ.get("UCP_REGEN_GOLDEN"):
        GOLDEN.write_text(json.dumps(digests, indent=1) + "\n")
    pinned = json.loads(GOLDEN.read_text())
    assert {case: [k for k in d if d[k] != pinned[case].get(k)] for case, d in digests.items()} == \
        {case: [] for case in CASES}
    assert digests == pinned
