"""What replication reads back from a tier is checked like a manifest before recovery writes anything."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

import ucp
from ucp.replication.errors import ReplicaError
from ucp.replication.replica_tiers import DiskTier, MemoryTier
from ucp.replication.replicas import ReplicaManager
from ucp.checksum import digest
from ucp.errors import ManifestError

ESCAPE = "r0/../../../../escape"


def _replicated(tmp_path, tier):
    path = str(tmp_path / "jobs" / "run" / "ck")
    ucp.save({"w": torch.arange(64.0)}, path)
    ReplicaManager(tiers=[tier], replicas=0).replicate(path)
    return path, tier.checkpoints()[0]


def _doctor(tier, ck, key, blob=b"owned"):
    """Add an array to the tier's replica map, with a blob whose digest matches the record."""
    meta = tier.get_meta(ck)
    rmap = json.loads(meta.replica_map)
    rmap["arrays"][key] = {"owner": 0, "bytes": len(blob), "digest": digest(blob),
                           "files": [["f", len(blob), digest(blob)]], "holders": [{"rank": 0, "tier": tier.tier}]}
    tier.put_meta(ck, dataclasses.replace(meta, replica_map=json.dumps(rmap).encode()))
    tier.put(ck, key, blob)


def _outside(tmp_path) -> list[str]:
    return sorted(os.listdir(tmp_path / "jobs"))


def test_a_disk_tier_naming_an_escaping_array_is_refused_and_nothing_is_written(tmp_path):
    path, ck = _replicated(tmp_path, DiskTier(tmp_path / "tier", capacity_bytes=1 << 20))
    _doctor(DiskTier(tmp_path / "tier", capacity_bytes=1 << 20), ck, ESCAPE)
    os.remove(os.path.join(path, "manifest.json"))  # recovery would rebuild every array it is told of
    with pytest.raises(ManifestError) as err:
        ReplicaManager(tiers=[DiskTier(tmp_path / "tier", capacity_bytes=1 << 20)], replicas=0).recover(path)
    blob = os.path.join(tmp_path / "tier", ck, "r0%2F..%2F..%2F..%2F..%2Fescape.blob")
    assert str(err.value) == (
        f"{blob}: replica blob for array key {ESCAPE!r}, which is not a relative path of plain names under data/; "
        "the replica tier is damaged - remove that file (or the tier's folder) and replicate again")
    assert _outside(tmp_path) == ["run"] and not os.path.exists(tmp_path / "escape")


def test_recover_refuses_a_replica_map_with_an_escaping_key(tmp_path):
    tier = MemoryTier(capacity_bytes=1 << 20)
    path, ck = _replicated(tmp_path, tier)
    _doctor(tier, ck, ESCAPE)
    os.remove(os.path.join(path, "manifest.json"))
    with pytest.raises(ManifestError) as err:
        ReplicaManager(tiers=[tier], replicas=0).recover(path)
    assert str(err.value) == (
        f"replica map of {path} on rank 0: not a replica map this version reads (array key {ESCAPE!r} is not a "
        "relative path of plain names under data/); replicate the checkpoint again")
    assert _outside(tmp_path) == ["run"] and not os.path.exists(os.path.join(path, "manifest.json"))


def test_recover_accepts_only_arrays_the_manifest_names(tmp_path):
    tier = MemoryTier(capacity_bytes=1 << 20)
    path, ck = _replicated(tmp_path, tier)
    _doctor(tier, ck, "r0/planted")
    with pytest.raises(ReplicaError) as err:
        ReplicaManager(tiers=[tier], replicas=0).recover(path)
    assert str(err.value) == (
        f"replica map of {path} on rank 0: the replica map names array 'r0/planted', which the manifest does not; "
        "the replica tier is damaged or not this checkpoint's - remove it and replicate again")
    assert not os.path.exists(os.path.join(path, "data", "r0", "planted"))
    with pytest.raises(ReplicaError, match="names array 'r0/planted'"):  # re-replication reads the map too
        ReplicaManager(tiers=[tier], replicas=0).replicate(path)


def test_recover_refuses_a_tier_whose_manifest_is_another_checkpoint(tmp_path):
    tier = MemoryTier(capacity_bytes=1 << 20)
    path, ck = _replicated(tmp_path, tier)
    meta = tier.get_meta(ck)
    tier.put_meta(ck, dataclasses.replace(meta, manifest=meta.manifest.replace(b'"w"', b'"v"')))
    os.remove(os.path.join(path, "manifest.json"))
    with pytest.raises(ReplicaError, match=f"not checkpoint {ck}; the replica tier is damaged"):
        ReplicaManager(tiers=[tier], replicas=0).recover(path)
    assert not os.path.exists(os.path.join(path, "manifest.json"))


@pytest.mark.parametrize("head", [b"not json", b'{"path": 1, "generation": 1, "manifest_bytes": 0}',
                                  b'{"path": "/c", "generation": 1, "manifest_bytes": 99999}'])
def test_a_damaged_disk_tier_metadata_file_is_refused_by_name(tmp_path, head):
    folder = tmp_path / "tier" / "0123456789abcdef"
    folder.mkdir(parents=True)
    (folder / "meta.bin").write_bytes(head + b"\n{}")
    with pytest.raises(ManifestError, match=f"^{folder / 'meta.bin'}: not replica metadata this version reads"):
        DiskTier(tmp_path / "tier", capacity_bytes=1 << 20)


@pytest.mark.parametrize("field, value, message", [
    ("files", [["../x", 1, "0" * 16]], "names file '../x'; a file name must be one plain name"),
    ("files", [["a/b", 1, "0" * 16]], "names file 'a/b'"),
    ("owner", -1, "owner of r0/w must be an integer >= 0, got -1"),
    ("digest", "zz", "digest must be 16 hex digits"),
    ("holders", [{"rank": 0, "tier": "tape"}], "holder tier 'tape' is not one of memory, disk"),
])
def test_replica_map_fields_are_checked(tmp_path, field, value, message):
    from ucp.replication.replica_map import ReplicaMap

    tier = MemoryTier(capacity_bytes=1 << 20)
    _replicated(tmp_path, tier)
    data = json.loads(tier.get_meta(tier.checkpoints()[0]).replica_map)
    key = next(iter(data["arrays"]))
    data["arrays"]["r0/w"] = {**data["arrays"].pop(key), field: value}
    with pytest.raises(ManifestError, match="not a replica map this version reads") as err:
        ReplicaMap.from_json(json.dumps(data))
    assert message in str(err.value)
