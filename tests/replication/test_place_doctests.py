"""The examples in the replication modules' docstrings run and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "ucp.replication",
    "ucp.replication.cluster",
    "ucp.replication.placement",
    "ucp.replication.failures",
    "ucp.replication.replay",
    "ucp.replication.recovery",
    "ucp.replication.forecast",
    "ucp.replication.scenarios",
    "ucp.replication.policies",
    "ucp.replication.simulator",
    "ucp.replication.rl_env",
    "ucp.replication.rl_net",
    "ucp.replication.rl_policy",
    "ucp.replication.policy_file",
    "ucp.replication.published_rates",
    "ucp.replication.optimum",
    "ucp.replication.heterogeneity",
    "ucp.replication.transfer_times",
    "ucp.replication.io_cost",
    "ucp.replication.live_risk",
    "ucp.replication.evaluate",
    "ucp.replication.online_loop",
    "ucp.replication.imitation",
    "ucp.replication.replica_tiers",
    "ucp.replication.replica_map",
    "ucp.replication.replica_trust",
    "ucp.replication.replica_files",
    "ucp.replication.replica_plan",
    "ucp.replication.replica_transfer",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(importlib.import_module("ucp").__path__[0] + "/..")
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
