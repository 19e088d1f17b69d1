"""Replication reads and writes a checkpoint through its store: the same confinement as ucp.load.

Regressions: replication had its own fsspec client, so a checkpoint whose ``data/r0`` is a link
out of it had recovery write the repaired arrays outside the checkpoint; a file of an array linked
to a file outside had replication read it and copy its bytes into peers' tiers; and a FIFO where
the manifest belongs blocked recovery forever.
"""

from __future__ import annotations

import os
import shutil
import threading

import pytest
import torch

import ucp
from ucp.errors import UnsafePathError
from ucp.replication.errors import ReplicaError
from ucp.replication.replica_files import CheckpointFiles
from ucp.replication.replica_tiers import MemoryTier
from ucp.replication.replicas import ReplicaManager


def _replicated(tmp_path):
    path = str(tmp_path / "ck")
    ucp.save({"w": torch.arange(64.0), "b": torch.ones(3)}, path)
    replicas = ReplicaManager(tiers=[MemoryTier(capacity_bytes=1 << 20)], replicas=0)
    return path, replicas, replicas.replicate(path)


def test_recovery_never_writes_through_a_link_out_of_the_checkpoint(tmp_path):
    path, replicas, rmap = _replicated(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    data = os.path.join(path, "data", "r0")
    shutil.rmtree(data)
    os.symlink(outside, data)  # the arrays "missing" behind a link to a directory elsewhere
    with pytest.raises(ReplicaError) as err:
        replicas.recover(path)
    key = min(rmap.arrays)
    assert str(err.value).startswith(f"cannot write array {key!r} into {path}: {data} resolves to {outside}, "
                                     f"outside the checkpoint {os.path.realpath(path)}; refusing to write into it - "
                                     "replace the link with a directory")
    assert os.listdir(outside) == []


def test_replication_never_reads_a_file_linked_out_of_the_checkpoint(tmp_path):
    path = str(tmp_path / "ck")
    ucp.save({"w": torch.arange(64.0)}, path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the checkpoint's")
    (key,) = os.listdir(os.path.join(path, "data", "r0"))
    link = os.path.join(path, "data", "r0", key, "c.9")
    os.symlink(secret, link)
    tier = MemoryTier(capacity_bytes=1 << 20)
    with pytest.raises(ReplicaError) as err:
        ReplicaManager(tiers=[tier], replicas=0).replicate(path)
    assert str(err.value) == (f"UnsafePathError: array 'r0/{key}': {link} resolves to {secret}, outside the "
                              f"checkpoint {os.path.realpath(path)}; refusing to read it - replace the link with "
                              "the file itself")
    assert all(b"not the checkpoint's" not in (tier.get(ck, k) or b"") for ck in tier.checkpoints()
               for k in tier.keys(ck))


def test_a_fifo_for_a_manifest_is_refused_not_waited_on(tmp_path):
    path, replicas, _ = _replicated(tmp_path)
    manifest = os.path.join(path, "manifest.json")
    os.remove(manifest)
    os.mkfifo(manifest)
    found: list = []
    worker = threading.Thread(target=lambda: found.append(_error(lambda: replicas.recover(path))), daemon=True)
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():  # blocked in open(): a writer lets it go, so the test process can end
        with open(manifest, "wb"):
            pass
        worker.join(timeout=30)
        pytest.fail("recovery blocked on a FIFO where the manifest belongs")
    assert isinstance(found[0], UnsafePathError)
    assert str(found[0]) == (f"{manifest} is a FIFO, not a regular file; refusing to read it - the checkpoint is "
                             "damaged (restore the file or load an older checkpoint)")


def _error(call):
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the test looks at it
        return err
    return None


@pytest.mark.parametrize("name", ["../outside.json", "ABSOLUTE", "data/../../outside.json"])
def test_checkpoint_files_refuse_a_name_outside_the_checkpoint(tmp_path, name):
    path, _, _ = _replicated(tmp_path)
    name = str(tmp_path / "outside.json") if name == "ABSOLUTE" else name
    with pytest.raises(UnsafePathError, match=r"is not a relative path of plain names inside the checkpoint"):
        CheckpointFiles(path).write(name, b"{}")
    assert sorted(os.listdir(tmp_path)) == ["ck"]
