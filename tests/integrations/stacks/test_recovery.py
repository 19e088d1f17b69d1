"""A real failure and its recovery with each checkpointer: ucp and the peers' own paths.

One rank is SIGKILLed after a checkpoint; the job restarts under a smaller layout and its
losses must continue the uninterrupted run's.
"""

from __future__ import annotations

import pytest

from ucp.integrations.stacks.common import TrainSettings
from ucp.integrations.stacks.recovery import FailurePlan, run_with_failure
from ucp.integrations.stacks.transition import reference_run

CASES = [
    ("megatron", "tp=2,pp=2", "dp=3,zero=1", "ucp"),
    ("native", "tp=2,dp=2", "dp=2", "dcp"),
    ("deepspeed", "dp=4,zero=2", "dp=2,zero=2", "deepspeed"),
]


@pytest.mark.slow
@pytest.mark.parametrize("stack,before,after,checkpointer", CASES, ids=[c[3] for c in CASES])
def test_recovers_from_a_killed_rank_on_fewer_ranks(stack, before, after, checkpointer, tmp_path):
    plan = FailurePlan(stack=stack, before=before, after=after, steps=7, save_every=3, kill_after_step=4,
                       kill_rank=2, checkpointer=checkpointer, verify_load=checkpointer == "ucp")
    events: list[dict] = []
    report = run_with_failure(plan, tmp_path / "run", on_event=events.append)
    reference = reference_run("", TrainSettings(), 7)
    assert report.killed_at_step >= 4 and report.resumed_from == 3
    assert sorted(report.losses) == list(range(1, 8))
    for step, loss in report.losses.items():
        assert abs(loss - reference[step - 1]) / reference[step - 1] < 1e-4, (step, loss, reference[step - 1])
    parts = (report.detect_s, report.teardown_s, report.convert_s, report.restart_s, report.load_s,
             report.first_step_s)
    assert all(p >= 0 for p in parts) and abs(sum(parts) - report.recovery_s) < 1e-6
    assert [e["kind"] for e in events if e["kind"] in ("killed", "detected", "restarting", "loaded")] == [
        "killed", "detected", "restarting", "loaded"]
    if checkpointer == "deepspeed":  # ds_to_universal ran between the two runs
        assert report.convert_s > 0 and report.checkpoint.endswith("_universal")
    if checkpointer == "ucp":
        assert report.verified_tensors > 0 and not report.verify_mismatches


def test_plan_refuses_a_checkpointer_that_does_not_run_on_the_stack():
    with pytest.raises(ValueError, match="checkpointer 'dcp' does not run on the megatron stack; it runs on native"):
        FailurePlan(stack="megatron", before="tp=2", after="tp=1", checkpointer="dcp")
    with pytest.raises(ValueError, match=r"kill_after_step \(2\) must be at least save_every \(5\)"):
        FailurePlan(stack="native", before="dp=2", after="dp=1", save_every=5, kill_after_step=2)
    with pytest.raises(ValueError, match="kill_rank 4 is not a rank of dp=2"):
        FailurePlan(stack="native", before="dp=2", after="dp=1", kill_rank=4)


@pytest.mark.slow
def test_a_bf16_restart_is_compared_bit_for_bit(tmp_path):
    # bf16 parameters have no numpy dtype: the load's check compares their bit patterns
    plan = FailurePlan(stack="megatron", before="tp=2,zero=1", after="dp=1,zero=1", steps=5, save_every=3,
                       kill_after_step=3, kill_rank=1, settings=TrainSettings(precision="bf16"), verify_load=True)
    report = run_with_failure(plan, tmp_path / "run")
    assert report.resumed_from == 3 and report.verified_tensors > 0 and not report.verify_mismatches
