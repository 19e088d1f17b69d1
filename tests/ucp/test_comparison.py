"""ucp.diff: every kind of difference named, across formats, block by block."""

from __future__ import annotations

import doctest

import pytest
import torch
from safetensors.torch import save_file

import ucp
import ucp.comparison as comparison


def test_equal_across_formats(tmp_path):
    sd = {"w": torch.randn(5, 3), "b": torch.randn(3).bfloat16()}
    torch.save(sd, tmp_path / "a.pt")
    save_file(sd, tmp_path / "b.safetensors")
    report = ucp.diff(tmp_path / "a.pt", tmp_path / "b.safetensors")
    assert report.equal and report.tensors_compared == 2 and (report.a_format, report.b_format) == ("torch", "safetensors")


def test_each_kind_of_difference_is_named(tmp_path):
    a = {"same": torch.ones(2), "only_a": torch.ones(1), "shape": torch.ones(2, 2), "dtype": torch.ones(2),
         "vals": torch.tensor([1.0, 2.0, float("nan"), 4.0]), "step": 3}
    b = {"same": torch.ones(2), "only_b": torch.ones(1), "shape": torch.ones(4), "dtype": torch.ones(2).double(),
         "vals": torch.tensor([1.0, 2.5, float("nan"), 3.0]), "step": 4}
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    found = [(d.name, d.kind, d.detail) for d in ucp.diff(tmp_path / "a.pt", tmp_path / "b.pt").differences]
    assert found == [
        ("only_a", "missing", f"in {tmp_path / 'a.pt'} only"),
        ("only_b", "extra", f"in {tmp_path / 'b.pt'} only"),
        ("shape", "shape", "[2, 2] vs [4]"),
        ("dtype", "dtype", "float32 vs float64"),
        ("vals", "values", "2 of 4 elements differ (max |a-b| = 1)"),
        ("step", "state", "3 vs 4"),
    ]
    tolerant = ucp.diff(tmp_path / "a.pt", tmp_path / "b.pt", atol=0.6, compare_state=False)
    assert [(d.name, d.elements, d.max_abs_diff) for d in tolerant.differences if d.kind == "values"] == [("vals", 1, 1.0)]


def test_bitwise_by_default_and_nan_against_number(tmp_path):
    torch.save({"z": torch.tensor([0.0, 1.0])}, tmp_path / "a.pt")
    torch.save({"z": torch.tensor([-0.0, float("nan")])}, tmp_path / "b.pt")
    (d,) = ucp.diff(tmp_path / "a.pt", tmp_path / "b.pt").differences
    assert (d.elements, d.max_abs_diff) == (2, float("inf"))  # -0.0 differs in bits; a NaN against 1 is unbounded


def test_large_tensors_compare_in_blocks(tmp_path, monkeypatch):
    big = torch.randn(16384, 64)  # 4 MiB
    other = big.clone()
    other[16000, 3] += 1
    torch.save({"big": big}, tmp_path / "a.pt")
    torch.save({"big": other}, tmp_path / "b.pt")
    seen = []
    real = comparison._bits_differ
    monkeypatch.setattr(comparison, "_bits_differ", lambda x, y: seen.append(x.numel()) or real(x, y))
    (d,) = ucp.diff(tmp_path / "a.pt", tmp_path / "b.pt", memory_budget="4MiB").differences
    assert d.elements == 1 and d.max_abs_diff == pytest.approx(1.0)
    assert seen == [1 << 18] * 4  # blocks of a quarter of the budget: 1 MiB of float32 each


def test_bad_atol():
    with pytest.raises(ValueError, match="atol must be >= 0, got -1"):
        ucp.diff("a", "b", atol=-1)


def test_doctests():
    assert doctest.testmod(comparison).failed == 0
