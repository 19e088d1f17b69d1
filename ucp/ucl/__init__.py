"""UCL, the Universal Checkpoint Language: one program maps local tensors onto logical ones for any layout.

Example::

    from ucp import ucl
    prog = ucl.load_program("megatron-gpt", num_layers=32, heads=32, kv_heads=8, vocab_size=128256)
    fmap = ucl.spec_for_load(prog, "tp=2,pp=2", 3, logical)   # logical: name -> LogicalTensor
    ucl.local_shapes(fmap)                                    # what rank 3 allocates

See docs/UCL.md for the language reference.
"""

from ucp.ucl.bind import (  # noqa: F401
    BoundProgram,
    LocalTensor,
    format_params,
    load_program,
    local_shapes,
    parse_params,
    preset_names,
    spec_for_load,
    spec_for_save,
)
from ucp.ucl.check import CheckReport, Finding, check_program  # noqa: F401
from ucp.ucl.compiler import BoundFragmentMap  # noqa: F401
from ucp.ucl.declared import declared_logical  # noqa: F401
from ucp.ucl.errors import DeclaredShapeError, ProgramMismatchError, UclError, UclSyntaxError  # noqa: F401
from ucp.ucl.parser import parse  # noqa: F401


def __getattr__(name: str):
    # convert_names needs torch: imported on first use so parsing and checking stay light
    if name == "convert_names":
        from ucp.ucl.convert import convert_names

        return convert_names
    raise AttributeError(f"module 'ucl' has no attribute {name!r}")
