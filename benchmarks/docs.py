"""The docs' benchmark tables, rendered from stored results: one command rewrites them, a test checks them.

A table in a markdown page sits between two markers naming the stored result
it is rendered from::

    <!-- benchmark: threads/2026-12-04-0123456789.json -->
    ...the caption and table, generated...
    <!-- /benchmark -->

``python -m benchmarks docs`` rewrites every such block from its result;
``--check`` only says which differ (tests/test_benchmark_docs.py runs it), so a
table no stored result renders fails the suite.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import harness, results

REPO = Path(__file__).resolve().parent.parent
#: Where generated tables may live.
PAGES = ("README.md", "docs")
_BLOCK = re.compile(r"(<!-- benchmark: (?P<source>\S+) -->\n)(?P<body>.*?)(<!-- /benchmark -->)", re.DOTALL)


def pages() -> list[Path]:
    found: list[Path] = []
    for name in PAGES:
        path = REPO / name
        found += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return found


def rendered(source: str) -> str:
    """The block for stored result ``source`` (``NAME/FILE.json`` under benchmarks/results/)."""
    result = results.read(results.ROOT / source)
    return results.render(result, harness.load(result.benchmark)) + "\n"


def update(page: Path) -> bool:
    """Rewrite ``page``'s blocks from their results; whether anything changed."""
    text = page.read_text()
    new = _BLOCK.sub(lambda m: m.group(1) + rendered(m.group("source")) + m.group(4), text)
    if new != text:
        page.write_text(new)
    return new != text


def stale() -> list[str]:
    """``page: source`` for every block whose text differs from what its stored result renders."""
    found = []
    for page in pages():
        for match in _BLOCK.finditer(page.read_text()):
            if match.group("body") != rendered(match.group("source")):
                found.append(f"{page.relative_to(REPO)}: {match.group('source')}")
    return found


def sources() -> list[str]:
    """Every stored result a page renders."""
    return [m.group("source") for page in pages() for m in _BLOCK.finditer(page.read_text())]
