"""The Transformers callback with the real Trainer and a tiny Llama (offline): kill, resume, ETTR."""

from __future__ import annotations

import ast

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from ucp.reliability.ettr.tracker import ETTRTracker
from ucp.api import load


@pytest.mark.slow
def test_transformers_run_killed_and_resumed(tmp_path, jobs, same_state, committed):
    jobs.run_until("tiny_transformers_job.py", str(tmp_path), "30", "--sleep", "0.03", line="step 17")
    last = committed(tmp_path)[-1]
    assert last == 15

    out = jobs.run("tiny_transformers_job.py", str(tmp_path), "30")
    assert f"resumed {last}" in out
    # Model, optimizer and LR scheduler after the resume equal the killed process's at its last save.
    same_state(load(tmp_path / "witness" / f"witness_{last}"), load(tmp_path / "witness" / "resumed"))
    assert committed(tmp_path)[-1] == 30

    summary = ETTRTracker(tmp_path).summary()
    assert (summary.restarts, summary.last_step) == (1, 30)
    assert summary.lost_steps >= 16 - last and summary.lost_s > 0
    logged = ast.literal_eval(next(line for line in out.splitlines() if line.startswith("logged ettr")).split(" ", 2)[2])
    assert logged and all(0 < value < 1 for value in logged)
    assert "1 restart" in out


def test_missing_framework_names_the_extra():
    from ucp.integrations._optional import MissingDependencyError, require

    with pytest.raises(MissingDependencyError) as caught:
        require("no_such_framework_xyz", extra="lightning")
    assert "install it with: pip install 'ucp-middleware[lightning]'" in str(caught.value)
    assert isinstance(caught.value, ImportError)
