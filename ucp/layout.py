"""Parallel layouts: sizes of each parallel dimension and a rank's coordinates.

A layout round-trips through a short string form, which is also the literal
syntax of the CLI and of UCL::

    >>> lay = Layout.parse("tp=2,pp=2,dp=2")
    >>> str(lay)
    'tp=2,pp=2,dp=2'
    >>> lay.world_size
    8
    >>> lay.coords(5)
    RankCoords(rank=5, tp=1, cp=0, dp=0, pp=1, ep=0, edp=0)

Rank order follows Megatron: tp varies fastest, then cp, then dp, then pp.
Expert parallelism subdivides the data-parallel group: ``ep`` must divide
``dp``; a rank's expert-parallel rank is ``dp_rank % ep`` and its
expert-data-parallel rank ``dp_rank // ep``.

Sizes are bounded (:data:`MAX_WORLD_SIZE` ranks in all, :data:`MAX_VPP` model
chunks per rank), so that everything that walks the ranks or the pipeline
stages of a layout costs at most that much: a typo such as ``dp=1000000000``
is refused at once instead of running for hours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ucp.errors import LayoutError

_DIMS = ("tp", "pp", "dp", "cp", "ep", "vpp", "zero")
_DEFAULTS = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "vpp": 1, "zero": 0}

# 2**20 ranks: ten times the largest training jobs run so far, far below what makes a
# per-rank walk (the checker compiles every rank) take longer than a coffee break.
MAX_WORLD_SIZE = 1 << 20
# Interleaved pipeline chunks per rank; Megatron uses a handful (each chunk holds >= 1 layer).
MAX_VPP = 1 << 10


@dataclass(frozen=True)
class RankCoords:
    """Where one rank sits in each parallel dimension."""

    rank: int
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    edp: int


@dataclass(frozen=True)
class Layout:
    """Sizes of the parallel dimensions and the ZeRO stage.

    ``vpp`` is the number of virtual (interleaved) pipeline stages per rank;
    ``zero`` the ZeRO stage (0 = none, 1/2 = optimizer/gradient partitioning,
    3 = parameters partitioned too).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    zero: int = 0

    def __post_init__(self) -> None:
        for name in _DIMS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise LayoutError(f"layout {name} must be an integer, got {value!r}")
            if name == "zero":
                if value not in (0, 1, 2, 3):
                    raise LayoutError(f"layout zero must be 0, 1, 2 or 3, got {value}")
            elif value < 1:
                raise LayoutError(f"layout {name} must be >= 1, got {value}")
            elif value > (MAX_VPP if name == "vpp" else MAX_WORLD_SIZE):
                limit = MAX_VPP if name == "vpp" else MAX_WORLD_SIZE
                raise LayoutError(f"layout {name}={value} is larger than the {limit} this library supports")
        if self.world_size > MAX_WORLD_SIZE:
            raise LayoutError(
                f"layout {self} has {self.world_size} ranks (tp*cp*dp*pp), more than the {MAX_WORLD_SIZE} "
                "this library supports"
            )
        if self.dp % self.ep:
            raise LayoutError(
                f"layout ep={self.ep} must divide dp={self.dp} (experts are spread over the data-parallel group)"
            )

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def coords(self, rank: int) -> RankCoords:
        """The coordinates of ``rank`` (0 <= rank < world_size)."""
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside a layout of {self.world_size} ranks ({self})")
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return RankCoords(rank=rank, tp=tp, cp=cp, dp=dp, pp=pp, ep=dp % self.ep, edp=dp // self.ep)

    def rank_of(self, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The inverse of :meth:`coords`."""
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Layout":
        """The inverse of :meth:`to_dict`; every value must be an integer (JSON from a manifest is checked here)."""
        if not isinstance(data, dict):
            raise LayoutError(f"a layout must be an object of dimension sizes, got {type(data).__name__}")
        unknown = set(data) - set(_DIMS)
        if unknown:
            raise LayoutError(
                f"unknown layout dimension(s) {sorted(map(str, unknown))}; expected some of {list(_DIMS)}"
            )
        bad = {k: v for k, v in data.items() if not isinstance(v, int) or isinstance(v, bool)}
        if bad:
            name, value = next(iter(bad.items()))
            raise LayoutError(f"layout {name} must be an integer, got {value!r}")
        return cls(**data)

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """Parse ``"tp=2,pp=2,dp=4"`` (any order, omitted dimensions default)."""
        values: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep or name not in _DIMS:
                raise LayoutError(
                    f"bad layout item {part!r} in {text!r}: expected NAME=INT with NAME one of {', '.join(_DIMS)}"
                )
            if name in values:
                raise LayoutError(f"layout dimension {name!r} given twice in {text!r}")
            try:
                values[name] = int(value)
            except ValueError:
                raise LayoutError(
                    f"bad layout value {_short(value)} for {name} in {_short(text)}: expected an integer"
                ) from None
        return cls(**values)

    def __str__(self) -> str:
        parts = [f"{n}={getattr(self, n)}" for n in _DIMS if getattr(self, n) != _DEFAULTS[n]]
        return ",".join(parts) or "tp=1"


def _short(text: str, limit: int = 60) -> str:
    """``repr(text)``, cut in the middle when long (error messages echo user input)."""
    return repr(text) if len(text) <= limit else repr(text[: limit // 2] + "..." + text[-limit // 2 :])
