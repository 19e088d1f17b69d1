"""The UCL program of a checkpoint: what the manifest records, and how save and load apply it.

A checkpoint saved through a UCL program describes itself: the manifest keeps the
program's full text, its parameter values and the preset it came from
(docs/FORMAT.md, "program"), so a load under another layout needs nothing else::

    ucp.save(state, "ckpt/5", program="megatron-gpt:num_layers=4,heads=8,...", layout="tp=2", rank=r, world_size=2)
    mine = ucp.load("ckpt/5", layout="tp=4", rank=r)       # the manifest's program, re-targeted

A program given to a load is checked against the recorded one: a model parameter with
another value (``heads=2`` for a checkpoint saved with ``heads=4``) would cut fused
tensors wrongly, so it is refused, naming both values.
"""

from __future__ import annotations

import os
from typing import Any

from ucp.errors import LayoutError
from ucp.layout import Layout
from ucp.program_record import ProgramRecord
from ucp.spec import FragmentMap, LogicalTensor


def compile_for_save(
    program: Any, *, spec: Any, layout: Layout | None, rank: int, local: dict, logical: dict | None
) -> tuple[FragmentMap, ProgramRecord]:
    """The fragment map of ``rank`` saving ``local`` (key -> (shape, dtype)) under ``program``, and its record.

    ``program`` is anything :func:`ucp.ucl.load_program` reads: UCL text, a ``.ucl`` path, a preset name
    or reference, or a ``BoundProgram``. A ``spec`` given too is refused (one of them would be ignored).
    """
    if spec is not None:
        from ucp.ucl.errors import UclError

        raise UclError("pass spec= or program= to save, not both: a spec is a compiled program for one rank")
    if layout is None:
        raise LayoutError("program= needs layout= (e.g. layout='tp=2,dp=2') to be compiled into a fragment map")
    from ucp.ucl.bind import load_program, spec_for_save

    bound = load_program(program)
    return spec_for_save(bound, layout, rank, local, shapes=logical), bound.record()


def compile_for_load(
    path: str,
    recorded: ProgramRecord | None,
    saved_layout: dict | None,
    logical: dict,
    *,
    spec: Any,
    program: Any,
    layout: Layout | None,
    rank: int | None,
) -> Any:
    """What ``ucp.load`` loads by: ``spec`` as given, a program's map for ``rank`` of ``layout``, or None (whole tensors).

    Without ``program``, a ``layout`` (or a ``rank`` of the saved layout) uses the checkpoint's own
    program. A given program must agree with the recorded one on every model parameter.
    """
    from ucp.ucl.errors import UclError

    if spec is not None and program is not None:
        raise UclError("pass spec= or program= to load, not both: a spec is a compiled program for one rank")
    if spec is not None or (program is None and layout is None and (rank is None or recorded is None)):
        return spec
    if layout is None and rank is not None and saved_layout is not None:
        layout = Layout.from_dict(saved_layout)  # a rank of the layout the checkpoint was saved with
    if layout is None or rank is None:
        raise LayoutError(
            "loading through a UCL program needs layout= (e.g. 'tp=2,dp=2') and rank= to say which shard to load"
        )
    from ucp.ucl.bind import load_program, spec_for_load

    if program is None:
        if recorded is None:
            raise UclError(
                f"checkpoint {path} records no UCL program, so it cannot be loaded under layout {layout} "
                "by itself: pass program= (the program it was saved with) or spec="
            )
        bound = load_program(recorded)
    else:
        bound = merge_with_recorded(path, load_program(program), recorded)
    return spec_for_load(bound, layout, rank, logical)


def merge_with_recorded(path: str, bound: Any, recorded: ProgramRecord | None) -> Any:
    """``bound`` (a ``ucl.BoundProgram``) checked against the checkpoint's recorded program and completed by it.

    Raises ProgramMismatchError naming every model parameter whose value differs; model parameters
    ``bound`` leaves without a value take the saved ones.
    """
    if recorded is None:
        return bound
    from ucp.ucl.bind import load_program, param_conflicts, with_saved_params
    from ucp.ucl.errors import ProgramMismatchError

    saved = load_program(recorded)
    conflicts = param_conflicts(bound, saved)
    if not conflicts:
        return with_saved_params(bound, saved)
    detail = "; ".join(f"{n}={_value(given)} given, {n}={_value(was)} saved" for n, given, was in conflicts)
    raise ProgramMismatchError(
        f"the program given disagrees with the one checkpoint {path} was saved with: {detail}. These parameters "
        "describe the model, and another value maps its tensors wrongly; leave the program out to use the "
        "checkpoint's own, or give the saved values"
    )


def read_against(path: str) -> dict[str, LogicalTensor]:
    """Logical tensors of a checkpoint, through the engine's reader (its errors are UcpErrors): what
    ``ucp ucl check --against CHECKPOINT`` checks a program against."""
    from ucp.reader import CheckpointReader

    return CheckpointReader(os.fspath(path), verify=False).logical()


def program_against(program, path: str, params: dict | None = None):
    """The program to check a checkpoint with: ``program`` (None: the checkpoint's own) with ``params``.

    It gets the checkpoint's values for the model parameters it leaves out; a model parameter given
    another value than the checkpoint's is a ProgramMismatchError, as in ``ucp.load``.
    """
    from ucp.reader import CheckpointReader
    from ucp.ucl.bind import load_program
    from ucp.ucl.errors import UclError

    recorded = CheckpointReader(os.fspath(path), verify=False).manifest.program
    if program is None and recorded is None:
        raise UclError(f"checkpoint {path} records no UCL program: name the program to check it with")
    given = load_program(recorded if program is None else program, **(params or {}))
    return merge_with_recorded(path, given, recorded)


def _value(value: Any) -> str:
    return "|".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
