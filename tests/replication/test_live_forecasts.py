"""Forecasts in the live path: ReplicaManager places with LogRisk's forecasts and re-places when they move.

Four gloo processes save a checkpoint and replicate it with the forecast-aware greedy policy;
each rank's risk comes from a ``ucp logs analyze --json``-shaped report through the pretrained
forecaster (:class:`ucp.replication.live_risk.LogRisk`). Node n1 logs hardware errors and fatal
incidents: its arrays get more copies than a quiet node's. Then n1 goes quiet and n3 starts
failing: ``replace_if_forecasts_changed`` places again, n3's arrays gain copies, n1's lose the
ones no longer placed (dropped from the tiers), and an unchanged forecast changes nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import ucp
from ucp.stores.options import StoreOptions
from ucp.replication.live_risk import LogRisk
from ucp.replication.policies import GreedyForecast
from ucp.replication.replica_tiers import MemoryTier
from ucp.replication.replicas import ReplicaManager
from tests.replication.test_replica_recovery import WORLD, _spec, _state
from ucp.integrations.launch import free_port

HOUR = 3600.0


def _report(risky: str, now: float) -> dict:
    """A node that logged hardware errors in the last hour and failed three times in the last day."""
    events = [{"timestamp": now - 60.0 * k, "node": risky, "category": "hardware/gpu/xid"} for k in range(1, 40)]
    incidents = [{"start": now - 6 * HOUR * k, "fatal": True, "root_cause": {"node": risky}} for k in range(1, 4)]
    return {"schema_version": 2, "events": events, "incidents": incidents}


def _copies(rmap, owner: int) -> list[int]:
    return [len({h.rank for h in r.holders} - {owner}) for r in rmap.arrays.values() if r.owner == owner]


def _worker(rank: int, port: int, root: str, forecaster) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))  # a loaded 2-core CI machine
    try:
        path = f"{root}/ckpt"
        # One array per fragment (format 3 would pack the rank's state into one): copies are placed per array.
        ucp.save(_state(rank), path, spec=_spec(rank), process_group=dist.group.WORLD,
                 store_options=StoreOptions(pack_max_bytes=256 << 10))
        state = {"report": _report("n1", 1e6), "now": 1e6}
        risk = LogRisk(forecaster)
        tier = MemoryTier(capacity_bytes=64 << 20)
        manager = ReplicaManager(tiers=[tier], replicas=2, node=f"n{rank}", policy=GreedyForecast(),
                                 process_group=dist.group.WORLD,
                                 risk=lambda node: risk.probabilities(state["report"], [node], now=state["now"])[node])
        first = manager.replicate(path)
        assert min(_copies(first, 1)) > max(_copies(first, 0))  # the risky node's arrays get the spare copies
        assert manager.replace_if_forecasts_changed(path) is False  # nothing moved
        state.update(report=_report("n3", 1e6 + 30 * 24 * HOUR), now=1e6 + 30 * 24 * HOUR)
        assert manager.replace_if_forecasts_changed(path) is True
        again = ReplicaManager(tiers=[tier], replicas=2, node=f"n{rank}", process_group=dist.group.WORLD)
        second = again._agreed_map(first.checkpoint)
        assert min(_copies(second, 3)) > max(_copies(second, 1))
        held = set(tier.keys(first.checkpoint))
        placed = {k for k, r in second.arrays.items() if any(h.rank == rank for h in r.holders)}
        assert held == placed  # copies no longer placed were dropped; the budget followed the risk
        out = ucp.load(path, spec=_spec(rank), rank=rank)
        assert all(bool((out[k] == _state(rank)[k]).all()) for k in ("w", "big", "small"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_replicas_follow_forecasts_from_logs(tmp_path):
    from ucp.replication.scenarios import pretrained_forecaster

    forecaster = pretrained_forecaster(intervals=300)
    mp.spawn(_worker, args=(free_port(), str(tmp_path), forecaster), nprocs=WORLD, join=True)
