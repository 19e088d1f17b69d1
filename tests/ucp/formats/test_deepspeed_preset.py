"""The deepspeed-zero UCL preset refuses what it cannot describe, saying why; the format reads it instead."""

from __future__ import annotations

import pytest
import torch

from ucp import ucl
from tests.ucp.formats.deepspeed_helpers import OURS
from ucp.formats import get_format
from ucp.spec import LogicalTensor

META = {"w": LogicalTensor("w", (4,), "float32"), "w/fp32": LogicalTensor("w/fp32", (4,), "float32")}
HINT = "read DeepSpeed folders with the deepspeed-zero format (ucp convert --from deepspeed-zero)"


@pytest.mark.parametrize("params, message", [
    ({"groups": 2}, "deepspeed-zero.ucl:31: deepspeed-zero describes one param group, not 2: a UCL flat buffer "
                    "selects its members by key globs in the program, and DeepSpeed's group membership "
                    f"(param_shapes) is known only to the model; {HINT}"),
    ({"frozen": ["blocks.0.norm.weight"]}, "deepspeed-zero.ucl:32: deepspeed-zero cannot leave the 1 frozen "
                                           "parameter(s) out of the flat buffers: UCL members are key globs and "
                                           f"`order by` never excludes one; {HINT}"),
    ({"buffers": ["pos_scale", "seen"]}, "deepspeed-zero.ucl:33: deepspeed-zero cannot leave the 2 buffer(s) out "
                                         "of the flat buffers: UCL members are key globs and `order by` never "
                                         f"excludes one; {HINT}"),
])
def test_the_preset_names_what_it_cannot_describe(params, message):
    with pytest.raises(ucl.UclError) as err:
        ucl.spec_for_load("deepspeed-zero", "dp=3,zero=2", 0, META, params=params)
    assert str(err.value) == f"dp=3,zero=2 is not a layout this program supports: {message}"


def test_one_group_without_frozen_or_buffers_still_works():
    fmap = ucl.spec_for_load("deepspeed-zero", "dp=2,zero=1", 0, META)
    assert set(fmap.tensors) == {"module/w", "optim/fp32/group0"}


def test_the_format_reads_the_checkpoint_the_preset_refuses():
    root = OURS / "zero2-dp3"  # two groups, a frozen parameter, two buffers, the last rank's padding stripped
    with get_format("deepspeed-zero").open_reader(root) as reader:
        state = reader.state()
        assert len(state.param_groups) == 2 and state.extra["frozen"] and state.extra["buffers"]
        assert all(torch.isfinite(i.read().float()).all() for i in reader.tensors())
