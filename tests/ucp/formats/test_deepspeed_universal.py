"""The deepspeed-universal writer writes what DeepSpeed's own ds_to_universal writes; the reader reads both.

For every real DeepSpeed fixture: convert the ZeRO/pipeline folder (its
non-tensor state passed through JSON, as a converter stores it) and compare
with DeepSpeed's output beside the fixture: the same files; byte-identical
per-parameter files and ZeRO-1/2 ``optimizer_state.pt``; model-states files
with the same keys, values and tensors. The known, documented differences are
asserted as such.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from tests.ucp.formats.deepspeed_helpers import (ALL, IDS, OURS, convert, files_under, same_structure,
                                                 universal_dir)
from ucp.errors import CheckpointExistsError, FormatError
from ucp.formats import detect_format, get_format
from ucp.formats.base import TrainingState
from ucp.formats.deepspeed.pt import load_pt


def _is_fp32_run_with_tied_head(root) -> bool:
    ms = next(iter(load_pt(p) for p in (universal_dir(root)).glob("*model_states.pt")))
    module = ms.get("module") or {}
    return "head.weight" in (ms.get("shared_params") or {}) and module["emb.weight"].dtype == torch.float32


def _drop_fragment_padding(states: dict, name: str) -> None:
    """A ZeRO-3 rank's frozen fragment ends in padding that DeepSpeed leaves uninitialised (we write zeros)."""
    rank, dp = int(name.split("_")[3]), states["dp_world_size"]
    for param, frag in states["frozen_param_fragments"].items():
        numel = math.prod(states["frozen_param_shapes"][param])
        per_rank = math.ceil(numel / dp)
        states["frozen_param_fragments"][param] = frag[:max(0, min(per_rank, numel - rank * per_rank))]


@pytest.mark.parametrize("root", ALL, ids=IDS)
def test_the_writer_reproduces_ds_to_universal(root, tmp_path):
    theirs = universal_dir(root)
    ours = tmp_path / "ckpt" / theirs.name
    convert(root, ours)
    assert (tmp_path / "ckpt" / "latest_universal").read_text() == theirs.name
    extra = set(files_under(ours)) - set(files_under(theirs))
    # DeepSpeed's tool drops a pipeline's buffers (its model states hold no module); we keep them.
    assert extra == ({"zero/tied_modules.embed.pos_scale/fp32.pt"} if "pipe" in root.name else set())
    assert set(files_under(theirs)) <= set(files_under(ours))
    zero3 = "zero3" in root.name
    for name in files_under(theirs):
        a, b = (theirs / name).read_bytes(), (ours / name).read_bytes()
        if a == b:
            continue
        obj_a, obj_b = load_pt(theirs / name), load_pt(ours / name)
        if name.endswith("model_states.pt"):
            if zero3:
                _drop_fragment_padding(obj_a, name), _drop_fragment_padding(obj_b, name)
            same_structure(obj_a, obj_b, name)  # tensors laid out afresh: same keys, same values
        elif name == "zero/optimizer_state.pt" and zero3:
            # DeepSpeed's ZeRO-3 tool also copies rank 0's flat partitions, which its loader never reads.
            obj_a.pop("fp32_flat_groups")
            for state in obj_a["optimizer_state_dict"]["state"].values():
                state.pop("exp_avg"), state.pop("exp_avg_sq")
            same_structure(obj_a, obj_b, name)
        elif name == "zero/head.weight/fp32.pt" and _is_fp32_run_with_tied_head(root):
            # DeepSpeed's tool saves the tied alias as a view of the whole flat buffer; we save the tensor.
            same_structure(obj_a, obj_b, name)
        else:
            raise AssertionError(f"{name} differs from DeepSpeed's")


@pytest.mark.parametrize("root", ALL, ids=IDS)
def test_reading_deepspeeds_universal_output_gives_the_zero_readers_tensors(root):
    with detect_format(root).open_reader(root) as source:
        expected = {i.name: i for i in source.tensors()}
    with get_format("deepspeed-universal").open_reader(root) as reader:
        got = {i.name: i for i in reader.tensors()}
        state = reader.state()
    optimizer = {n for n in expected if "/" in n}
    assert optimizer <= set(got)
    for name in optimizer:
        assert torch.equal(got[name].read(), expected[name].read()), name
    for name in (n for n in expected if "/" not in n and n in got):  # ZeRO-3 frozen ones from the rank files
        assert torch.equal(got[name].read(), expected[name].read()), name
    assert state.step == 3 and len(state.param_groups) == (1 if "shared" in str(root) else 2)


def test_universal_to_universal_is_byte_identical(tmp_path):
    root = OURS / "zero2-dp3"
    out = tmp_path / "again" / "global_step3_universal"
    with get_format("deepspeed-universal").open_reader(root) as reader:
        writer = get_format("deepspeed-universal").open_writer(out)
        for info in reader.tensors():
            writer.add(info.name, info.read())
        writer.set_state(reader.state())
        writer.close()
    theirs = universal_dir(root)
    assert files_under(out) == files_under(theirs)
    differ = [n for n in files_under(theirs) if (theirs / n).read_bytes() != (out / n).read_bytes()]
    assert differ == ["mp_rank_00_model_states.pt", "zero/head.weight/fp32.pt"]


def test_a_source_that_is_not_deepspeed_gets_a_loadable_layout(tmp_path):
    """Logical tensors of a plain torch run (no separate masters, torch AdamW step tensors)."""
    w, b = torch.randn(4, 3), torch.randn(4)
    out = tmp_path / "u" / "step7"
    with get_format("deepspeed-universal").open_writer(out) as writer:
        writer.add("fc.weight", w)
        writer.add("fc.bias", b)
        writer.add("buf", torch.arange(3))
        for name, t in (("fc.weight", w), ("fc.bias", b)):
            writer.add(f"{name}/exp_avg", t * 0.1)
            writer.add(f"{name}/exp_avg_sq", t * t)
            writer.add(f"{name}/step", torch.tensor(7.0))
        writer.set_state(TrainingState(step=7, param_groups=(
            {"lr": 0.1, "betas": [0.9, 0.95], "params": ["fc.weight"]}, {"lr": 0.2, "params": ["fc.bias"]})))
    zero = out / "zero"
    assert load_pt(zero / "fc.weight" / "fp32.pt")["param"].equal(w)
    assert load_pt(zero / "fc.weight" / "step.pt").item() == 7.0
    assert load_pt(zero / "buf" / "fp32.pt")["param"].equal(torch.arange(3.0))
    opt = load_pt(zero / "optimizer_state.pt")
    assert opt["param_groups"][0]["betas"] == (0.9, 0.95) and opt["ds_version"]
    assert opt["optimizer_state_dict"]["state"][0]["step"].item() == 7.0
    ms = load_pt(out / "mp_rank_00_model_states.pt")
    assert ms["global_steps"] == 7 and list(ms["module"]) == ["fc.weight", "fc.bias", "buf"]
    assert [list(g) for g in ms["param_shapes"]] == [["fc.weight"], ["fc.bias"]]
    with get_format("deepspeed-universal").open_reader(out) as reader:
        names = [i.name for i in reader.tensors()]
    assert names == ["fc.weight", "fc.bias", "buf", "fc.bias/fp32", "fc.bias/exp_avg", "fc.bias/exp_avg_sq",
                     "fc.bias/step", "fc.weight/fp32", "fc.weight/exp_avg", "fc.weight/exp_avg_sq", "fc.weight/step"]


def test_names_that_cannot_be_folders_are_refused_and_nothing_is_left(tmp_path):
    out = tmp_path / "u" / "x"
    writer = get_format("deepspeed-universal").open_writer(out)
    with pytest.raises(FormatError) as err:
        writer.add("a/b/exp_avg", torch.ones(1))
    assert str(err.value) == ("logical name 'a/b/exp_avg' cannot be written to deepspeed-universal: it keeps one "
                              "folder per parameter, named by the parameter (no '/', '.', '..'), with one file per "
                              "state")
    with pytest.raises(FormatError, match=r"'\.\./x/fp32'"):
        writer.add("../x/fp32", torch.ones(1))
    writer.abort()
    assert os.listdir(tmp_path / "u") == []


def test_optimizer_states_without_weights_are_refused_at_close(tmp_path):
    out = tmp_path / "u" / "x"
    writer = get_format("deepspeed-universal").open_writer(out)
    writer.add("w/exp_avg", torch.ones(2))
    with pytest.raises(FormatError) as err:
        writer.close()
    assert str(err.value) == ("optimizer states of 'w' were given without its master weights or its weights "
                              "(w/fp32 or w); DeepSpeed's loader needs fp32.pt")
    assert os.listdir(tmp_path / "u") == []


def test_an_existing_checkpoint_is_not_replaced_unless_asked(tmp_path):
    out = tmp_path / "u" / "x"
    out.mkdir(parents=True)
    with pytest.raises(CheckpointExistsError, match="exists; pass overwrite=True to replace it"):
        get_format("deepspeed-universal").open_writer(out)
    with get_format("deepspeed-universal").open_writer(out, overwrite=True) as writer:
        writer.add("w", torch.ones(2))
    assert (out / "zero" / "w" / "fp32.pt").exists()


def test_zero3_style_needs_a_deepspeed_zero3_source(tmp_path):
    writer = get_format("deepspeed-universal").open_writer(tmp_path / "u" / "x", style="zero3")
    writer.add("w", torch.ones(2))
    with pytest.raises(FormatError, match="style 'zero3' needs the ZeRO-3 model-states files of a DeepSpeed source"):
        writer.close()
