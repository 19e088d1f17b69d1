"""The end-to-end demo behind ``ucp demo``: a real failure, a layout change, an unbroken loss curve.

1. Train the Llama-style decoder (:mod:`ucp.integrations.llama`) Megatron style on 8
   gloo processes as ``tp=2,pp=2,dp=2`` with the distributed optimizer,
   checkpointing through ucp every few steps (the megatron-gpt UCL preset maps
   every rank's shards onto whole tensors).
2. SIGKILL one rank mid-run; the agent notices, stops the others.
3. Restart on 6 processes as ``tp=2,dp=3``: each rank reads only its shards of
   the last committed checkpoint, which is checked bit for bit against the
   checkpoint's logical tensors, and training goes on.
4. Report the loss before and after next to an uninterrupted single-process run,
   checkpoint size, save time, time lost to the failure, recovery time and the
   run's ETTR, and draw both loss curves into a PNG.
5. The same failure recovered hot (``hot=True``): the survivors never restart; they
   re-form their process group in-process and reshard the checkpoint from the copies
   held in their memory into ``tp=2,dp=3`` (:mod:`ucp.integrations.stacks.hot`); the
   recovery split is shown next to the restart path's, every tensor checked bit for bit.

    report = run_demo("ucp-demo-out")
    report.recovery.recovery_s, report.max_relative_error, report.plot
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ucp.integrations.launch import start_fork_server
from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.stacks.common import TrainSettings
from ucp.integrations.stacks.recovery import FailurePlan, RecoveryReport, run_with_failure
from ucp.integrations.stacks.transition import reference_run
from ucp.errors import UcpError
from ucp.layout import Layout

STACK = "megatron"
FIRST_LAYOUT, SECOND_LAYOUT = "tp=2,pp=2,dp=2,zero=1", "tp=2,dp=3,zero=1"
PLOT_NAME = "loss_curves.png"
LOSS_TOLERANCE = 1e-4  # relative, per step: what the transition tests hold every layout change to


class DemoCheckFailed(UcpError, RuntimeError):
    """The checkpoint failed ``ucp verify``, or the resumed ranks' tensors are not the checkpoint's."""


@dataclass
class DemoReport:
    """What the demo did and measured (durations in seconds)."""

    directory: str
    recovery: RecoveryReport
    reference: list[float] = field(default_factory=list)
    ettr: object = None  # reliability.ettr.tracker.ETTRSummary
    plot: str | None = None
    verified: bool = False
    hot: object = None  # integrations.stacks.hot.HotReport

    @property
    def hot_relative_error(self) -> float:
        return max(abs(loss - self.reference[s - 1]) / self.reference[s - 1] for s, loss in self.hot.losses.items())

    @property
    def relative_errors(self) -> dict[int, float]:
        return {s: abs(loss - self.reference[s - 1]) / self.reference[s - 1]
                for s, loss in {**self.recovery.first_losses, **self.recovery.losses}.items()}

    @property
    def max_relative_error(self) -> float:
        return max(self.relative_errors.values())

    @property
    def mean_save_s(self) -> float:
        saves = self.recovery.saves
        return sum(s["seconds"] for s in saves) / len(saves)

    @property
    def time_lost_s(self) -> float:
        """Compute redone (since the checkpoint) plus the recovery itself."""
        return self.recovery.lost_compute_s + self.recovery.recovery_s

    def to_dict(self) -> dict:
        r = self.recovery
        return {
            "directory": self.directory, "stack": r.plan.stack, "first_layout": r.plan.before,
            "second_layout": r.plan.after, "killed_rank": r.plan.kill_rank, "killed_at_step": r.killed_at_step,
            "resumed_from_step": r.resumed_from, "final_step": r.final_step,
            "losses": {str(s): v for s, v in r.losses.items()},
            "first_run_losses": {str(s): v for s, v in r.first_losses.items()},
            "reference": self.reference, "max_relative_error": self.max_relative_error,
            "verified_tensors": r.verified_tensors, "verify_mismatches": r.verify_mismatches,
            "checkpoint_bytes": r.checkpoint_bytes, "mean_save_s": self.mean_save_s,
            "time_lost_s": self.time_lost_s, "lost_compute_s": r.lost_compute_s,
            "recovery_s": r.recovery_s, "recovery_parts_s": {k: getattr(r, k) for k in (
                "detect_s", "teardown_s", "convert_s", "restart_s", "load_s", "first_step_s")},
            "ettr": self.ettr.to_dict() if self.ettr is not None else None, "plot": self.plot,
            "hot": None if self.hot is None else {
                "layout_after": self.hot.layout_after, "why": self.hot.why, "recovery_s": self.hot.recovery_s,
                "recovery_parts_s": {k: getattr(self.hot, k) for k in ("detect_s", "reform_s", "reshard_s")},
                "first_step_s": self.hot.first_step_s, "lost_steps": self.hot.lost_steps,
                "bitwise": self.hot.bitwise, "elements": self.hot.elements,
                "max_relative_error": self.hot_relative_error},
        }


def plot_losses(report: DemoReport, path: str) -> str:
    """Both loss curves overlaid: the uninterrupted reference and the run that failed and resumed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = report.recovery
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    steps = range(1, len(report.reference) + 1)
    ax.plot(steps, report.reference, color="0.25", lw=2.5, alpha=0.45, label="uninterrupted reference (1 process)")
    before = sorted(r.first_losses)
    ax.plot(before, [r.first_losses[s] for s in before], "o", ms=4, color="tab:blue",
            label=f"{r.plan.before} ({len(before)} steps, {Layout.parse(r.plan.before).world_size} processes)")
    after = sorted(s for s in r.losses if s > r.resumed_from)
    ax.plot(after, [r.losses[s] for s in after], "s", ms=4, mfc="none", color="tab:orange",
            label=f"resumed as {r.plan.after} ({Layout.parse(r.plan.after).world_size} processes)")
    ax.axvline(r.killed_at_step + 0.5, color="tab:red", ls="--", lw=1)
    ax.annotate(f"SIGKILL rank {r.plan.kill_rank}", (r.killed_at_step + 0.5, max(report.reference)),
                color="tab:red", fontsize=8, ha="left", va="top", xytext=(3, 0), textcoords="offset points")
    ax.axvline(r.resumed_from, color="tab:green", ls=":", lw=1)
    ax.annotate(f"checkpoint {r.resumed_from}", (r.resumed_from, min(report.reference)), color="tab:green",
                fontsize=8, ha="right", va="bottom", xytext=(-3, 0), textcoords="offset points")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"Llama-style decoder: failure at step {r.killed_at_step}, resumed from step {r.resumed_from} "
                 f"on another layout (max deviation {report.max_relative_error:.1e})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _progress(say):
    def show(event: dict) -> None:
        kind = event["kind"]
        if kind == "step" and (event["step"] % 5 == 0 or event["step"] == 1):
            say(f"  step {event['step']:3d}  loss {event['loss']:.4f}  ({event['seconds'] * 1000:.0f} ms)")
        elif kind == "saved":
            say(f"  step {event['step']:3d}  checkpoint committed in {event['seconds']:.2f}s "
                "(every rank wrote only its own shards)")
        elif kind == "killed":
            say(f"  step {event['step']:3d}  SIGKILL -> rank {event['rank']}  (an unannounced failure)")
        elif kind == "detected" and "uids" in event:
            say("  the agent saw the process die; the survivors' collectives fail and they wait for a new generation")
        elif kind == "detected":
            say("  the agent saw the rank die; stopping the survivors (they are stuck in a collective)")
        elif kind == "restarting":
            say(f"2. restarting on fewer ranks as {event['layout']} from checkpoint step {event['step']}")
        elif kind == "loaded":
            say(f"  every rank loaded its shards of step {event['step']} (resharded from the 8-rank layout)")
        elif kind == "reformed":
            say(f"  the agent published generation {event['generation']}: {event['layout']} ({event['why']})")
        elif kind == "recovered":
            say(f"  the survivors resharded step {event['step']} from memory into {event['layout']}, no restart")
        elif kind == "verified":
            verdict = "all bit-exact" if not event["mismatches"] else f"MISMATCHES: {event['mismatches'][:5]}"
            say(f"  checked {event['tensors']} logical tensors (parameters, fp32 masters, Adam moments) "
                f"against the checkpoint: {verdict}")
    return show


def run_demo(directory: str | os.PathLike, *, say=print, steps: int = 40, save_every: int = 5,
             kill_after_step: int = 22, model: str = "", plot: bool = True, hot: bool = True) -> DemoReport:
    """Run the whole demo in ``directory`` (emptied first); see the module doc."""
    import ucp
    from ucp.reliability.ettr.tracker import ETTRTracker

    directory = os.fspath(directory)
    settings = TrainSettings()
    cfg = LlamaConfig.parse(model)
    plan = FailurePlan(stack=STACK, before=FIRST_LAYOUT, after=SECOND_LAYOUT, model=model, settings=settings,
                       steps=steps, save_every=save_every, kill_after_step=kill_after_step, kill_rank=5,
                       verify_load=True, keep_last=None)
    start_fork_server()
    say(f"1. training a Llama-style decoder (GQA, RoPE, SwiGLU; {cfg.layers} layers) Megatron style on 8 "
        f"processes as {FIRST_LAYOUT}; ucp checkpoint every {save_every} steps, mapped by the megatron-gpt "
        f"UCL preset; a failure kills rank {plan.kill_rank} after step {kill_after_step}")
    recovery = run_with_failure(plan, directory, on_event=_progress(say))
    say("3. the uninterrupted reference: the same steps on one process, never stopped")
    report = DemoReport(directory, recovery, reference=reference_run(model, settings, steps))
    report.verified = recovery.verified_tensors > 0 and not recovery.verify_mismatches
    checked = ucp.verify(recovery.checkpoint)
    if not checked.ok or not report.verified:
        raise DemoCheckFailed(f"checkpoint {recovery.checkpoint} failed verification: {checked} "
                              f"{recovery.verify_mismatches[:5]}")
    report.ettr = ETTRTracker(directory).summary()
    if hot:
        report.hot = _run_hot(directory, say, model, settings, save_every, steps)
        if not report.hot.bitwise or report.hot_relative_error >= LOSS_TOLERANCE:
            raise DemoCheckFailed(f"hot recovery: tensors {report.hot.mismatches[:5] or 'equal'}, RNG "
                                  f"{'restored' if report.hot.rng_ok else 'NOT restored'}, loss deviation "
                                  f"{report.hot_relative_error:.1e}")
    if plot:
        report.plot = plot_losses(report, os.path.join(directory, PLOT_NAME))
    for line in summary_lines(report):
        say(line)
    if report.max_relative_error >= LOSS_TOLERANCE:  # the table above shows where the curves part
        step = max(report.relative_errors, key=report.relative_errors.get)
        raise DemoCheckFailed(f"the run's loss left the uninterrupted reference: {report.max_relative_error:.1e} "
                              f"relative at step {step} (tolerance {LOSS_TOLERANCE:.0e})")
    return report


def _run_hot(directory: str, say, model: str, settings: TrainSettings, save_every: int, steps: int):
    """The same failure, recovered without a restart (a short run: the kill comes a step after the
    first checkpoint, and training stops three steps later)."""
    from ucp.integrations.stacks.hot import HotPlan, run_hot

    kill_after = save_every + 1
    plan = HotPlan(layout=FIRST_LAYOUT, model=model, settings=settings, steps=min(steps, kill_after + 3),
                   save_every=save_every, kill_after_step=kill_after, kill_uid=5, override=SECOND_LAYOUT)
    say(f"4. the same failure, recovered hot: 8 processes as {FIRST_LAYOUT}, checkpoint arrays replicated into "
        f"peers' memory; SIGKILL of rank 5 after step {kill_after}; the survivors stay up")
    return run_hot(plan, os.path.join(directory, "hot"), on_event=_progress(say))


def _shown(path: str) -> str:
    """A path as the user would type it: relative when under the working directory."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def summary_lines(report: DemoReport) -> list[str]:
    """The report as a table (rich renders it; plain text when captured)."""
    from rich.console import Console
    from rich.table import Table

    r = report.recovery
    losses = r.losses
    ref = report.reference
    around = [s for s in range(r.resumed_from - 1, min(r.killed_at_step + 3, r.final_step) + 1) if s >= 1]
    curve = Table(title="loss around the failure (the run vs the uninterrupted reference)")
    for column in ("step", f"before: {r.plan.before}", f"after: {r.plan.after}", "reference", "rel. diff"):
        curve.add_column(column, justify="right")
    for s in around:
        first = r.first_losses.get(s)
        second = losses.get(s) if s > r.resumed_from else None
        shown = second if second is not None else first
        curve.add_row(str(s), "" if first is None else f"{first:.6f}", "" if second is None else f"{second:.6f}",
                      f"{ref[s - 1]:.6f}", f"{abs(shown - ref[s - 1]) / ref[s - 1]:.1e}")
    curve.add_row(str(r.final_step), "", f"{losses[r.final_step]:.6f}", f"{ref[r.final_step - 1]:.6f}",
                  f"{report.relative_errors[r.final_step]:.1e}")
    facts = Table(title="what the failure cost")
    facts.add_column("measure")
    facts.add_column("value", justify="right")
    redone = r.killed_at_step - r.resumed_from
    facts.add_row("largest loss deviation from the reference, any step", f"{report.max_relative_error:.1e} (relative)")
    facts.add_row("checkpoint size (one step)", f"{r.checkpoint_bytes / 2**20:.2f} MiB")
    facts.add_row("save time (mean, blocking)", f"{report.mean_save_s:.2f} s over {len(r.saves)} saves")
    facts.add_row("time lost to the failure", f"{report.time_lost_s:.2f} s ({r.lost_compute_s:.2f} s of compute "
                  f"redone: {redone} steps; {r.recovery_s:.2f} s recovery)")
    facts.add_row("recovery time (SIGKILL -> first step done)",
                  f"{r.recovery_s:.2f} s = detect {r.detect_s:.2f} + teardown {r.teardown_s:.2f} + restart "
                  f"{r.restart_s:.2f} + load {r.load_s:.2f} + first step {r.first_step_s:.2f}")
    facts.add_row("ETTR of the run (toy steps of ~0.1 s: start-up and saves dominate)", str(report.ettr))
    if report.hot is not None:
        h = report.hot
        facts.add_row("recovery, restart path (SIGKILL -> first step starts)",
                      f"{r.recovery_s - r.first_step_s:.2f} s = detect {r.detect_s:.2f} + teardown {r.teardown_s:.2f} "
                      f"+ restart {r.restart_s:.2f} + load {r.load_s:.2f}")
        facts.add_row("recovery, hot: no restart (SIGKILL -> first step starts)",
                      f"{h.recovery_s:.2f} s = detect {h.detect_s:.2f} + re-form {h.reform_s:.2f} + reshard "
                      f"from memory {h.reshard_s:.2f}")
        facts.add_row("hot recovery's new state came from",
                      f"own memory {h.elements['own']}, peers {h.elements['peer']}, storage {h.elements['storage']} "
                      f"elements; every tensor {'bit-exact' if h.bitwise else 'NOT bit-exact'}; "
                      f"loss deviation {report.hot_relative_error:.1e}")
    console = Console(width=120, force_terminal=False)
    with console.capture() as captured:
        console.print(curve)
        console.print(facts)
    text = captured.get()
    cfg = LlamaConfig.parse(r.plan.model)
    check = (f"   next: ucp inspect {_shown(r.checkpoint)} ; ucp ucl check megatron-gpt "
             f"--layout tp=4,pp=4,dp=2,zero=1 --against {_shown(r.checkpoint)} "
             f"--param {cfg.megatron_program().split(':', 1)[1]}")
    plot = [f"   the two loss curves, overlaid: {_shown(report.plot)}"] if report.plot else []
    return [*text.rstrip("\n").split("\n"), *plot, check]


__all__ = ["run_demo", "DemoReport", "DemoCheckFailed", "plot_losses", "summary_lines", "FIRST_LAYOUT",
           "SECOND_LAYOUT", "PLOT_NAME"]
