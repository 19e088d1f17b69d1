"""Evicting a checkpoint from the page cache (what the recovery bench does before a restart reads it)."""

import os
import shutil

import pytest

from ucp.integrations.page_cache import cached_fraction, evict


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux's fincore to see the page cache")
def test_evict_drops_the_files_pages(tmp_path):
    folder = tmp_path / "ck"
    (folder / "data").mkdir(parents=True)
    for i in range(3):
        (folder / "data" / f"f{i}").write_bytes(os.urandom(1 << 20))
    for i in range(3):
        (folder / "data" / f"f{i}").read_bytes()
    assert cached_fraction(folder) > 0.5
    assert evict(folder) == 3 << 20
    assert cached_fraction(folder) < 0.05
