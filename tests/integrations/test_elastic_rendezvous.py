"""The elastic rendezvous: a generation whose members never all come times out naming who is missing.

A real TCPStore plays the agent's rendezvous store; two ElasticContexts stand for two processes.
"""

from __future__ import annotations

import json
import queue
import re
import time
from datetime import timedelta

import pytest

from ucp.integrations.elastic import ElasticContext, RendezvousTimeout
from ucp.integrations.launch import free_port


@pytest.fixture
def store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))


def _publish(store, generation: int, uids: list[int]) -> None:
    info = {"uids": uids, "layout": "dp=2", "active": len(uids), "why": "test"}
    store.set(f"members/{generation}", json.dumps(info))
    store.set("gen", str(generation))


def test_a_member_that_never_comes_is_named_with_the_stage_it_was_last_in(store):
    _publish(store, 1, [0, 1])
    # process 1 reported (through its beat) that it is still forming generation 0's group
    store.set("stage/1", json.dumps(["forming the process group of generation 0", time.time() - 7]))
    ctx = ElasticContext(0, store, queue.Queue(), 30.0, 0.3)
    with pytest.raises(RendezvousTimeout) as err:
        ctx.join(after=0)
    assert re.fullmatch(r"process 0: generation 1 was not formed within 0.3s; not ready: process 1 "
                        r"\(forming the process group of generation 0 for (7|8)s\)", str(err.value)), str(err.value)
    assert ctx.stage == "ready for generation 1"


def test_no_generation_at_all_says_the_agent_is_gone(store):
    _publish(store, 0, [0])
    ctx = ElasticContext(1, store, queue.Queue(), 30.0, 0.2)
    with pytest.raises(RendezvousTimeout) as err:
        ctx.join(after=0)
    assert str(err.value) == ("process 1: no generation after 0 was formed within 0.2s; the agent is gone or "
                              "cannot place this rank")


def test_every_member_ready_joins_with_its_rank(store):
    _publish(store, 2, [3, 0])
    store.set("ready/2/3", "1")
    ctx = ElasticContext(0, store, queue.Queue(), 30.0, 5.0)
    membership = ctx.join(after=1)
    assert (membership.generation, membership.rank, membership.world, membership.uids) == (2, 1, 2, (3, 0))


FORMING_CHILD = """
import json, queue, sys, threading, time
from datetime import timedelta
import torch.distributed as dist
from ucp.integrations.elastic import ElasticContext, _beat_forever

port = int(sys.argv[1])
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
beats = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
# the group's timeout is a minute: only the release can end the wait within the test's bound
ctx = ElasticContext(0, store, queue.Queue(), 60.0, 60.0)
ctx.membership = ctx.join(after=0)
threading.Thread(target=_beat_forever, args=(beats, ctx, port), daemon=True).start()
began = time.monotonic()
try:
    ctx.form()
    print("formed", flush=True)
except RuntimeError as err:
    print(type(err).__name__, round(time.monotonic() - began), flush=True)
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="lists /proc/self/fd")
def test_forming_a_group_whose_member_died_ends_when_a_newer_generation_comes(store):
    # generation 1 names processes 0 and 1; process 1 died before it published its address, so
    # process 0's init_process_group waits for it. The agent publishes generation 2: within a few
    # seconds process 0 must be out of the old group's formation (not after the group's timeout)
    import subprocess
    import sys

    _publish(store, 1, [0, 1])
    store.set("ready/1/1", "1")  # it was ready, then died
    child = subprocess.Popen([sys.executable, "-c", FORMING_CHILD, str(store.port)], stdout=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 60
        while not (store.check(["stage/0"]) and json.loads(store.get("stage/0"))[0].startswith("forming")):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.05)
        time.sleep(0.5)
        _publish(store, 2, [0])
        out, _ = child.communicate(timeout=30)
    finally:
        child.kill()
    kind, seconds = out.split()
    assert kind in ("DistStoreError", "DistNetworkError", "RuntimeError") and int(seconds) < 15, out
