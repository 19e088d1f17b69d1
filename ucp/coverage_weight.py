"""Checking that fragments tile a tensor when no single process holds them all.

A save with sharded metadata (docs/FORMAT.md, section 9) never brings every
fragment of a tensor to one rank, so the exact tiling check of
:func:`ucp.geometry.tiles_exactly` cannot run there. Instead every group of
ranks sums two numbers per tensor over its fragments, and rank 0 adds the
groups' sums: the element count, and a *coverage weight* modulo a 61-bit
prime. Each cut coordinate ``c`` of dim ``d`` gets a pseudo-random value
``P_d(c)`` derived from a per-save seed; a box weighs
``prod_d (P_d(stop_d) - P_d(offset_d))`` (a flat range: the sum over its at most
``2N - 1`` boxes). The weights of fragments that cover every element exactly
once add up to the whole tensor's weight; otherwise the difference is a
nonzero polynomial of degree ``ndim`` in the random values, which vanishes with
probability at most ``ndim / 2**61`` (Schwartz-Zippel). Sums are additive, so
groups can be merged in any order and no message grows with the fragments.

    >>> from ucp.geometry import Box
    >>> w = CoverageWeights("save-token")
    >>> halves = w.weight(Box((0, 0), (2, 4)), (4, 4)) + w.weight(Box((2, 0), (2, 4)), (4, 4))
    >>> halves % PRIME == w.whole((4, 4))
    True
    >>> twice_top = 2 * w.weight(Box((0, 0), (2, 4)), (4, 4))
    >>> twice_top % PRIME == w.whole((4, 4))
    False
"""

from __future__ import annotations

import xxhash

from ucp.geometry import Box, FlatRange, Region, flat_to_boxes

PRIME = (1 << 61) - 1


class CoverageWeights:
    """The coverage weights of one save (every rank derives the same values from ``seed``)."""

    def __init__(self, seed: str) -> None:
        self._seed = seed.encode()
        self._values: dict[tuple[int, int], int] = {}

    def _value(self, dim: int, coordinate: int) -> int:
        key = (dim, coordinate)
        found = self._values.get(key)
        if found is None:
            found = xxhash.xxh3_64_intdigest(b"%s:%d:%d" % (self._seed, dim, coordinate)) % PRIME
            self._values[key] = found
        return found

    def _box(self, box: Box) -> int:
        term = 1
        for dim, (offset, size) in enumerate(zip(box.offsets, box.sizes, strict=True)):
            term = term * (self._value(dim, offset + size) - self._value(dim, offset)) % PRIME
        return term

    def weight(self, region: Region, shape: tuple[int, ...]) -> int:
        """The weight of one fragment's region of a ``shape`` tensor (an int in ``[0, PRIME)``)."""
        if not region.numel:
            return 0
        if isinstance(region, FlatRange):
            if len(shape) <= 1:
                return self._box(Box((region.start,), (region.numel,)) if shape else Box((), ()))
            return sum(self._box(box) for _, box in flat_to_boxes(region, shape)) % PRIME
        return self._box(region)

    def whole(self, shape: tuple[int, ...]) -> int:
        """The weight of the whole tensor: what the fragments' weights must add up to."""
        return self._box(Box.full(shape)) if all(shape) else 0
