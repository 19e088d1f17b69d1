"""Events made in bulk (`events_from`) are the events Event's own constructor makes."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, asdict

import pytest

from ucp.reliability.logs.records import Event, events_from


def test_events_from_equals_the_constructor():
    rows = [("a.log", 3, 1.5e9, "gpu-1", "42", "hardware/gpu", 7, 0.9, "Xid 79", "error", False),
            ("b.log", 9, None, None, None, "software/oom", 2, 1.0, "killed", None, True)]
    got = events_from(rows, [0, None])
    want = tuple(Event(*row, incident) for row, incident in zip(rows, [0, None]))
    assert got == want
    assert [asdict(e) for e in got] == [asdict(e) for e in want]
    assert [e.to_dict() for e in got] == [e.to_dict() for e in want]
    assert list(vars(got[0])) == list(vars(want[0]))  # same field order: reports serialise alike
    assert hash(got[1]) == hash(want[1]) and pickle.loads(pickle.dumps(got[0])) == want[0]
    with pytest.raises(FrozenInstanceError):
        got[0].line = 4  # still frozen
