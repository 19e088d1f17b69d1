"""How each torch dtype is stored in a zarr v3 array.

Most torch dtypes have a zarr v3 data type of the same name. The ones zarr v3
lacks (``bfloat16`` and the one-byte float kinds) are stored as the unsigned
integer of the same width holding the exact bit pattern, so that *any* zarr
reader opens the array; the true dtype is recorded in the manifest and in the
array's attributes (docs/FORMAT.md, "Data types")::

    >>> storage_dtype("bfloat16")
    'uint16'
    >>> storage_dtype("float32")
    'float32'
"""

from __future__ import annotations

import numpy as np
import torch

from ucp.errors import UcpError


class UnsupportedDtypeError(UcpError, TypeError):
    """A tensor's dtype has no storage rule in the format."""


# torch dtype name -> zarr v3 data type name of the stored array.
_NATIVE = {
    "bool": "bool",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "complex64": "complex64",
    "complex128": "complex128",
}
# Stored as their bit pattern: zarr v3 has no data type for them.
_BIT_PATTERN = {
    "bfloat16": "uint16",
    "float8_e4m3fn": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float8_e8m0fnu": "uint8",
    "float4_e2m1fn_x2": "uint8",
}
_TORCH_UINT = {"uint8": torch.uint8, "uint16": torch.uint16}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; raises UnsupportedDtypeError for names outside the format."""
    if name not in _NATIVE and name not in _BIT_PATTERN:
        raise UnsupportedDtypeError(
            f"dtype {name!r} is not supported by the checkpoint format; "
            f"supported: {', '.join(sorted({**_NATIVE, **_BIT_PATTERN}))}"
        )
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedDtypeError(f"dtype {name!r} is not available in this torch version ({torch.__version__})")
    return dtype


def storage_dtype(name: str) -> str:
    """The zarr v3 data type that stores tensors of torch dtype ``name``."""
    torch_dtype(name)  # validates
    return _NATIVE.get(name) or _BIT_PATTERN[name]


def is_bit_pattern(name: str) -> bool:
    return name in _BIT_PATTERN


def check_supported(dtype: torch.dtype, *, key: str) -> str:
    """The dtype's name, or UnsupportedDtypeError naming the tensor ``key``."""
    name = dtype_name(dtype)
    if name not in _NATIVE and name not in _BIT_PATTERN:
        raise UnsupportedDtypeError(
            f"tensor {key!r} has dtype {name}, which the checkpoint format cannot store; "
            f"convert it (e.g. tensor.to(torch.float32)) before saving"
        )
    return name


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view (no copy) of a CPU tensor in its storage dtype."""
    name = dtype_name(tensor.dtype)
    if name in _BIT_PATTERN:
        tensor = tensor.view(_TORCH_UINT[_BIT_PATTERN[name]])
    return tensor.numpy()


def host_array(tensor: torch.Tensor):
    """A C-contiguous numpy array of the tensor (a view when it already is one, on the CPU).

    Non-contiguous CPU tensors are copied by numpy, not by torch's ``contiguous()``, whose
    intra-op thread pool stalls when other processes keep the cores busy.
    """
    # A conjugate or negative view keeps its values in a lazy bit numpy cannot see: resolve it.
    return np.ascontiguousarray(to_numpy(tensor.detach().to("cpu").resolve_conj().resolve_neg()))


def from_numpy(array: np.ndarray, name: str) -> torch.Tensor:
    """A tensor of torch dtype ``name`` viewing ``array`` (stored in the storage dtype)."""
    tensor = torch.from_numpy(array)
    if name in _BIT_PATTERN:
        tensor = tensor.view(torch_dtype(name))
    return tensor


def allocate(shape, dtype: str, *, zeros: bool = False, what: str = "tensor"):
    """A new host tensor, or TensorTooLargeError naming ``what`` when memory refuses it.

    A damaged or hostile manifest can claim any shape: the error says so instead of
    letting an allocator error (or the OOM killer) speak.
    """
    import math

    import torch

    from ucp.errors import TensorTooLargeError

    kind = torch_dtype(dtype)
    try:
        return (torch.zeros if zeros else torch.empty)(tuple(shape), dtype=kind)
    except (RuntimeError, MemoryError) as err:
        nbytes = math.prod(shape) * kind.itemsize
        raise TensorTooLargeError(
            f"cannot allocate {what} {dtype}{list(shape)} ({nbytes / 2**30:.1f} GiB): {str(err).splitlines()[0]}; "
            "read it in pieces (ucp.read_tensor with a region, ucp.iter_tensors) or, if that size is "
            "wrong, the manifest is damaged - check it with `ucp verify`"
        ) from None
