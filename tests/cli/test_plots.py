"""The offline plots page: built by Python alone (no Node.js), and a clear line where it is missing."""

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from tfdist_cli import plots

from helpers.project import REPO


def test_the_page_is_built_with_python_alone(tmp_path):
    # An empty PATH: no node, no npm, nothing else a build could reach for.
    page = tmp_path / "offline.html"
    empty = tmp_path / "bin"
    empty.mkdir()
    result = subprocess.run([sys.executable, str(REPO / "vega" / "build_template.py"), str(page)],
                            env={"PATH": str(empty), "HOME": os.environ.get("HOME", "/root")},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert "vega@" in result.stdout and "vega-lite@5." in result.stdout
    assert "{plot_divs}" in text and "{scripts}" not in text, "DVC fills {plot_divs}; {scripts} would add CDN tags"
    assert "window.vegaEmbed=" in text.replace(" ", "") and "https://cdn" not in text


def test_a_missing_page_is_one_line_saying_how_to_build_it(tmp_path, monkeypatch):
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[plots]\n    html_template = ../vega/offline.html\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(plots.plots, [])
    assert result.exit_code == 2
    (line,) = result.output.splitlines()
    assert line == (f"error: {tmp_path / 'vega' / 'offline.html'} (the offline page dvc plots draws on) is missing: "
                    "build it with `python vega/build_template.py` (make install does)")
    assert not (tmp_path / "dvc_plots").exists()


def test_the_repo_points_dvc_at_the_page_the_builder_writes():
    assert plots.offline_page(REPO) == Path(REPO / "vega" / "offline.html")
