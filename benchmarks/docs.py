"""The docs' benchmark tables, rendered from stored results: one command rewrites them, a test checks them.

A table in a markdown page sits between two markers naming the stored result
it is rendered from::

    <!-- benchmark: threads/2026-12-04-0123456789.json -->
    ...the caption and table, generated...
    <!-- /benchmark -->

or, for the committed baseline's comparison (README's table of results)::

    <!-- comparison: reports/compare/compare.json -->
    ...
    <!-- /comparison -->

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
_BLOCK = re.compile(r"(<!-- (?P<kind>benchmark|comparison): (?P<source>\S+) -->\n)(?P<body>.*?)(<!-- /(?P=kind) -->)",
                    re.DOTALL)


def pages() -> list[Path]:
    found: list[Path] = []
    for name in PAGES:
        path = REPO / name
        found += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return found


def rendered(kind: str, source: str) -> str:
    """The block for stored result ``source`` (``NAME/FILE.json`` under benchmarks/results/, or a compare.json)."""
    if kind == "comparison":
        return comparison_table(REPO / source) + "\n"
    result = results.read(results.ROOT / source)
    return results.render(result, harness.load(result.benchmark)) + "\n"


def comparison_table(path: Path) -> str:
    """A compare.json's results table, under where it was measured."""
    import json

    from tfdist.compare.comparison import rows_from_json
    from tfdist.compare.render import table_markdown

    data = json.loads(path.read_text())
    return f"*{data['measured_on']}*\n\n" + table_markdown("results", rows_from_json(data, str(path)))


def update(page: Path) -> bool:
    """Rewrite ``page``'s blocks from their results; whether anything changed."""
    text = page.read_text()
    new = _BLOCK.sub(lambda m: m.group(1) + rendered(m.group("kind"), m.group("source")) + m.group(5), text)
    if new != text:
        page.write_text(new)
    return new != text


def stale() -> list[str]:
    """``page: source`` for every block whose text differs from what its stored result renders."""
    found = []
    for page in pages():
        for match in _BLOCK.finditer(page.read_text()):
            if match.group("body") != rendered(match.group("kind"), match.group("source")):
                found.append(f"{page.relative_to(REPO)}: {match.group('source')}")
    return found


def sources() -> list[str]:
    """Every stored result a page renders."""
    return [m.group("source") for page in pages() for m in _BLOCK.finditer(page.read_text())]
