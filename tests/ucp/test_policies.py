"""Save and retention policies: decision tables, validation messages, union laws."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ucp.policies import (
    AnyOf,
    EveryNSteps,
    EveryTSeconds,
    KeepAll,
    KeepEvery,
    KeepLast,
    KeepUnion,
    RetentionPolicy,
    SavePolicy,
)


@pytest.mark.parametrize(
    ("policy", "step", "since", "expected"),
    [
        (EveryNSteps(10), 0, 99.0, False),  # nothing trained yet
        (EveryNSteps(10), 9, 99.0, False),
        (EveryNSteps(10), 10, 0.0, True),
        (EveryNSteps(10), 25, 0.0, False),
        (EveryNSteps(1), 1, 0.0, True),
        (EveryTSeconds(30.0), 1, 29.9, False),
        (EveryTSeconds(30.0), 1, 30.0, True),
        (EveryTSeconds(30), 7, 100.0, True),
        (AnyOf(EveryNSteps(10), EveryTSeconds(30.0)), 10, 0.0, True),
        (AnyOf(EveryNSteps(10), EveryTSeconds(30.0)), 11, 31.0, True),
        (AnyOf(EveryNSteps(10), EveryTSeconds(30.0)), 11, 5.0, False),
        (AnyOf(EveryNSteps(3)), 6, 0.0, True),
    ],
)
def test_save_policy_table(policy: SavePolicy, step: int, since: float, expected: bool) -> None:
    assert policy.should_save(step=step, seconds_since_save=since) is expected


@pytest.mark.parametrize(
    ("policy", "steps", "expected"),
    [
        (KeepLast(3), [100, 200, 300, 400, 500], {300, 400, 500}),
        (KeepLast(3), [500, 100, 300], {100, 300, 500}),
        (KeepLast(1), [7, 3, 9, 9], {9}),
        (KeepLast(2), [], set()),
        (KeepEvery(1000), [500, 1000, 1500, 2000, 2500], {1000, 2000}),
        (KeepEvery(1000), [500, 1500], set()),
        (KeepAll(), [1, 2, 3], {1, 2, 3}),
        (KeepUnion(KeepLast(2), KeepEvery(1000)), [500, 1000, 1500, 2000, 2500], {1000, 2000, 2500}),
        (KeepUnion(KeepLast(1)), [3, 4], {4}),
    ],
)
def test_retention_table(policy: RetentionPolicy, steps: list[int], expected: set[int]) -> None:
    assert policy.keep(steps) == expected


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EveryNSteps(0), "EveryNSteps n must be a positive integer, got 0"),
        (lambda: EveryNSteps(2.5), "EveryNSteps n must be a positive integer, got 2.5"),
        (lambda: EveryNSteps(True), "EveryNSteps n must be a positive integer, got True"),
        (lambda: EveryTSeconds(0), "EveryTSeconds seconds must be a positive number, got 0"),
        (lambda: EveryTSeconds(float("nan")), "EveryTSeconds seconds must be a positive number, got nan"),
        (lambda: KeepLast(-1), "KeepLast k must be a positive integer, got -1"),
        (lambda: KeepEvery(0), "KeepEvery m must be a positive integer, got 0"),
        (lambda: AnyOf(), "AnyOf needs at least one save policy"),
        (lambda: KeepUnion(), "KeepUnion needs at least one retention policy"),
    ],
)
def test_bad_arguments_name_the_problem(make, message: str) -> None:
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value) == message


def test_combinators_reject_objects_without_the_method() -> None:
    with pytest.raises(TypeError, match="AnyOf: KeepAll\\(\\) has no should_save method"):
        AnyOf(KeepAll())
    with pytest.raises(TypeError, match="KeepUnion: EveryNSteps\\(n=3\\) has no keep method"):
        KeepUnion(EveryNSteps(3))


def test_policies_are_frozen_values_and_satisfy_the_protocols() -> None:
    assert EveryNSteps(5) == EveryNSteps(5)
    assert hash(KeepUnion(KeepLast(1), KeepAll())) == hash(KeepUnion(KeepLast(1), KeepAll()))
    with pytest.raises(AttributeError):
        EveryNSteps(5).n = 6  # type: ignore[misc]
    for policy in (EveryNSteps(1), EveryTSeconds(1.0), AnyOf(EveryNSteps(1))):
        assert isinstance(policy, SavePolicy)
    for policy in (KeepLast(1), KeepEvery(1), KeepAll(), KeepUnion(KeepAll())):
        assert isinstance(policy, RetentionPolicy)


def test_any_of_asks_every_policy_each_step() -> None:
    # A stateful policy (like an adaptive one) must see every step, even when another says yes.
    seen: list[int] = []

    class Recording:
        def should_save(self, *, step: int, seconds_since_save: float) -> bool:
            seen.append(step)
            return False

    policy = AnyOf(EveryNSteps(1), Recording())
    for step in (1, 2, 3):
        assert policy.should_save(step=step, seconds_since_save=0.0)
    assert seen == [1, 2, 3]


steps_lists = st.lists(st.integers(min_value=0, max_value=10_000), max_size=40)


@given(steps_lists, st.integers(min_value=1, max_value=10))
def test_keep_last_keeps_the_k_largest(steps: list[int], k: int) -> None:
    kept = KeepLast(k).keep(steps)
    assert kept <= set(steps)
    assert len(kept) == min(k, len(set(steps)))
    assert all(s <= min(kept) for s in set(steps) - kept) if kept else not steps


@given(steps_lists, st.integers(min_value=1, max_value=10), st.integers(min_value=1, max_value=500))
def test_union_is_the_set_union(steps: list[int], k: int, m: int) -> None:
    union = KeepUnion(KeepLast(k), KeepEvery(m)).keep(steps)
    assert union == KeepLast(k).keep(steps) | KeepEvery(m).keep(steps)
