"""dvc.yaml cannot go stale: each stage depends on exactly the project modules it can run and the knobs that decide it.

The modules a stage can run are found statically: every ``import`` of a project
module in the stage script and, transitively, in those modules, including
imports inside functions (the lazy ones a plain import would not load). A
fresh interpreter that loads each stage script checks the finder: what it
actually loads must be among them.

A stage's ``params:`` are derived from the knobs themselves: each knob in
``config.py`` says which kinds of stage it decides (``decides``), and a
stage lists exactly those, so a knob that changes a result always reruns
the stage and one that does not never does.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tfdist.config.knobs import STAGES
from tfdist.config.params import knob_roles, stage_params

from helpers.imports import reachable_files
from helpers.project import REPO


def stages():
    """(stage name, script, the .py deps dvc.yaml lists) for every stage."""
    for name, stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items():
        script = next(word for word in stage["cmd"].split() if word.endswith(".py"))
        yield name, script, {dep for dep in stage["deps"] if dep.endswith(".py")}


@pytest.mark.parametrize(("stage", "script", "deps"), list(stages()), ids=[s[0] for s in stages()])
def test_each_stage_depends_on_exactly_the_modules_it_can_run(stage, script, deps):
    reachable = reachable_files(REPO / script)
    assert not reachable - deps, f"{stage}: dvc.yaml misses {sorted(reachable - deps)} (editing them would not rerun it)"
    assert not deps - reachable, f"{stage}: dvc.yaml lists {sorted(deps - reachable)}, which it never imports"


LOADED = """
import json, runpy, sys
sys.argv = [{script!r}, "--help"]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit:
    pass
print(json.dumps(sorted(getattr(m, "__file__", None) or "" for m in list(sys.modules.values()))))
"""


@pytest.mark.parametrize("script", sorted({s[1] for s in stages()}))
def test_what_a_fresh_interpreter_loads_for_a_stage_is_among_what_the_finder_sees(script):
    result = subprocess.run([sys.executable, "-c", LOADED.format(script=script)], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=True)
    roots = [REPO / "src" / "tfdist", REPO / "stages"]
    loaded = {str(Path(f).resolve().relative_to(REPO)) for f in json.loads(result.stdout.splitlines()[-1])
              if f and any(Path(f).resolve().is_relative_to(root) for root in roots)}
    assert loaded, "the stage loaded no project module at all"
    assert loaded <= reachable_files(REPO / script), sorted(loaded - reachable_files(REPO / script))


def listed_params(stage: dict) -> set[str]:
    """The knobs a dvc.yaml stage lists, a section (``train``) standing for every knob in it."""
    knobs = set(knob_roles())
    found = set()
    for entry in stage.get("params", []):
        assert isinstance(entry, str), f"params from another file are not expected here: {entry!r}"
        covered = {knob for knob in knobs if knob == entry or knob.startswith(f"{entry}.")}
        assert covered, f"{entry!r} is no knob or section of params.yaml"
        found |= covered
    return found


@pytest.mark.parametrize("stage", list(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]))
def test_each_stage_lists_exactly_the_knobs_that_decide_it(stage):
    kind = stage.split("-")[0]
    assert kind in STAGES, f"{stage}: no kind of stage in tfdist.config.STAGES"
    listed = listed_params(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage])
    expected = set(stage_params(kind))
    assert not expected - listed, f"{stage}: dvc.yaml misses {sorted(expected - listed)} (changing them would not rerun it)"
    assert not listed - expected, f"{stage}: dvc.yaml lists {sorted(listed - expected)}, which decide nothing it makes"


def test_the_knobs_that_decided_nothing_before_are_now_in_the_train_stages():
    # dvc exp run -S distributed.all_reduce=ring once reran nothing and reported the old run.
    assert {"distributed.micro_batches", "distributed.all_reduce"} <= set(stage_params("train"))
    assert "distributed.max_restarts" not in stage_params("train"), "an operational knob decides no result"
