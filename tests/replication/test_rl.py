"""The RL placer: gymnasium's env checker, action masks, the shipped policy, training and closed-loop retraining."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from ucp.replication.cluster import ClusterSpec
from ucp.replication.errors import PlacementInputError, PolicyFileError
from ucp.replication.placement import ClusterView, NodeState, PlacementRequest, validate_placement
from ucp.replication.rl_env import PlacementBuilder, PlacementEnv, ReplayedEpisodes, SimulatedEpisodes
from ucp.replication.policy_file import save_policy
from ucp.replication.rl_policy import RLPolicy, train_policy
from ucp.replication.simulator import Scenario, run_interval
from ucp.replication.scenarios import family_trace

# one worker runs this module, so its module-scoped fixture is built once (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("rl")

SPEC = ClusterSpec()


@pytest.fixture(scope="module")
def shipped():
    return RLPolicy.load(online=False)


@pytest.fixture(scope="module")
def source():
    return SimulatedEpisodes.from_family("correlated-rack", intervals=200, seed=3)


def test_env_passes_gymnasiums_checker(source):
    check_env(PlacementEnv(source=source), skip_render_check=True)


def test_masks_exclude_every_invalid_site():
    spec = ClusterSpec(nodes=8, rack_size=2, memory_slots=1, disk_slots=1)
    base = ClusterView.uniform(spec)
    nodes = list(base.nodes)
    nodes[3] = NodeState(**{**vars(nodes[3]), "alive": False})
    nodes[5] = NodeState(**{**vars(nodes[5]), "memory_free_bytes": 0.0})
    view = ClusterView(tuple(nodes), spec)
    builder = PlacementBuilder(PlacementRequest.one_per_node(spec), view, max_nodes=32)
    owner = builder.current.owner
    mask = builder.action_masks()
    assert mask.shape == (65,)
    assert not mask[2 * owner] and not mask[2 * owner + 1]  # never on the owner
    assert not mask[6] and not mask[7]  # node 3 is down
    assert not mask[10] and mask[11]  # node 5: memory full, disk free
    assert not mask[16:64].any()  # padding beyond the 8 real nodes
    assert not mask[64]  # 'skip' is masked until the fragment has its minimum replica
    first = builder.current
    while builder.round == 0:  # round 0: every fragment's first replica, the lowest valid site
        builder.apply(int(np.flatnonzero(builder.action_masks()[:-1])[0]))
    assert builder.current == first  # round 1 starts again with the riskiest fragment
    holder = builder.sites[first.fragment_id][0].node
    assert not builder.action_masks()[2 * holder] and not builder.action_masks()[2 * holder + 1]
    assert builder.action_masks()[64]  # a second replica is optional


def test_invalid_action_is_penalised_without_a_state_change(source):
    env = PlacementEnv(source=source)
    obs, _ = env.reset(seed=0)
    owner = env.builder.current.owner
    after, reward, done, _, info = env.step(2 * owner)
    assert reward == -1.0 and info == {"invalid_action": True} and not done
    assert np.array_equal(obs, after)


def _play(env, prefer_far_memory: bool) -> tuple[float, float]:
    """Scripted episode: far racks and memory first, or the owner's rack and disk first."""
    start, total, done = env.potential(), 0.0, False
    while not done:
        b = env.builder
        valid = np.flatnonzero(b.action_masks()[:-1])
        far = lambda a: b.rack[a // 2] != b.rack[b.current.owner]  # noqa: E731
        score = lambda a: (far(a) == prefer_far_memory) * 2 + ((a % 2 == 0) == prefer_far_memory)  # noqa: E731
        _, reward, done, _, _ = env.step(int(max(valid, key=score)) if len(valid) else 64)
        total += reward
    return total, env.potential() - start


def test_episode_return_ranks_placements_by_expected_recovery_time(source):
    good, bad = PlacementEnv(source=source), PlacementEnv(source=source)
    good.reset(seed=1)
    bad.reset(seed=1)
    good_return, good_change = _play(good, prefer_far_memory=True)
    bad_return, bad_change = _play(bad, prefer_far_memory=False)
    assert good_return == pytest.approx(good_change) and bad_return == pytest.approx(bad_change)
    assert good_return > bad_return  # memory in other racks beats disk in the owner's rack
    validate_placement(good.builder.request, good.builder.view, good.builder.placement())


def _random_views(count, seed):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        base = ClusterView.uniform(SPEC, rng.uniform(0, 0.2, SPEC.nodes) ** 2)
        nodes = [NodeState(**{**vars(n), "memory_free_bytes": n.memory_free_bytes * rng.integers(0, 2)})
                 for n in base.nodes]
        yield ClusterView(tuple(nodes), SPEC), int(rng.integers(0, SPEC.remote_every))


def test_shipped_policy_only_makes_valid_placements(shipped):
    for view, stale in _random_views(25, seed=4):
        request = PlacementRequest.one_per_node(SPEC, intervals_since_remote=stale)
        placement = shipped.place(request, view)
        validate_placement(request, view, placement)
        assert placement.replica_bytes(request) <= request.budget_bytes


def test_shipped_policy_keeps_replicas_off_the_owners_rack(shipped):
    view = ClusterView.uniform(SPEC, np.random.default_rng(5).uniform(0, 0.2, SPEC.nodes) ** 2)
    request = PlacementRequest.one_per_node(SPEC, intervals_since_remote=3)
    placement = shipped.place(request, view)
    # a rack failure never takes every copy of a shard (random placement would, for ~3% of shards)
    for frag in request.fragments:
        assert any(SPEC.rack_of(s.node) != SPEC.rack_of(frag.owner) for s in placement.sites[frag.fragment_id])
    with_memory = sum(any(s.tier == "memory" for s in sites) for sites in placement.sites.values())
    assert with_memory >= 12  # 16 memory slots for 16 shards: most shards get a fast copy


def test_numpy_actor_equals_the_torch_network(shipped):
    builder = PlacementBuilder(PlacementRequest.one_per_node(SPEC), next(_random_views(1, seed=6))[0])
    obs = builder.observation()
    net = shipped.model.policy.mlp_extractor
    expected = net.forward_actor(torch.as_tensor(obs)[None])[0].detach().numpy()
    assert np.allclose(net.numpy_actor()(obs), expected, atol=1e-5)


def test_too_large_a_cluster_is_refused(shipped):
    spec = ClusterSpec(nodes=40, rack_size=8)
    with pytest.raises(PlacementInputError) as err:
        shipped.place(PlacementRequest.one_per_node(spec), ClusterView.uniform(spec))
    assert str(err.value) == ("the RL policy handles up to 32 nodes, the cluster has 40; "
                              "retrain it with `ucp place train --max-nodes N`")


def test_missing_policy_file(tmp_path):
    with pytest.raises(PolicyFileError) as err:
        RLPolicy.load(tmp_path / "none.safetensors")
    assert str(err.value) == (f"{tmp_path / 'none.safetensors'}: no trained placement policy; "
                              f"run `ucp place train --out {tmp_path / 'none.safetensors'}`")


def test_short_training_run_is_reproducible_and_loads(tmp_path, source):
    a = train_policy(timesteps=1024, seed=3, scenarios=source.scenarios)
    b = train_policy(timesteps=1024, seed=3, scenarios=source.scenarios)
    for pa, pb in zip(a.policy.parameters(), b.policy.parameters()):
        assert torch.equal(pa, pb)
    save_policy(a, tmp_path / "p.safetensors")
    policy = RLPolicy.load(tmp_path / "p.safetensors", online=False)
    request, view = PlacementRequest.one_per_node(SPEC), ClusterView.uniform(SPEC, [0.01] * 16)
    validate_placement(request, view, policy.place(request, view))


def test_closed_loop_retrains_on_observed_failures(tmp_path):
    trace = family_trace("correlated-rack", intervals=120, seed=8)
    scenario = Scenario.without_forecasts(trace)
    policy = RLPolicy.load(online=True, retrain_every=60, retrain_steps=1024, min_outcomes=2)
    before = [p.detach().clone() for p in policy.model.policy.parameters()]
    for t in range(120):
        policy.observe(run_interval(policy, scenario, t))
    assert len(policy.history) == sum(1 for events in trace.failures if events) > 2
    changed = any(not torch.equal(a, b) for a, b in zip(before, policy.model.policy.parameters()))
    assert changed and policy._since < 60  # retrained within the last 60 intervals
    episodes = ReplayedEpisodes(policy.history)
    request, view, cases = episodes.sample(np.random.default_rng(0))
    assert cases and all(c.lost <= c.unavailable for c in cases)
