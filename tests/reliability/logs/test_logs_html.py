"""The HTML report renders in a real browser (headless Chromium) as a page a person reads."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ucp.reliability.logs.analyze import AnalysisOptions, analyze_logs
from ucp.reliability.logs.report_html import render_html, write_html

LOGHUB = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "loghub"
# Flags from the environment notes: no sandbox (root in a container), no GPU, no network chatter.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("a headless Chromium is needed for this test: `make test` installs Debian's chromium "
                         "(apt-get install -y chromium)")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    log = tmp_path_factory.mktemp("html") / "gpu.log"
    log.write_text("\n".join(
        [f"Jun  3 1{h}:00:00 gpu-a0{h % 3} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
         for h in range(8)]
        + [f"Jun  3 1{h}:05:00 gpu-a0{h % 3} foo: FATAL frobnicator quux failed on shelf {h}" for h in range(6)]) + "\n")
    return analyze_logs([str(log), str(LOGHUB / "HPC_2k.log")], options=AnalysisOptions(default_year=2024))


def test_page_has_the_sections_a_reader_needs_and_no_raw_json(result):
    page = render_html(result)
    for heading in ("Failure categories", "Mined categories", "Largest incidents", "Lemon nodes", "Plots", "Input"):
        assert f"<h2>{heading}" in page
    assert 'class="cards"' in page and "failures / 1000 node-days" in page
    assert "frobnicator quux failed" in page  # a mined category with its example line
    assert "hardware/gpu/xid-79" in page and "&times;" in page  # an incident and its cascade
    for name in ("categories", "timeline", "mttf", "heatmap"):
        assert f'alt="{name}" src="data:image/png;base64,' in page
    assert "<pre>{" not in page and '"summary"' not in page  # no JSON dump
    assert "http://" not in page and "https://" not in page  # self-contained


@pytest.mark.slow
def test_headless_browser_renders_the_report(result, tmp_path):
    page = tmp_path / "report.html"
    write_html(result, str(page))
    shot = tmp_path / "shot.png"
    base = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1800"]
    env = {**os.environ, "HOME": str(tmp_path)}
    run = subprocess.run([*base, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True,
                         timeout=120, env=env)
    assert run.returncode == 0 and shot.stat().st_size > 20_000, run.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == (1800, 1280)
    # Not a blank page: the dark header band, white cards and text are all there.
    assert pixels[:40, :, :3].mean() < 0.3 and pixels[200:, :, :3].std() > 0.1
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, env=env)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Mined categories" in dom.stdout and "frobnicator quux failed" in dom.stdout
    images = dom.stdout.count('src="data:image/png;base64,')
    assert images == 4
