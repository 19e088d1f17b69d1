"""A restricted unpickler: tensors, containers and primitives; nothing in a file ever runs.

Pickle is a program: ``find_class`` hands it any importable callable, and
``REDUCE`` calls it. This unpickler resolves only an allow-list of harmless
globals for real (torch's tensor rebuild functions and storages, dtypes,
``collections``, numpy arrays, ``argparse.Namespace``, ``datetime``...), and
refuses outright the names a hostile file needs to run code (``os.system``,
``builtins.eval``, ``subprocess``, ``importlib``, ``functools``, ``operator``,
any other ``torch``/``numpy`` function...). Every other global — a foreign
framework's class, say DeepSpeed's ``LossScaler`` — is, by the caller's choice,

* ``unknown="refuse"`` (the default): an :class:`~ucp.errors.UnsafePickleError`
  naming the class and how to allow it, or
* ``unknown="stand-in"`` (what readers of foreign checkpoints use): an
  :class:`InertObject` subclass that records its name, arguments and state and
  does nothing else. The foreign module is never imported.

Callers extend the allow-list with ``allow=["mypkg.module.MyClass", MyOtherClass]``.

>>> import pickle, collections, torch
>>> data = pickle.dumps({"w": torch.ones(2), "order": collections.OrderedDict(a=1)})
>>> loads(data)["order"]
OrderedDict([('a', 1)])
>>> import os
>>> class Evil:
...     def __reduce__(self):
...         return (os.system, ("echo pwned",))
>>> loads(pickle.dumps(Evil()))
Traceback (most recent call last):
...
ucp.errors.UnsafePickleError: the pickle calls posix.system, which can run code; refused (nothing was executed)
"""

from __future__ import annotations

import _compat_pickle
import importlib
import io
import os
import pickle
import types
from typing import Any, BinaryIO, Iterable

from ucp.errors import FormatError, UcpError, UnsafePickleError

__all__ = ["InertObject", "RestrictedUnpickler", "loads", "load", "torch_load", "pickle_module", "SAFE_GLOBALS"]

# Resolved for real: constructing these runs no code from the file.
SAFE_GLOBALS = frozenset(
    {
        "builtins.set",
        "builtins.frozenset",
        "builtins.slice",
        "builtins.complex",
        "builtins.bytearray",
        "builtins.bytes",
        "builtins.range",
        "builtins.list",
        "builtins.dict",
        "builtins.tuple",
        "builtins.int",
        "builtins.float",
        "builtins.str",
        "builtins.bool",
        "builtins.object",
        "collections.OrderedDict",
        "collections.defaultdict",
        "collections.Counter",
        "collections.deque",
        "copyreg._reconstructor",
        "_codecs.encode",
        "argparse.Namespace",
        "datetime.datetime",
        "datetime.date",
        "datetime.time",
        "datetime.timedelta",
        "datetime.timezone",
        "decimal.Decimal",
        "fractions.Fraction",
        "uuid.UUID",
        "pathlib.Path",
        "pathlib.PosixPath",
        "pathlib.WindowsPath",
        "pathlib.PurePath",
        "pathlib.PurePosixPath",
        "pathlib.PureWindowsPath",
        "torch.Size",
        "torch.device",
        "torch.dtype",
        "torch.Tensor",
        "torch.nn.parameter.Parameter",
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_parameter",
        "torch._utils._rebuild_parameter_with_state",
        "torch._utils._rebuild_meta_tensor_no_storage",
        "torch._utils._rebuild_device_tensor_from_numpy",
        "torch.storage.UntypedStorage",
        "torch.storage.TypedStorage",
        "numpy.ndarray",
        "numpy.dtype",
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
        "numpy.random._pickle.__randomstate_ctor",
        "numpy.random._pickle.__bit_generator_ctor",
        "numpy.random._pickle.__generator_ctor",
        "numpy.random.mtrand.RandomState",
    }
)

# Modules whose globals a checkpoint has no business naming: a pickle that does is refused,
# whatever ``unknown`` says (unless the caller allows that exact name).
_DENIED_MODULES = frozenset(
    {
        "os",
        "posix",
        "nt",
        "posixpath",
        "ntpath",
        "subprocess",
        "sys",
        "builtins",
        "__builtin__",
        "importlib",
        "runpy",
        "code",
        "codeop",
        "shutil",
        "socket",
        "pickle",
        "_pickle",
        "marshal",
        "ctypes",
        "pty",
        "signal",
        "multiprocessing",
        "webbrowser",
        "types",
        "functools",
        "operator",
        "io",
        "_io",
        "tempfile",
        "pdb",
        "timeit",
        "trace",
        "cProfile",
        "profile",
        "gc",
        "inspect",
        "ast",
        "asyncio",
        "threading",
        "_thread",
        "select",
        "sysconfig",
        "site",
        "urllib",
        "http",
        "ftplib",
        "smtplib",
        "telnetlib",
        "requests",
        "copyreg",
        "glob",
        "torch",
        "numpy",
        "zipimport",
        "pkgutil",
        "platform",
        "ensurepip",
        "venv",
        "distutils",
        "setuptools",
        "pip",
    }
)
_DENIED_NAMES = frozenset(
    {
        "system",
        "popen",
        "exec",
        "eval",
        "execfile",
        "compile",
        "__import__",
        "getattr",
        "setattr",
        "delattr",
        "open",
        "input",
        "spawn",
        "spawnv",
        "spawnl",
        "call",
        "check_call",
        "check_output",
        "run",
        "Popen",
        "load",
        "loads",
        "import_module",
    }
)
# torch's dtypes are pickled as ``torch.float32`` and friends.
_TORCH_DTYPES = frozenset(
    {
        "float32",
        "float",
        "float64",
        "double",
        "float16",
        "half",
        "bfloat16",
        "complex32",
        "complex64",
        "complex128",
        "cfloat",
        "cdouble",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "int8",
        "int16",
        "short",
        "int32",
        "int",
        "int64",
        "long",
        "bool",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "strided",
        "sparse_coo",
        "contiguous_format",
        "preserve_format",
        "channels_last",
    }
)


class InertObject:
    """Stands in for an object of a class that was not allowed: it records, and never runs anything.

    ``origin`` is the ``module.name`` the pickle asked for; ``args``/``kwargs`` what it
    was called with; ``state`` what ``__setstate__`` received; ``called`` whether the
    pickle called the class (``cls(*args)``) rather than only ``cls.__new__(cls, *args)``.

    >>> cls = _stand_in("deepspeed.runtime.fp16.loss_scaler", "LossScaler")
    >>> obj = cls(1.0); obj.__setstate__({"cur_scale": 4.0})
    >>> obj.origin, obj.args, obj.state
    ('deepspeed.runtime.fp16.loss_scaler.LossScaler', (1.0,), {'cur_scale': 4.0})
    """

    origin = "?"
    args: tuple
    kwargs: dict[str, Any]
    state: Any
    called: bool

    # __new__, not __init__: pickle's NEWOBJ opcode builds objects with cls.__new__(cls, *args)
    # and never calls __init__, and the arguments must be kept either way.
    def __new__(cls, *args: Any, **kwargs: Any) -> "InertObject":
        self = super().__new__(cls)
        self.args = args
        self.kwargs = kwargs
        self.state = None
        self.called = False
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.called = True  # built by calling the class (REDUCE), not by NEWOBJ alone

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __reduce__(self):  # pickling a stand-in again would name a class that cannot be imported
        raise TypeError(f"an inert stand-in for {self.origin} cannot be pickled")

    def __repr__(self) -> str:
        return f"<inert {self.origin}>"


_STAND_INS: dict[tuple[str, str], type] = {}


def _stand_in(module: str, name: str) -> type:
    key = (module, name)
    cls = _STAND_INS.get(key)
    if cls is None:
        cls = type(
            name.rpartition(".")[2] or "Foreign",
            (InertObject,),
            {
                "origin": f"{module}.{name}",
                "__module__": "ucp.unpickle.foreign",
            },
        )
        _STAND_INS[key] = cls
    return cls


# What one pickle may make its allowed callables allocate, all calls together: this many bytes per byte
# of the file it came from, plus a floor. Plain data never needs more (a list of n items costs ~8n
# bytes, and the n items are in the file); ``bytearray(3_000_000_000)`` in a 400-byte file does.
ALLOC_PER_BYTE = 16
ALLOC_FLOOR = 1 << 20
# How a call to each allocating global is charged (see _Bounded): by its integer arguments
# (a size), by the length of its first argument (a container built from it), or by both.
_BY_SIZE = frozenset(
    {
        "builtins.bytearray",
        "builtins.bytes",
        "torch.storage.UntypedStorage",
        "torch.storage.TypedStorage",
        "torch.Tensor",
        "numpy.ndarray",
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
    }
)
_BY_LENGTH = frozenset(
    {
        "builtins.list",
        "builtins.tuple",
        "builtins.set",
        "builtins.frozenset",
        "builtins.dict",
        "builtins.str",
        "builtins.bytearray",
        "builtins.bytes",
        "collections.OrderedDict",
        "collections.defaultdict",
        "collections.Counter",
        "collections.deque",
        "torch.Size",
        "_codecs.encode",
    }
)


class _Bounded:
    """An allowed global that allocates, charged against the unpickler's budget before it runs."""

    def __init__(self, fn: Any, full: str, unpickler: "RestrictedUnpickler") -> None:
        self.fn, self.full, self.unpickler = fn, full, unpickler

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A bounded class passed as an argument (ndarray to _reconstruct) must be the class itself.
        args = tuple(a.fn if isinstance(a, _Bounded) else a for a in args)
        self.unpickler._charge(self.full, _cost(self.full, args))
        return self.fn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # cls.__new__ (NEWOBJ), __reduce__ targets...
        return getattr(self.fn, name)


def _cost(full: str, args: tuple) -> int:
    """Bytes a call may allocate, from its arguments (an overestimate is fine; the budget is generous)."""
    cost = 0
    if full in _BY_SIZE:
        for arg in args:
            if isinstance(arg, int) and not isinstance(arg, bool):
                cost += 8 * max(arg, 0)
            elif isinstance(arg, (tuple, list)) and all(isinstance(a, int) for a in arg):
                n = 1
                for a in arg:
                    n *= max(a, 0)
                cost += 8 * n
    if full in _BY_LENGTH and args:
        try:
            cost += 8 * len(args[0])
        except TypeError:
            pass  # not sized (an int, an iterator over the file's own data)
        except OverflowError:
            return 1 << 80  # range(10**30)
    if full == "copyreg._reconstructor" and len(args) == 3:  # base.__new__(cls, state): base decides
        base = args[1]
        name = f"{getattr(base, '__module__', '')}.{getattr(base, '__qualname__', '')}"
        cost += _cost(name, (args[2],)) if name in _BY_SIZE | _BY_LENGTH else 0
    if full.startswith("torch.") and full.endswith("Storage"):  # legacy typed storages: Storage(n)
        cost += sum(8 * max(a, 0) for a in args if isinstance(a, int) and not isinstance(a, bool))
    return cost


def _fraction(*args: Any) -> Any:
    """``fractions.Fraction`` without exponents: ``Fraction("1e999999999")`` computes a 10^9-digit integer."""
    import decimal
    import fractions

    for arg in args:
        if isinstance(arg, str) and ("e" in arg.lower() or len(arg) > 4300):
            raise FormatError(f"the pickle builds Fraction({arg[:40]!r}), which pickled fractions never are")
        if isinstance(arg, (float, decimal.Decimal)):
            raise FormatError("the pickle builds a Fraction from a float or Decimal, which pickled fractions never do")
    return fractions.Fraction(*args)


def _plain_tensor(func: Any, new_type: Any, args: tuple, state: Any) -> Any:
    """``torch._tensor._rebuild_from_type_v2``: a tensor subclass comes back as the plain tensor."""
    return func(*args)


def _global_name(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, tuple) and len(item) == 2:
        return f"{item[0]}.{item[1]}"
    return f"{item.__module__}.{item.__qualname__}"


def _split(full: str) -> tuple[str, str]:
    module, _, name = full.rpartition(".")
    return module, name


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only allowed globals (see the module doc).

    ``allow``: extra ``"module.name"`` strings, ``(module, name)`` pairs or the objects
    themselves; ``unknown``: ``"refuse"`` or ``"stand-in"`` for globals neither allowed nor denied.
    """

    def __init__(
        self,
        file: BinaryIO,
        *,
        allow: Iterable[Any] = (),
        unknown: str = "refuse",
        source: str = "",
        budget: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(file, **kwargs)
        if unknown not in ("refuse", "stand-in"):
            raise ValueError(f"unknown must be 'refuse' or 'stand-in', got {unknown!r}")
        self._allowed = {_global_name(item) for item in allow}
        self._unknown = unknown
        self._source = source or getattr(file, "name", None) or "the pickle"
        self._budget = budget if budget is not None else ALLOC_FLOOR + ALLOC_PER_BYTE * _size_of(file)
        self._spent = 0
        # An attribute, not a method: torch.load installs its own storage loader the same way.
        self.persistent_load = _refuse_persistent  # type: ignore[method-assign]  # as torch.load does

    def _charge(self, full: str, cost: int) -> None:
        self._spent += cost
        if self._spent > self._budget:
            raise FormatError(
                f"{self._source}: the pickle asks {full} for about {cost} bytes, more than a file "
                f"of its size can describe (budget {self._budget} bytes); refused before allocating "
                "(damaged or hostile file)"
            )

    def load(self) -> Any:
        """Unpickle; anything but a refusal of ours is a :class:`~ucp.errors.FormatError` naming the source."""
        try:
            return super().load()
        except (UcpError, KeyboardInterrupt):
            raise
        except (Exception, RecursionError, MemoryError) as err:  # noqa: BLE001 - a hostile file can raise anything
            raise FormatError(
                f"{self._source} is not a readable torch.save/pickle file ({type(err).__name__}: {str(err)[:200]})"
            ) from None

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol < 3 pickles, torch.save's default) mean their Python 3 ones.
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full = f"{module}.{name}"
        if full in self._allowed:
            return _resolve(module, name)
        if full == "torch._tensor._rebuild_from_type_v2":
            return _plain_tensor
        if full == "torch.storage._load_from_bytes":
            return _storage_from_bytes
        if full == "fractions.Fraction":
            return _fraction
        if full in SAFE_GLOBALS or (module == "torch" and (name in _TORCH_DTYPES or name.endswith("Storage"))):
            try:
                value = _resolve(module, name)
            except (ImportError, AttributeError):
                if not module.startswith("numpy"):
                    raise
                # numpy 1 vs 2 module names
                value = _resolve(module.replace("numpy._core", "numpy.core").replace("numpy.core", "numpy._core"), name)
            if (
                full in _BY_SIZE
                or full in _BY_LENGTH
                or full == "copyreg._reconstructor"
                or (module == "torch" and name.endswith("Storage"))
            ):
                return _Bounded(value, full, self)
            return value
        root = module.partition(".")[0]
        if root in _DENIED_MODULES or name.rpartition(".")[2] in _DENIED_NAMES or name.startswith("__"):
            raise UnsafePickleError(f"the pickle calls {full}, which can run code; refused (nothing was executed)")
        if self._unknown == "stand-in":
            return _stand_in(module, name)
        raise UnsafePickleError(
            f"the pickle needs {full}, which is not on the allow-list of plain data types; if you trust this "
            f"file, allow it explicitly (allow_objects=[{full!r}])"
        )


def _size_of(file: Any) -> int:
    """Bytes in the file being unpickled (a BytesIO, an open file, anything seekable), 0 if unknown."""
    try:
        return file.getbuffer().nbytes
    except (AttributeError, ValueError, TypeError):
        pass
    try:
        return os.fstat(file.fileno()).st_size
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    try:
        here = file.tell()
        end = file.seek(0, io.SEEK_END)
        file.seek(here)
        return end
    except (AttributeError, OSError, ValueError):
        return 0


def _refuse_persistent(pid: Any) -> Any:
    raise UnsafePickleError(f"the pickle refers to an external object {pid!r}, which plain data never does")


def _resolve(module: str, name: str) -> Any:
    value: Any = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _storage_from_bytes(data: bytes) -> Any:
    # torch's own version calls torch.load(weights_only=False) on the bytes: read them restricted.
    return torch_load(io.BytesIO(data), unknown="refuse")


def loads(data: bytes, *, allow: Iterable[Any] = (), unknown: str = "refuse") -> Any:
    """Unpickle ``data`` restricted (see the module doc)."""
    return RestrictedUnpickler(io.BytesIO(data), allow=allow, unknown=unknown).load()


def load(file: BinaryIO, *, allow: Iterable[Any] = (), unknown: str = "refuse") -> Any:
    """Unpickle from an open binary file, restricted."""
    return RestrictedUnpickler(file, allow=allow, unknown=unknown).load()


def pickle_module(*, allow: Iterable[Any] = (), unknown: str = "stand-in", source: str = "") -> types.SimpleNamespace:
    """A ``pickle_module`` for ``torch.load`` whose unpickler is restricted (``source`` names the file in errors)."""
    allow = tuple(allow)

    class _Unpickler(RestrictedUnpickler):
        def __init__(self, file: BinaryIO, **kwargs: Any) -> None:
            super().__init__(file, allow=allow, unknown=unknown, source=source, **kwargs)

    return types.SimpleNamespace(
        Unpickler=_Unpickler,
        load=lambda file, **kwargs: _Unpickler(file, **kwargs).load(),
        __name__="ucp.unpickle",
    )


def torch_load(
    source: str | os.PathLike | BinaryIO,
    *,
    allow: Iterable[Any] = (),
    unknown: str = "stand-in",
    map_location: Any = "cpu",
    mmap: bool = False,
) -> Any:
    """``torch.load`` through the restricted unpickler: a ``.pt`` file of a foreign framework, safely.

    Foreign classes become :class:`InertObject` stand-ins by default (``unknown="stand-in"``);
    the framework is never imported, and a file naming ``os.system`` is refused.
    ``mmap=True`` maps tensor bytes instead of reading them (zip-format files).

    >>> import torch, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "w.pt")
    >>> torch.save({"w": torch.arange(3)}, path)
    >>> torch_load(path)["w"]
    tensor([0, 1, 2])
    """
    import torch

    where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else ""
    options: dict[str, Any] = {
        "map_location": map_location,
        "weights_only": False,
        "pickle_module": pickle_module(allow=allow, unknown=unknown, source=where),
    }
    if mmap:
        options["mmap"] = True
    try:
        return torch.load(source, **options)
    except UcpError:
        raise
    except Exception as err:  # noqa: BLE001 - torch.load on damaged or hostile bytes raises anything
        where = where or "the file"
        raise FormatError(
            f"{where} is not a readable torch.save/pickle file ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''})"
        ) from None
