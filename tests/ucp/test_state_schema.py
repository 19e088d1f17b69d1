"""The state-tree check accepts exactly the trees a load can rebuild (issue 8, item 14: verify must check
everything load relies on)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.errors import ManifestError, UnsafeObjectError
from ucp.state import unflatten_state
from ucp.state_schema import MAX_STATE_DEPTH, check_state_tree

_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3)
_TAGS = st.sampled_from(["$tensor", "$tuple", "$dict", "$float", "$object", "$other"])


def _tagged(inner):
    return st.builds(lambda tag, body: {tag: body}, _TAGS,
                     _SCALARS | st.lists(inner, max_size=3) | st.sampled_from(["nan", "inf", "-inf", "1.5"])
                     | st.lists(st.tuples(_SCALARS, inner).map(list), max_size=2))


TREES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=3) | _tagged(inner), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(TREES)
def test_the_check_passes_exactly_the_trees_a_load_rebuilds(tree):
    try:
        check_state_tree(tree, where="states[0]")
        accepted = True
    except ManifestError:
        accepted = False
    try:
        unflatten_state(tree, lambda key, path: key)
        rebuilt = True
    except UnsafeObjectError:  # a pickled object without allow_objects: refused on purpose, before its body is read
        return
    except Exception:  # noqa: BLE001 - a tree the loader cannot rebuild, however it fails
        rebuilt = False
    # A load checks the tree first (Manifest.from_dict), so it never meets one the check rejects.
    assert accepted == rebuilt, "the check and the loader disagree about this tree"


@pytest.mark.parametrize("depth, leaf, ok", [(MAX_STATE_DEPTH, [], True), (MAX_STATE_DEPTH + 1, [], False),
                                            (MAX_STATE_DEPTH - 1, [1], True), (MAX_STATE_DEPTH, [1], False)])
def test_the_depth_limit(depth, leaf, ok):
    tree: list = leaf
    for _ in range(depth):
        tree = [tree]
    if ok:
        check_state_tree(tree, where="states[0]")
        unflatten_state(tree, lambda key, path: key)
    else:
        with pytest.raises(ManifestError, match="nested deeper than 256 levels"):
            check_state_tree(tree, where="states[0]")
        with pytest.raises(ManifestError, match="nested deeper than 256 levels"):
            unflatten_state(tree, lambda key, path: key)
