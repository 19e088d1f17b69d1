"""FsspecStore's constructor refuses a filesystem without the path inside it."""

from __future__ import annotations

import fsspec
import pytest

import ucp
from ucp.stores.fsspec_store import FsspecStore


def test_fs_without_root_is_refused_by_name():
    with pytest.raises(ucp.InvalidArgumentError) as err:
        FsspecStore("memory://args/ckpt", fs=fsspec.filesystem("memory"))
    assert str(err.value) == ("FsspecStore('memory://args/ckpt', fs=...): give root= too, the checkpoint's path "
                              "inside fs")


def test_fs_with_root_is_used():
    store = FsspecStore("memory://args/ckpt", fs=fsspec.filesystem("memory"), root="/args/ckpt/")
    assert store.root == "/args/ckpt"
