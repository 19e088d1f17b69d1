"""Logical names from nested state (the layouts frameworks save) and the tree back from them."""

from __future__ import annotations

import doctest

import pytest
import torch

import ucp.formats.naming as naming
from ucp.errors import FormatError
from ucp.formats.naming import build_tree, split_tree, strip_wrappers

T = torch.zeros(1)


@pytest.mark.parametrize("name, expected", [
    ("module.layers.0.weight", "layers.0.weight"),
    ("module.module.w", "w"),
    ("_orig_mod.embed.weight", "embed.weight"),
    ("layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.attn.wq.weight", "layers.0.attn.wq.weight"),
    ("encoder.module.weight", "encoder.module.weight"),  # only a leading module. is DDP's
    ("module", "module"),
])
def test_strip_wrappers(name, expected):
    assert strip_wrappers(name) == expected


def test_flat_state_dict_with_step():
    names, state = split_tree({"module.fc.weight": T, "fc.bias": T, "step": 4})
    assert sorted(names) == ["fc.bias", "fc.weight"] and state.step == 4


def test_lightning_checkpoint():
    ckpt = {"state_dict": {"model.w": T}, "optimizer_states": [{"state": {0: {"exp_avg": T}},
            "param_groups": [{"lr": 1.0, "params": [0]}]}], "epoch": 2, "global_step": 40,
            "lr_schedulers": [{"last_epoch": 40}], "pytorch-lightning_version": "2.4.0"}
    names, state = split_tree(ckpt)
    assert sorted(names) == ["0/exp_avg", "model.w"]
    assert state.step == 40 and state.extra["lr_schedulers"] == [{"last_epoch": 40}]
    assert state.extra["$roots"] == {"optimizer": "optimizer_states", "model": "state_dict"}


def test_optimizer_ids_named_by_param_names():
    osd = {"state": {0: {"exp_avg": T}, 1: {"momentum_buffer": T}},
           "param_groups": [{"lr": 0.1, "params": [0, 1], "param_names": ["module.a", "b"]}]}
    names, state = split_tree({"model": {"a": T, "b": T}, "optim": osd})
    assert sorted(names) == ["a", "a/exp_avg", "b", "b/momentum_buffer"]
    assert state.param_groups == ({"lr": 0.1, "params": ["a", "b"]},)


def test_flattened_optimizer_state_dict_regroups_equal_hyper_parameters():
    flat = {"state.a.exp_avg": T, "state.b.c.exp_avg": T, "param_groups.a.lr": 0.1, "param_groups.b.c.lr": 0.1,
            "param_groups.d.lr": 0.2}
    names, state = split_tree({"model": {"a": T, "b.c": T, "d": T}, "optimizer": flat})
    assert sorted(names) == ["a", "a/exp_avg", "b.c", "b.c/exp_avg", "d"]
    assert state.param_groups == ({"lr": 0.1, "params": ["a", "b.c"]}, {"lr": 0.2, "params": ["d"]})


def test_other_tensors_keep_their_paths_and_rng_is_separated():
    names, state = split_tree({"model": {"w": T}, "ema": {"w": T, "decay": 0.99}, "extra_w": T,
                               "rng_state": {"python": (3, (1, 2), None)}, "cuda_rng": T})
    assert sorted(names) == ["cuda_rng", "ema/w", "extra_w", "w"]
    assert state.rng == {"rng_state": {"python": {"$tuple": [3, {"$tuple": [1, 2]}, None]}}}
    assert state.extra["ema/decay"] == 0.99


def test_a_wrapper_around_the_roots_is_looked_through():
    # The DCP recipe saves {"app": AppState(model, optimizer)}, whose state_dict is {"model": ..., "optim": ...}.
    osd = {"state": {"fc.w": {"exp_avg": T}}, "param_groups": [{"lr": 0.1, "params": ["fc.w"]}]}
    tree = {"app": {"model": {"fc.w": T}, "optim": osd}, "step": 4}
    names, state = split_tree(tree)
    assert sorted(names) == ["fc.w", "fc.w/exp_avg"] and state.step == 4
    rebuilt = build_tree(list(names), state, lambda n: T)
    assert set(rebuilt) == {"app", "step"} and set(rebuilt["app"]) == {"model", "optim"}


def test_two_tensors_with_one_name_are_refused():
    with pytest.raises(FormatError, match=r"two tensors get the logical name 'w': 'module\.w' and 'w' \(a wrapper "
                                          r"prefix stripped from one of them\?\); rename one before converting"):
        split_tree({"module.w": T, "w": T})


@pytest.mark.parametrize("tree", [
    {"model": {"a": T, "b.c": T}, "optim": {"state": {"a": {"exp_avg": T, "step": T}},
                                           "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["a", "b.c"]}]},
     "step": 3, "ema": {"a": T}, "top": T, "rng": {"seed": 1}, "note": "x"},
    {"w": T, "step": 1},
    {"state_dict": {"w": T}, "optimizer_states": [{"state": {0: {"exp_avg": T}},
                                                   "param_groups": [{"lr": 1.0, "params": [0]}]}], "global_step": 9},
    {"model": {"w": T, "_extra_state": b"\x00"}, "optimizer": {"state": {}, "param_groups": []}},
    {"app": {"model": {"w": T}, "optim": {"state": {"w": {"m": T}}, "param_groups": [{"params": ["w"]}]}},
     "epoch": 2},
])
def test_build_tree_inverts_split_tree(tree):
    names, state = split_tree(tree)
    again, state2 = split_tree(naming.unplain(build_tree(list(names), state, lambda n: T)))
    assert sorted(again) == sorted(names) and state2 == state


def test_doctests():
    assert doctest.testmod(naming).failed == 0
