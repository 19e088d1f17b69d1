"""Coordinators without a process group (the process-group one runs in the multi-process save tests)."""

from __future__ import annotations

import os

import pytest

from ucp.agreement import Agreement, Failure
from ucp.coordination import SharedStaging, SingleProcess, coordinator_for
from ucp.errors import LayoutError
from ucp.parts import new_part
from ucp.stores import DEFAULT_OPTIONS


def test_the_coordinator_follows_the_arguments_and_refuses_a_rank_outside_the_world():
    assert coordinator_for() == SingleProcess(0, 1)
    assert coordinator_for(rank=3, world_size=4) == SharedStaging(3, 4)
    with pytest.raises(LayoutError, match=r"^rank 4 must be in \[0, world_size=4\)$"):
        coordinator_for(rank=4, world_size=4)


def test_a_single_process_agrees_with_itself():
    alone = SingleProcess()
    assert alone.broadcast({"a": 1}) == {"a": 1}
    assert alone.agree("OSError: disk full") == Agreement(Failure(0, "OSError: disk full"), None)
    assert alone.agree(None, fatal=True) == Agreement(None, Failure(0, None))


def test_a_single_process_that_failed_removes_its_staging_area_and_raises(tmp_path):
    path = str(tmp_path / "c")
    target = SingleProcess().begin(path, overwrite=False, storage_options=None, options=DEFAULT_OPTIONS)
    target.storage.write_bytes("data/x", b"1")
    with pytest.raises(OSError, match="^disk full$"):
        SingleProcess().close(target, new_part(rank=0, world_size=1, checksum_algorithm=None),
                              failure=OSError("disk full"))
    assert os.listdir(tmp_path) == []


def test_a_shared_staging_rank_that_failed_leaves_a_part_saying_why(tmp_path):
    path = str(tmp_path / "c")
    coord = SharedStaging(1, 2)
    target = coord.begin(path, overwrite=False, storage_options=None, options=DEFAULT_OPTIONS)
    part = new_part(rank=1, world_size=2, checksum_algorithm=None)
    with pytest.raises(OSError, match="^disk full$"):
        coord.close(target, part, failure=OSError("disk full"))
    assert part["error"] == "OSError: disk full"
    assert target.storage.exists("parts", "rank-00001.json")
