"""The examples in the replication modules' docstrings run and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "replication",
    "replication.cluster",
    "replication.placement",
    "replication.failures",
    "replication.replay",
    "replication.recovery",
    "replication.forecast",
    "replication.scenarios",
    "replication.policies",
    "replication.simulator",
    "replication.rl_env",
    "replication.rl_net",
    "replication.rl_policy",
    "replication.policy_file",
    "replication.published_rates",
    "replication.optimum",
    "replication.live_risk",
    "replication.evaluate",
    "replication.replica_tiers",
    "replication.replica_map",
    "replication.replica_trust",
    "replication.replica_files",
    "replication.replica_plan",
    "replication.replica_transfer",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(importlib.import_module("replication").__path__[0] + "/..")
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
