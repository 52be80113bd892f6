"""The private TensorFlow APIs tfdist relies on (all in tfdist.tf_private) still do what it needs.

If a TensorFlow or tf_keras upgrade moves or changes one, this fails first, naming it.
"""

import contextlib
import subprocess
import sys
import time

from tfdist import native_logs, tf_private
from tfdist.tf_imports import keras, tf
from tfdist.tf_private import (
    _kept_inputs,
    create_optimizer_slots,
    inputs_kept_alive,
    one_device_input_options,
    runs_steps_in_one_function,
    tracing_count,
    train_function_reading_metrics_last,
    untracked,
)


def test_untracked_attributes_are_neither_weights_nor_dependencies():
    class Holder(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)
            self._hold((keras.metrics.Mean(name="held"),))

        @untracked
        def _hold(self, metrics):
            self.held = metrics

        def call(self, x):
            return self.dense(x)

    layer = Holder()
    layer(tf.zeros((1, 3)))
    assert len(layer.weights) == 2, "only the Dense kernel and bias"
    assert isinstance(layer.held, tuple) and layer.held[0].name == "held"


def test_tracing_count_counts_traces_of_a_tf_function():
    @tf.function
    def double(x):
        return 2 * x

    assert tracing_count(double) == 0
    double(tf.constant(1.0))
    double(tf.constant(2.0))
    assert tracing_count(double) == 1
    double(tf.constant([1.0, 2.0]))
    assert tracing_count(double) == 2
    assert tracing_count(lambda: None) == 0 and tracing_count(None) == 0


def test_resetting_the_eager_context_leaves_tensorflow_usable():
    code = ("from tfdist.tf_private import reset_eager_context\nfrom tfdist.tf_imports import tf\n"
            "tf.constant(1.0) + 1\nreset_eager_context()\nprint(int(tf.constant(2) + 1))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "3"


def test_optimizer_slots_are_created_up_front_for_legacy_and_new_optimizers():
    for make in (keras.optimizers.legacy.Adam, keras.optimizers.Adam):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        optimizer = make(0.01)
        create_optimizer_slots(optimizer, model.trainable_variables)
        variables = optimizer.variables() if callable(optimizer.variables) else optimizer.variables
        assert len(variables) >= 4, f"{make.__name__}: two moments for each of kernel and bias"


def test_a_kept_alive_input_is_still_the_distributed_dataset_fit_expects_and_keeps_each_iterator(monkeypatch):
    strategy = tf.distribute.get_strategy()  # the default strategy: distributes like the others, in this process
    dataset = tf.data.Dataset.from_tensor_slices((tf.ones((8, 3)), tf.zeros((8,)))).batch(4).repeat()
    assert inputs_kept_alive(strategy, dataset, coordinated=False) is dataset, \
        "kept only in a process that ends without teardown (here, the iterators would be destroyed at exit anyway)"
    monkeypatch.setattr(native_logs, "_without_teardown", [True])  # as tfdist_cli.contract.run_stage declares it
    kept = inputs_kept_alive(strategy, dataset, coordinated=False)
    assert isinstance(kept, type(strategy.experimental_distribute_dataset(dataset)))
    before = len(_kept_inputs)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    history = model.fit(kept, epochs=2, steps_per_epoch=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert len(_kept_inputs) == before + 1, "fit iterates the endless input once, and that iterator is kept"
    assert _kept_inputs[-1] is not None


def test_a_one_device_worker_reads_its_batches_from_a_plain_iterator_in_and_out_of_a_function():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])  # one device, as each CPU worker of multi_worker_mirrored

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return tf.data.Dataset.range(12).batch(context.get_per_replica_batch_size(3)).repeat()

    options = one_device_input_options(strategy)
    assert options is not None and not options.experimental_fetch_to_device
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn, options))
    (worker,) = iterator._iterators
    assert type(worker._iterator).__name__ == "OwnedIterator", "tf.distribute's own iterator, no multi-device copy"
    assert next(iterator).numpy().tolist() == [0, 1, 2]

    @tf.function
    def two(iterator):
        return next(iterator) + strategy.run(lambda batch: batch, args=(next(iterator),))

    assert two(iterator).numpy().tolist() == [3 + 6, 4 + 7, 5 + 8]
    default = iter(strategy.distribute_datasets_from_function(dataset_fn))
    assert type(default._iterators[0]._iterator).__name__ == "OwnedMultiDeviceIterator", "other inputs as they were"


def test_steps_in_one_function_are_told_from_one_step_a_call():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=5)
    assert runs_steps_in_one_function(model)
    model.compile("sgd", "mse", steps_per_execution=1)
    assert not runs_steps_in_one_function(model)


def test_the_multi_step_function_reads_metrics_on_the_last_step_only_and_counts_every_step():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"], steps_per_execution=4)
    traced = []

    @contextlib.contextmanager
    def reading(read):
        traced.append(read)  # entered while the function is traced, once per kind of step
        yield

    function = train_function_reading_metrics_last(model, reading)
    dataset = tf.data.Dataset.from_tensor_slices((tf.ones((16, 3)), tf.zeros((16, 1)))).batch(2).repeat()
    logs = function(iter(dataset))
    # each trace (tf.function may trace twice, the first creating variables) has the steps before the last
    # unread, then the last read
    assert traced and traced[0::2] == [False] * (len(traced) // 2) and traced[1::2] == [True] * (len(traced) // 2)
    assert {"loss", "mae"} <= set(logs) and float(logs["loss"]) >= 0
    assert int(model._train_counter.numpy()) == 4, "each of the execution's steps counted"


def test_the_coordination_service_is_configured_with_our_heartbeat_before_the_strategy():
    code = ("from tfdist.tf_private import configure_collective_coordination, _eager_context\n"
            "configure_collective_coordination({'worker': ['localhost:1', 'localhost:2']}, 7.5)\n"
            "config = _eager_context.context()._coordination_service_config\n"
            "print(config.heartbeat_timeout_in_ms, config.service_leader, [j.num_tasks for j in config.coordinated_job_list])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "7500 /job:worker/replica:0/task:0 [2]"


def test_backup_and_restore_checkpoints_are_found_and_name_their_finished_epochs(tmp_path):
    from tfdist.tf_private import backup_and_restore_checkpoint, backup_and_restore_epochs

    assert backup_and_restore_checkpoint(tmp_path) is None
    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    backup = keras.callbacks.BackupAndRestore(str(tmp_path), save_freq="epoch", delete_checkpoint=False)
    model.fit(tf.zeros((4, 2)), tf.zeros((4, 1)), epochs=3, callbacks=[backup], verbose=0)
    latest = backup_and_restore_checkpoint(tmp_path)
    assert latest is not None
    assert backup_and_restore_epochs(tf.train.load_checkpoint(latest)) == 3


def test_without_a_coordination_service_a_key_is_neither_claimed_nor_waited_for():
    started = time.monotonic()
    assert not tf_private.cluster_key_claim("tfdist/test", "1"), "one process has no cluster to agree with"
    assert tf_private.cluster_key_wait("tfdist/test") is None
    assert time.monotonic() - started < 5


def test_the_graphs_of_a_function_first_instantiated_inside_are_collected_with_their_partitions():
    @tf.function
    def product(x):
        return tf.linalg.matmul(x, x) + 1.0

    with tf_private.function_graphs_collected() as graphs:
        assert graphs == [], "filled on leaving"
        product(tf.ones((2, 2)))
    ops = [node.op for graph in graphs for partition in graph.partition_graphs for node in partition.node]
    assert any("MatMul" in op for op in ops), ops  # MatMul, or oneDNN's _MklMatMul
    with tf_private.function_graphs_collected() as again:
        product(tf.ones((2, 2)))
    assert not [graph for graph in again if graph.partition_graphs], "a later call instantiates nothing"
