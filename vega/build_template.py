"""Write the HTML template ``dvc plots show`` / ``dvc plots diff`` use: Vega inlined, so plots draw offline.

DVC's default page loads Vega, Vega-Lite and vega-embed from a CDN when it is
opened; without a network its interactive plots stay blank. This template
carries the three libraries inside the page instead, and leaves out DVC's
``{scripts}`` placeholder, the only place the CDN tags would go.
``.dvc/config`` points ``plots.html_template`` here, so plain ``dvc plots show``
uses it.

The libraries come from ``vl-convert-python``, a Python package pinned in
uv.lock that bundles them (``vl_convert.javascript_bundle``): Python alone
builds the page, no Node.js or npm. Vega-Lite is the newest 5.x it ships,
the major version of DVC's own plot templates.

    python vega/build_template.py              # make install runs it
    python vega/build_template.py OUT.html     # elsewhere (the tests do)
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "offline.html"
#: DVC's templates are Vega-Lite 5 specs: bundle the newest Vega-Lite 5 the package has.
VEGA_LITE_MAJOR = "5"
PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>DVC plots</title>
    <!-- %(versions)s, inlined from vl-convert-python: nothing is fetched when this page is opened -->
    <script>%(bundle)s</script>
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


def bundle() -> tuple[str, str]:
    """``(versions, JavaScript)``: Vega, Vega-Lite and vega-embed as one script that sets ``window.vegaEmbed``.

    The bundle is wrapped in a function, so its top-level names (``const n``, ...)
    cannot clash with those of the scripts DVC adds to the page.
    """
    try:
        import vl_convert
    except ImportError:
        raise SystemExit("error: vl-convert-python is not installed; run `make install` "
                         "(or `pip install -e .`, which installs it) and build again") from None
    version = max((v for v in vl_convert.get_vegalite_versions() if v.split(".")[0] == VEGA_LITE_MAJOR),
                  key=lambda v: tuple(int(part) for part in v.split(".")))
    code = vl_convert.javascript_bundle(vl_version=version)
    if "</script" in code.lower():
        raise SystemExit("error: the Vega bundle contains '</script' and cannot be inlined")
    versions = (f"vega@{vl_convert.get_vega_version()}, vega-lite@{version}, "
                f"vega-embed@{vl_convert.get_vega_embed_version()}")
    return versions, f"(function () {{\n{code}\n}})();"


def main(argv: list[str]) -> None:
    target = Path(argv[0]) if argv else TEMPLATE
    versions, code = bundle()
    page = PAGE % {"versions": versions, "bundle": code}
    staged = target.with_suffix(".html.tmp")
    staged.write_text(page, encoding="utf-8")
    staged.replace(target)
    sys.stdout.write(f"wrote {target} ({len(page) // 1024} KiB): {versions}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
