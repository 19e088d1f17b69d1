"""The restricted unpickler: plain data loads, code never runs, foreign classes stay inert."""

from __future__ import annotations

import argparse
import collections
import doctest
import io
import os
import pickle

import numpy as np
import pytest
import torch

import ucp.unpickle as unpickle
from ucp.errors import FormatError, UcpError, UnsafeObjectError, UnsafePickleError


class _Reduce:
    """Pickles as a call of ``func(*args)``: what a hostile file does."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def _marker(tmp_path):
    return tmp_path / "ran"


@pytest.mark.parametrize("func_args", [
    (os.system, "touch {m}"),
    (eval, "open({m!r}, 'w')"),
    (exec, "open({m!r}, 'w')"),
    (__import__("subprocess").call, ["touch", "{m}"]),
    (getattr, None),  # getattr({}, "clear"): the first step of every attribute gadget
])
def test_code_execution_is_refused_and_nothing_runs(tmp_path, func_args):
    func, arg = func_args
    marker = _marker(tmp_path)
    if isinstance(arg, str):
        arg = arg.format(m=str(marker))
    elif isinstance(arg, list):
        arg = [a.format(m=str(marker)) for a in arg]
    data = pickle.dumps(_Reduce(func, arg) if arg is not None else _Reduce(func, {}, "clear"))
    with pytest.raises(UnsafePickleError, match=r"which can run code; refused \(nothing was executed\)"):
        unpickle.loads(data, unknown="stand-in")
    assert not marker.exists()


def test_refused_even_when_the_call_hides_inside_a_tensor_file(tmp_path):
    marker = _marker(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": _Reduce(os.system, f"touch {marker}")}, path)
    with pytest.raises(UnsafePickleError, match=r"(posix|os)\.system"):
        unpickle.torch_load(path)
    assert not marker.exists()


def test_plain_data_round_trips():
    value = {
        "t": torch.arange(6.0).view(2, 3), "p": torch.nn.Parameter(torch.ones(2)), "bf": torch.ones(3, dtype=torch.bfloat16),
        "od": collections.OrderedDict(a=1), "set": {1, 2}, "tuple": (1, "a", None), "size": torch.Size([2, 3]),
        "np": np.arange(4, dtype=np.int16), "ns": argparse.Namespace(lr=0.1, name="x"), "dtype": torch.float16,
        "dd": collections.defaultdict(list, a=[1]), "cplx": 1 + 2j, "bytes": b"\x00\x01",
    }
    buf = io.BytesIO()
    torch.save(value, buf)
    buf.seek(0)
    got = unpickle.torch_load(buf)
    assert torch.equal(got["t"], value["t"]) and got["bf"].dtype == torch.bfloat16
    assert isinstance(got["p"], torch.Tensor) and torch.equal(got["p"], value["p"])
    assert got["od"] == value["od"] and got["set"] == {1, 2} and got["tuple"] == (1, "a", None)
    assert got["size"] == torch.Size([2, 3]) and got["dtype"] is torch.float16
    assert np.array_equal(got["np"], value["np"]) and got["np"].dtype == np.int16
    assert vars(got["ns"]) == {"lr": 0.1, "name": "x"}
    assert got["dd"]["a"] == [1] and got["cplx"] == 1 + 2j and got["bytes"] == b"\x00\x01"


def test_numpy_random_state_loads():
    state = np.random.RandomState(3).get_state()
    got = unpickle.loads(pickle.dumps(state))
    assert got[0] == "MT19937" and np.array_equal(got[1], state[1])


class Foreign:  # a class from "another framework"
    def __init__(self, scale):
        self.scale = scale


def test_foreign_classes_are_refused_by_default_with_the_way_to_allow_them():
    data = pickle.dumps({"scaler": Foreign(4.0)})
    name = f"{Foreign.__module__}.Foreign"
    with pytest.raises(UnsafePickleError) as err:
        unpickle.loads(data)
    assert str(err.value) == (
        f"the pickle needs {name}, which is not on the allow-list of plain data types; if you trust this "
        f"file, allow it explicitly (allow_objects=[{name!r}])"
    )
    assert isinstance(err.value, UcpError) and isinstance(err.value, UnsafeObjectError)
    assert isinstance(err.value, pickle.UnpicklingError)
    assert unpickle.loads(data, allow=[Foreign])["scaler"].scale == 4.0
    assert unpickle.loads(data, allow=[name])["scaler"].scale == 4.0


def test_foreign_classes_become_inert_stand_ins_that_keep_their_data():
    got = unpickle.loads(pickle.dumps({"scaler": Foreign(4.0)}), unknown="stand-in")["scaler"]
    assert isinstance(got, unpickle.InertObject)
    assert got.origin == f"{Foreign.__module__}.Foreign"
    assert got.state == {"scale": 4.0}
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(got)


def test_a_denied_name_stays_denied_unless_allowed_exactly():
    data = pickle.dumps(_Reduce(os.getcwd))
    with pytest.raises(UnsafePickleError, match=r"(posix|os)\.getcwd"):
        unpickle.loads(data, unknown="stand-in")
    assert unpickle.loads(data, allow=["posix.getcwd", "os.getcwd"]) == os.getcwd()


def test_persistent_ids_are_refused():
    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return "ext" if obj == "x" else None

    buf = io.BytesIO()
    P(buf).dump(["x"])
    with pytest.raises(UnsafePickleError, match="external object 'ext'"):
        unpickle.loads(buf.getvalue())


def test_garbage_is_a_format_error(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"\x80\x04not a pickle at all")
    with pytest.raises(FormatError, match="is not a readable torch.save/pickle file"):
        unpickle.torch_load(path)


def test_doctests():
    assert doctest.testmod(unpickle, optionflags=doctest.ELLIPSIS).failed == 0


class NewObj:
    """Pickles through NEWOBJ (``cls.__new__(cls, *args)``), never calling ``__init__``."""

    def __init__(self, value):
        self.value = value

    def __getnewargs__(self):
        return (self.value,)


def test_stand_ins_built_by_newobj_keep_their_arguments_and_state():
    got = unpickle.loads(pickle.dumps(NewObj(7), protocol=2), unknown="stand-in")
    assert got.args == (7,) and got.kwargs == {} and got.state == {"value": 7}
