"""The RL placement policy: MaskablePPO behind :class:`PlacementPolicy`, retrained closed-loop.

:func:`train_policy` trains from scratch on simulated episodes of the synthetic
families (never the evaluated seeds) and is what ``ucp place train`` runs; the
result ships as ``ucp/replication/data/placement-policy.safetensors`` (weights and
JSON configuration, :mod:`ucp.replication.policy_file`: nothing unpickled). :class:`RLPolicy`
places greedily (arg-max over the *masked* logits, so it never picks an invalid
site) and, when ``online``, keeps the outcomes that followed its placements and
fine-tunes PPO on them every ``retrain_every`` intervals: the failures that
really happened are the reward's cases (:class:`~ucp.replication.rl_env.ReplayedEpisodes`).

Example::

    >>> from ucp.replication.cluster import ClusterSpec
    >>> from ucp.replication.placement import ClusterView, PlacementRequest, validate_placement
    >>> policy = RLPolicy.load()
    >>> spec = ClusterSpec()
    >>> request, view = PlacementRequest.one_per_node(spec), ClusterView.uniform(spec, [0.01] * 16)
    >>> validate_placement(request, view, policy.place(request, view))
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from ucp.replication.placement import ClusterView, Placement, PlacementRequest
from ucp.replication.rl_env import MAX_NODES, PlacementBuilder, PlacementEnv, ReplayedEpisodes, SimulatedEpisodes

ENVS = 8  # parallel episodes per rollout: one batched forward pass serves all eight
PPO_SETTINGS = {"n_steps": 128, "batch_size": 256, "n_epochs": 4, "learning_rate": 5e-4, "gamma": 1.0,
                "gae_lambda": 0.95, "ent_coef": 0.005, "clip_range": 0.2}


def shipped_policy_path():
    return resources.files("ucp.replication") / "data" / "placement-policy.safetensors"


def quiet_logger():
    """A logger that writes nothing: stable-baselines3's default makes a ``SB3-<time>`` folder in the
    system temp directory on every ``learn()`` (hundreds per evaluation) and never removes it."""
    from stable_baselines3.common.logger import Logger

    return Logger(folder=None, output_formats=[])


@contextlib.contextmanager
def _one_thread():
    """One torch thread: reproducible, and polite on a shared machine; restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _vec(make_env, count: int = ENVS):
    from stable_baselines3.common.vec_env import DummyVecEnv

    return DummyVecEnv([make_env] * count)


def _new_model(config, *, seed: int):
    """An untrained MaskablePPO shaped by a policy file's ``config`` (its weights come from the file)."""
    from sb3_contrib import MaskablePPO

    from ucp.replication.rl_net import NodeScorerPolicy

    # The envs only lend their spaces (and their count, which sizes the rollout buffer) here: they are
    # never reset; retraining sets real ones.
    envs = _vec(lambda: PlacementEnv(source=None, max_nodes=config.max_nodes), ENVS)
    # No orthogonal initialisation: the file's weights replace every tensor, and its QR
    # decompositions were most of the time a policy took to load (seconds on a busy machine).
    with _one_thread():
        model = MaskablePPO(NodeScorerPolicy, envs, seed=seed, device="cpu", verbose=0,
                            policy_kwargs={"net_arch": {"hidden": config.hidden}, "ortho_init": False},
                            **PPO_SETTINGS)
    model.set_logger(quiet_logger())
    return model


def training_scenarios(*, seed: int, intervals: int, spec=None, pretrain_intervals: int = 3000, io=None):
    """Synthetic scenarios for offline training, with forecasts as the evaluation makes them.

    The training families only (never a ``HELD_OUT`` one), on seeds no evaluation uses.
    """
    from ucp.replication.scenarios import (HETERO_TRAINING, RL_TRAIN_SEED, SYNTHETIC, TRAINING_ONLY, build_scenario,
                                           pretrained_forecaster)

    forecaster = pretrained_forecaster(spec=spec, intervals=pretrain_intervals)
    return [build_scenario(family, intervals=intervals, seed=RL_TRAIN_SEED + 10 * seed + i, forecaster=forecaster,
                           spec=spec, io=io)
            for i, family in enumerate(SYNTHETIC + TRAINING_ONLY + HETERO_TRAINING)]


def train_policy(*, timesteps: int, seed: int = 0, intervals: int = 2000, spec=None, max_nodes: int = MAX_NODES,
                 pretrain_intervals: int = 3000, scenarios=None, progress=None, io=None):
    """Train MaskablePPO from scratch; returns the model (``model.save(path)`` to keep it).

    ``io``: the I/O cost model the training scenarios' read times come from (None: constants).
    """
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback

    from ucp.replication.rl_net import NodeScorerPolicy

    class _Progress(BaseCallback):
        def _on_step(self) -> bool:
            if progress is not None:
                progress(self.num_timesteps)
            return True

    scenarios = scenarios or training_scenarios(seed=seed, intervals=intervals, spec=spec,
                                                pretrain_intervals=pretrain_intervals, io=io)
    source = SimulatedEpisodes(scenarios)
    with _one_thread():
        envs = _vec(lambda: PlacementEnv(source=source, max_nodes=max_nodes))
        model = MaskablePPO(NodeScorerPolicy, envs, seed=seed, device="cpu", verbose=0, **PPO_SETTINGS)
        model.set_logger(quiet_logger())
        model.learn(total_timesteps=timesteps, callback=_Progress())
    return model


@dataclass
class RLPolicy:
    """The learned placer. Mutable on purpose: it keeps outcomes and retrains (closed loop)."""

    model: object
    online: bool = True
    retrain_every: int = 250
    retrain_steps: int = 2048
    min_outcomes: int = 8
    name: str = "rl"
    history: deque = field(default_factory=lambda: deque(maxlen=400))
    _since: int = 0
    _actor: object = None  # numpy snapshot of the actor; dropped after retraining

    @classmethod
    def load(cls, path=None, *, seed: int = 0, **options) -> "RLPolicy":
        """The shipped policy (or ``path``), ready to place and to keep learning.

        Only safetensors policy files are read (:mod:`ucp.replication.policy_file`); nothing is unpickled.
        """
        from ucp.replication.policy_file import load_into, read_policy

        where = str(path or shipped_policy_path())
        policy_file = read_policy(where)
        return cls(load_into(_new_model(policy_file.config, seed=seed), policy_file, where=where), **options)

    def save(self, path) -> None:
        """Write the policy as it is now (after any retraining) in the safe format."""
        from ucp.replication.policy_file import save_policy

        save_policy(self.model, path)

    @property
    def max_nodes(self) -> int:
        return (self.model.action_space.n - 1) // 2

    def place(self, request: PlacementRequest, view: ClusterView) -> Placement:
        if self._actor is None:
            self._actor = self.model.policy.mlp_extractor.numpy_actor()
        builder = PlacementBuilder(request, view, max_nodes=self.max_nodes)
        while not builder.done:
            logits = self._actor(builder.observation())
            logits[~builder.action_masks()] = -np.inf  # never an invalid site
            builder.apply(int(np.argmax(logits)))
        return builder.placement()

    def observe(self, outcome) -> None:
        if outcome.events:
            self.history.append(outcome)
        self._since += 1
        if self.online and self._since >= self.retrain_every and len(self.history) >= self.min_outcomes:
            self.retrain()

    def retrain(self) -> None:
        """Fine-tune on the kept outcomes: each episode re-places a past checkpoint against its real failures."""
        self._since, self._actor = 0, None
        source = ReplayedEpisodes(self.history)
        self.model.set_env(_vec(lambda: PlacementEnv(source=source, max_nodes=self.max_nodes)))
        self.model.set_logger(quiet_logger())
        with _one_thread():
            self.model.learn(total_timesteps=self.retrain_steps, reset_num_timesteps=False)
