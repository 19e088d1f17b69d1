"""The README's API examples run as written."""

import re
from pathlib import Path

import torch

import ucl
from ucp.layout import Layout

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_single_process_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    scope = {"model": model, "opt": opt, "step": 7}
    exec(_python_blocks()[0], scope)  # noqa: S102 - our own README
    assert (tmp_path / "ckpt" / "step_100" / "manifest.json").is_file()
    assert (tmp_path / "ckpt" / "step_200" / "manifest.json").is_file()
    assert scope["step"] == 0  # nothing to resume: the manager names its dirs step_00000001, not step_100


def test_distributed_example_names_a_real_preset_and_layouts():
    block = _python_blocks()[1]
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
    exec(_python_blocks()[2], scope)  # noqa: S102
    assert torch.equal(scope["row"], model.weight.detach()[:1])
    import ucp

    assert sorted(k for k in ucp.load(tmp_path / "ckpt" / "parts") if k.startswith("rank")) == ["rank0", "rank1"]
