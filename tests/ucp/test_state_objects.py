"""Python objects in a state: opt-in on save, restricted unpickling on load; malformed trees are refused."""

from __future__ import annotations

import datetime
import json
import os

import pytest
import torch

import ucp


class Point:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Point) and other.x == self.x


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_loading_objects_never_runs_code_from_the_checkpoint(tmp_path):
    marker = tmp_path / "pwned"
    ucp.save({"w": torch.ones(2), "obj": RunsCode(marker)}, tmp_path / "c", allow_objects=True)
    with pytest.raises(ucp.UnsafePickleError) as err:
        ucp.load(tmp_path / "c", allow_objects=True)
    assert str(err.value) == (
        "cannot load the pickled object at 'obj': the pickle calls posix.system, which can run code; "
        "refused (nothing was executed)"
    )
    assert not marker.exists()


def test_plain_data_objects_load_with_true_and_other_classes_need_naming(tmp_path):
    state = {"cfg": {"when": datetime.date(2026, 1, 2), "point": Point(3)}}
    ucp.save(state, tmp_path / "c", allow_objects=True)
    name = f"{Point.__module__}.{Point.__qualname__}"
    with pytest.raises(ucp.UnsafePickleError) as err:
        ucp.load(tmp_path / "c", allow_objects=True)
    assert str(err.value) == (
        f"cannot load the pickled object at 'cfg/point': the pickle needs {name}, which is not on the allow-list "
        f"of plain data types; if you trust this file, allow it explicitly (allow_objects=[{name!r}])"
    )
    assert ucp.load(tmp_path / "c", allow_objects=[name]) == state
    assert ucp.load(tmp_path / "c", allow_objects=[Point]) == state


def test_objects_stay_refused_without_opt_in_and_the_message_says_how(tmp_path):
    ucp.save({"when": datetime.date(2026, 1, 2)}, tmp_path / "c", allow_objects=True)
    with pytest.raises(ucp.UnsafeObjectError) as err:
        ucp.load(tmp_path / "c")
    assert str(err.value) == (
        "checkpoint holds a pickled Python object at 'when'; pass allow_objects=True to load it with the "
        "restricted unpickler (plain data types only), or allow_objects=['module.Class', ...] to allow more"
    )


@pytest.mark.parametrize(("node", "message"), [
    ({"$float": "lots"}, "bad {'$float': 'lots'} at 'x': expected \"nan\", \"inf\" or \"-inf\""),
    ({"$dict": [[1]]}, "bad $dict at 'x': expected a list of [key, value] pairs"),
    ({"$tuple": 3}, "bad $tuple at 'x': expected a list"),
    ({"$tensor": 7}, "bad $tensor at 'x': expected a tensor key (a string)"),
    ({"$object": "%%%"}, "bad $object at 'x': not base64 of a pickle"),
])
def test_malformed_tags_in_a_state_tree_are_manifest_errors(tmp_path, node, message):
    ucp.save({"x": 1}, tmp_path / "c")
    manifest = tmp_path / "c" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["states"]["0"]["x"] = node
    manifest.write_text(json.dumps(data))
    with pytest.raises(ucp.ManifestError) as err:
        ucp.load(tmp_path / "c", allow_objects=True)
    assert str(err.value) == f"state tree of {tmp_path / 'c'}: {message}"


def test_a_state_nested_deeper_than_the_limit_is_refused_both_ways(tmp_path):
    deep: list = []
    node = deep
    for _ in range(300):
        node.append([])
        node = node[0]
    with pytest.raises(ucp.UnsafeObjectError, match="state is nested deeper than 256 levels at 'deep/0/0/0/"):
        ucp.save({"deep": deep}, tmp_path / "a")
    ucp.save({"x": 1}, tmp_path / "c")
    manifest = tmp_path / "c" / "manifest.json"
    data = json.loads(manifest.read_text())
    tree: list = []
    node = tree
    for _ in range(900):
        node.append([])
        node = node[0]
    data["states"]["0"]["x"] = tree
    manifest.write_text(json.dumps(data))
    with pytest.raises(ucp.ManifestError, match="state tree of .*: nested deeper than 256 levels at 'x/0/0/"):
        ucp.load(tmp_path / "c")
