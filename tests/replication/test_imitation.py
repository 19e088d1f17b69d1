"""DAgger from the exact optimum: the teacher's actions complete to the optimum, and the learner moves toward it."""

from __future__ import annotations

import numpy as np
import pytest

from ucp.replication.imitation import _rollout, dagger, expert_action, teacher_instances
from ucp.replication.optimum import expected_seconds, optimum, small_instance
from ucp.replication.rl_env import PlacementBuilder
from ucp.replication.rl_policy import RLPolicy


@pytest.mark.parametrize("kind", [{}, {"hetero": True}])
def test_following_the_teacher_reaches_the_optimum(kind):
    for seed in range(3):
        instance = small_instance(seed=seed, **kind)
        builder = PlacementBuilder(instance.request, instance.view)
        while not builder.done:
            builder.apply(expert_action(builder, instance))
        assert expected_seconds(instance, builder.placement()) == pytest.approx(optimum(instance)[1])


def test_teacher_instances_avoid_the_evaluation_seeds_and_fit():
    instances = teacher_instances(4)
    assert all(optimum(i)[1] > 0 for i in instances)
    evaluated = [small_instance(seed=s, hetero=True) for s in range(20)]
    assert not any(i.request == e.request for i in instances for e in evaluated)


def test_dagger_moves_the_policy_toward_the_teacher():
    instances = teacher_instances(8)
    policy = RLPolicy.load(online=False)

    def agreement():
        actor = policy.model.policy.mlp_extractor.numpy_actor()
        rows = [r for i in instances for r in _rollout(i, actor, policy.max_nodes, follow_teacher=True)]
        return np.mean([np.argmax(np.where(m, actor(o), -np.inf)) == a for o, m, a in rows])

    before = agreement()
    stats = dagger(policy, instances, rounds=2, epochs=40, seed=0)
    assert stats["samples"] >= 2 * 8 * 3 and agreement() > before
