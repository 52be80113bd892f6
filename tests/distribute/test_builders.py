"""The builders: each record's tf.distribute strategy, made on this machine's (logical) devices."""

import pytest

from tfdist.distribute.builders import BUILDERS, build_strategy
from tfdist.distribute.registry import REGISTRY, StrategyError, get_spec
from tfdist.runtime.threads import configure_cpu_devices

from helpers.devices import HAS_GPU, LOGICAL_CPUS, cpu_only


def make_strategy(name, devices=2, task=None, all_reduce="auto"):
    """The strategy of record ``name``, as the train stage builds it."""
    return build_strategy(get_spec(name), devices, task, all_reduce)


def test_every_record_has_a_builder_for_its_tensorflow_api():
    assert {spec.tf_strategy for spec in REGISTRY.values()} <= set(BUILDERS)


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


def test_tpu_fails_clearly_without_a_tpu():
    with pytest.raises(StrategyError, match="strategy 'tpu' needs a TPU, and none was found"):
        make_strategy("tpu")


@cpu_only
def test_devices_cannot_be_resplit_once_tensorflow_runs():
    make_strategy("mirrored", devices=LOGICAL_CPUS)
    with pytest.raises(StrategyError, match="cannot split the CPU into 3 devices: TensorFlow already runs with 2"):
        configure_cpu_devices(3)


@cpu_only
def test_nccl_all_reduce_needs_gpus():
    with pytest.raises(StrategyError, match="distributed.all_reduce nccl needs a GPU on every worker"):
        make_strategy("multi_worker_mirrored", all_reduce="nccl")
