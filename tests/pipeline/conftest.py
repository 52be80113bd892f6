"""The browser the end-to-end tests look through: headless Debian Chromium, one per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from helpers.browser import CHROMIUM, CHROMIUM_FLAGS


@pytest.fixture(scope="session")
def browser() -> Any:
    """Headless Debian Chromium, driven by Playwright, for every browser test of the session."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM}: install Debian's chromium (make browser-deps) or set TFDIST_CHROMIUM")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()
