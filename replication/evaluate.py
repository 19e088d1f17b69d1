"""``ucp place eval``: every policy on identical seeded scenarios of every family.

For each family one trace is made from its seed and the forecasts are computed
once (a copy of the pretrained forecaster, learning online along the trace), so
all five policies see the very same failures and the very same views. Each
policy starts fresh per family (the RL policy from the shipped file, then
retrained closed-loop on that family's outcomes only).

Example::

    >>> options = EvalOptions(intervals=60, families=("correlated-rack",), rl_online=False, pretrain_intervals=300)
    >>> report = evaluate(options)
    >>> sorted(report.to_dict()["scenarios"]["correlated-rack"])
    ['greedy', 'group', 'rack-aware', 'rl', 'static-random']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replication.cluster import ClusterSpec
from replication.errors import PlacementInputError
from replication.forecast import evaluate_forecasts
from replication.policies import baseline_policies
from replication.scenarios import FAMILIES, build_scenario, pretrained_forecaster
from replication.simulator import simulate

POLICY_NAMES = ("static-random", "rack-aware", "group", "greedy", "rl")
METRICS = ("mean_recovery_s", "remote_share", "data_loss_events", "storage_bytes", "storage_utilization")


@dataclass(frozen=True)
class EvalOptions:
    """What to evaluate; the defaults are the documented run (docs/REPLICATION.md)."""

    intervals: int = 2000
    seed: int = 0
    replicas: int = 2
    families: tuple[str, ...] = FAMILIES
    spec: ClusterSpec = field(default_factory=ClusterSpec)
    report_path: str | None = None  # `ucp logs analyze --json` output for log-replay
    policy_path: str | None = None  # trained RL policy (default: the shipped one)
    rl_online: bool = True
    pretrain_intervals: int = 3000  # per synthetic family, for the forecaster's pretraining traces

    def __post_init__(self) -> None:
        if self.intervals < 1:
            raise PlacementInputError(f"intervals must be >= 1, got {self.intervals}")
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown or not self.families:
            raise PlacementInputError(
                f"unknown scenario family '{(unknown or [''])[0]}'; choose from {', '.join(FAMILIES)}")

    def family_seed(self, family: str) -> int:
        return 100 * self.seed + FAMILIES.index(family)


@dataclass(frozen=True)
class EvalReport:
    """Per family and policy the five metrics; forecast quality and recovery counts per family."""

    scenarios: dict
    forecasts: dict
    recoveries: dict
    options: EvalOptions

    def to_dict(self) -> dict:
        """Exactly the ``--json`` document: ``{"scenarios": {family: {policy: {metric: value}}}}``."""
        return {"scenarios": {fam: {pol: dict(vals) for pol, vals in rows.items()}
                              for fam, rows in self.scenarios.items()}}


def make_policies(options: EvalOptions, seed: int) -> list:
    from replication.rl_policy import RLPolicy

    rl = RLPolicy.load(options.policy_path, seed=seed, online=options.rl_online)
    return baseline_policies(seed=seed) + [rl]


def evaluate(options: EvalOptions = EvalOptions(), *, progress=None) -> EvalReport:
    """Run every policy on every family; ``progress(family, policy, done, total)`` is called per interval."""
    forecaster = pretrained_forecaster(spec=options.spec, intervals=options.pretrain_intervals)
    scenarios, forecasts, recoveries = {}, {}, {}
    for family in options.families:
        seed = options.family_seed(family)
        scenario = build_scenario(family, intervals=options.intervals, seed=seed, forecaster=forecaster,
                                  spec=options.spec, replicas=options.replicas, report_path=options.report_path)
        forecasts[family] = evaluate_forecasts(scenario.trace.failure_matrix(), scenario.forecasts)
        recoveries[family] = scenario.trace.event_count()
        scenarios[family] = {}
        for policy in make_policies(options, seed):
            done = [0]

            def tick(family=family, name=policy.name, done=done):
                done[0] += 1
                if progress is not None:
                    progress(family, name, done[0], options.intervals)

            scenarios[family][policy.name] = simulate(policy, scenario, progress=tick).summary()
    return EvalReport(scenarios, forecasts, recoveries, options)


def comparisons(report: EvalReport) -> list[str]:
    """Plain sentences: RL against static random and against the best heuristic, per family."""
    lines = []
    for family, rows in report.scenarios.items():
        rl, base = rows["rl"], rows["static-random"]
        heuristics = {k: v for k, v in rows.items() if k != "rl"}
        best_name = min(heuristics, key=lambda k: heuristics[k]["mean_recovery_s"])
        best = heuristics[best_name]
        cut = 1 - rl["mean_recovery_s"] / base["mean_recovery_s"] if base["mean_recovery_s"] else 0.0
        vs_best = rl["mean_recovery_s"] / best["mean_recovery_s"] - 1 if best["mean_recovery_s"] else 0.0
        storage = rl["storage_bytes"] / base["storage_bytes"] if base["storage_bytes"] else 0.0
        lines.append(f"{family}: rl downtime {abs(cut):.1%} {'lower' if cut >= 0 else 'higher'} than static-random "
                     f"at {storage:.2f}x its storage; {abs(vs_best):.1%} {'longer' if vs_best > 0 else 'shorter'} "
                     f"than the best heuristic ({best_name})")
    return lines


def plot(report: EvalReport, path) -> None:
    """Grouped bars: mean recovery time and storage utilization per family and policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    families = list(report.scenarios)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.16
    x = np.arange(len(families))
    for j, name in enumerate(POLICY_NAMES):
        rec = [report.scenarios[f][name]["mean_recovery_s"] for f in families]
        util = [100 * report.scenarios[f][name]["storage_utilization"] for f in families]
        axes[0].bar(x + (j - 2) * width, rec, width, label=name)
        axes[1].bar(x + (j - 2) * width, util, width, label=name)
    axes[0].set_ylabel("mean recovery time per failure (s)")
    axes[1].set_ylabel("storage utilization (%)")
    for ax in axes:
        ax.set_xticks(x, families)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    opts = report.options
    fig.suptitle(f"Replica placement, {opts.intervals} checkpoint intervals per family, seed {opts.seed}, "
                 f"{opts.replicas} replicas per shard budget")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
