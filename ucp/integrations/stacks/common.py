"""What every reference trainer shares: settings, the checkpoint's non-tensor state, snapshots.

**The checkpoint schema.** Whatever the stack, a checkpoint holds the logical
tensors of :mod:`ucp.integrations.llama.model` (``<name>``, the parameters in their
training dtype), their Adam moments ``<name>/exp_avg`` and ``<name>/exp_avg_sq``
and, where a stack keeps them apart from the parameters, the fp32 master weights
``<name>/fp32`` (the names every ucp format uses). Where masters and parameters
are the same tensors (fp32 training without a distributed optimizer) there is no
``/fp32`` entry, and a loader takes the master from ``<name>``
(:func:`master_name`).

**Mixed precision.** ``TrainSettings(precision="bf16")`` trains with bf16 parameters
and fp32 masters on every stack; its checkpoints hold ``<name>`` as bfloat16 (the
parameter the model computes with, always ``master.to(bfloat16)``) and
``<name>/fp32`` as float32. A load takes masters only from a float32 source
(``<name>/fp32``, or ``<name>`` of an fp32 run) and refuses a checkpoint that has
bf16 parameters but no masters (:class:`MissingMastersError`): rebuilding masters
from bf16 values would lose precision silently. The JSON tree holds the step (Adam's step count equals
it: every parameter steps every step), the data position, each rank's RNG state
and what the run was.

Example::

    >>> progress = Progress(step=3, position=24)
    >>> Progress.from_tree(progress.to_tree(rank=0, run={"stack": "native"})).position
    24
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Any

import torch

from ucp.errors import UcpError
from ucp.geometry import Box

__all__ = ["TrainSettings", "Progress", "STATES", "PRECISIONS", "MissingMastersError", "master_name",
           "check_masters", "assemble", "make_adam", "global_tokens",
           "global_loss", "gather_to_rank0", "fresh_adam_state"]

STATES = ("exp_avg", "exp_avg_sq")  # Adam's moments; "fp32" is added where masters are separate
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}  # TrainSettings.precision -> parameter dtype


class MissingMastersError(UcpError, ValueError):
    """A checkpoint has low-precision parameters but not the fp32 masters a load needs."""


@dataclass(frozen=True)
class TrainSettings:
    """Optimiser and data settings, identical across layouts so runs can be compared step by step.

    ``global_batch`` samples of ``seq_len + 1`` tokens per step, whatever dp is;
    ``microbatches`` per step for pipeline schedules (capped by the local batch).
    ``precision``: ``"fp32"``, or ``"bf16"`` for bf16 parameters and gradients with fp32 master
    weights and fp32 Adam moments (every stack starts from the logical initial weights rounded
    to bf16, as Megatron's masters are copies of its bf16 parameters).

        >>> TrainSettings(precision="bf16").param_dtype
        torch.bfloat16
    """

    global_batch: int = 8
    lr: float = 1e-2
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    data_seed: int = 0
    microbatches: int = 2
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            from ucp.integrations.llama.config import ConfigError

            raise ConfigError(f"unknown precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype the model's parameters (and gradients) are held in."""
        return PRECISIONS[self.precision]

    @property
    def mixed(self) -> bool:
        """Whether fp32 masters are kept apart from lower-precision parameters."""
        return self.param_dtype != torch.float32

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def make_adam(params, settings: TrainSettings) -> torch.optim.Adam:
    """The optimiser every stack uses (single-tensor code path: the same arithmetic everywhere)."""
    return torch.optim.Adam(params, lr=settings.lr, betas=(settings.beta1, settings.beta2), eps=settings.eps,
                            foreach=False)


def fresh_adam_state(tensor: torch.Tensor) -> dict:
    """Adam's state for ``tensor`` before its first step, as torch creates it. Trainers create it up
    front, so a step-0 checkpoint has moments to save and a load has tensors to fill."""
    return {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(tensor), "exp_avg_sq": torch.zeros_like(tensor)}


def global_tokens(settings: TrainSettings, seq_len: int) -> int:
    """Tokens whose losses are averaged each step: every rank divides its loss sum by this."""
    return settings.global_batch * seq_len


def master_name(name: str, logical: dict) -> str:
    """Where the fp32 master of parameter ``name`` lives in a checkpoint with tensors ``logical``."""
    return f"{name}/fp32" if f"{name}/fp32" in logical else name


def check_masters(path: str, logical: dict, names) -> None:
    """Refuse a load whose fp32 masters would have to be rebuilt from lower-precision parameters.

    ``logical``: the checkpoint's logical tensors (name -> LogicalTensor); ``names``: the
    parameters the loading rank needs masters of. A master comes from ``<name>/fp32`` or, for a
    checkpoint of an fp32 run, from ``<name>`` itself; it must be float32 either way.
    """
    bad = sorted(n for n in names if n in logical and logical[master_name(n, logical)].dtype != "float32")
    if bad:
        source = logical[master_name(bad[0], logical)]
        raise MissingMastersError(
            f"checkpoint {path} holds {source.name!r} as {source.dtype} and no fp32 master {bad[0] + '/fp32'!r} "
            f"({len(bad)} parameter(s) like it): rebuilding fp32 masters from {source.dtype} values would lose "
            "precision; load a checkpoint saved with its masters (every ucp trainer saves them in bf16 mode)")


def _rng_text() -> str:
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()


def _set_rng(text: str) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8))


@dataclass(frozen=True)
class Progress:
    """The non-tensor training state: step and data position (samples consumed)."""

    step: int = 0
    position: int = 0

    def to_tree(self, *, rank: int, run: dict) -> dict:
        """The JSON saved beside the tensors (each rank's own RNG state included)."""
        return {"step": self.step, "data": {"position": self.position}, "rng": {"rank": rank, "torch": _rng_text()},
                "run": dict(run)}

    @classmethod
    def from_tree(cls, tree: dict) -> "Progress":
        return cls(step=int(tree["step"]), position=int(tree["data"]["position"]))

    @staticmethod
    def restore_rng(tree: dict, *, rank: int, seed: int) -> None:
        """This rank's saved RNG state; a rank the saved layout did not have gets a fresh,
        deterministic one (``seed + rank + step``) instead of a copy of another rank's stream."""
        rng = tree.get("rng") or {}
        if rng.get("rank") == rank and "torch" in rng:
            _set_rng(rng["torch"])
        else:
            torch.manual_seed(seed + rank + int(tree.get("step", 0)))


def assemble(pieces: list[tuple[str, Box, torch.Tensor]], shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """Whole tensors from ``(name, box, block)`` pieces (from every rank); refuses holes and disagreements.

    ``shapes``: name -> (shape, dtype).
    """
    out = {name: torch.full(shape, math.nan, dtype=dtype) for name, (shape, dtype) in shapes.items()}
    filled = {name: torch.zeros(shape, dtype=torch.bool) for name, (shape, _) in shapes.items()}
    for name, box, block in pieces:
        view = out[name][box.slices()] if box.ndim else out[name]
        seen = filled[name][box.slices()] if box.ndim else filled[name]
        if bool(seen.any()) and not torch.equal(view[seen], block.reshape(view.shape)[seen]):
            raise AssertionError(f"replicas of {name} {box} disagree")
        view.copy_(block.reshape(view.shape))
        seen.fill_(True)
    holes = [name for name, mask in filled.items() if not bool(mask.all())]
    if holes:
        raise AssertionError(f"no rank holds all of {holes[:5]}")
    return out


def global_loss(local: torch.Tensor | None) -> float:
    """The step's loss on every rank: the sum of the ranks' ``local`` loss sums (already divided by
    the global token count). Ranks whose loss repeats another's (tp > 1, earlier pipeline stages)
    pass None. Summed in float64, so the value does not depend on the number of ranks' order."""
    import torch.distributed as dist

    total = torch.zeros(1, dtype=torch.float64)
    if local is not None:
        total += local.detach().double().reshape(1)
    dist.all_reduce(total)
    return float(total)


def gather_to_rank0(obj: Any) -> list | None:
    """``obj`` of every rank, on rank 0 (None elsewhere)."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


class CheckpointSaving:
    """``save(path)`` for a trainer whose ``checkpoint_state()`` gives ``(state, ucp.save options)``."""

    def save(self, path: str):
        import ucp

        state, options = self.checkpoint_state()
        return ucp.save(state, path, **options)


def _repoint(fmap, logical: dict, source_of):
    """``fmap`` with each piece reading logical tensor ``source_of(name)`` of ``logical`` instead
    (a local tensor whose pieces all move takes that tensor's dtype)."""
    import dataclasses

    tensors, local = {}, dict(fmap.local)
    for key, spec in fmap.tensors.items():
        pieces = tuple(dataclasses.replace(p, logical=source_of(p.logical)) for p in spec.pieces)
        tensors[key] = dataclasses.replace(spec, pieces=pieces)
        dtypes = {logical[p.logical].dtype for p in pieces}
        if pieces != spec.pieces and len(dtypes) == 1 and key in local:
            local[key] = dataclasses.replace(local[key], dtype=dtypes.pop())
    used = {p.logical for t in tensors.values() for p in t.pieces}
    return dataclasses.replace(fmap, tensors=tensors, local=local,
                               logical={n: t for n, t in logical.items() if n in used})


def plan_program_load(path: str, program_for, layout, rank: int, *, masters: bool = False,
                      params_are_masters: bool = False) -> tuple[bool, Any, dict[str, torch.Tensor]]:
    """Plan a UCL load of a checkpoint of any stack into one rank of ``layout``.

    Returns whether the local tensors hold fp32 masters (``optim/fp32/...``), the rank's
    fragment map from ``program_for(states)``, and zeroed local tensors to load into.
    ``masters``: the target keeps fp32 masters apart from its parameters; from a checkpoint of
    an fp32 run (no ``/fp32`` entries) they are then read, bit for bit, from its fp32
    parameters, never rebuilt from the target's own (maybe bf16) parameters.
    ``params_are_masters``: the target trains in fp32, so its parameters are read from the
    checkpoint's masters where it has them (a bf16 run's ``<name>`` is only their rounding).
    A checkpoint whose parameters are below fp32 and that has no masters is refused
    (:class:`MissingMastersError`). Reads only the checkpoint's root metadata to decide.
    """
    from ucp.reader import CheckpointReader

    with CheckpointReader(path) as reader:
        logical = reader.logical()
    return plan_logical_load(logical, path, program_for, layout, rank, masters=masters,
                             params_are_masters=params_are_masters)


def plan_logical_load(logical: dict, where: str, program_for, layout, rank: int, *, masters: bool = False,
                      params_are_masters: bool = False) -> tuple[bool, Any, dict[str, torch.Tensor]]:
    """:func:`plan_program_load` over a checkpoint's logical tensors already at hand (``where``
    names them in errors), e.g. a checkpoint held in peers' memory."""
    import dataclasses

    from ucp import ucl

    path = where
    has_masters = any(name.endswith("/fp32") for name in logical)
    alias = masters and not has_masters  # an fp32 run's parameters stand in for its masters
    source = dict(logical)
    if alias:
        source.update({f"{n}/fp32": dataclasses.replace(t, name=f"{n}/fp32") for n, t in logical.items()
                       if "/" not in n})
    states = ("fp32", *STATES) if has_masters or alias else STATES
    fmap = ucl.spec_for_load(program_for(states), layout, rank, source)
    check_masters(path, logical, {p.logical.removesuffix("/fp32") for spec in fmap.tensors.values()
                                  for p in spec.pieces if "/" not in p.logical.removesuffix("/fp32")})
    if alias:
        fmap = _repoint(fmap, logical, lambda n: n if n in logical else n.removesuffix("/fp32"))
    elif params_are_masters and has_masters:
        fmap = _repoint(fmap, logical, lambda n: master_name(n, logical) if "/" not in n else n)
    into = {k: torch.zeros(t.shape, dtype=getattr(torch, t.dtype)) for k, t in ucl.local_shapes(fmap).items()}
    return has_masters or alias, fmap, into
