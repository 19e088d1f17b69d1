"""Check a UCL program against a concrete layout before any I/O.

For every rank the program is compiled in the load direction; then, over all
ranks together:

* every element of every logical tensor is covered exactly once (replicas
  counted once), using :func:`ucp.geometry.coverage_gaps` (no element masks);
* the ranks holding identical pieces agree with the replica counts they declare;
* shapes are consistent: compiling each rank's local shapes in the save
  direction gives back the same logical shapes;
* rules that matched nothing on any rank are reported as warnings (unless their
  ``where`` switches them off for this layout, like expert rules of a dense model).

    >>> from ucp.spec import LogicalTensor
    >>> report = check_program("ucl 1\\ntensor w -> w\\n  split dim 1 over tp\\n", "tp=2,dp=2",
    ...                        {"w": LogicalTensor("w", (4, 6), "float32")})
    >>> report.ok, report.ranks
    (True, 4)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ucp.ucl.bind import load_program
from ucp.ucl.compiler import compile_load, compile_save, switched_off
from ucp.ucl.env import Context, unmet_requirements
from ucp.ucl.errors import DeclaredShapeError, UclError
from ucp.ucl.program import FlatRule, TensorRule
from ucp.geometry import coverage_gaps
from ucp.layout import Layout
from ucp.spec import LogicalTensor


@dataclass(frozen=True)
class Finding:
    """One problem: ``kind`` is layout | coverage | overlap | replicas | shape | unused-rule | compile | model.

    ``layout``: a ``require`` statement of the program rejects the layout (nothing else is checked then).
    ``shape``: a logical shape contradicts what the program declares or implies.
    ``model``: a real model's state dict disagrees with the program (:mod:`ucp.ucl.model_check`).
    """

    kind: str
    message: str
    logical: str = ""
    rank: int = -1
    line: int = 0

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "message": self.message,
            "logical": self.logical,
            "rank": self.rank,
            "line": self.line,
        }


@dataclass(frozen=True)
class CheckReport:
    program: str
    layout: str
    ranks: int
    logical_tensors: int
    local_tensors: int
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    warnings: tuple[Finding, ...] = field(default_factory=tuple)  # rules that matched nothing

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict:
        return {
            "program": self.program,
            "layout": self.layout,
            "ok": self.ok,
            "ranks": self.ranks,
            "logical_tensors": self.logical_tensors,
            "local_tensors": self.local_tensors,
            "findings": [f.to_dict() for f in self.findings],
            "warnings": [f.to_dict() for f in self.warnings],
        }


def check_program(
    program, layout, logical: dict, *, params: dict | None = None, shapes_roundtrip: bool = True, progress=None
) -> CheckReport:
    """Validate ``program`` for ``layout`` over the logical tensors ``logical`` (name -> LogicalTensor).

    ``progress(done, total)`` is called after each rank (a CLI draws a bar with it).
    """
    bound = load_program(program, **(params or {}))
    prog = bound.program
    lay = layout if isinstance(layout, Layout) else Layout.parse(str(layout))
    logical = {
        n: (t if isinstance(t, LogicalTensor) else LogicalTensor(n, tuple(t[0]), str(t[1]))) for n, t in logical.items()
    }
    findings: list[Finding] = []
    try:
        unmet = unmet_requirements(Context.make(prog, lay, 0, bound.params))
    except UclError as err:
        unmet = [str(err)]
    if unmet:
        return CheckReport(
            prog.filename, str(lay), lay.world_size, len(logical), 0, tuple(Finding("layout", m) for m in unmet)
        )
    regions: dict[str, list] = defaultdict(list)
    owners: dict[str, list] = defaultdict(list)
    groups: dict[frozenset, list] = defaultdict(list)
    used: set[int] = set()
    local_count = 0
    for rank in range(lay.world_size):
        if progress is not None:
            progress(rank, lay.world_size)
        try:
            fmap = compile_load(prog, lay, rank, logical, params=bound.params)
        except DeclaredShapeError as err:
            findings.append(Finding("shape", f"rank {rank}: {err}", rank=rank))
            continue
        except UclError as err:
            findings.append(Finding("compile", f"rank {rank}: {err}", rank=rank))
            continue
        used |= fmap.rules_used
        local_count += len(fmap.tensors)
        saved = fmap
        if shapes_roundtrip:
            local = {k: (lt.shape, lt.dtype) for k, lt in fmap.local.items()}
            try:
                saved = compile_save(prog, lay, rank, local, params=bound.params, shapes=logical)
            except UclError as err:
                findings.append(Finding("shape", f"rank {rank}: saving the loaded shapes fails: {err}", rank=rank))
                saved = fmap
            else:
                for name, lt in saved.logical.items():
                    if name in logical and tuple(logical[name].shape) != tuple(lt.shape):
                        findings.append(
                            Finding(
                                "shape",
                                f"rank {rank}: local shapes imply {name!r} {tuple(lt.shape)}, the checkpoint "
                                f"has {tuple(logical[name].shape)} (declare 'size dim D = ...')",
                                name,
                                rank,
                            )
                        )
                        saved = fmap  # its pieces assume wrong shapes: judge coverage on the load map
        for key, spec in saved.tensors.items():
            ident = frozenset((p.logical, str(p.target)) for p in spec.pieces)
            if ident:
                groups[ident].append((rank, key, spec.replica, spec.replicas))
            if spec.replica != 0:
                continue
            for piece in spec.pieces:
                regions[piece.logical].append(piece.target)
                owners[piece.logical].append((rank, key))
    for name, lt in logical.items():
        uncovered, overlaps = coverage_gaps(regions.get(name, []), lt.shape)
        if uncovered:
            findings.append(
                Finding(
                    "coverage", f"{name!r}: {uncovered} element(s) of {tuple(lt.shape)} are covered by no rank", name
                )
            )
        for a, b in overlaps[:3]:
            (ra, ka), (rb, kb) = owners[name][a], owners[name][b]
            findings.append(
                Finding(
                    "overlap",
                    f"{name!r}: rank {ra} {ka!r} and rank {rb} {kb!r} both save "
                    "the same elements (declare them replicas)",
                    name,
                    ra,
                )
            )
    for holders in groups.values():
        declared = {h[3] for h in holders}
        indices = sorted(h[2] for h in holders)
        if declared != {len(holders)} or indices != list(range(len(holders))):
            rank, key = holders[0][0], holders[0][1]
            findings.append(
                Finding(
                    "replicas",
                    f"rank {rank} {key!r}: {len(holders)} rank(s) hold these pieces but the specs "
                    f"declare replicas {sorted(declared)} with indices {indices[:8]}",
                    rank=rank,
                )
            )
    warnings = []
    contexts: list = []
    for rule in prog.rules:
        if not isinstance(rule, (TensorRule, FlatRule)) or rule.line in used or getattr(rule, "derived", False):
            continue
        contexts = contexts or [Context.make(prog, lay, r, bound.params) for r in range(lay.world_size)]
        if all(switched_off(rule, ctx) for ctx in contexts):
            continue  # its 'where' turns it off for this layout (e.g. expert rules of a dense model)
        warnings.append(
            Finding(
                "unused-rule",
                f"{prog.where(rule.line)}: rule {rule.local.text!r} matched nothing on any rank of {lay}",
                line=rule.line,
            )
        )
    return CheckReport(
        prog.filename, str(lay), lay.world_size, len(logical), local_count, tuple(findings), tuple(warnings)
    )
