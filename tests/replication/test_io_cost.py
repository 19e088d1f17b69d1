"""The I/O cost model: measured through the replica tiers, fitted with gradient boosting, checked held out."""

from __future__ import annotations

import json

import pytest

from ucp.replication.errors import PlacementInputError
from ucp.replication.io_cost import (IO_TIERS, IoCostModel, Transfer, held_out_r2, load_measurements, measure,
                                     save_measurements)
from ucp.replication.replica_tiers import DiskTier, MemoryTier
from ucp.replication.transfer_times import TransferTimes
from ucp.replication.cluster import ClusterSpec


def test_measure_times_put_and_get_through_the_tiers(tmp_path):
    tiers = {"memory": MemoryTier(capacity_bytes=1 << 22), "disk": DiskTier(tmp_path / "d", capacity_bytes=1 << 22)}
    rows = measure(tiers, sizes=(4096, 65536), runs=2)
    assert sorted({(r.tier, r.op, r.nbytes, r.run) for r in rows}) == sorted(
        (t, o, n, k) for t in tiers for o in ("write", "restore") for n in (4096, 65536) for k in range(2))
    assert all(r.seconds > 0 for r in rows)
    assert tiers["disk"].checkpoints() == [] and tiers["memory"].bytes_held() == 0  # evicted after timing
    save_measurements(rows, tmp_path / "io.json")
    assert load_measurements(tmp_path / "io.json") == rows


def test_the_shipped_model_is_fitted_at_load_and_held_out_r2_is_reported():
    rows = load_measurements()
    assert {r.tier for r in rows} == set(IO_TIERS) and len({r.run for r in rows}) >= 3
    by_run, by_size = held_out_r2(rows, split="run"), held_out_r2(rows, split="size")
    assert by_run["r2_log_seconds"] > 0.8 and by_size["r2_log_seconds"] > 0.6  # docs/REPLICATION.md has the values
    model = IoCostModel.shipped()
    assert model.seconds("restore", "remote", 64e9) > model.seconds("restore", "disk", 64e9)
    # beyond the largest measured fragment the throughput stays the largest size's
    big = max(r.nbytes for r in rows)
    assert model.throughput("restore", "disk", 64e9) == pytest.approx(model.throughput("restore", "disk", big))


def test_times_are_the_slower_of_the_store_and_the_path():
    spec, model = ClusterSpec(), IoCostModel.shipped()
    times = TransferTimes(spec, (1.0, 0.5), model)
    store = model.seconds("restore", "remote", 64e9)
    assert times.tier_seconds("remote", 64e9) == pytest.approx(max(store, 64e9 / spec.remote_bandwidth_bps))
    assert times.peer_seconds(1, "disk", 64e9) == pytest.approx(2 * times.tier_seconds("disk", 64e9))
    assert TransferTimes(spec).tier_seconds("memory", 64e9) == pytest.approx(64e9 / spec.memory_bandwidth_bps)


@pytest.mark.parametrize("doc, message", [
    ({"format": "other"}, "not a ucp-io-measurements version 1 document; write one with "
                          "`ucp place io-measure --out FILE`"),
    ({"format": "ucp-io-measurements", "version": 1, "rows": [["tape", "write", 1, 0, 1.0]]},
     "row 0 ['tape', 'write', 1, 0, 1.0] is not (tier, op, bytes > 0, run, seconds > 0)"),
])
def test_bad_tables_are_refused_by_name(tmp_path, doc, message):
    path = tmp_path / "io.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlacementInputError) as err:
        load_measurements(path)
    assert str(err.value) == f"{path}: {message}"


def test_a_table_missing_a_tier_is_refused():
    rows = [Transfer("memory", op, 1024, 0, 1e-6) for op in ("write", "restore")]
    with pytest.raises(PlacementInputError) as err:
        IoCostModel(rows)
    assert str(err.value) == ("I/O measurements lack disk write, disk restore, remote write, remote restore; "
                              "measure every tier with `ucp place io-measure`")
