"""Policy files: weights and JSON configuration only; nothing from the file is ever run."""

from __future__ import annotations

import base64
import json
import os
import pickle
import struct
from pathlib import Path
import tempfile
import zipfile

import pytest
import torch
from safetensors.torch import save

from ucp.replication.errors import PolicyFileError
from ucp.replication.policy_file import METADATA_KEY, read_policy
from ucp.replication.rl_policy import RLPolicy, shipped_policy_path, train_policy
from ucp.replication.rl_env import SimulatedEpisodes


class _Command:
    """Unpickling this runs a shell command (what a doctored stable-baselines3 zip carries)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _doctored_zip(path, marker) -> None:
    payload = base64.b64encode(pickle.dumps(_Command(marker))).decode()
    data = {"policy_class": {":type:": "<class 'type'>", ":serialized:": payload},
            "observation_space": {":type:": "<class 'gymnasium.spaces.box.Box'>", ":serialized:": payload}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data", json.dumps(data))
        archive.writestr("_stable_baselines3_version", "2.9.2")


def test_a_doctored_policy_zip_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    _doctored_zip(tmp_path / "p.zip", marker)
    with pytest.raises(PolicyFileError) as err:
        RLPolicy.load(tmp_path / "p.zip")
    assert str(err.value) == (
        f"{tmp_path / 'p.zip'} is a zip archive (a stable-baselines3 save, whose pickled entries can run code "
        "when loaded); placement policies are read only as safetensors with a JSON configuration - retrain "
        "with `ucp place train --out FILE.safetensors`")
    assert not marker.exists()


def test_place_eval_refuses_a_doctored_policy_file(tmp_path):
    from ucp.tools.cli import main

    marker = tmp_path / "ran"
    _doctored_zip(tmp_path / "p.zip", marker)
    code = main(["place", "eval", "--intervals", "5", "--pretrain-intervals", "50", "--families", "independent",
                 "--policy-file", str(tmp_path / "p.zip"), "--quiet"])
    assert code == 2 and not marker.exists()


def _write(path, tensors, config) -> None:
    path.write_bytes(save(tensors, metadata={METADATA_KEY: json.dumps(config)} if config is not None else None))


def _shipped_parts():
    raw = Path(shipped_policy_path()).read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    config = json.loads(json.loads(raw[8:8 + size])["__metadata__"][METADATA_KEY])
    from safetensors.torch import load

    return load(raw), config


@pytest.mark.parametrize("change, message", [
    (lambda t, c: c.update(format="other"), "configuration ('other', 1) is not ucp-placement-policy version 1; "
                                            "retrain the policy with `ucp place train`"),
    (lambda t, c: c.update(max_nodes=10**9), "configuration field 'max_nodes' must be an integer in 2..1024, got "
                                             "1000000000; retrain the policy"),
    (lambda t, c: c.update(node_features=12), "trained for 12 node and 11 global features, this version observes 13 "
                                              "and 11; retrain it with `ucp place train`"),
    (lambda t, c: t.pop("policy/value_net.bias"), "lacks tensor 'policy/value_net.bias'"),
    (lambda t, c: t.update({"evil/x": torch.zeros(1)}), "unexpected tensor 'evil/x'"),
    (lambda t, c: t.update({"policy/value_net.bias": torch.zeros(3)}),
     "tensor 'policy/value_net.bias' is torch.float32 [3], the network needs torch.float32 [1]"),
    (lambda t, c: t["policy/value_net.bias"].fill_(float("nan")), "tensor 'policy/value_net.bias' holds NaN"),
])
def test_damaged_policy_files_are_refused_by_name(tmp_path, change, message):
    tensors, config = _shipped_parts()
    change(tensors, config)
    _write(tmp_path / "p.safetensors", tensors, config)
    with pytest.raises(PolicyFileError, match="retrain") as err:
        RLPolicy.load(tmp_path / "p.safetensors")
    assert message in str(err.value) and str(tmp_path / "p.safetensors") in str(err.value)


def test_a_safetensors_file_without_configuration_or_garbage_is_refused(tmp_path):
    tensors, _ = _shipped_parts()
    _write(tmp_path / "a.safetensors", tensors, None)
    with pytest.raises(PolicyFileError, match="without the 'ucp_placement_policy' configuration"):
        read_policy(tmp_path / "a.safetensors")
    (tmp_path / "b.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(PolicyFileError, match="not a safetensors placement policy"):
        read_policy(tmp_path / "b.safetensors")


def test_save_and_load_round_trip_keeps_weights_and_optimizer_state(tmp_path):
    policy = RLPolicy.load(online=False)
    policy.save(tmp_path / "p.safetensors")
    again = RLPolicy.load(tmp_path / "p.safetensors", online=False)
    for a, b in zip(policy.model.policy.parameters(), again.model.policy.parameters()):
        assert torch.equal(a, b)
    sa, sb = policy.model.policy.optimizer.state_dict()["state"], again.model.policy.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)


def test_training_and_retraining_leave_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    from ucp.replication.scenarios import family_trace
    from ucp.replication.simulator import Scenario, run_interval

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what stable-baselines3's logger writes under
    source = SimulatedEpisodes.from_family("independent", intervals=40, seed=2)
    train_policy(timesteps=256, seed=1, scenarios=source.scenarios)
    policy = RLPolicy.load(online=True, retrain_steps=256)
    scenario = Scenario.without_forecasts(family_trace("correlated-rack", intervals=120, seed=8))
    policy.history.extend(run_interval(policy, scenario, t) for t in range(120) if scenario.trace.failures[t])
    assert policy.history
    policy.retrain()
    assert os.listdir(tmp_path) == []
