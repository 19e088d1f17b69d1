"""A layout change, proven: train under A, save, resume under B, compare with an uninterrupted run.

:func:`run_transition` trains ``steps_before`` steps under layout A (any stack),
saves a universal checkpoint, resumes it under layout B (any stack) and trains
``steps_after`` more steps (``native_deepspeed``: A saves DeepSpeed's own checkpoint, which
ucp's DeepSpeed reader turns into a universal one first). It returns every step's loss next to the
single-process reference run's, and checks the checkpoint bit for bit: the
logical tensors A held when it saved equal the checkpoint's, the ones B holds
right after the load equal A's, and rank 0's RNG state after the load is the one it saved.

    result = run_transition(Transition("tp 2->4", ("megatron", "tp=2,dp=2"), ("megatron", "tp=4")), "/tmp/t")
    assert result.worst_relative < 1e-4 and not result.mismatches
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ucp.integrations.launch import WITH_DEEPSPEED, run
from ucp.integrations.stacks.common import TrainSettings
from ucp.integrations.stacks.jobs import Job, run_job

__all__ = ["Transition", "TransitionResult", "run_transition", "compare_snapshots", "reference_run"]


@dataclass(frozen=True)
class Transition:
    """``before``/``after``: ``(stack, layout)``; ``model``: a LlamaConfig string."""

    name: str
    before: tuple[str, str]
    after: tuple[str, str]
    model: str = ""
    steps_before: int = 3
    steps_after: int = 10
    native_deepspeed: bool = False  # A saves a native DeepSpeed checkpoint; ucp's reader converts it
    precision: str = "fp32"  # TrainSettings.precision of both runs and of the reference

    def __str__(self) -> str:
        return f"{self.name}: {self.before[0]} {self.before[1]} -> {self.after[0]} {self.after[1]} ({self.precision})"


@dataclass
class TransitionResult:
    transition: Transition
    reference: list[float]
    losses: dict[int, float]
    saved_tensors: int = 0
    loaded_tensors: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def relative_errors(self) -> dict[int, float]:
        return {s: abs(loss - self.reference[s - 1]) / abs(self.reference[s - 1]) for s, loss in self.losses.items()}

    @property
    def worst_relative(self) -> float:
        return max(self.relative_errors.values())


def _reference(ctx, model: str, settings: TrainSettings, steps: int) -> list[float]:
    from ucp.integrations.llama.config import LlamaConfig
    from ucp.integrations.llama.reference import reference_losses

    return reference_losses(LlamaConfig.parse(model), settings, steps=steps)


def reference_run(model: str, settings: TrainSettings, steps: int, *, preload=WITH_DEEPSPEED) -> list[float]:
    """The uninterrupted single-process run's losses (in a worker: one thread, like the ranks)."""
    return run(_reference, world=1, args=(model, settings, steps), preload=preload)


def _expected(name: str, saved: dict) -> str | None:
    """Which saved tensor a loaded one must equal: itself, or the parameter for a master that the
    saving stack did not keep apart (fp32 training: the parameters are the masters)."""
    if name in saved:
        return name
    if name.endswith("/fp32") and name[: -len("/fp32")] in saved:
        return name[: -len("/fp32")]
    return None


def compare_snapshots(saved: dict[str, np.ndarray], loaded: dict[str, np.ndarray]) -> list[str]:
    """Names whose loaded tensor is not bitwise the saved one (or has nothing to be compared with)."""
    bad = []
    for name, tensor in sorted(loaded.items()):
        source = _expected(name, saved)
        if source is None or saved[source].shape != tensor.shape or not np.array_equal(
                saved[source].view(np.uint8), tensor.view(np.uint8)):
            bad.append(name)
    return bad


def run_transition(t: Transition, directory: str | os.PathLike, *, settings: TrainSettings = TrainSettings(),
                   reference: list[float] | None = None, preload=WITH_DEEPSPEED) -> TransitionResult:
    """Run ``t`` in ``directory`` (see the module doc). ``reference`` reuses a reference run;
    ``settings.precision`` is replaced by the transition's."""
    import dataclasses

    import ucp

    settings = dataclasses.replace(settings, precision=t.precision)
    path = os.path.join(os.fspath(directory), f"step_{t.steps_before:08d}")
    total = t.steps_before + t.steps_after
    if reference is None:
        reference = reference_run(t.model, settings, total, preload=preload)
    saved_to = path
    if t.native_deepspeed:
        saved_to = os.path.join(os.fspath(directory), "native", f"step_{t.steps_before:08d}")
    first = Job(t.before[0], t.before[1], t.model, settings, until_step=t.steps_before, save_to=saved_to,
                snapshots=True, native_save=t.native_deepspeed)
    a = run(run_job, world=first.world, args=(first,), preload=preload)
    if t.native_deepspeed:
        from ucp.integrations.deepspeed.native import to_ucp

        to_ucp(saved_to, path)
    second = Job(t.after[0], t.after[1], t.model, settings, until_step=total, resume_from=path, snapshots=True)
    b = run(run_job, world=second.world, args=(second,), preload=preload)
    result = TransitionResult(t, reference[:total], {**a["losses"], **b["losses"]},
                              saved_tensors=len(a["saved"]), loaded_tensors=len(b["loaded"]))
    from ucp.dtypes import to_numpy

    in_checkpoint = {name: to_numpy(ucp.read_tensor(path, name)) for name in a["saved"]}
    result.mismatches = [f"saved {n}" for n in compare_snapshots(in_checkpoint, a["saved"])]
    result.mismatches += [f"loaded {n}" for n in compare_snapshots(a["saved"], b["loaded"])]
    if b["start_step"] != t.steps_before:
        result.mismatches.append(f"resumed at step {b['start_step']}, saved at {t.steps_before}")
    # rank 0 exists in every layout: its RNG stream goes on where it stopped (a native DeepSpeed
    # checkpoint records no torch RNG state, so there the resumed rank starts a fresh stream)
    if not t.native_deepspeed and b["rng_loaded"] != a["rng_saved"]:
        result.mismatches.append(f"rank 0's RNG state: saved {a['rng_saved']}, restored {b['rng_loaded']}")
    return result
