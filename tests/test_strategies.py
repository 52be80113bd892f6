import pytest

from tfdist.strategies import StrategyError, configure_cpu_devices, make_strategy

from conftest import LOGICAL_CPUS


def test_default_is_one_replica_on_the_first_device():
    _, info = make_strategy("default")
    assert info.replicas == 1 and info.devices == ["/cpu:0"] and info.synchronous


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


def test_devices_cannot_be_resplit_once_tensorflow_runs():
    make_strategy("mirrored", devices=LOGICAL_CPUS)
    with pytest.raises(StrategyError, match="cannot split the CPU into 3 devices: TensorFlow already runs with 2"):
        configure_cpu_devices(3)
