"""The docs a user reads: every relative link leads to a file and, with an anchor, to a heading in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading '{anchor}' in {file.name}")
    assert not broken, broken


def test_no_working_notes_in_what_users_read() -> None:
    """Dates of the project's own work ("this round", "last stop") mean nothing to a user."""
    notes = re.compile(r"\b(this|last|next|previous) (round|stop)\b", re.IGNORECASE)
    hits = [f"{page.name}: {m.group(0)}" for page in PAGES for m in notes.finditer(page.read_text())]
    assert not hits, hits


#: The longest a page may be, where a limit holds: the README a newcomer reads at once, the performance pages by topic.
LIMITS = {ROOT / "README.md": 250, **{page: 400 for page in PAGES if "performance" in page.name or "performance" in page.parts}}


@pytest.mark.parametrize("page", list(LIMITS), ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_stay_short_enough_to_read(page: Path) -> None:
    lines = len(page.read_text().splitlines())
    assert lines <= LIMITS[page], f"{page.relative_to(ROOT)}: {lines} lines, over {LIMITS[page]}; split it by topic"
