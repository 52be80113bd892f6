import ast

import pytest

from tfdist.config import DistributedConfig
from tfdist.strategies import (
    COMMUNICATION,
    NORMAL_STRATEGY,
    PIPELINE_STRATEGIES,
    REGISTRY,
    StrategyError,
    configure_cpu_devices,
    get_spec,
    make_strategy,
)

from conftest import HAS_GPU, LOGICAL_CPUS, REPO, cpu_only


def test_default_is_one_replica_on_the_first_device():
    _, info = make_strategy("default")
    assert info.replicas == 1 and info.devices == ["/gpu:0" if HAS_GPU else "/cpu:0"] and info.synchronous


@cpu_only
@pytest.mark.parametrize("name", ["mirrored", "central_storage", "MIRRORED"])
def test_multi_device_strategies_use_the_logical_cpus(name):
    strategy, info = make_strategy(name, devices=LOGICAL_CPUS)
    assert strategy.num_replicas_in_sync == info.replicas == LOGICAL_CPUS
    assert info.devices == [f"/cpu:{i}" for i in range(LOGICAL_CPUS)]


def test_one_device():
    strategy, info = make_strategy("one_device")
    assert type(strategy).__name__ == "OneDeviceStrategy" and info.replicas == 1


@pytest.mark.parametrize("name", ["bogus", False, None, 3])
def test_unknown_or_non_string_names_are_refused(name):
    with pytest.raises(StrategyError, match=f"unknown strategy {name!r}; choose one of default, one_device"):
        make_strategy(name)


def test_tpu_fails_clearly_without_a_tpu():
    with pytest.raises(StrategyError, match="strategy 'tpu' needs a TPU, and none was found"):
        make_strategy("tpu")


@cpu_only
def test_devices_cannot_be_resplit_once_tensorflow_runs():
    make_strategy("mirrored", devices=LOGICAL_CPUS)
    with pytest.raises(StrategyError, match="cannot split the CPU into 3 devices: TensorFlow already runs with 2"):
        configure_cpu_devices(3)


def test_every_record_is_consistent():
    for name, spec in REGISTRY.items():
        assert spec.name == name and name == name.lower()
        assert spec.paradigm in ("none", "data", "model", "pipeline") and spec.backup in ("keras", "checkpoint")
        assert spec.communication in COMMUNICATION and set(spec.loops) <= {"fit", "custom"}, name
        assert (spec.communication == "activations") == spec.splits_layers, name
        assert spec.device_rule in ("first", "split", "per_task", "tpu")
        assert bool(spec.cluster_jobs) == spec.multi_process == bool(spec.local_jobs), name
        assert not spec.launcher_trains or spec.multi_process, name
        assert set(spec.local_jobs.values()) <= {"one", *DistributedConfig.__dataclass_fields__}, name
    assert NORMAL_STRATEGY in REGISTRY and NORMAL_STRATEGY not in PIPELINE_STRATEGIES
    assert get_spec("Parameter_Server") is REGISTRY["parameter_server"]


@pytest.mark.parametrize(("precision", "refused"), [("mixed_float16", ["central_storage", "parameter_server", "tpu"]),
                                                    ("mixed_bfloat16", []), ("float32", [])])
def test_loss_scaling_decides_where_mixed_float16_is_refused(precision, refused):
    for name, spec in REGISTRY.items():
        if name in refused:
            with pytest.raises(StrategyError, match=f"mixed_float16 needs loss scaling, .* not {name}; use mixed_bfloat16"):
                spec.check_precision(precision)
        else:
            spec.check_precision(precision)


def test_no_module_but_the_registry_names_a_strategy():
    # Adding a strategy is one record in strategies.py: no other module may branch on a strategy's name.
    names = set(REGISTRY)
    offenders = []
    for path in sorted((REPO / "src" / "tfdist").glob("*.py")):
        if path.name == "strategies.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                offenders.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not offenders, offenders


def test_adding_a_strategy_is_one_record(monkeypatch):
    # A hypothetical strategy: one record, and the config, the cluster checks and the launcher know it.
    from dataclasses import replace

    from tfdist import strategies
    from tfdist.cluster_spec import ClusterTask, check_cluster
    from tfdist.launcher import local_cluster

    spec = replace(REGISTRY["multi_worker_mirrored"], name="ring_all_reduce", local_jobs={"worker": "workers"})
    monkeypatch.setitem(strategies.REGISTRY, spec.name, spec)
    assert get_spec("ring_all_reduce") is spec
    check_cluster(ClusterTask({"worker": ["a:1", "b:1"]}, "worker", 0), spec)
    assert local_cluster(spec, DistributedConfig(workers=3))["worker"][2].startswith("127.0.0.1:")
