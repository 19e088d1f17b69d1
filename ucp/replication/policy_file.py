"""The RL placer's file: weights and optimizer state as safetensors, the configuration as JSON.

A policy file is one safetensors file. Its tensors are the policy network's
``state_dict`` (``policy/<name>``) and the Adam moments the closed loop keeps
learning with (``optimizer/<index>/<exp_avg|exp_avg_sq|step>``); its header's
``__metadata__`` holds one JSON document under ``ucp_placement_policy``: the
format and version, the observation layout the network was trained for, its
size and how it was trained. Nothing in it is unpickled, so a file from anyone
can be read: a stable-baselines3 zip (whose ``:serialized:`` entries are
cloudpickles that run code when loaded) is refused, and so is every tensor the
freshly built network does not have with exactly that shape and dtype.

Example::

    >>> import os, tempfile
    >>> from ucp.replication.rl_policy import train_policy
    >>> from ucp.replication.rl_env import SimulatedEpisodes
    >>> source = SimulatedEpisodes.from_family("independent", intervals=30, seed=1)
    >>> model = train_policy(timesteps=64, scenarios=source.scenarios)
    >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
    >>> save_policy(model, path, trained={"timesteps": 64, "seed": 0})
    >>> read_policy(path).config.max_nodes
    32
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ucp.file_io import write_atomic
from ucp.replication.errors import PolicyFileError

FORMAT = "ucp-placement-policy"
VERSION = 1
METADATA_KEY = "ucp_placement_policy"
MAX_FILE_BYTES = 64 << 20  # the shipped policy is ~0.3 MB; a larger file is not one of ours
_ZIP_MAGIC = b"PK\x03\x04"
_OPTIMIZER_STATES = ("exp_avg", "exp_avg_sq", "step")


@dataclass(frozen=True)
class PolicyConfig:
    """What a policy file says about its network; everything is checked before a tensor is used."""

    max_nodes: int
    hidden: int
    node_features: int
    global_features: int
    trained: dict = field(default_factory=dict)  # how it was made (timesteps, seed, scenarios): for people

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, **asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, where: str) -> "PolicyConfig":
        from ucp.replication.rl_env import GLOBAL_FEATURES, NODE_FEATURES

        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise PolicyFileError(f"{where}: its configuration is not JSON ({err}); retrain the policy") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
            got = (data.get("format"), data.get("version")) if isinstance(data, dict) else type(data).__name__
            raise PolicyFileError(f"{where}: configuration {got!r:.80} is not {FORMAT} version {VERSION}; "
                                  "retrain the policy with `ucp place train`")
        limits = {"max_nodes": (2, 1024), "hidden": (1, 1024), "node_features": (1, 1024),
                  "global_features": (1, 1024)}
        for name, (low, high) in limits.items():
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise PolicyFileError(f"{where}: configuration field '{name}' must be an integer in "
                                      f"{low}..{high}, got {value!r:.40}; retrain the policy")
        if (data["node_features"], data["global_features"]) != (NODE_FEATURES, GLOBAL_FEATURES):
            raise PolicyFileError(
                f"{where}: trained for {data['node_features']} node and {data['global_features']} global "
                f"features, this version observes {NODE_FEATURES} and {GLOBAL_FEATURES}; retrain it with "
                "`ucp place train`")
        trained = data.get("trained", {})
        if not isinstance(trained, dict):
            raise PolicyFileError(f"{where}: configuration field 'trained' must be an object")
        return cls(data["max_nodes"], data["hidden"], data["node_features"], data["global_features"], trained)


@dataclass(frozen=True)
class PolicyFile:
    """A checked policy file: its configuration and tensors (network, optimizer)."""

    config: PolicyConfig
    network: dict
    optimizer: dict  # parameter index -> {state name: tensor}


def save_policy(model, path, *, trained: dict | None = None) -> None:
    """Write ``model`` (a MaskablePPO with :class:`~ucp.replication.rl_net.NodeScorerPolicy`) to ``path``."""
    from safetensors.torch import save

    from ucp.replication.rl_env import GLOBAL_FEATURES, NODE_FEATURES

    net = model.policy.mlp_extractor
    config = PolicyConfig(net.max_nodes, net.hidden, NODE_FEATURES, GLOBAL_FEATURES, dict(trained or {}))
    tensors = {f"policy/{k}": v.detach().cpu().contiguous() for k, v in model.policy.state_dict().items()}
    for index, state in model.policy.optimizer.state_dict()["state"].items():
        for name in _OPTIMIZER_STATES:
            if name in state:
                tensors[f"optimizer/{index}/{name}"] = state[name].detach().cpu().contiguous().reshape(-1) \
                    if name == "step" else state[name].detach().cpu().contiguous()
    data = save(tensors, metadata={METADATA_KEY: config.to_json()})
    write_atomic(path, data)  # a reader never sees half a policy


def read_policy(path) -> PolicyFile:
    """Read and check a policy file; :class:`PolicyFileError` names the file and what is wrong."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    from ucp.confined import read_regular_file

    where = str(path)
    if not Path(where).is_file():
        raise PolicyFileError(f"{where}: no trained placement policy; run `ucp place train --out {where}`")
    raw = read_regular_file(where, limit=MAX_FILE_BYTES, what="a placement policy")
    if raw.startswith(_ZIP_MAGIC):
        raise PolicyFileError(
            f"{where} is a zip archive (a stable-baselines3 save, whose pickled entries can run code when "
            "loaded); placement policies are read only as safetensors with a JSON configuration - "
            "retrain with `ucp place train --out FILE.safetensors`")
    try:
        tensors = load(raw)
        metadata = _header(raw).get("__metadata__") or {}
    except (SafetensorError, ValueError, struct.error) as err:
        raise PolicyFileError(f"{where}: not a safetensors placement policy ({err}); retrain with "
                              "`ucp place train`") from None
    if METADATA_KEY not in metadata:
        raise PolicyFileError(f"{where}: a safetensors file without the '{METADATA_KEY}' configuration; "
                              "retrain with `ucp place train`")
    config = PolicyConfig.from_json(metadata[METADATA_KEY], where=where)
    network, optimizer = {}, {}
    for name, tensor in tensors.items():
        head, _, rest = name.partition("/")
        if head == "policy" and rest:
            network[rest] = tensor
        elif head == "optimizer" and rest.count("/") == 1 and rest.split("/")[0].isdigit() \
                and rest.split("/")[1] in _OPTIMIZER_STATES:
            index, state = rest.split("/")
            optimizer.setdefault(int(index), {})[state] = tensor
        else:
            raise PolicyFileError(f"{where}: unexpected tensor {name!r:.80}; retrain with `ucp place train`")
        if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
            raise PolicyFileError(f"{where}: tensor {name!r} holds NaN or infinite values; retrain the policy")
    return PolicyFile(config, network, optimizer)


def _header(raw: bytes) -> dict:
    """The safetensors JSON header (safetensors.torch.load has checked its bounds already)."""
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + size])


def load_into(model, policy_file: PolicyFile, *, where: str):
    """``model`` (a MaskablePPO built for ``policy_file.config``) with the file's network and optimizer
    state, checked tensor by tensor; :meth:`ucp.replication.rl_policy.RLPolicy.load` builds it."""
    import torch

    expected = model.policy.state_dict()
    _same_tensors(where, "policy/", expected, policy_file.network)
    model.policy.load_state_dict(policy_file.network, strict=True)
    params = [p for group in model.policy.optimizer.param_groups for p in group["params"]]
    state = {}
    for index, moments in sorted(policy_file.optimizer.items()):
        if index >= len(params) or set(moments) != set(_OPTIMIZER_STATES):
            raise PolicyFileError(f"{where}: optimizer state {index} does not match the network; retrain the policy")
        shape = params[index].shape
        if moments["exp_avg"].shape != shape or moments["exp_avg_sq"].shape != shape or moments["step"].numel() != 1:
            raise PolicyFileError(f"{where}: optimizer state {index} has the wrong shape; retrain the policy")
        step = float(moments["step"].reshape(()))
        if not (math.isfinite(step) and step >= 0):
            raise PolicyFileError(f"{where}: optimizer state {index} has step {step}; retrain the policy")
        state[index] = {"step": torch.tensor(step), "exp_avg": moments["exp_avg"].float(),
                        "exp_avg_sq": moments["exp_avg_sq"].float()}
    optimizer_state = model.policy.optimizer.state_dict()
    optimizer_state["state"] = state
    model.policy.optimizer.load_state_dict(optimizer_state)
    return model


def _same_tensors(where: str, prefix: str, expected: dict, found: dict) -> None:
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or extra:
        name, what = (missing[0], "lacks") if missing else (extra[0], "has an unexpected")
        raise PolicyFileError(f"{where} {what} tensor '{prefix}{name}'; it was saved by another version of the "
                              "placer - retrain with `ucp place train`")
    for name, tensor in expected.items():
        got = found[name]
        if got.shape != tensor.shape or got.dtype != tensor.dtype:
            raise PolicyFileError(
                f"{where}: tensor '{prefix}{name}' is {got.dtype} {list(got.shape)}, the network needs "
                f"{tensor.dtype} {list(tensor.shape)}; retrain with `ucp place train`")
