"""Write the HTML template ``dvc plots show`` / ``dvc plots diff`` use: Vega inlined, so plots draw offline.

DVC's default page loads Vega, Vega-Lite and vega-embed from a CDN when it is
opened; without a network its interactive plots stay blank. This template
carries the three libraries (installed by ``npm ci`` from ``package-lock.json``)
inside the page instead, and leaves out DVC's ``{scripts}`` placeholder, the
only place the CDN tags would go. ``.dvc/config`` points ``plots.html_template``
here, so plain ``dvc plots show`` uses it.

    python vega/build_template.py        # make install runs it after npm ci
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "offline.html"
LIBRARIES = (("vega", "build/vega.min.js"), ("vega-lite", "build/vega-lite.min.js"),
             ("vega-embed", "build/vega-embed.min.js"))
PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>DVC plots</title>
    <!-- %(versions)s, inlined from npm: nothing is fetched when this page is opened -->
    %(scripts)s
    <style>
        body { font-family: sans-serif; }
        table { border-spacing: 15px; }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def library_script(package: str, build: str) -> tuple[str, str]:
    """``(name@version, <script> element)`` of one installed library, its source-map comment dropped."""
    folder = HERE / "node_modules" / package
    try:
        version = json.loads((folder / "package.json").read_text())["version"]
        code = (folder / build).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SystemExit(f"error: {folder / build} is missing; run `npm ci --prefix vega` first (make install does)") from None
    code = "\n".join(line for line in code.splitlines() if not line.startswith("//# sourceMappingURL="))
    if "</script" in code.lower():
        raise SystemExit(f"error: {package}'s build contains '</script' and cannot be inlined")
    return f"{package}@{version}", f"<script>{code}</script>"


def main() -> None:
    built = [library_script(package, build) for package, build in LIBRARIES]
    page = PAGE % {"versions": ", ".join(name for name, _ in built), "scripts": "\n    ".join(s for _, s in built)}
    staged = TEMPLATE.with_suffix(".html.tmp")
    staged.write_text(page, encoding="utf-8")
    staged.replace(TEMPLATE)
    sys.stdout.write(f"wrote {TEMPLATE.relative_to(HERE.parent)} ({len(page) // 1024} KiB): "
                     f"{', '.join(name for name, _ in built)}\n")


if __name__ == "__main__":
    main()
