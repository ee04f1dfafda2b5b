"""The documentation's screenshots: made by `docs/screenshots.py`, committed, referenced.

- every image the script makes is committed in docs/images, and every
  `images/...png` a page of docs/ shows exists:
  test_every_screenshot_is_committed_and_every_reference_exists
- the script, run for real (`duly dev`, headless Chromium), writes each image
  as a PNG 1280 pixels wide: test_the_script_writes_every_screenshot (slow)
"""

from __future__ import annotations

import importlib.util
import re
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import REPO_ROOT

DOCS = REPO_ROOT / "docs"
SCRIPT = DOCS / "screenshots.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REFERENCE = re.compile(r"""[^\s("'<>]*images/[^\s)"'<>]+\.png""")


def screenshots_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_screenshots", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height, read from its IHDR chunk; AssertionError if it is none."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_every_screenshot_is_committed_and_every_reference_exists() -> None:
    images = screenshots_script().IMAGES
    assert len(images) == 7
    for name in images:
        assert (DOCS / "images" / name).is_file(), f"docs/images/{name}: run docs/screenshots.py"
    pages = sorted(DOCS.rglob("*.md"))
    for page in pages:
        for reference in REFERENCE.findall(page.read_text()):
            if "://" in reference:
                continue
            target = (page.parent / reference).resolve()
            assert target.is_file(), f"{page.relative_to(REPO_ROOT)} shows {reference}: missing"


@pytest.mark.slow
def test_the_script_writes_every_screenshot(tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    for name in screenshots_script().IMAGES:
        width, height = png_size(tmp_path / name)
        assert width == 1280 and height >= 600, (name, width, height)
