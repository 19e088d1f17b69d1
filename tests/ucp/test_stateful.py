"""Stateful objects in the state tree, and loads into a state that never drop saved data."""

from __future__ import annotations

import pytest
import torch

import ucp
from ucp.stateful import create_optimizer_state


def _train(model, opt, steps, *, seed=0, sched=None):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=gen)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()


def _fresh(seed=1):
    torch.manual_seed(seed)  # other initial weights than the saved run: the load must replace them
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, opt


def _assert_same_optimizer(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys() and sa["state"]
    for i, entry in sa["state"].items():
        assert entry.keys() == sb["state"][i].keys()
        for name, value in entry.items():
            assert torch.equal(value, sb["state"][i][name]), (i, name)


def test_objects_in_the_state_resume_into_fresh_ones_bitwise(tmp_path):
    model, opt = _fresh(0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    _train(model, opt, 5, sched=sched)
    ucp.save({"model": model, "optim": opt, "sched": sched, "step": 5}, tmp_path / "c")

    model2, opt2 = _fresh(1)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    state = {"model": model2, "optim": opt2, "sched": sched2, "step": 0}
    ucp.load(tmp_path / "c", into=state)
    assert state["step"] == 5 and state["model"] is model2
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    _assert_same_optimizer(opt, opt2)
    assert opt2.state_dict()["state"][0]["step"] == 5
    assert sched2.state_dict() == sched.state_dict()
    _train(model, opt, 3, seed=7, sched=sched)
    _train(model2, opt2, 3, seed=7, sched=sched2)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_a_save_captures_objects_when_it_runs_so_later_saves_are_not_stale(tmp_path):
    model, opt = _fresh(0)
    state = {"model": model, "optim": opt}
    ucp.save(state, tmp_path / "before")
    _train(model, opt, 2)
    ucp.save(state, tmp_path / "after")
    assert not [n for n, _ in ucp.iter_tensors(tmp_path / "before") if n.startswith("optim/state/")]
    saved = ucp.load(tmp_path / "after")
    assert torch.equal(saved["optim"]["state"][0]["exp_avg"], opt.state[model[0].weight]["exp_avg"])
    assert saved["optim"]["state"][0]["step"] == 2


def test_the_hinted_strict_false_load_of_a_state_dict_snapshot_keeps_the_optimizer_state(tmp_path):
    """The README's old pattern: a fresh optimizer's state_dict() has no per-parameter state yet."""
    model, opt = _fresh(0)
    _train(model, opt, 10)
    manager = ucp.CheckpointManager(tmp_path)
    manager.save(10, {"model": model.state_dict(), "optim": opt.state_dict(), "step": 10})

    model2, opt2 = _fresh(1)
    state = {"model": model2.state_dict(), "optim": opt2.state_dict(), "step": 0}
    with pytest.raises(ucp.KeyMismatchError, match=r"put the optimizer itself in the state \(\{'optim': opt\}\)"):
        manager.restore(into=state)
    assert manager.restore(into=state, strict=False) == 10
    opt2.load_state_dict(state["optim"])
    _assert_same_optimizer(opt, opt2)
    assert opt2.state_dict()["state"][0]["step"] == 10 and state["step"] == 10


def test_non_tensor_values_are_updated_in_place_like_tensors(tmp_path):
    ucp.save({"w": torch.ones(2), "step": 7, "hp": {"lr": 0.5, "betas": (0.8, 0.9)}, "hist": [1, 2, 3]}, tmp_path / "c")
    into = {"w": torch.zeros(2), "step": 0, "hp": {"lr": 1.0, "betas": (0.0, 0.0)}, "hist": []}
    hp = into["hp"]
    out = ucp.load(tmp_path / "c", into=into)
    assert into["step"] == 7 and into["hp"] is hp and hp == {"lr": 0.5, "betas": (0.8, 0.9)}
    assert into["hist"] == [1, 2, 3] and torch.equal(into["w"], torch.ones(2)) and out["w"] is into["w"]


def test_the_tree_a_converted_checkpoint_loads_as_is_accepted_back_as_into(tmp_path):
    from safetensors.torch import save_file

    save_file({"a.weight": torch.arange(6.0).view(2, 3), "a.bias": torch.ones(2)}, tmp_path / "m.safetensors")
    ucp.convert(tmp_path / "m.safetensors", tmp_path / "c")
    loaded = ucp.load(tmp_path / "c")
    assert list(loaded) == ["model"]
    into = {"model": {k: torch.zeros_like(v) for k, v in loaded["model"].items()}}
    out = ucp.load(tmp_path / "c", into=into)
    assert torch.equal(into["model"]["a.weight"], torch.arange(6.0).view(2, 3))
    assert out["model"]["a.bias"] is into["model"]["a.bias"] and torch.equal(into["model"]["a.bias"], torch.ones(2))


def test_strict_false_skips_only_whole_top_level_keys_and_says_so(tmp_path):
    model, opt = _fresh(0)
    _train(model, opt, 1)
    ucp.save({"model": model, "optim": opt, "step": 1}, tmp_path / "c")
    into = {"model": _fresh(1)[0].state_dict()}
    with pytest.warns(ucp.PartialLoadWarning, match=r"^strict=False: 12 saved tensor\(s\) of .* were not loaded"):
        out = ucp.load(tmp_path / "c", into=into, strict=False)
    # No half optimizer (param_groups without its state) is handed back or merged in.
    assert "optim" not in out and "optim" not in into and into["step"] == 1
    assert torch.equal(into["model"]["0.weight"], model[0].weight)


def test_a_fresh_optimizer_gets_state_only_for_the_parameters_that_had_some(tmp_path):
    model, opt = _fresh(0)
    model[0].weight.requires_grad_(False)  # frozen: no optimizer state is ever made for it
    _train(model, opt, 3)
    ucp.save({"model": model, "optim": opt}, tmp_path / "c")
    model2, opt2 = _fresh(1)
    before = [p.detach().clone() for p in model2.parameters()]
    with pytest.warns(ucp.PartialLoadWarning, match="model/0.bias"):
        ucp.load(tmp_path / "c", into={"optim": opt2}, strict=False)
    assert sorted(opt2.state_dict()["state"]) == [1, 2, 3]
    _assert_same_optimizer(opt, opt2)
    assert all(torch.equal(p, q) for p, q in zip(before, model2.parameters()))  # creating state moved nothing


def test_creating_optimizer_state_keeps_gradients_and_learning_rates():
    model, opt = _fresh(0)
    model(torch.ones(1, 4)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    create_optimizer_state(opt, {0, 1})
    assert sorted(opt.state_dict()["state"]) == [0, 1] and opt.param_groups[0]["lr"] == 1e-2
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))


def test_a_dict_keyed_by_paths_is_filled_in_place_and_loads_again(tmp_path):
    # {"model/w": t} names the tensor the nested save holds at model/w: the load fills it and must
    # not add a nested "model" entry beside it (a second copy, and a name clash on the next load)
    ucp.save({"model": {"w": torch.arange(3.0), "b": torch.ones(2), "cfg": {"n": 1}}, "step": 4}, tmp_path / "c")
    w, b = torch.empty(3), torch.empty(2)
    flat = {"model/w": w, "model/b": b}
    for _ in range(2):
        ucp.load(tmp_path / "c", into=flat)
        assert list(flat) == ["model/w", "model/b", "model/cfg", "step"]
        assert flat["model/w"] is w and torch.equal(w, torch.arange(3.0)) and torch.equal(b, torch.ones(2))
        assert flat["model/cfg"] == {"n": 1} and flat["step"] == 4
