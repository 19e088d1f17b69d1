"""A fused dimension split unevenly, padded or sized: refused, never saved or loaded wrongly.

UCL cuts a fused dimension into equal groups of its parts (``[a_g; b_g]`` per group). An
uneven cut (gate/up of ffn=50 over tp=4: parts of 13, 13, 12, 12 rows) is not representable,
and a ``pad``/``size`` clause on the fused dimension has nowhere to apply. Before, the
compiler ignored such clauses: a ``pad dim 0`` on a fused gate/up committed a checkpoint whose
logical tensors were 52 rows, the padding saved as data (``test_padded_fused_dim...``).
"""

from __future__ import annotations

import pytest
import torch

from ucp import ucl
import ucp
from ucp.errors import LayoutError
from ucp.spec import LogicalTensor

FUSED = "ucl 1\ntensor w\n  fuse dim 0\n    part a\n    part b\n  split dim 0 over tp\n"
ROWS = [13, 13, 12, 12]  # 50 rows of each part over tp=4, as split_evenly cuts them
A = torch.arange(50 * 3, dtype=torch.float32).reshape(50, 3)
B = -A


def _local(rank: int, *, pad_to: int = 0) -> torch.Tensor:
    start, rows = sum(ROWS[:rank]), ROWS[rank]
    padding = torch.zeros(max(pad_to - rows, 0), 3)
    return torch.cat([A[start:start + rows], padding, B[start:start + rows], padding])


def test_padded_fused_dim_is_refused_where_it_used_to_save_padding_as_data(tmp_path):
    program = FUSED + "  pad dim 0 to multiple of 4\n  size dim 0 = 50\n"
    with pytest.raises(ucl.UclSyntaxError) as info:
        ucp.save({"w": _local(0, pad_to=13)}, tmp_path / "ck", program=program, layout="tp=4", rank=0, world_size=4)
    assert str(info.value) == (
        "<ucl>:7:3: 'pad dim 0' on the fused dimension ('fuse dim 0' above): a fused dimension is cut into equal "
        "groups of its parts, so it cannot be padded or sized; declare each part's logical shape instead: "
        "part NAME shape [...]\n"
        "      pad dim 0 to multiple of 4\n"
        "      ^"
    )
    assert not (tmp_path / "ck" / "manifest.json").exists()


@pytest.mark.parametrize("program,message", [
    ("ucl 1\ntensor w\n  size dim 0 = 50\n  fuse dim 0\n    part a\n    part b\n",
     "m.ucl:4:3: 'fuse dim 0' on a dimension the rule pads or sizes ('pad dim 0' or 'size dim 0' above)"),
    (FUSED + "  size dim 0 = 50\n", "m.ucl:7:3: 'size dim 0' on the fused dimension ('fuse dim 0' above)"),
])
def test_sized_fused_dim_is_refused_in_either_order(program, message):
    with pytest.raises(ucl.UclSyntaxError) as info:
        ucl.parse(program, filename="m.ucl")
    assert str(info.value).startswith(message + ": a fused dimension is cut into equal groups")


def test_padding_another_dim_of_a_fused_tensor_is_still_fine():
    program = ucl.parse("ucl 1\ntensor w\n  fuse dim 0\n    part a\n    part b\n  pad dim 1 to multiple of 4\n"
                        "  size dim 1 = 3\n  split dim 1 over tp\n", filename="m.ucl")
    fmap = ucl.spec_for_save(program, "tp=2", 1, {"w": ((4, 2), "float32")})
    assert sorted((p.logical, p.target.offsets, p.target.sizes) for p in fmap.tensors["w"].pieces) == [
        ("a", (0, 2), (2, 1)), ("b", (0, 2), (2, 1))]


def test_uneven_fused_split_with_declared_shapes_is_refused_at_save():
    program = "ucl 1\ntensor w\n  fuse dim 0\n    part a shape [50, 3]\n    part b shape [50, 3]\n  split dim 0 over tp\n"
    with pytest.raises(ucl.UclError) as info:
        ucl.spec_for_save(program, "tp=4", 0, {"w": ((26, 3), "float32")})
    assert str(info.value) == (
        "<ucl>:2: 'a' has 50 elements along dim 0, not a multiple of the 4 fused groups: a fused dimension is cut "
        "into equal groups, so an uneven split of it is refused (Megatron refuses it too: ffn_hidden_size and the "
        "query/key/value heads must divide by tp)"
    )


def test_uneven_fused_split_without_shapes_is_refused_at_commit(tmp_path):
    """Each rank alone cannot know the others' part sizes; the commit sees they disagree and writes no manifest."""
    path = tmp_path / "ck"
    for rank in range(4):
        ucp.save({"w": _local(rank)}, path, program=FUSED, layout="tp=4", rank=rank, world_size=4)
    with pytest.raises(LayoutError) as info:
        ucp.finalize(path, world_size=4)
    assert str(info.value) == ("ranks disagree on logical tensor 'a': rank 0 has float32[52, 3], rank 2 has "
                               "float32[48, 3]; fix the spec of one of them")
    assert not (path / "manifest.json").exists()


def test_uneven_fused_split_is_refused_at_load():
    logical = {n: LogicalTensor(n, (50, 3), "float32") for n in ("a", "b")}
    with pytest.raises(ucl.UclError, match=r"'a' has 50 elements along dim 0, not a multiple of the 4 fused groups"):
        ucl.spec_for_load(FUSED, "tp=4", 2, logical)
