"""ETTR with recovery and save costs learned from the recovery bench, restart against hot recovery.

The recovery bench (``python -m ucp.tools.bench.recovery_bench --update-costs``) writes its
summary to ``ucp/reliability/data/recovery_costs.json``, shipped with the package
(docs/ETTR.md, "Measured costs", describes the file). This module reads it and gives every
system (``ucp-hot``, ``ucp-restart``, ``dcp-restart``, ``deepspeed-universal``, ``torchft``) a
per-failure downtime and a per-checkpoint save cost for the analytical model
(:func:`~ucp.reliability.ettr.model.expected_ettr`):

* **downtime** = recovery (SIGKILL to the start of the first step after it) extrapolated to
  the job's GPU count, plus what the first step takes beyond a normal step (warm-up); the
  work redone since the last checkpoint is the model's own ``interval / 2`` term;
* **save cost** = a *background* save's cost to the loop: the snapshot the loop waits for plus
  the slowdown of the steps that overlap the write (both measured), the same for every system.

Extrapolation from the bench's ``world`` ranks to ``gpus``: the bench measures one process
per rank with the per-rank state of its size; a larger job is taken to hold the same state per
rank (weak scaling), so the parts each rank does on its own data (detection, teardown,
conversion, loading or resharding its shard, the first step) stay as measured, and the parts
that coordinate every rank (``reform`` for the hot path, ``restart`` for the restart paths:
process start, rendezvous, process-group creation) grow with ``log2(gpus) / log2(world)``, the
depth of a tree collective. torchft's recovery is not split by the bench (its quorum and its
heal from a peer are one part), so it is held as measured, which favours it. The seconds are this machine's (CPU, gloo, a local disk); the ratios between
systems are what carries over, not the seconds.

    >>> costs = MeasuredCosts.from_summary(EXAMPLE, size="demo", scenario="spare")
    >>> round(costs.recovery["ucp-hot"].at(gpus=4), 2), round(costs.recovery["ucp-hot"].at(gpus=16), 2)
    (1.0, 1.5)
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

from ucp.reliability.ettr.model import ETTRInputError, JobReliability, expected_ettr, optimal_interval_s

__all__ = ["COSTS_FILE", "LLAMA3", "MeasuredCostsError", "RecoveryCost", "SaveCost", "MeasuredCosts",
           "compare_systems", "llama3_failures_per_1000_node_days"]

COSTS_FILE = Path(__file__).resolve().parents[1] / "data" / "recovery_costs.json"
# Parts of a recovery that coordinate every rank, by the name the bench gives them.
COORDINATION_PARTS = ("reform_s", "restart_s")
RESTARTING = ("ucp-restart", "dcp-restart", "deepspeed-universal")  # these pay the queue wait, if any

# Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 5): 419 unexpected
# interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs.
LLAMA3 = {"interruptions": 419, "days": 54.0, "gpus": 16384}

EXAMPLE = {"world": 4, "sizes": {"demo": {"state_bytes": 522624}},
           "scenarios": {"demo-spare": {"ucp-hot": {"recovery_s": 1.0, "first_step_s": 0.5, "lost_steps": 1,
                                                    "parts": {"detect_s": 0.1, "reform_s": 0.5, "reshard_s": 0.4}}}},
           "save_costs": {"demo": {"step_s": 0.4, "save_sync_s": 1.2, "save_blocking_s": 0.9,
                                   "save_background_s": 0.3, "slowdown_s": 0.1}}}


class MeasuredCostsError(ETTRInputError):
    """The recovery-costs file is missing, unreadable or lacks what was asked for."""


def llama3_failures_per_1000_node_days(gpus_per_node: int = 8) -> float:
    """Llama 3's interruption rate per 1000 node-days (419 in 54 days on 16,384 GPUs).

    >>> round(llama3_failures_per_1000_node_days(), 2)
    3.79
    """
    nodes = LLAMA3["gpus"] / gpus_per_node
    return LLAMA3["interruptions"] / (LLAMA3["days"] * nodes) * 1000.0


@dataclass(frozen=True)
class RecoveryCost:
    """One system's measured recovery, split into what stays and what grows with the job."""

    system: str
    measured_world: int
    recovery_s: float
    coordination_s: float
    first_step_s: float
    lost_steps: float

    def at(self, *, gpus: int) -> float:
        """Recovery extrapolated to ``gpus`` ranks (see the module doc)."""
        growth = math.log2(max(gpus, 2)) / math.log2(max(self.measured_world, 2))
        return self.recovery_s - self.coordination_s + self.coordination_s * growth


@dataclass(frozen=True)
class SaveCost:
    """What one checkpoint costs the training loop (seconds, medians of the bench's rounds)."""

    step_s: float
    save_sync_s: float
    save_blocking_s: float
    save_background_s: float
    slowdown_s: float

    @property
    def background_cost_s(self) -> float:
        """A background save's cost to the loop: the snapshot it waits for + the slowed steps."""
        return self.save_blocking_s + self.slowdown_s


@dataclass(frozen=True)
class MeasuredCosts:
    """The costs of one size and one transition of the recovery bench."""

    source: str
    size: str
    scenario: str
    world: int
    state_bytes: int
    recovery: dict[str, RecoveryCost]
    save: SaveCost

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, *, size: str = "1gib",
             scenario: str = "spare") -> MeasuredCosts:
        """Read the bench summary at ``path`` (default: the shipped :data:`COSTS_FILE`)."""
        path = Path(path) if path is not None else COSTS_FILE
        try:
            summary = json.loads(path.read_text())
        except FileNotFoundError:
            raise MeasuredCostsError(f"no recovery-costs file at {path}; write one with "
                                     "`python -m ucp.tools.bench.recovery_bench --json FILE`") from None
        except (OSError, ValueError) as error:
            raise MeasuredCostsError(f"cannot read recovery-costs file {path}: {error}") from None
        return cls.from_summary(summary, size=size, scenario=scenario, source=str(path))

    @classmethod
    def from_summary(cls, summary: dict, *, size: str, scenario: str, source: str = "<summary>") -> MeasuredCosts:
        name = f"{size}-{scenario}"
        rows = summary.get("scenarios", {}).get(name)
        saves = summary.get("save_costs", {}).get(size)
        if rows is None or saves is None:
            have = sorted(summary.get("scenarios", {}))
            missing = f"scenario {name!r}" if rows is None else f"save costs for size {size!r}"
            raise MeasuredCostsError(f"recovery-costs file {source} has no {missing} (it has scenarios "
                                     f"{', '.join(have) or 'none'}); rerun the recovery bench with that size "
                                     "and transition")
        world = int(summary.get("world", 4))
        recovery = {system: RecoveryCost(system, world, row["recovery_s"],
                                         sum(row.get("parts", {}).get(p, 0.0) for p in COORDINATION_PARTS),
                                         row["first_step_s"], row["lost_steps"])
                    for system, row in rows.items()}
        save = SaveCost(**{k: saves[k] for k in ("step_s", "save_sync_s", "save_blocking_s", "save_background_s",
                                                 "slowdown_s")})
        return cls(source, size, scenario, world, int(summary["sizes"][size]["state_bytes"]), recovery, save)


def compare_systems(costs: MeasuredCosts, job: JobReliability, *, gpus: int,
                    interval_s: float | None = None) -> list[dict]:
    """One row per system: its downtime at ``gpus``, the save cost, the ETTR-optimal interval and
    E[ETTR] there (and at ``interval_s``). ``job`` gives the size and failure rate (and the queue
    wait, charged to the systems that restart the job); its restart and save times are replaced.
    """
    rows = []
    for system, cost in costs.recovery.items():
        downtime = cost.at(gpus=gpus) + max(0.0, cost.first_step_s - costs.save.step_s)
        measured = replace(job, restart_s=downtime, save_blocking_s=costs.save.background_cost_s,
                           queue_s=job.queue_s if system in RESTARTING else 0.0)
        best = optimal_interval_s(measured)
        row = {"system": system, "recovery_measured_s": cost.recovery_s, "recovery_at_gpus_s": cost.at(gpus=gpus),
               "downtime_s": downtime, "save_cost_s": costs.save.background_cost_s,
               "optimal_interval_s": best, "ettr_at_optimal": expected_ettr(measured, interval_s=best)}
        if interval_s is not None:
            row["ettr_at_interval"] = expected_ettr(measured, interval_s=interval_s)
        rows.append(row)
    return rows
