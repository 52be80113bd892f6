"""Headless Debian Chromium through Playwright: what a dvc plots page draws with networking off."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playwright.sync_api import TimeoutError as PlaywrightTimeout

from helpers.project import REPO

#: Debian's Chromium, which the browser tests drive through Playwright (nothing is downloaded).
CHROMIUM = os.environ.get("TFDIST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("TFDIST_TEST_ARTIFACTS", REPO / "test-artifacts"))
# Headless as root, and quiet: without the background-networking flags Chromium keeps
# calling Google's services, which this network refuses.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


@dataclass(frozen=True)
class DrawnPage:
    """What a page drew in a browser with networking off."""

    plots: int
    requests: list[str]
    errors: list[str]


def draw_offline(browser: Any, page_file: Path, screenshot: str | None = None) -> DrawnPage:
    """Open a ``dvc plots`` page in a browser context with networking off; count the Vega plots it drew."""
    context = browser.new_context(offline=True, viewport={"width": 1600, "height": 1000})
    try:
        page = context.new_page()
        requests: list[str] = []
        errors: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(page_file.as_uri())
        drawn = page.locator(".vega-embed canvas, .vega-embed svg.marks")
        try:
            drawn.first.wait_for(timeout=15_000)
            page.wait_for_timeout(500)  # the others draw in the same tick or the next
        except PlaywrightTimeout:
            pass  # nothing drew: the count says so
        if screenshot:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / screenshot))
        return DrawnPage(drawn.count(), [url for url in requests if not url.startswith("file:")], errors)
    finally:
        context.close()
