"""What installing the project puts into site-packages: one top-level package, ``ucp``, with its data.

Generic names such as ``tools`` or ``integrations`` at the top of site-packages would collide with a
user's own packages, so the wheel is built here (from a copy of the tree, without network access)
and its contents are checked.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# one worker runs this module, so its module-scoped fixture is built once (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("packaging")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "ucp", tree / "ucp", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "--no-build-isolation",
                           "--quiet", "-w", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_installs_one_top_level_package(wheel):
    wheel_names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in wheel_names if ".dist-info/" not in name}
    assert top == {"ucp"}


def test_the_wheel_carries_its_data_and_console_script(wheel):
    zf = zipfile.ZipFile(wheel)
    names = set(zf.namelist())
    for data in ("ucp/ucl/presets/megatron-gpt.ucl", "ucp/reliability/data/taxonomy.json",
                 "ucp/reliability/data/detector.json", "ucp/replication/data/placement-policy.safetensors"):
        assert data in names, data
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "ucp = ucp.tools.cli:main" in zf.read(entry_points).decode()
