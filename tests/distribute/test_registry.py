"""The strategy registry: consistent records, derived facts asked one way, and the only place a strategy is named."""

import ast
from dataclasses import replace

import pytest

from tfdist.config.knobs import Config, DistributedConfig
from tfdist.distribute import registry
from tfdist.distribute.registry import (
    COMMUNICATION,
    DEFAULT_PIPELINE,
    NORMAL_STRATEGY,
    PARADIGMS,
    PIPELINE_STRATEGIES,
    REGISTRY,
    StrategyError,
    check_pipeline,
    get_spec,
)

from helpers.project import REPO


def test_every_record_is_consistent():
    for name, spec in REGISTRY.items():
        assert spec.name == name and name == name.lower()
        assert spec.paradigm in PARADIGMS and spec.backup in ("keras", "checkpoint")
        assert spec.communication in COMMUNICATION and set(spec.loops) <= {"fit", "custom"}, name
        assert (spec.communication == "activations") == spec.splits_layers, name
        assert bool(spec.cluster_jobs) == spec.multi_process == bool(spec.local_jobs), name
        assert not spec.coordinated or spec.multi_process, name
        assert set(spec.local_jobs) <= {"chief", "worker", "ps"}, name
        assert spec.pipelined <= spec.splits_layers and spec.distributes == (name != NORMAL_STRATEGY), name
    assert NORMAL_STRATEGY in REGISTRY and NORMAL_STRATEGY not in PIPELINE_STRATEGIES
    assert get_spec("Parameter_Server") is REGISTRY["parameter_server"]


def test_derived_facts_come_from_the_record():
    ps, mwms, pipeline = get_spec("parameter_server"), get_spec("multi_worker_mirrored"), get_spec("pipeline_parallel")
    assert ps.has_ps and not mwms.has_ps
    assert ps.task_counts(workers=3, ps=2) == {"chief": 1, "worker": 3, "ps": 2}
    assert mwms.task_counts(workers=3, ps=2) == {"worker": 3}
    assert pipeline.micro_batches(5) == 5 and get_spec("model_parallel").micro_batches(5) == 1
    assert [name for name, spec in REGISTRY.items() if spec.splits_layers] == ["model_parallel", "pipeline_parallel"]


def test_the_registry_knows_three_paradigms():
    assert {get_spec(name).paradigm for name in ("mirrored", "model_parallel", "pipeline_parallel")} == {
        "data", "model", "pipeline"}
    assert get_spec("pipeline_parallel").loops == ("custom",)


@pytest.mark.parametrize("name", ["bogus", False, None, 3])
def test_unknown_or_non_string_names_are_refused(name):
    with pytest.raises(StrategyError, match=f"unknown strategy {name!r}; choose one of default, one_device"):
        get_spec(name)


def test_a_pipeline_list_names_only_strategies_the_pipeline_runs():
    check_pipeline(list(PIPELINE_STRATEGIES))
    with pytest.raises(StrategyError, match="distributed.strategies\\[1\\] must be one of one_device, mirrored"):
        check_pipeline(["mirrored", "bogus"])
    with pytest.raises(StrategyError, match="distributed.strategies\\[0\\] must be one of .*; got 'default'"):
        check_pipeline(["default"])


def test_the_default_pipeline_of_the_config_is_the_registrys():
    # config/knobs.py names no strategy but this default (it imports no strategy module); it cannot drift from the registry.
    assert tuple(Config().distributed.strategies) == DEFAULT_PIPELINE


def _default_strategies_nodes(tree: ast.Module) -> set[int]:
    """The nodes of config/knobs.py's ``strategies`` default, which the test above holds equal to the registry's."""
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "strategies":
            return {id(child) for child in ast.walk(node)}
    return set()


def test_no_module_but_the_registry_names_a_strategy():
    # Adding a strategy is one record in distribute/registry.py: no other module may branch on a strategy's name.
    names = set(REGISTRY)
    offenders = []
    for path in sorted((REPO / "src" / "tfdist").rglob("*.py")):
        if path.name == "registry.py":
            continue
        tree = ast.parse(path.read_text())
        allowed = _default_strategies_nodes(tree) if path.name == "knobs.py" else set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in allowed:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert not offenders, offenders


def test_adding_a_strategy_is_one_record(monkeypatch):
    # A hypothetical strategy: one record, and the config, the cluster checks and the launcher know it.
    from tfdist.cluster.launcher import local_cluster
    from tfdist.cluster.roles import check_cluster
    from tfdist.distribute.cluster_spec import ClusterTask

    spec = replace(REGISTRY["multi_worker_mirrored"], name="ring_all_reduce")
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    assert get_spec("ring_all_reduce") is spec
    check_cluster(ClusterTask({"worker": ["a:1", "b:1"]}, "worker", 0), spec)
    assert local_cluster(spec, DistributedConfig(workers=3))["worker"][2].startswith("127.0.0.1:")
