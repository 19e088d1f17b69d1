"""The README's API examples run as written."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ucp import ucl
import ucp
from ucp.layout import Layout

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _run_api_example(tmp_path, monkeypatch) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The first block, after one training step (it saves ckpt/step_100 and ckpt/step_200 at step 7)."""
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    exec(_python_blocks()[0], {"model": model, "opt": opt, "step": 7})  # noqa: S102 - our own README
    return model, opt


def test_single_process_example_runs(tmp_path, monkeypatch):
    model, opt = _run_api_example(tmp_path, monkeypatch)
    assert (tmp_path / "ckpt" / "step_100" / "manifest.json").is_file()
    assert (tmp_path / "ckpt" / "step_200" / "manifest.json").is_file()
    saved = ucp.load(tmp_path / "ckpt" / "step_200")
    assert saved["step"] == 7 and torch.equal(saved["optim"]["state"][0]["exp_avg"], opt.state[model.weight]["exp_avg"])


def test_a_manager_resumes_from_the_checkpoints_the_api_example_saved(tmp_path, monkeypatch):
    """ucp.save(state, "ckpt/step_100") and then a manager on ckpt/: restore finds it (issue: it started over)."""
    model, _ = _run_api_example(tmp_path, monkeypatch)
    manager = ucp.CheckpointManager("ckpt")
    ckpt = tmp_path / "ckpt"
    assert manager.checkpoints() == [(7, str(ckpt / "step_100")), (7, str(ckpt / "step_200"))]  # newest last
    fresh = torch.nn.Linear(4, 3)
    state = {"model": fresh, "optim": torch.optim.Adam(fresh.parameters()), "step": 0}
    assert manager.restore(into=state) == 7 and state["step"] == 7
    assert torch.equal(fresh.weight, model.weight) and state["optim"].state_dict()["state"][0]["step"] == 1


@pytest.mark.slow
def test_the_resume_example_run_in_two_processes_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    job_path = Path(__file__).with_name("readme_resume_job.py")
    env = {**os.environ, "PYTHONPATH": str(README.parent)}

    def run(directory: str, total: int, out: str) -> dict:
        subprocess.run([sys.executable, str(job_path), str(tmp_path / directory), str(total), "5", str(tmp_path / out)],
                       check=True, env=env, timeout=240)
        return torch.load(tmp_path / out)

    first = run("ckpt", 12, "first.pt")  # trains 1..12, saves steps 5 and 10, exits
    resumed = run("ckpt", 30, "resumed.pt")  # a new process: fresh objects, restore 10, train 11..30
    # The uninterrupted run, here (a third process would only add start-up time).
    spec = importlib.util.spec_from_file_location("readme_resume_job", job_path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    monkeypatch.chdir(tmp_path)  # the job changes directory; this puts it back
    threads = torch.get_num_threads()
    try:
        job.main([str(tmp_path / "straight" / "ckpt"), "30", "5", str(tmp_path / "straight.pt")])
    finally:
        torch.set_num_threads(threads)
    straight = torch.load(tmp_path / "straight.pt")
    assert (first["start"], resumed["start"], straight["start"]) == (1, 11, 1)
    assert resumed["step"] == straight["step"] == 30
    for name, value in straight["model"].items():
        assert torch.equal(resumed["model"][name], value), name
    a, b = resumed["optim"], straight["optim"]
    assert a["param_groups"] == b["param_groups"] and sorted(a["state"]) == sorted(b["state"]) == [0, 1, 2, 3]
    for i, entry in b["state"].items():
        assert entry["step"] == 30
        for key, value in entry.items():
            assert torch.equal(a["state"][i][key], value), (i, key)


def test_distributed_example_names_a_real_preset_and_layouts():
    block = _python_blocks()[2]
    program = re.search(r'gpt = "([^"]+)"', block).group(1)
    bound = ucl.load_program(program)
    assert bound.params["num_layers"] == 32
    for text in re.findall(r'layout="([^"]+)"', block):
        assert Layout.parse(text).world_size in (64, 32)


def test_tensor_reads_and_finalize_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(4, 3)
    scope = {"model": model, "opt": torch.optim.Adam(model.parameters()), "step": 7, "torch": torch}
    exec(_python_blocks()[0], scope)  # noqa: S102 - makes ckpt/step_100
    exec(_python_blocks()[3], scope)  # noqa: S102
    assert torch.equal(scope["row"], model.weight.detach()[:1])
    assert sorted(k for k in ucp.load(tmp_path / "ckpt" / "parts") if k.startswith("rank")) == ["rank0", "rank1"]
