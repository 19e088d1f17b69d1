"""The RL placement environment (gymnasium) and the state machine it shares with inference.

One episode places one checkpoint in rounds, as the static policies do: every
fragment's first replica (fragments in order of decreasing owner risk), then
every fragment's second, then third. Each step either puts the current
fragment's replica of this round on ``(node, tier)`` or skips it (allowed once
the fragment has ``min_replicas``), so the budget can move between fragments.
Actions: ``2 * node + tier`` (tier 0 memory, 1 disk) for ``node < max_nodes``,
and ``2 * max_nodes`` = skip. Invalid
actions (the owner, a dead or padding node, a node already holding the fragment,
a full tier, a step that would break the budget or the per-fragment limits) are
masked (:meth:`PlacementEnv.action_masks`, for sb3-contrib's MaskablePPO); an
unmasked agent that takes one anyway gets a penalty of -1 and no state change.

The observation is permutation-friendly: per-node features relative to the
current fragment (rack relations, forecast, free tiers, load, valid actions, speed),
then global features (owner risk, budget, staleness of the remote copy, tier
speeds, the fragment's size against the mean). Clusters of up to ``max_nodes`` nodes fit, padded.

Reward: the change of a potential, minus the expected recovery time of the
partial placement over *failure cases* (sets of lost nodes with weights), in
checkpoint intervals, where only shards that already have a replica count as
lost. Summed over an episode it is the (negated) expected recovery time of the
final placement, up to a constant: potential-based shaping, so every step gets
its own credit. Cases come from an
:class:`EpisodeSource`: true hazards of a simulated trace (offline training) or
the failures that really followed a placement (online, closed loop).

Example::

    >>> from gymnasium.utils.env_checker import check_env
    >>> env = PlacementEnv(source=SimulatedEpisodes.from_family("correlated-rack", intervals=50, seed=1))
    >>> check_env(env, skip_render_check=True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import gymnasium as gym
import numpy as np

from ucp.replication.cluster import DISK, MEMORY, REMOTE, ClusterSpec
from ucp.replication.placement import ClusterView, Placement, PlacementRequest, ReplicaSite
from ucp.replication.recovery import recover

MAX_NODES = 32
NODE_FEATURES = 13
GLOBAL_FEATURES = 11
_TIERS = (MEMORY, DISK)
_BURST_SAMPLES = 4


def _risk_scale(p: float | np.ndarray):
    """Forecasts span decades (1e-4 .. 0.5): a log scale mapped to about [0, 1.5]."""
    return np.clip((np.log10(np.maximum(p, 1e-5)) + 4.0) / 4.0, 0.0, 1.5)


@dataclass(frozen=True)
class FailureCase:
    """A set of nodes lost together; replicas on ``unavailable`` (⊇ ``lost``) are gone; ``weight``."""

    lost: frozenset
    unavailable: frozenset
    weight: float


class PlacementBuilder:
    """Builds one placement action by action; the same logic serves training and inference."""

    def __init__(self, request: PlacementRequest, view: ClusterView, *, max_nodes: int = MAX_NODES):
        if len(view.nodes) > max_nodes:
            from ucp.replication.errors import PlacementInputError

            raise PlacementInputError(
                f"the RL policy handles up to {max_nodes} nodes, the cluster has {len(view.nodes)}; "
                "retrain it with `ucp place train --max-nodes N`")
        self.request, self.view, self.max_nodes = request, view, max_nodes
        spec = view.spec
        n = len(view.nodes)
        self.n = n
        self.prob = np.array([s.failure_probability for s in view.nodes])
        self.risk = _risk_scale(self.prob)
        self.rack = np.array([s.rack for s in view.nodes])
        self.alive = np.array([s.alive for s in view.nodes])
        self.free = np.array([[s.memory_free_bytes, s.disk_free_bytes] for s in view.nodes], dtype=float)
        self.held = np.zeros(n)
        self.order = sorted(request.fragments, key=lambda f: (-self.prob[f.owner], f.owner))
        self.positions = len(self.order) * request.max_replicas  # round r, fragment i: position r * F + i
        # bytes still owed to fragments below min_replicas: the budget must always cover them
        self.deficit = sum(f.nbytes for f in self.order) * request.min_replicas
        self.budget = request.budget_bytes
        self.sites: dict[str, list[ReplicaSite]] = {f.fragment_id: [] for f in self.order}
        self.fragments_of: dict[int, list[str]] = {}
        for frag in self.order:
            self.fragments_of.setdefault(frag.owner, []).append(frag.fragment_id)
        self.k = 0  # position
        self._mask: np.ndarray | None = None
        self.times = view.times
        self.speed = np.array([s.speed for s in view.nodes])
        self.mean_bytes = float(np.mean([f.nbytes for f in self.order])) if self.order else spec.shard_bytes
        t_remote = self.times.tier_seconds(REMOTE, self.mean_bytes)
        self._spec_features = [self.times.tier_seconds(MEMORY, self.mean_bytes) / t_remote,
                               self.times.tier_seconds(DISK, self.mean_bytes) / t_remote,
                               min(request.intervals_since_remote * spec.interval_s / t_remote / 30.0, 2.0)]
        self._skip_forced()

    # -- state ------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.k >= self.positions

    @property
    def round(self) -> int:
        return self.k // len(self.order)

    @property
    def current(self):
        return self.order[self.k % len(self.order)]

    def action_masks(self) -> np.ndarray:
        if self._mask is None:
            self._mask = self._compute_mask()
        return self._mask

    def _compute_mask(self) -> np.ndarray:
        mask = np.zeros(2 * self.max_nodes + 1, dtype=bool)
        if self.done:
            mask[-1] = True
            return mask
        frag = self.current
        chosen = self.sites[frag.fragment_id]
        count = len(chosen)
        owed = self.deficit - (frag.nbytes if count < self.request.min_replicas else 0.0)
        # a relative slack: budget and deficit are sums of unequal float sizes taken in different orders
        slack = 1e-9 * self.request.budget_bytes
        if count <= self.round and count < self.request.max_replicas and self.budget - frag.nbytes >= owed - slack:
            ok = self.alive.copy()
            ok[frag.owner] = False
            for site in chosen:
                ok[site.node] = False
            for tier in range(2):
                mask[tier: 2 * self.n: 2] = ok & (self.free[:, tier] >= frag.nbytes)
        mask[-1] = count >= self.request.min_replicas or not mask[:-1].any()
        return mask

    def observation(self) -> np.ndarray:
        m, n = self.max_nodes, self.n
        nodes = np.zeros((m, NODE_FEATURES), dtype=np.float32)
        glob = np.zeros(GLOBAL_FEATURES, dtype=np.float32)
        if self.done:
            return np.concatenate([nodes.ravel(), glob])
        frag = self.current
        chosen = self.sites[frag.fragment_id]
        mask = self.action_masks()
        holder = np.zeros(n, dtype=bool)
        holder[[s.node for s in chosen]] = True
        rack_used = np.zeros(n, dtype=bool)
        for site in chosen:
            rack_used |= self.rack == self.rack[site.node]
        nodes[:n, 0] = self.alive
        nodes[frag.owner, 1] = 1.0
        nodes[:n, 2] = self.rack == self.rack[frag.owner]
        nodes[:n, 3] = rack_used
        nodes[:n, 4] = holder
        nodes[:n, 5] = self.risk
        nodes[:n, 6] = self.free[:, 0] >= frag.nbytes
        nodes[:n, 7] = np.clip(self.free[:, 1] / (4.0 * frag.nbytes), 0.0, 1.0)
        nodes[:n, 8] = self.held / 3.0
        nodes[:n, 9] = mask[0: 2 * n: 2]
        nodes[:n, 10] = mask[1: 2 * n: 2]
        nodes[:n, 11] = np.clip(np.log2(self.speed) / 2.0, -1.5, 1.5)  # heterogeneity: slow nodes read slowly
        nodes[:n, 12] = np.clip(self.free[:, 0] / (2.0 * frag.nbytes), 0.0, 1.0)
        mean_p = float(self.prob.mean())
        glob[:] = [self.risk[frag.owner], len(chosen) / self.request.max_replicas,
                   self.budget / (len(self.order) * frag.nbytes), self.round / self.request.max_replicas,
                   (self.k % len(self.order)) / len(self.order),
                   min(max(math.log10(max(self.prob[frag.owner], 1e-5) / max(mean_p, 1e-5)), -2.0), 2.0),
                   _risk_scale(mean_p), *self._spec_features,
                   min(max(math.log2(frag.nbytes / self.mean_bytes), -2.0), 2.0) / 2.0]
        return np.concatenate([nodes.ravel(), glob]).astype(np.float32)

    # -- transitions --------------------------------------------------------------------
    def apply(self, action: int) -> int | None:
        """Apply a *valid* action; returns the owner whose fragment gained a replica (None: moved on)."""
        frag = self.current
        self._mask = None
        if action == 2 * self.max_nodes:
            self.k += 1
            self._skip_forced()
            return None
        node, tier = divmod(int(action), 2)
        if len(self.sites[frag.fragment_id]) < self.request.min_replicas:
            self.deficit -= frag.nbytes
        self.sites[frag.fragment_id].append(ReplicaSite(node, _TIERS[tier]))
        self.free[node, tier] -= frag.nbytes
        self.held[node] += 1
        self.budget -= frag.nbytes
        self.k += 1  # one replica per fragment and round
        self._skip_forced()
        return frag.owner

    def _skip_forced(self) -> None:
        """Move past fragments whose only valid action is 'next' (no decision to learn)."""
        while not self.done:
            if self.action_masks()[:-1].any():
                return
            self.k += 1
            self._mask = None

    def placement(self) -> Placement:
        return Placement(self.sites)


class EpisodeSource:
    """Yields ``(request, view, cases)`` for one episode from a numpy Generator."""

    def sample(self, rng: np.random.Generator):
        raise NotImplementedError  # an abstract base: subclasses below


class SimulatedEpisodes(EpisodeSource):
    """Episodes from simulated traces: the views the forecaster produced, cases from the true hazards."""

    def __init__(self, scenarios, *, replicas: int = 2):
        self.scenarios = [s for s in scenarios if s.trace.node_hazard is not None]
        if not self.scenarios:
            from ucp.replication.errors import PlacementInputError

            raise PlacementInputError("simulated episodes need synthetic traces (with true hazards)")
        self.replicas = replicas
        # Weights are hazards over their mean per interval, *not* normalised per episode: the target
        # is the mean recovery time over failures, so an interval twice as likely to see one counts twice.
        totals = [s.trace.node_hazard.sum(1) + s.trace.rack_hazard.sum(1) + s.trace.burst_hazard
                  for s in self.scenarios]
        self.scale = 1.0 / max(float(np.mean(np.concatenate(totals))), 1e-12)

    @classmethod
    def from_family(cls, family: str, *, intervals: int, seed: int, spec: ClusterSpec | None = None):
        """Flat-forecast episodes of one family (tests and quick checks)."""
        from ucp.replication.scenarios import family_trace
        from ucp.replication.simulator import Scenario

        return cls([Scenario.without_forecasts(family_trace(family, intervals=intervals, seed=seed, spec=spec))])

    def sample(self, rng):
        scenario = self.scenarios[rng.integers(len(self.scenarios))]
        trace = scenario.trace
        t = int(rng.integers(trace.intervals))
        spec = trace.spec
        cases = [FailureCase(frozenset([i]), frozenset([i]), float(w) * self.scale)
                 for i, w in enumerate(trace.node_hazard[t])]
        for r, w in enumerate(trace.rack_hazard[t]):
            if w > 0:
                nodes = frozenset(range(r * spec.rack_size, min((r + 1) * spec.rack_size, spec.nodes)))
                cases.append(FailureCase(nodes, nodes, float(w) * self.scale))
        if trace.burst_hazard[t] > 0:  # bursts hit any nodes: a few random ones stand for all
            for _ in range(_BURST_SAMPLES):
                size = min(trace.burst_size, spec.nodes)
                nodes = frozenset(rng.choice(spec.nodes, size=size, replace=False).tolist())
                cases.append(FailureCase(nodes, nodes, float(trace.burst_hazard[t]) * self.scale / _BURST_SAMPLES))
        return scenario.request(t), scenario.view(t), cases


class ReplayedEpisodes(EpisodeSource):
    """Episodes from observed outcomes: the view a placement was made in, the failures that followed."""

    def __init__(self, outcomes):
        self.outcomes = [o for o in outcomes if o.events]

    def sample(self, rng):
        outcome = self.outcomes[rng.integers(len(self.outcomes))]
        gone, cases = frozenset(), []
        for lost in outcome.events:
            gone = gone | lost
            cases.append(FailureCase(lost, gone, 1.0))
        return outcome.request, outcome.view, cases


class PlacementEnv(gym.Env):
    """Gymnasium environment: one checkpoint placement per episode (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, *, source: EpisodeSource, max_nodes: int = MAX_NODES):
        super().__init__()
        self.source, self.max_nodes = source, max_nodes
        size = max_nodes * NODE_FEATURES + GLOBAL_FEATURES
        self.observation_space = gym.spaces.Box(low=-2.0, high=2.0, shape=(size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2 * max_nodes + 1)
        self.builder: PlacementBuilder | None = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        while True:
            request, view, cases = self.source.sample(self.np_random)
            self.builder = PlacementBuilder(request, view, max_nodes=self.max_nodes)
            if not self.builder.done:  # a placement with a decision in it
                break
        self.cases = list(cases)
        self.by_owner: dict[int, list[int]] = {}
        for i, case in enumerate(self.cases):
            for node in case.lost:
                self.by_owner.setdefault(node, []).append(i)
        self.costs = np.array([self._cost(c) for c in self.cases])
        self.steps, self.step_limit = 0, 4 * len(request.fragments) * (request.max_replicas + 1)
        return self.builder.observation(), {}

    def _cost(self, case: FailureCase) -> float:
        b = self.builder
        # Only shards that already have a replica count as lost: every shard must get one (the mask
        # says so), so "no replica yet" is no decision, and charging it would bury the signal of the
        # choices that are decisions (which tier, which rack) under large, fixed jumps.
        placed = frozenset(o for o in case.lost if any(b.sites[fid] for fid in b.fragments_of.get(o, ())))
        partial = SimpleNamespace(sites=b.sites)
        seconds = recover(b.request, partial, spec=b.view.spec, lost=placed, unavailable=case.unavailable,
                          times=b.times).seconds
        return seconds / b.view.spec.interval_s

    def potential(self) -> float:
        return -float(np.dot([c.weight for c in self.cases], self.costs))

    def step(self, action):
        self.steps += 1
        truncated = self.steps >= self.step_limit
        if not self.builder.action_masks()[int(action)]:
            # unreachable under masking; a penalty without a state change for unmasked agents
            return self.builder.observation(), -1.0, False, truncated, {"invalid_action": True}
        before = self.potential()
        owner = self.builder.apply(int(action))
        if owner is not None:
            for i in self.by_owner.get(owner, ()):
                self.costs[i] = self._cost(self.cases[i])
        reward = self.potential() - before
        return self.builder.observation(), float(reward), self.builder.done, truncated and not self.builder.done, {}

    def action_masks(self) -> np.ndarray:
        return self.builder.action_masks()
