"""Layouts: the string form round-trips, coordinates invert, bad input is named."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ucp.errors import LayoutError, UcpError
from ucp.layout import Layout


@pytest.mark.parametrize(
    "text, expected",
    [
        ("tp=2,pp=2,dp=4", Layout(tp=2, pp=2, dp=4)),
        ("dp=4, tp=2", Layout(tp=2, dp=4)),
        ("", Layout()),
        ("tp=1", Layout()),
        ("tp=2,dp=4,ep=2,zero=1", Layout(tp=2, dp=4, ep=2, zero=1)),
        ("pp=4,vpp=2,cp=2", Layout(pp=4, vpp=2, cp=2)),
    ],
)
def test_parse(text, expected):
    assert Layout.parse(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("tp=2,xx=3", "bad layout item 'xx=3' in 'tp=2,xx=3': expected NAME=INT with NAME one of tp, pp, dp, cp, ep, vpp, zero"),
        ("tp", "bad layout item 'tp' in 'tp': expected NAME=INT with NAME one of tp, pp, dp, cp, ep, vpp, zero"),
        ("tp=two", "bad layout value 'two' for tp in 'tp=two': expected an integer"),
        ("tp=2,tp=4", "layout dimension 'tp' given twice in 'tp=2,tp=4'"),
        ("tp=0", "layout tp must be >= 1, got 0"),
        ("zero=4", "layout zero must be 0, 1, 2 or 3, got 4"),
        ("dp=4,ep=3", "layout ep=3 must divide dp=4 (experts are spread over the data-parallel group)"),
    ],
)
def test_parse_errors(text, message):
    with pytest.raises(LayoutError) as info:
        Layout.parse(text)
    assert str(info.value) == message
    assert isinstance(info.value, UcpError) and isinstance(info.value, ValueError)


layouts = st.builds(
    lambda tp, pp, dp_mult, cp, ep, vpp, zero: Layout(tp=tp, pp=pp, dp=dp_mult * ep, cp=cp, ep=ep, vpp=vpp, zero=zero),
    st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 2), st.integers(1, 4),
    st.integers(1, 2), st.integers(0, 3),
)


@given(layouts)
def test_string_and_dict_round_trip(layout):
    assert Layout.parse(str(layout)) == layout
    assert Layout.from_dict(layout.to_dict()) == layout


@given(layouts)
def test_coords_are_a_bijection(layout):
    seen = set()
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        assert layout.rank_of(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp) == rank
        assert c.ep == c.dp % layout.ep and c.edp == c.dp // layout.ep
        seen.add((c.tp, c.cp, c.dp, c.pp))
    assert len(seen) == layout.world_size


def test_tp_varies_fastest():
    lay = Layout(tp=2, pp=2, dp=2)
    assert [(c.tp, c.dp, c.pp) for c in map(lay.coords, range(8))] == [
        (0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)
    ]


def test_rank_out_of_range():
    with pytest.raises(LayoutError, match=r"^rank 8 is outside a layout of 8 ranks \(tp=2,pp=2,dp=2\)$"):
        Layout(tp=2, pp=2, dp=2).coords(8)


def test_from_dict_rejects_unknown():
    with pytest.raises(LayoutError, match="unknown layout dimension"):
        Layout.from_dict({"tp": 2, "sp": 2})


@pytest.mark.parametrize(
    "text, message",
    [
        ("dp=1000000000", "layout dp=1000000000 is larger than the 1048576 this library supports"),
        ("tp=1024,dp=1024,pp=2",
         "layout tp=1024,pp=2,dp=1024 has 2097152 ranks (tp*cp*dp*pp), more than the 1048576 this library supports"),
        ("pp=4,vpp=2000", "layout vpp=2000 is larger than the 1024 this library supports"),
        ("dp=" + "9" * 5000, f"bad layout value {'9' * 30 + '...' + '9' * 30!r} for dp in "
                             f"{'dp=' + '9' * 27 + '...' + '9' * 30!r}: expected an integer"),  # echoes cut short
    ],
)
def test_sizes_are_bounded_so_walking_the_ranks_is(text, message):
    # everything that walks a layout's ranks (the UCL checker compiles each one) costs at most 2**20 of them
    with pytest.raises(LayoutError) as info:
        Layout.parse(text)
    assert str(info.value) == message


def test_the_largest_layouts_are_accepted():
    assert Layout.parse("dp=1048576").world_size == 2**20
    assert Layout.parse("tp=8,pp=16,dp=8192,vpp=1024").world_size == 2**20


@pytest.mark.parametrize(
    "data, message",
    [
        ({"tp": 1e400}, "layout tp must be an integer, got inf"),
        ({"dp": "2"}, "layout dp must be an integer, got '2'"),
        ({"pp": True}, "layout pp must be an integer, got True"),
        ({"tp": None}, "layout tp must be an integer, got None"),
        ([2, 2], "a layout must be an object of dimension sizes, got list"),
        ({"dp": 2**40}, "layout dp=1099511627776 is larger than the 1048576 this library supports"),
    ],
)
def test_from_dict_refuses_what_is_not_a_layout(data, message):
    # a manifest's layout is JSON anyone can edit: every value is checked, never coerced
    with pytest.raises(LayoutError) as info:
        Layout.from_dict(data)
    assert str(info.value) == message
