"""The benchmark harness: results stored as data with their machine and commit, compared side by side, and the docs'
tables exactly what their stored results render."""

from __future__ import annotations

import sys
import types

import pytest

from benchmarks import docs, harness, results
from benchmarks.results import Cell, Result

from helpers.project import REPO


def result(commit: str, steps: dict[int, list[float]]) -> Result:
    return Result(benchmark="toy", title="A toy's step", command="python -m benchmarks toy", date="2026-12-04",
                  commit=commit, machine=results.machine(), options={"rounds": 3}, seconds=1.0, steal_seconds=0.0,
                  cells=[Cell({"batch": batch}, [{"ms_per_step": v} for v in values]) for batch, values in steps.items()])


def test_a_result_keeps_every_round_with_the_machine_and_commit_and_reads_back(tmp_path):
    stored = results.store(result("abc1234567", {25: [1.0, 1.2, 1.1]}), tmp_path)
    again = results.store(result("abc1234567", {25: [1.0]}), tmp_path)
    assert stored != again, "a later run never overwrites an earlier one"
    back = results.read(stored)
    assert back.cell(batch=25).values("ms_per_step") == [1.0, 1.2, 1.1]
    assert back.machine["cores"] >= 1 and back.machine["cpu"] and "flags" in back.machine
    assert "| 25 | 1.10 (1.00-1.20) |" in results.render(back)
    assert "commit abc1234567" in results.render(back) and "3 alternated rounds" in results.render(back)


def test_two_results_compare_cell_by_cell_with_the_range_of_the_ratio():
    old, new = result("old", {25: [1.0, 1.1, 1.2], 256: [10.0]}), result("new", {25: [2.0, 2.2, 2.4]})
    table = results.compare(old, new)
    assert "| batch 25 | 2.00x (1.67-2.40) |" in table
    assert "256" not in table.split("\n", 1)[1], "a cell only one run has is not compared"
    with pytest.raises(SystemExit, match="different benchmarks"):
        results.compare(old, Result(**{**new.__dict__, "benchmark": "other"}))


def test_the_harness_alternates_rounds_over_cells_and_skips_what_the_machine_cannot_run(monkeypatch, tmp_path):
    order = []

    def measure(cell, context, options):
        order.append(cell["batch"])
        if cell["batch"] == 512:
            raise harness.Unsupported("needs a GPU")
        return {"ms_per_step": float(cell["batch"])}

    toy = types.SimpleNamespace(__name__="benchmarks.toy", TITLE="A toy's step", DEFAULTS={"rounds": 2},
                                cells=lambda options: [{"batch": b} for b in (*options.batches, 512)], measure=measure)
    monkeypatch.setattr(harness, "load", lambda name: toy)
    monkeypatch.setattr(results, "ROOT", tmp_path)
    found = harness.run("toy", ["--batches", "25", "256"])
    assert order == [25, 256, 512, 25, 256], "round after round, a skipped cell not tried again"
    assert found.cell(batch=512).skipped == "needs a GPU" and found.cell(batch=25).values("ms_per_step") == [25.0, 25.0]
    assert len(list((tmp_path / "toy").glob("*.json"))) == 1


def test_a_bad_option_is_one_line(monkeypatch, capsys):
    toy = types.SimpleNamespace(__name__="benchmarks.toy", TITLE="toy", cells=lambda o: [], measure=lambda *a: {})
    with pytest.raises(SystemExit):
        harness.parse_options(toy, ["--rounds", "0"])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err


def test_every_table_in_the_docs_is_what_its_stored_result_renders():
    assert docs.sources(), "the docs render at least one stored result"
    assert not docs.stale(), "run python -m benchmarks docs"


def test_listing_the_benchmarks_imports_none_of_them():
    before = set(sys.modules)
    described = {name: harness.describe(name) for name in harness.benchmark_names()}
    assert described["threads"][0] and not described["suite_cpu"][0], "a harness benchmark, and a script"
    assert not {m for m in set(sys.modules) - before if m.startswith("benchmarks.") and m != "benchmarks.harness"}
    assert (REPO / "benchmarks" / "results").is_dir()


def test_at_most_two_benchmarks_stay_scripts_each_saying_why():
    scripts = sorted(name for name in harness.benchmark_names() if not harness.describe(name)[0])
    assert scripts == ["ps_profile", "suite_cpu"], f"move {scripts} onto the harness, or say in the docstring why not"
    for name in scripts:
        assert "not on the harness" in (REPO / "benchmarks" / f"{name}.py").read_text().lower(), name
