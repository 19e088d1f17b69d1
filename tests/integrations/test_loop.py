"""TrainingSession: a real training subprocess, SIGKILLed and restarted, resumes exactly."""

from __future__ import annotations

import pytest
import torch

from ucp.integrations.loop import TrainingSession
from ucp.reliability.ettr.adaptive import AdaptiveIntervalPolicy
from ucp.reliability.ettr.tracker import ETTRTracker
from ucp.api import load
from ucp.policies import EveryNSteps

# one worker runs this module, so its module-scoped fixture is built once (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("loop")


@pytest.fixture(scope="module")
def uninterrupted_final(tmp_path_factory, jobs):
    """The final state of a run that never crashed (how it saves does not change it)."""
    directory = tmp_path_factory.mktemp("reference")
    jobs.run("tiny_loop_job.py", str(directory), "30")
    return load(directory / "final")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkilled_run_resumes_from_last_committed_step_identically(
    tmp_path, jobs, same_state, committed, uninterrupted_final, mode
):
    extra = ["--async-save"] if mode == "async" else []
    crashed = tmp_path / "crashed"

    jobs.run_until("tiny_loop_job.py", str(crashed), "30", "--sleep", "0.02", *extra, line="step 17")
    last = committed(crashed)[-1]
    assert last in (10, 15)  # 15 unless the kill beat an async commit

    out = jobs.run("tiny_loop_job.py", str(crashed), "30", *extra)
    assert f"resumed {last}" in out
    # Same final model, optimizer, scheduler and RNG as the run that never crashed.
    same_state(uninterrupted_final, load(crashed / "final"))

    summary = ETTRTracker(crashed).summary()
    assert summary.restarts == 1
    # "step 17" is printed before the session records it: 16 is surely recorded.
    assert summary.lost_steps >= 16 - last and summary.lost_s > 0
    assert summary.downtime_s > 0 and 0 < summary.ettr < 1
    assert "summary ETTR" in out and "1 restart" in out


def test_explicit_calls_and_adaptive_policy(tmp_path):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = AdaptiveIntervalPolicy(nodes=1, failures_per_node_day=0.5, restart_s=1.0, min_interval_s=1e-3)
    lines: list[str] = []
    session = TrainingSession(tmp_path, model=model, optimizer=optimizer, save_policy=policy, log=lines.append)
    assert session.resume() == 0 and session.interval_s == policy.interval_s
    session.save(1)  # one measured save: the policy now uses its real cost
    assert policy.saves_observed == 1 and session.summary().saves == 1
    assert policy.save_blocking_s == session.manager.records[0].blocking_seconds
    for step in (2, 3):
        with session.step(step):
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
        session.maybe_save(step)
    summary = session.close()
    assert summary.productive_s > 0 and summary.restarts == 0
    assert lines and lines[-1].startswith("ETTR ")

    again = TrainingSession(tmp_path, model=torch.nn.Linear(4, 2), save_policy=EveryNSteps(100))
    assert again.resume() == again.manager.latest_step() >= 1
    assert again.summary().resumes == 1


def test_exception_in_the_loop_counts_as_a_crash(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError):
        with TrainingSession(tmp_path, model=model, save_policy=EveryNSteps(2)) as session:
            for step in session.steps(5):
                if step == 4:
                    raise RuntimeError("boom")
    restarted = TrainingSession(tmp_path, model=model, save_policy=EveryNSteps(2))
    assert restarted.resume() == 2
    assert restarted.summary().restarts == 1


def test_needs_a_model_or_state_functions(tmp_path):
    with pytest.raises(TypeError, match=r"TrainingSession needs model= \(or state_fn= and restore_fn=\)"):
        TrainingSession(tmp_path)
