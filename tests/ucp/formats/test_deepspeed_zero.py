"""The deepspeed-zero and deepspeed-pipeline readers against real DeepSpeed checkpoints and DeepSpeed's own tool.

The fixtures (tests/fixtures/deepspeed, made by ucp/tools/fixtures/gen_deepspeed.py,
and ../shared/fixtures/deepspeed) were written by real DeepSpeed on gloo; beside
each lies DeepSpeed's ``ds_to_universal`` output, the whole fp32 / exp_avg /
exp_avg_sq of every parameter. Reading the ZeRO partitions must give exactly
those, for every case: several param groups, a frozen parameter, buffers, a
tied embedding, dp=3 and dp=4 with padding, ZeRO-1/2/3, bf16 and fp16 with
fp32 masters, a pipeline.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests.ucp.formats.deepspeed_helpers import ALL, IDS, OURS, universal_dir, universal_tensor
from ucp.errors import FormatError, UnsafePickleError
from ucp.formats import detect_format, get_format
from ucp.formats.deepspeed.pt import load_pt
from ucp.geometry import Box, FlatRange


def _expected_format(root) -> str:
    return "deepspeed-pipeline" if "pipe" in root.name else "deepspeed-zero"


@pytest.mark.parametrize("root", ALL, ids=IDS)
def test_every_state_equals_deepspeeds_own_universal_output_bitwise(root):
    fmt = detect_format(root)
    assert fmt.name == _expected_format(root)
    compared = 0
    with fmt.open_reader(root) as reader:
        for info in reader.tensors():
            param, _, key = info.name.partition("/")
            if not key:
                continue
            got = info.read()
            assert (got.dtype, tuple(got.shape)) == (getattr(torch, info.dtype), info.shape), info.name
            ref = universal_tensor(root, param, key)
            if isinstance(ref, torch.Tensor):
                assert got.dtype == ref.dtype and torch.equal(got.reshape(-1), ref.reshape(-1)), info.name
            else:
                assert got.item() == ref, info.name
            compared += 1
    assert compared >= 3 * 8


@pytest.mark.parametrize("root", ALL, ids=IDS)
def test_model_tensors_are_the_weights_deepspeed_keeps(root):
    """Buffers, frozen and tied parameters equal the fp32.pt DeepSpeed's tool writes for them; trained ones
    equal their fp32 masters rounded to the model dtype (what DeepSpeed's engine copies after each step)."""
    reader = detect_format(root).open_reader(root)
    infos = {i.name: i for i in reader.tensors()}
    reader.close()  # reads after close still work (the files are mapped again)
    for name, info in infos.items():
        if "/" in name:
            continue
        got = info.read()
        master = infos.get(f"{name}/fp32")
        if master is not None:
            assert torch.equal(got, master.read().to(got.dtype)), name
            continue
        path = universal_dir(root) / "zero" / name / "fp32.pt"
        if path.exists():
            assert torch.equal(got.float(), load_pt(path)["param"]), name


@pytest.mark.parametrize("root", ALL, ids=IDS)
def test_region_reads_equal_slices_of_the_whole(root):
    with detect_format(root).open_reader(root) as reader:
        for info in reader.tensors():
            whole = info.read()
            if whole.dim() == 2:
                box = Box((1, 2), (whole.shape[0] - 3, whole.shape[1] - 5))
                assert torch.equal(info.read(box), whole[box.slices()]), info.name
            if whole.numel() > 9:
                rng = FlatRange(3, whole.numel() - 4)
                assert torch.equal(info.read(rng), whole.reshape(-1)[3:whole.numel() - 4]), info.name


def test_a_region_read_opens_only_the_partitions_that_hold_it():
    root = OURS / "zero2-dp3"
    with detect_format(root).open_reader(root) as reader:
        info = {i.name: i for i in reader.tensors()}["emb.weight/exp_avg"]
        assert reader.opened_partitions() == {0: [0]}  # the layout comes from rank 0's file alone
        info.read(Box((0, 0), (2, 10)))  # rows 0-1 live on rank 0
        assert reader.opened_partitions() == {0: [0]}
        info.read(Box((50, 0), (1, 10)))  # the last row: emb.weight spans ranks 0 and 1 only
        assert reader.opened_partitions() == {0: [0, 1]}


def test_the_dp3_fixture_has_the_last_ranks_fp32_padding_stripped():
    """The case the shipped preset failed on: DeepSpeed stores fewer fp32 elements on the last rank."""
    step = OURS / "zero2-dp3" / "global_step3"
    last = load_pt(step / "zero_pp_rank_2_mp_rank_00_optim_states.pt")["optimizer_state_dict"]
    first = load_pt(step / "zero_pp_rank_0_mp_rank_00_optim_states.pt")["optimizer_state_dict"]
    assert last["group_paddings"][0] > 0
    assert last["single_partition_of_fp32_groups"][0].numel() + last["group_paddings"][0] == \
        first["single_partition_of_fp32_groups"][0].numel()


def test_training_state_names_groups_hyperparameters_tied_frozen_and_buffers():
    with detect_format(OURS / "zero2-dp3").open_reader(OURS / "zero2-dp3") as reader:
        state = reader.state()
    assert state.step == 3
    assert [g["params"] for g in state.param_groups] == [
        ["emb.weight", "blocks.0.fc1.weight", "blocks.0.fc2.weight"],
        ["blocks.0.fc1.bias", "blocks.0.fc2.bias", "blocks.0.norm.bias", "ln.weight", "ln.bias"]]
    assert [(g["lr"], g["weight_decay"], g["betas"]) for g in state.param_groups] == [
        (0.001, 0.1, [0.9, 0.999]), (0.002, 0.0, [0.9, 0.999])]
    assert state.extra["tied"] == {"head.weight": "emb.weight"}
    assert state.extra["frozen"] == ["blocks.0.norm.weight"]
    assert state.extra["buffers"] == ["pos_scale", "seen"]
    assert (state.extra["zero_stage"], state.extra["dp"]) == (2, 3)
    assert state.extra["deepspeed"]["group_steps"] == [3, 3]


def test_torch_adamw_step_tensors_are_logical_tensors():
    with detect_format(OURS / "zero1-dp2").open_reader(OURS / "zero1-dp2") as reader:
        steps = {i.name: i.read() for i in reader.tensors() if i.name.endswith("/step")}
    assert steps["emb.weight/step"].dim() == 0 and float(steps["emb.weight/step"]) == 3.0
    assert "blocks.0.norm.weight/step" not in steps and len(steps) == 8


def test_the_pipeline_maps_layer_files_to_the_engines_names():
    root = OURS / "pipe-pp2-dp2"
    with detect_format(root).open_reader(root) as reader:
        names = [i.name for i in reader.tensors() if "/" not in i.name]
    assert names[:2] == ["tied_modules.embed.weight", "tied_modules.embed.pos_scale"]
    assert {"1.fc1.weight", "2.norm.bias", "3.weight", "3.bias"} <= set(names)
    assert not any(n.startswith("0.") or n.startswith("4.") for n in names)


# ------------------------------------------------------------------------------------------ bad input
def _copy(tmp_path, case="zero2-dp3"):
    dst = tmp_path / case
    shutil.copytree(OURS / case, dst)
    return dst


def test_a_missing_rank_file_is_named(tmp_path):
    root = _copy(tmp_path)
    os.remove(root / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    with pytest.raises(FormatError) as err:
        get_format("deepspeed-zero").open_reader(root)
    assert str(err.value) == (f"{root}/global_step3: optimizer files of data-parallel rank(s) [1] are missing "
                              "(found ranks [0, 2])")


def test_a_rank_file_of_another_checkpoint_is_refused_when_read(tmp_path):
    root = _copy(tmp_path)
    other = OURS / "zero3-dp4" / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shutil.copy(other, root / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    with get_format("deepspeed-zero").open_reader(root) as reader:
        info = {i.name: i for i in reader.tensors()}["emb.weight/fp32"]
        with pytest.raises(FormatError, match="holds no fp32 partitions"):
            info.read()


def test_tensor_parallel_deepspeed_folders_are_refused_with_the_way_out(tmp_path):
    root = _copy(tmp_path)
    step = root / "global_step3"
    for dp in range(3):
        shutil.copy(step / f"zero_pp_rank_{dp}_mp_rank_00_optim_states.pt", step / f"zero_pp_rank_{dp}_mp_rank_01_optim_states.pt")
    with pytest.raises(FormatError, match=r"tensor-parallel DeepSpeed checkpoints \(mp_rank_00..01\) are not read "
                                          "directly.*ds_to_universal"):
        get_format("deepspeed-zero").open_reader(root)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/ucp-deepspeed-pwned",))


def test_a_hostile_optimizer_file_is_refused_and_nothing_runs(tmp_path):
    root = _copy(tmp_path)
    target = root / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": {"zero_stage": _Evil()}}, target, pickle_protocol=2)
    if os.path.exists("/tmp/ucp-deepspeed-pwned"):
        os.remove("/tmp/ucp-deepspeed-pwned")
    with pytest.raises(UnsafePickleError, match="posix.system, which can run code; refused"):
        get_format("deepspeed-zero").open_reader(root)
    assert not os.path.exists("/tmp/ucp-deepspeed-pwned")


def test_not_a_deepspeed_folder(tmp_path):
    with pytest.raises(FormatError, match="holds no \\*_optim_states.pt: not a DeepSpeed ZeRO checkpoint"):
        get_format("deepspeed-zero").open_reader(tmp_path)


@pytest.mark.parametrize("pads", [[0], ["4", 0], [0, -1], 7])
def test_group_paddings_that_do_not_fit_the_groups_are_refused(tmp_path, pads):
    """Before: a short list raised a raw IndexError deep in the partition geometry, a string a TypeError."""
    root = _copy(tmp_path)
    target = root / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    state = torch.load(target, weights_only=False)
    groups = len(state["optimizer_state_dict"]["single_partition_of_fp32_groups"])
    assert groups == 2
    state["optimizer_state_dict"]["group_paddings"] = pads
    torch.save(state, target)
    with pytest.raises(FormatError) as err:
        get_format("deepspeed-zero").open_reader(root)
    assert str(err.value) == (f"{target}: group_paddings must list one non-negative element count per param "
                              f"group (2), found {str(pads)}")
