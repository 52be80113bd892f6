"""The house: src/tfdist's folders are its architecture, imports only point down, and no two modules import each other.

Imports are read statically (lazy ones inside functions and ``TYPE_CHECKING``
ones included), as tests/pipeline/test_dvc_yaml.py reads them for dvc.yaml.
"""

import re
from pathlib import Path

import tomllib

from helpers.imports import imported_names, module_file, reachable_files
from helpers.project import REPO

SRC = REPO / "src"
#: Each module's floor, lowest first: a module imports only from lower floors or its own room (the leaves,
#: floor 0, are one room).
#: Leaves (errors, config, atomic writes, logs, hardware, TensorFlow imports) hold up everything;
#: data/ feeds distribute/, which cluster/ stands on beside tracking/; the stages' rooms are on top.
FLOORS = {
    "tfdist": 0, "tfdist.errors": 0, "tfdist.files": 0, "tfdist.crash_points": 0, "tfdist.native_logs": 0,
    "tfdist.hardware": 0, "tfdist.tf_imports": 0, "tfdist.tf_private": 0, "tfdist.runtime": 0, "tfdist.config": 0,
    "tfdist.records": 0, "tfdist.model_kinds": 0,
    "tfdist.data": 1,
    "tfdist.distribute": 2,
    "tfdist.cluster": 3, "tfdist.tracking": 3,
    "tfdist.resume": 4,  # a run's backup and what a rerun skips: over tracking, under the stages
    "tfdist.train": 5, "tfdist.evaluate": 5, "tfdist.compare": 5,
    "tfdist_cli": 6,  # the command line: click, over the whole library
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str:
    """``tfdist.train.fit`` -> ``tfdist.train``; a top-level module is its own room; the command line is one room."""
    parts = module.split(".")
    return parts[0] if parts[0] != "tfdist" else ".".join(parts[:2])


def imports() -> dict[str, set[str]]:
    """Module -> the tfdist modules it imports anywhere in it."""
    graph: dict[str, set[str]] = {}
    modules = {module_name(path) for path in SRC.rglob("*.py")}
    for path in SRC.rglob("*.py"):
        found = {name for name in imported_names(path) if name in modules}
        graph[module_name(path)] = found - {module_name(path)}
    return graph


def test_every_module_has_a_floor_and_imports_only_down_or_within_its_room():
    graph = imports()
    assert all(room(module) in FLOORS for module in graph), sorted(m for m in graph if room(m) not in FLOORS)
    floor = {module: FLOORS[room(module)] for module in graph}
    upward = [f"{module} -> {target}" for module, targets in graph.items() for target in targets
              if floor[target] > floor[module] or (floor[target] == floor[module] > 0 and room(target) != room(module))]
    assert not upward, upward


def test_no_import_circle():
    graph = imports()
    circles = []

    def visit(module: str, path: list[str]) -> None:
        for target in graph[module]:
            if target in path:
                circles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in done:
                visit(target, [*path, target])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    # a package importing its own submodules (``from tfdist.cluster import launcher``) is no circle
    assert not [c for c in circles if len(set(c.split(" -> "))) > 1 and not c.startswith("tfdist ->")], circles


def test_config_and_the_registry_are_leaves():
    graph = imports()
    config = set().union(*(targets for module, targets in graph.items() if room(module) == "tfdist.config"))
    assert config - {"tfdist.config.knobs"} <= {"tfdist", "tfdist.errors", "tfdist.model_kinds", "tfdist.records.strict"}, config
    assert graph["tfdist.distribute.registry"] <= {"tfdist", "tfdist.errors"}, graph["tfdist.distribute.registry"]


def test_every_subpackage_is_packaged():
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = {module_name(path) for path in SRC.rglob("__init__.py")}
    assert set(packages) - {"stages"} == folders, "pyproject.toml's packages must list every folder of src/"


#: The modules that may import MLflow, and why each: ``import mlflow`` costs seconds, so every other module (and so
#: every stage that does not log, and every probe of a store) stays free of it.
MLFLOW_IMPORTERS = {
    "tfdist.tracking.experiment": "points MLflow at the store and the experiment",
    "tfdist.tracking.runs": "runs, params, metrics, tags, datasets",
    "tfdist.tracking.models": "saves, logs, loads and registers models",
    "tfdist.tracking.addresses": "finds the newest execution for the UI's address",
    "tfdist.tracking.outage": "tells a store that stopped answering from a request it refused",
    "tfdist.resume.outbox": "sends each epoch's metrics through MLflow's client, off the training path",
    "tfdist.resume.rerun": "asks a run what it holds already (its model, its metric values)",
    "tfdist.tracking.schema": "migrates MLflow's schema once per version",
    "tfdist.tracking.server_app": "a plugin that runs inside mlflow server",
    "tfdist.tracking.mlflow_private": "MLflow's private API, each use tested",
    "tfdist.tracking.board_folder": "reads training runs' metrics and traces for tfdist tensorboard",
}


def test_only_the_named_tracking_modules_import_mlflow():
    importers = {module_name(path) for path in SRC.rglob("*.py")
                 if any(name == "mlflow" or name.startswith("mlflow.") for name in imported_names(path))}
    assert importers == set(MLFLOW_IMPORTERS), (
        f"import mlflow only in {sorted(MLFLOW_IMPORTERS)}; also in {sorted(importers - set(MLFLOW_IMPORTERS))}, "
        f"no longer in {sorted(set(MLFLOW_IMPORTERS) - importers)}")


def test_the_top_level_holds_at_most_twelve_modules():
    top = sorted(path.stem for path in (SRC / "tfdist").glob("*.py") if path.stem != "__init__")
    assert len(top) <= 12, f"{len(top)} top-level modules in src/tfdist (give them a room): {top}"


def test_the_library_never_imports_click_nor_the_command_line():
    """Commands (stages/, tfdist_cli/) parse arguments; the library takes values, so tests and notebooks call it plainly."""
    offenders = sorted(module_name(path) for path in (SRC / "tfdist").rglob("*.py")
                       if {name.split(".")[0] for name in imported_names(path)} & {"click", "tfdist_cli", "stages"})
    assert not offenders, offenders


def test_no_function_is_over_60_lines():
    """A function longer than a screen is read in pieces: split it where its parts have names."""
    import ast

    long = []
    for folder in ("src", "stages", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert not long, long


#: Library modules no test imports, and the test that runs them: through a stage, the ``tfdist`` command or a
#: server it starts (the test below holds that the module is within what that test runs).
RUN_BY = {
    "tfdist.compare.advice": "tests/compare/test_compute.py",  # the comparison's verdict and advice, in words
    "tfdist.compare.stage": "tests/cli/test_stages.py",
    "tfdist.tracking.server_app": "tests/tracking/test_server_doors.py",
    "tfdist.tracking.addresses": "tests/cli/test_tfdist_command.py",
    "tfdist.train.server": "tests/cluster/test_multi_process.py",
    "tfdist.train.stage": "tests/cli/test_stages.py",
    "tfdist_cli.__main__": "tests/cli/test_tfdist_command.py",
    "tfdist_cli.remote": "tests/cli/test_tfdist_command.py",
    "tfdist_cli.s3": "tests/tracking/test_object_store.py",
    "tfdist_cli.tensorboard": "tests/train/test_profiling.py",
    "tfdist_cli.server": "tests/tracking/test_server_doors.py",
    "tfdist_cli.ui": "tests/pipeline/test_browser.py",
}


def _run_by(test: Path) -> set[str]:
    """The project files ``test`` can run: what it imports, the stages and ``tfdist`` command it starts, and the
    MLflow server app (an entry point) that command's servers load."""
    helpers = {REPO / "tests" / Path(*name.split(".")).with_suffix(".py") for name in imported_names(test)
               if name.startswith("helpers.")}
    text = "".join(path.read_text() for path in {test, *helpers} if path.is_file())
    scripts = {REPO / "stages" / f"{name}.py" for name in re.findall(r"stages[./](\w+)", text)}
    if re.search(r"tfdist_cli|\btfdist (ui|server)\b|session_commands|\btfdist\b[\"' ]", text):
        entry_points = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["mlflow.app"]
        scripts |= {REPO / "src" / "tfdist_cli" / "__main__.py",
                    *(module_file(target.split(":")[0]) for target in entry_points.values())}
    return set().union(reachable_files(test), *(reachable_files(script) for script in scripts if script.is_file()))


def test_every_library_module_is_imported_by_a_test_or_run_by_a_named_one():
    tests = list((REPO / "tests").rglob("test_*.py")) + list((REPO / "tests" / "helpers").rglob("*.py"))
    imported = {".".join(name.split(".")[:i]) for test in tests for name in imported_names(test)
                for i in range(1, len(name.split(".")) + 1)}
    untested = sorted(module for module in imports() if module not in imported and module not in RUN_BY
                      and not module.endswith(("tfdist", "__init__")) and module_file(module).name != "__init__.py")
    assert not untested, f"no test imports {untested}: test them, or name in RUN_BY the test that runs each"
    for module, test in RUN_BY.items():
        assert str(module_file(module).relative_to(REPO)) in _run_by(REPO / test), f"{test} does not run {module}"
