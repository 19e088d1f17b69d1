"""Learned stamp layouts: the cached dates give what reading every field of the stamp gives, bit for bit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.reliability.logs.stamps import learn_layout

# (sample the layout is learned from, a formatter of (y, mo, d, h, mi, s, fraction digits, zone))
_LAYOUTS = [
    (["2016/05/01 00:00:00.000", "2016/05/01 00:00:01.250"],
     lambda y, mo, d, h, mi, s, f, z: f"{y}/{mo:02d}/{d:02d} {h:02d}:{mi:02d}:{s:02d}.{f}"),
    (["2024-06-01T10:00:00+02:00", "2024-06-01T10:00:05+02:00"],
     lambda y, mo, d, h, mi, s, f, z: f"{y}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{z}"),
    (["17/06/09 20:10:40", "17/06/09 20:10:41"],
     lambda y, mo, d, h, mi, s, f, z: f"{y % 100:02d}/{mo:02d}/{d:02d} {h:02d}:{mi:02d}:{s:02d}"),
    (["03-17 16:13:38.811", "03-17 16:13:38.819"],
     lambda y, mo, d, h, mi, s, f, z: f"{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}.{f}"),
    (["Jun 14 15:16:01", "Jun 14 15:16:02"],
     lambda y, mo, d, h, mi, s, f, z: f"{['Jan', 'Feb', 'Mar', 'Jun', 'Xyz'][mo % 5]} {d:2d} {h:02d}:{mi:02d}:{s:02d}"),
]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(range(len(_LAYOUTS))),
       st.lists(st.tuples(st.integers(1969, 2101), st.integers(0, 13), st.integers(0, 32), st.integers(0, 25),
                          st.integers(0, 61), st.integers(0, 99), st.from_regex(r"\d{1,9}", fullmatch=True),
                          st.sampled_from(["Z", "+02:00", "-0530", "", "+2"])), min_size=1, max_size=8))
def test_cached_minutes_give_the_field_by_field_result(which, stamps):
    sample, fmt = _LAYOUTS[which]
    layout = learn_layout(sample, year=2024)
    for fields in stamps + stamps:  # the second pass reads every stamp's date from the cache
        text = fmt(*fields)
        assert layout._convert(text) == layout._convert_fields(text), text
    texts = [fmt(*f) for f in stamps]
    assert [layout.convert(t) for t in texts] == [layout._convert_fields(t) for t in texts]


@settings(max_examples=80, deadline=None)
@given(st.from_regex(r"[0-9:T .\-]{0,12}(Z|[+-]\d\d:?\d\d|[+-]\d{1,5})?\]?", fullmatch=True))
def test_the_zone_is_found_in_the_stamps_tail(text):
    from ucp.reliability.logs.stamps import _ZONE

    whole, tail = _ZONE.search(text), _ZONE.search(text[-8:])
    assert (whole and whole.groups()) == (tail and tail.groups())
