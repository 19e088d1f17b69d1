"""What hot recovery does differently per stack: the layout check, and filling the new layout.

:func:`ucp.integrations.stacks.hot.run_hot` is one loop for every stack; the stack names
two things. ``layout_check(stack, model, settings)`` is the planner's constraint (the
layouts the stack's trainer accepts for this model). ``recover(ctx, plan, held)`` runs on
every process of a re-formed generation and returns the rank's trainer, filled with the
newest checkpoint held in memory (None on a rank left idle):

* **megatron** (TP/PP/DP, the distributed optimizer): the new fragment maps come from the
  UCL program, so every process (idle ones too, which may hold replicas) plans and
  reshards in one group; then the training ranks form their own group, build the trainer
  and take the tensors (:meth:`MegatronTrainer.load_tensors`).
* **native** (FSDP2 + DTensor TP): a rank's fragment map is its DTensors' own boxes, which
  exist only once the model is parallelised over a device mesh, and the mesh spans the
  whole default group. So idle processes first hand over the arrays only they hold to a
  training rank (:func:`ucp.replication.hot_reshard.hand_over`) and leave; the training
  ranks form their group, build the model under the new layout (``init=False``: no
  initial weights drawn) and reshard straight into its DTensors' local shards.
* **deepspeed** (ZeRO 1-3, data parallel): the same order, since a DeepSpeed engine also
  spans the default group; the map is the stack's UCL program, and the tensors are copied
  into the new engine's flat partitions. DeepSpeed keeps its groups in module globals, which
  are released first, or the new engine would reuse the old generation's.

The model and optimizer objects are built anew in both: they hold the old generation's
process groups (DTensor's device mesh, FSDP2's and the distributed optimizer's groups),
which died with it, and torch has no call that rebinds a module to new groups. What
survives is everything's bytes: a survivor's own shards come from its own memory.

    check = layout_check("native", "", TrainSettings())
    check(Layout.parse("tp=2"))      # raises for a layout the stack cannot run
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ucp.integrations.stacks.common import STATES, TrainSettings
from ucp.layout import Layout

__all__ = ["HOT_STACKS", "covers", "layout_check", "new_targets", "recover", "uncovered", "without_params"]

HOT_STACKS = ("megatron", "native", "deepspeed")


def layout_check(stack: str, model: str, settings: TrainSettings) -> Callable[[Layout], None]:
    """The planner's constraint: ``check(layout)`` raises when ``stack`` cannot run ``model`` under it."""
    from ucp.integrations.llama.config import LlamaConfig

    cfg = LlamaConfig.parse(model)
    if stack == "megatron":
        from ucp.integrations.megatron.trainer import MegatronTrainer

        def check(layout: Layout) -> None:
            MegatronTrainer._check(cfg, layout, settings)
            if cfg.layers % layout.pp:
                raise ValueError(f"pp={layout.pp} must divide the {cfg.layers} layers")

        return check
    if stack == "native":

        def check(layout: Layout) -> None:  # what NativeTrainer refuses, checked without building it
            if layout.ep > 1 or layout.vpp > 1 or layout.zero:
                raise ValueError(f"the torch-native stack runs tp, pp, dp and cp only, not {layout}")
            if cfg.heads % layout.tp or cfg.kv_heads % layout.tp:
                raise ValueError(f"tp={layout.tp} must divide heads ({cfg.heads}) and kv_heads ({cfg.kv_heads})")
            if cfg.seq_len % layout.cp:
                raise ValueError(f"cp={layout.cp} must divide seq_len ({cfg.seq_len})")
            if settings.global_batch < layout.dp:
                raise ValueError(f"global_batch ({settings.global_batch}) must be at least dp ({layout.dp})")
            if cfg.layers % layout.pp:
                raise ValueError(f"pp={layout.pp} must divide the {cfg.layers} layers")

        return check
    if stack == "deepspeed":

        def check(layout: Layout) -> None:  # what DeepSpeedTrainer refuses: ZeRO data parallelism only
            if layout.world_size != layout.dp or layout.ep > 1 or layout.vpp > 1 or not layout.zero:
                raise ValueError(f"the DeepSpeed stack runs dp=N with ZeRO stage 1, 2 or 3 only, not {layout}")

        return check
    raise ValueError(f"hot recovery runs the {', '.join(HOT_STACKS)} stacks, not {stack!r}")


def recover(ctx, plan, held) -> tuple[Any, str | None]:
    """This process's trainer under the new generation's layout, filled from the newest complete
    checkpoint or snapshot held in memory (``held``: the process's
    :class:`~ucp.integrations.stacks.hot.HeldMemory`; its ``complete``, the paths this process saw
    replicated on every rank), and its path; ``(None, None)`` on a process left idle (it has left
    the group). With ``UCP_HOT_PROFILE=DIR`` in the environment each process writes a cProfile of
    its recovery to ``DIR/recover-g<generation>-uid<uid>.prof`` (a diagnostic; the bench passes it on)."""
    import os

    where = os.environ.get("UCP_HOT_PROFILE")
    if not where:
        return _recover(ctx, plan, held)
    import cProfile

    profile = cProfile.Profile()
    try:
        return profile.runcall(_recover, ctx, plan, held)
    finally:
        os.makedirs(where, exist_ok=True)
        profile.dump_stats(os.path.join(where, f"recover-g{ctx.membership.generation}-uid{ctx.uid}.prof"))


def _recover(ctx, plan, held) -> tuple[Any, str | None]:
    if plan.stack == "native":
        return _build_first(ctx, plan, held, _fill_native)
    if plan.stack == "deepspeed":
        return _recover_deepspeed(ctx, plan, held)
    return _recover_megatron(ctx, plan, held)


def _announce(ctx, trainer, report, seconds: dict, extra: dict | None = None) -> None:
    """Every training rank's reshard summary, to rank 0, which emits ``recovered`` (a collective)."""
    import torch.distributed as dist

    summary = {"elements": report.elements, "peer_bytes": report.received_bytes, "in_place_bytes": report.in_place_bytes,
               "corrupt": list(report.corrupt),
               "path": report.path, "seconds": {"plan": report.plan_s, "transfer": report.transfer_s,
                                                "storage": report.storage_s, **seconds}, **(extra or {})}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, summary)
    if ctx.rank == 0:
        ctx.emit("recovered", t=time.monotonic(), step=trainer.progress.step, position=trainer.progress.position,
                 layout=str(ctx.membership.layout), ranks=everyone)


def _recover_megatron(ctx, plan, held):
    from ucp import ucl
    from ucp.integrations.llama.config import LlamaConfig
    from ucp.integrations.megatron.trainer import MegatronTrainer, megatron_program
    from ucp.integrations.stacks.jobs import build_trainer
    from ucp.replication.hot_reshard import reshard_from_memory
    from ucp.spec import FragmentMap

    m = ctx.membership
    cfg = LlamaConfig.parse(plan.model)
    masters: list[bool] = []

    def make_target(logical: dict):
        if not m.training:
            return FragmentMap(rank=m.rank, logical={}), {}
        masters.append(any(name.endswith("/fp32") for name in logical))
        states = ("fp32", *STATES) if masters[0] else STATES
        fmap = ucl.spec_for_load(held.program(megatron_program(cfg, states)), m.layout, m.rank, logical)
        if MegatronTrainer.params_from_masters(m.layout, plan.settings, masters[0]):
            fmap = without_params(fmap)  # written from the masters after the reshard: moving them is wasted
        return fmap, new_targets(fmap, ucl.local_shapes(fmap))

    began = time.perf_counter()
    tree, into, _, report = reshard_from_memory(held.all_tiers, make_target, round_bytes=plan.round_bytes,
                                                  alone_bytes=plan.alone_bytes,
                                                  complete=held.complete, parsed=held.manifests)
    if m.active < m.world:  # idle ranks leave; the training ones form their own group
        if not m.training:
            ctx.emit("idle", elements=report.elements)
            ctx.leave()
            return None, None
        ctx.form("train", world=m.active)
    resharded = time.perf_counter()
    # the trainer takes the filled tensors as its own parameters, masters and moments (no second
    # allocation, no copy); load_tensors then only copies what it could not take as it is
    trainer = build_trainer("megatron", cfg, m.layout, plan.settings, rank=m.rank, init=False, tensors=into)
    trainer.load_tensors(into, tree, has_masters=masters[0])
    _announce(ctx, trainer, report, {"reshard": resharded - began, "build": time.perf_counter() - resharded})
    return trainer, report.path


def without_params(fmap):
    """``fmap`` without its ``model/...`` tensors (for a trainer that writes its parameters from
    the masters it loads: :meth:`MegatronTrainer.params_from_masters`)."""
    import dataclasses

    keep = {k: v for k, v in fmap.tensors.items() if not k.startswith("model/")}
    return dataclasses.replace(fmap, tensors=keep, local={k: v for k, v in fmap.local.items() if k in keep})


def new_targets(fmap, shapes: dict) -> dict:
    """The local tensors a reshard fills (``shapes``: key -> LocalTensor, padding included), left
    unfilled where the map's pieces cover them (every piece is filled, or the reshard refuses) and
    zeroed only where elements map to nothing (padding): no pass over bytes that are overwritten."""
    import math

    import torch

    out = {}
    for key, local in shapes.items():
        shape = tuple(local.shape)
        gaps = uncovered(fmap.tensors[key].pieces, shape)
        if gaps is None:  # pieces this rule cannot place: the whole tensor zeroed
            out[key] = torch.zeros(shape, dtype=getattr(torch, local.dtype))
            continue
        out[key] = torch.empty(shape, dtype=getattr(torch, local.dtype))
        flat = out[key].view(-1) if math.prod(shape) else out[key]
        for start, stop in gaps:
            flat[start:stop].zero_()
    return out


def covers(pieces, shape: tuple[int, ...]) -> bool:
    """Whether the local regions of ``pieces`` cover every element of a tensor of ``shape``."""
    return uncovered(pieces, shape) == []


def uncovered(pieces, shape: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """The runs of a tensor of ``shape``'s flattening that no local region of ``pieces`` covers
    (flat runs, and boxes of whole rows, which are runs too); None where a piece is a box of
    partial rows (not placed here: the caller zeroes the whole tensor)."""
    import math

    from ucp.geometry import Box

    numel = math.prod(shape)
    row = math.prod(shape[1:])
    runs = []
    for piece in pieces:
        local = piece.local
        if isinstance(local, Box):
            if local.ndim == 0:
                runs.append((0, 1))
            elif tuple(local.offsets[1:]) == (0,) * (len(shape) - 1) and tuple(local.sizes[1:]) == tuple(shape[1:]):
                runs.append((local.offsets[0] * row, (local.offsets[0] + local.sizes[0]) * row))
            else:
                return None
        else:
            runs.append((local.start, local.stop))
    gaps, end = [], 0
    for start, stop in sorted(runs):
        if start > end:
            gaps.append((end, start))
        end = max(end, stop)
    if end < numel:
        gaps.append((end, numel))
    return gaps


def native_target(trainer, logical: dict):
    """The load-direction fragment map of a built :class:`NativeTrainer` and its live local shards
    to fill in place (the map :meth:`NativeTrainer.load` builds; masters taken from ``<name>/fp32``
    where the checkpoint has them)."""
    return trainer.load_target(logical, "the checkpoint held in memory")


def _build_first(ctx, plan, held, fill):
    """Recovery for a stack whose model must exist before its map does (native, DeepSpeed): idle
    processes hand over and leave, the training ranks form their group, build, and reshard;
    ``fill(trainer, logical) -> (fmap, into, finish)``, ``finish(tree)`` takes the tensors in."""
    import torch

    from ucp.integrations.llama.config import LlamaConfig
    from ucp.integrations.stacks.jobs import build_trainer
    from ucp.replication.hot_reshard import hand_over, reshard_from_memory

    m = ctx.membership
    began = time.perf_counter()
    handed = 0
    if m.active < m.world:
        handed = hand_over(held.all_tiers, active=m.active, round_bytes=plan.round_bytes, complete=held.complete)
        if not m.training:
            ctx.emit("idle", handed_bytes=handed)
            ctx.leave()
            return None, None
        ctx.form("train", world=m.active)
    formed = time.perf_counter()
    trainer = build_trainer(plan.stack, LlamaConfig.parse(plan.model), m.layout, plan.settings, rank=m.rank,
                            init=False)
    built = time.perf_counter()
    finish: list = []

    def make_target(logical: dict):
        fmap, into, done = fill(trainer, logical)
        finish.append(done)
        return fmap, into

    with torch.no_grad():
        tree, _, _, report = reshard_from_memory(held.all_tiers, make_target, round_bytes=plan.round_bytes,
                                                 alone_bytes=plan.alone_bytes,
                                                 complete=held.complete, parsed=held.manifests)
        finish[0](tree)
    _announce(ctx, trainer, report, {"hand_over": formed - began, "build": built - formed,
                                     "reshard": time.perf_counter() - built}, {"handed_bytes": handed})
    return trainer, report.path


def _restore_progress(trainer, tree: dict, states) -> None:
    """What a trainer's ``load`` does after its tensors: step, data position, Adam's step, RNG."""
    import torch

    from ucp.integrations.stacks.common import Progress

    trainer.progress = Progress.from_tree(tree)
    for state in states:
        state["step"] = torch.tensor(float(trainer.progress.step))
    Progress.restore_rng(tree, rank=trainer.rank, seed=trainer.settings.data_seed)


def _fill_native(trainer, logical: dict):
    fmap, into = native_target(trainer, logical)  # the live shards: filled in place
    return fmap, into, lambda tree: _restore_progress(trainer, tree, trainer.optimizer.state.values())


def _fill_deepspeed(trainer, logical: dict):
    """DeepSpeedTrainer's own load split in two: its map over the held checkpoint, then its copies
    into the engine's partitions (fp32 masters never rebuilt from bf16 parameters)."""
    fmap, into = trainer.load_target(logical, "the checkpoint held in memory")
    return fmap, into, lambda tree: trainer.load_tensors(into, tree)


def _recover_deepspeed(ctx, plan, held):
    from ucp.integrations.deepspeed.trainer import import_deepspeed

    import_deepspeed()
    from deepspeed.utils import groups

    # DeepSpeed keeps the groups it made in module globals (deepspeed.utils.groups); a new engine
    # would reuse the old generation's, now destroyed ("Group ... is not registered"). Its own
    # destroy_process_group releases them; the elastic context destroyed torch's groups directly.
    groups._release_process_group_references(None)
    return _build_first(ctx, plan, held, _fill_deepspeed)
