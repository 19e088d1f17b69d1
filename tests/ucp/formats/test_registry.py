"""The format registry: registration, lookup by name, detection, and its errors."""

from __future__ import annotations

import doctest

import pytest
import torch

import ucp.formats.base as base
from ucp.errors import FormatError
from ucp.formats.base import Format, TensorInfo, UnknownFormatError


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(base, "_REGISTRY", {})
    return base


def _fmt(name, detect):
    return Format(name=name, description=name, detect=detect, open_reader=lambda path: None)


def test_register_get_and_detect(registry, tmp_path):
    (tmp_path / "marker").write_text("x")
    registry.register_format(_fmt("never", lambda p: False))
    registry.register_format(_fmt("mine", lambda p: (tmp_path / "marker").exists()))
    assert registry.get_format("mine").name == "mine"
    assert registry.detect_format(tmp_path).name == "mine"
    assert set(registry.formats()) == {"never", "mine"}


def test_a_name_is_registered_once_unless_replaced(registry):
    registry.register_format(_fmt("a", lambda p: False))
    with pytest.raises(ValueError, match="a format named 'a' is already registered; pass replace=True"):
        registry.register_format(_fmt("a", lambda p: True))
    registry.register_format(_fmt("a", lambda p: True), replace=True)
    assert registry.get_format("a").detect("x")


def test_unknown_names_and_paths_say_what_is_known(registry, tmp_path):
    registry.register_format(_fmt("a", lambda p: False))
    with pytest.raises(UnknownFormatError, match=r"unknown checkpoint format 'b'; known formats: a"):
        registry.get_format("b")
    with pytest.raises(UnknownFormatError, match=r"is not a checkpoint in any known format \(looked for: a\)"):
        registry.detect_format(tmp_path)
    with pytest.raises(FormatError, match="no file or directory at"):
        registry.detect_format(tmp_path / "absent")


def test_a_detector_that_fails_does_not_hide_the_others(registry, tmp_path):
    def broken(path):
        raise OSError("unreadable")

    registry.register_format(_fmt("broken", broken))
    registry.register_format(_fmt("ok", lambda p: True))
    assert registry.detect_format(tmp_path).name == "ok"


def test_tensor_info_reads_regions():
    t = torch.arange(12.0).view(3, 4)
    info = TensorInfo("w", "float32", (3, 4), lambda region: t if region is None else t[region.slices()])
    assert torch.equal(info.read(), t) and info.nbytes == 48 and info.numel == 12


def test_doctests():
    assert doctest.testmod(base).failed == 0
