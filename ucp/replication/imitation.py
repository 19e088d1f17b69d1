"""Imitating the exact optimum (DAgger) on small instances, leashed to the PPO policy elsewhere.

PPO learns from a shaped reward and ties ``greedy``; on small instances the exact optimum
(:mod:`ucp.replication.optimum`) is known, so it can be a teacher instead. :func:`dagger`
fine-tunes the RL policy's actor by DAgger (Ross et al., AISTATS 2011): the first round
follows the teacher, later rounds follow the learner and ask the teacher, in every state
the learner reaches, for the best site of the current shard given the sites already
placed (:func:`expert_action`: the best completion, by exhaustive search). Small
instances have one replica per shard, so they say nothing about the second and third
copies or about skipping; a *leash* term keeps the policy's action distribution on
states of the 16-node training scenarios close to the PPO policy it started from
(KL divergence), so that it does not forget what the small instances cannot teach.

Teacher instances are drawn from the training cluster models only (the generic
heterogeneous small instance, ``hetero-rack``'s and ``hetero-lemon``'s models, alike
nodes), on seeds from 5,000,000 up: never the evaluation's optimum instances (seeds
from 0) and never a held-out family's cluster model.

Example::

    >>> from ucp.replication.optimum import optimum, small_instance
    >>> from ucp.replication.rl_env import PlacementBuilder
    >>> instance = small_instance(seed=0)
    >>> builder = PlacementBuilder(instance.request, instance.view)
    >>> best, _ = optimum(instance)
    >>> node, tier = divmod(expert_action(builder, instance), 2)
    >>> best.sites[builder.current.fragment_id][0].node == node
    True
"""

from __future__ import annotations

import itertools

import numpy as np

from ucp.replication.cluster import TIERS
from ucp.replication.optimum import Instance, expected_seconds, small_instance
from ucp.replication.placement import Placement, ReplicaSite

TEACHER_SEED = 5_000_000


def expert_action(builder, instance: Instance) -> int:
    """The action of the best completion of ``builder``'s partial placement (exhaustive; small instances)."""
    order = builder.order
    rest = order[builder.k % len(order):]
    choices = [[(node, t) for node in range(builder.n) if node != frag.owner and builder.alive[node]
                for t in range(len(TIERS)) if builder.free[node, t] >= frag.nbytes * (1 - 1e-9)] for frag in rest]
    best, best_cost = None, float("inf")
    for combo in itertools.product(*choices):
        used: dict = {}
        for frag, (node, t) in zip(rest, combo):
            used[(node, t)] = used.get((node, t), 0.0) + frag.nbytes
        if any(nbytes > builder.free[node, t] * (1 + 1e-9) for (node, t), nbytes in used.items()):
            continue
        sites = {fid: list(s) for fid, s in builder.sites.items()}
        for frag, (node, t) in zip(rest, combo):
            sites[frag.fragment_id] = sites[frag.fragment_id] + [ReplicaSite(node, TIERS[t])]
        cost = expected_seconds(instance, Placement(sites))
        if cost < best_cost - 1e-12:
            best, best_cost = combo, cost
    if best is None:  # nothing fits: the builder's own mask decides (a forced skip)
        return 2 * builder.max_nodes
    node, t = best[0]
    return 2 * node + t


def teacher_instances(count: int, *, io=None) -> list[Instance]:
    """Small instances from the training cluster models, in turn; draws with no fitting placement are passed."""
    from ucp.replication.optimum import optimum
    from ucp.replication.errors import PlacementError
    from ucp.replication.scenarios import HETERO, HETERO_TRAINING

    kinds = [{"hetero": True, "io": io}, {"io": io}] + [{"cluster": HETERO[f][1], "io": io} for f in HETERO_TRAINING]
    out, seed = [], TEACHER_SEED
    while len(out) < count:
        instance = small_instance(seed=seed, **kinds[seed % len(kinds)])
        seed += 1
        try:
            optimum(instance)
        except PlacementError:
            continue
        out.append(instance)
    return out


def _rollout(instance: Instance, actor, max_nodes: int, *, follow_teacher: bool):
    """(observation, mask, teacher's action) at every decision along one episode."""
    from ucp.replication.rl_env import PlacementBuilder

    builder = PlacementBuilder(instance.request, instance.view, max_nodes=max_nodes)
    rows = []
    while not builder.done:
        obs, mask = builder.observation(), builder.action_masks().copy()
        label = expert_action(builder, instance)
        if mask[label]:
            rows.append((obs, mask, label))
        if follow_teacher and mask[label]:
            action = label
        else:
            logits = actor(obs)
            logits[~mask] = -np.inf
            action = int(np.argmax(logits))
        builder.apply(action)
    return rows


def leash_states(source, actor, max_nodes: int, *, episodes: int, seed: int):
    """(observation, mask) along the starting policy's own placements of ``episodes`` training episodes."""
    from ucp.replication.rl_env import PlacementBuilder

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(episodes):
        request, view, _ = source.sample(rng)
        builder = PlacementBuilder(request, view, max_nodes=max_nodes)
        while not builder.done:
            obs, mask = builder.observation(), builder.action_masks().copy()
            rows.append((obs, mask))
            logits = actor(obs)
            logits[~mask] = -np.inf
            builder.apply(int(np.argmax(logits)))
    return rows


def dagger(policy, instances: list[Instance], *, rounds: int = 3, leash: list | None = None, leash_weight: float = 1.0,
           epochs: int = 30, lr: float = 1e-3, seed: int = 0, progress=None) -> dict:
    """Fine-tune ``policy`` (an :class:`~ucp.replication.rl_policy.RLPolicy`) in place; returns training stats.

    ``leash``: ``(observation, mask)`` rows (:func:`leash_states`) whose action distribution is held
    close to the starting policy's.
    """
    import torch

    from ucp.replication.rl_policy import _one_thread

    net = policy.model.policy.mlp_extractor
    torch.manual_seed(seed)
    data: list = []
    with torch.no_grad(), _one_thread():
        leash_obs = torch.tensor(np.array([r[0] for r in leash or []]), dtype=torch.float32)
        leash_mask = torch.tensor(np.array([r[1] for r in leash or []]), dtype=torch.bool)
        leash_target = (torch.log_softmax(net.forward_actor(leash_obs).masked_fill(~leash_mask, -1e9), -1)
                        if leash else None)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    stats = {"rounds": [], "samples": 0}
    for r in range(rounds):
        actor = net.numpy_actor()
        for instance in instances:
            data += _rollout(instance, actor, policy.max_nodes, follow_teacher=r == 0)
        agree = float(np.mean([np.argmax(np.where(m, actor(o), -np.inf)) == a for o, m, a in data]))
        obs = torch.tensor(np.array([d[0] for d in data]), dtype=torch.float32)
        mask = torch.tensor(np.array([d[1] for d in data]), dtype=torch.bool)
        label = torch.tensor([d[2] for d in data])
        rng = np.random.default_rng(seed + r)
        with _one_thread():
            for _ in range(epochs):
                for batch in np.array_split(rng.permutation(len(data)), max(1, len(data) // 128)):
                    logits = net.forward_actor(obs[batch]).masked_fill(~mask[batch], -1e9)
                    loss = torch.nn.functional.cross_entropy(logits, label[batch])
                    if leash:
                        pick = torch.as_tensor(rng.integers(len(leash_obs), size=len(batch)))
                        now = torch.log_softmax(net.forward_actor(leash_obs[pick]).masked_fill(~leash_mask[pick],
                                                                                                -1e9), -1)
                        old = leash_target[pick]
                        loss = loss + leash_weight * (old.exp() * (old - now)).sum(-1).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        stats["rounds"].append({"samples": len(data), "agreement_before": agree, "loss": float(loss.detach())})
        if progress is not None:
            progress(r + 1, rounds)
    policy._actor = None  # the numpy snapshot is stale
    stats["samples"] = len(data)
    return stats


def imitation_study(*, instances: int, rounds: int, leash_weight: float, evaluate: int = 20, seed: int = 0,
                    out=None, progress=None) -> dict:
    """Fine-tune the shipped policy by :func:`dagger` and compare optimum gaps before and after.

    Gaps (mean and worst over ``evaluate`` instances, seeds from 0) on the heterogeneous small
    instances, on ``hetero-x100``'s cluster model (never trained on) and on alike nodes, for
    ``greedy``, the shipped policy and the fine-tuned one (saved to ``out`` when given).
    """
    from ucp.replication.io_cost import IoCostModel
    from ucp.replication.optimum import optimum_gaps
    from ucp.replication.policies import GreedyForecast
    from ucp.replication.policy_file import save_policy
    from ucp.replication.rl_env import SimulatedEpisodes
    from ucp.replication.rl_policy import RLPolicy, training_scenarios
    from ucp.replication.scenarios import HETERO

    io = IoCostModel.shipped()
    shipped, tuned = RLPolicy.load(online=False), RLPolicy.load(online=False)
    source = SimulatedEpisodes(training_scenarios(seed=seed, intervals=300, pretrain_intervals=1000, io=io))
    leash = leash_states(source, shipped.model.policy.mlp_extractor.numpy_actor(), shipped.max_nodes,
                         episodes=60, seed=seed + 1)
    stats = dagger(tuned, teacher_instances(instances, io=io), rounds=rounds, leash=leash,
                   leash_weight=leash_weight, seed=seed, progress=progress)
    if out is not None:
        save_policy(tuned.model, out, trained={"imitation": {"instances": instances, "rounds": rounds,
                                                             "leash_weight": leash_weight, "seed": seed}})
    tuned.name = "rl-imitation"
    gaps = {}
    for key, kind in (("hetero", {"hetero": True}), ("hetero-x100", {"cluster": HETERO["hetero-x100"][1]}),
                      ("homogeneous", {})):
        found = optimum_gaps([GreedyForecast(), shipped, tuned], seeds=evaluate, io=io, **kind)
        gaps[key] = {name: {"optimum_gap": float(np.mean(g)), "max": float(np.max(g))} for name, g in found.items()}
    return {"training": stats, "leash_states": len(leash), "gaps": gaps}
