"""When to save and which checkpoints to keep: one-method protocols, dataclass policies.

A :class:`SavePolicy` answers "save now?" for one training step; a
:class:`RetentionPolicy` answers "which of these committed steps stay?".
Both are asked afresh every time (nothing is cached by the caller), so a
policy may change its mind over time, as the ETTR-driven adaptive interval does.

Example::

    >>> save = AnyOf(EveryNSteps(100), EveryTSeconds(1800.0))
    >>> save.should_save(step=200, seconds_since_save=5.0)
    True
    >>> keep = KeepUnion(KeepLast(2), KeepEvery(1000))
    >>> sorted(keep.keep([500, 1000, 1500, 2000, 2500]))
    [1000, 2000, 2500]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ucp.errors import InvalidArgumentError

__all__ = [
    "SavePolicy",
    "EveryNSteps",
    "EveryTSeconds",
    "AnyOf",
    "RetentionPolicy",
    "KeepLast",
    "KeepEvery",
    "KeepAll",
    "KeepUnion",
]


@runtime_checkable
class SavePolicy(Protocol):
    """Decides, at one step, whether a checkpoint is due."""

    def should_save(self, *, step: int, seconds_since_save: float) -> bool: ...


@runtime_checkable
class RetentionPolicy(Protocol):
    """Chooses which committed steps to keep; the rest may be deleted."""

    def keep(self, steps: Sequence[int]) -> set[int]: ...


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class EveryNSteps:
    """Save at every step that is a multiple of ``n`` (step 0 excluded: nothing trained yet).

    >>> EveryNSteps(50).should_save(step=150, seconds_since_save=0.0)
    True
    """

    n: int

    def __post_init__(self) -> None:
        _positive_int("EveryNSteps n", self.n)

    def should_save(self, *, step: int, seconds_since_save: float) -> bool:
        return step > 0 and step % self.n == 0


@dataclass(frozen=True)
class EveryTSeconds:
    """Save once at least ``seconds`` of wall time have passed since the last save.

    >>> EveryTSeconds(60.0).should_save(step=7, seconds_since_save=61.0)
    True
    """

    seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) or not self.seconds > 0:
            raise InvalidArgumentError(f"EveryTSeconds seconds must be a positive number, got {self.seconds!r}")

    def should_save(self, *, step: int, seconds_since_save: float) -> bool:
        return seconds_since_save >= self.seconds


@dataclass(frozen=True, init=False)
class AnyOf:
    """Save when any of the policies says so.

    >>> AnyOf(EveryNSteps(10), EveryTSeconds(5.0)).should_save(step=3, seconds_since_save=6.0)
    True
    """

    policies: tuple[SavePolicy, ...]

    def __init__(self, *policies: SavePolicy) -> None:
        if not policies:
            raise InvalidArgumentError("AnyOf needs at least one save policy")
        for policy in policies:
            if not callable(getattr(policy, "should_save", None)):
                raise InvalidArgumentError(f"AnyOf: {policy!r} has no should_save method")
        object.__setattr__(self, "policies", tuple(policies))

    def should_save(self, *, step: int, seconds_since_save: float) -> bool:
        # Ask every policy (no short circuit) so stateful ones see every step.
        answers = [p.should_save(step=step, seconds_since_save=seconds_since_save) for p in self.policies]
        return any(answers)


@dataclass(frozen=True)
class KeepLast:
    """Keep the ``k`` newest steps.

    >>> sorted(KeepLast(2).keep([10, 30, 20]))
    [20, 30]
    """

    k: int

    def __post_init__(self) -> None:
        _positive_int("KeepLast k", self.k)

    def keep(self, steps: Sequence[int]) -> set[int]:
        return set(sorted(set(steps))[-self.k :])


@dataclass(frozen=True)
class KeepEvery:
    """Keep every step that is a multiple of ``m`` (long-term snapshots).

    >>> sorted(KeepEvery(100).keep([50, 100, 150, 200]))
    [100, 200]
    """

    m: int

    def __post_init__(self) -> None:
        _positive_int("KeepEvery m", self.m)

    def keep(self, steps: Sequence[int]) -> set[int]:
        return {s for s in steps if s % self.m == 0}


@dataclass(frozen=True)
class KeepAll:
    """Keep everything (retention off).

    >>> sorted(KeepAll().keep([1, 2]))
    [1, 2]
    """

    def keep(self, steps: Sequence[int]) -> set[int]:
        return set(steps)


@dataclass(frozen=True, init=False)
class KeepUnion:
    """Keep a step if any of the policies keeps it.

    >>> sorted(KeepUnion(KeepLast(1), KeepEvery(10)).keep([10, 15, 20, 25]))
    [10, 20, 25]
    """

    policies: tuple[RetentionPolicy, ...]

    def __init__(self, *policies: RetentionPolicy) -> None:
        if not policies:
            raise InvalidArgumentError("KeepUnion needs at least one retention policy")
        for policy in policies:
            if not callable(getattr(policy, "keep", None)):
                raise InvalidArgumentError(f"KeepUnion: {policy!r} has no keep method")
        object.__setattr__(self, "policies", tuple(policies))

    def keep(self, steps: Sequence[int]) -> set[int]:
        kept: set[int] = set()
        for policy in self.policies:
            kept |= set(policy.keep(steps))
        return kept
