"""Every TensorFlow and tf_keras API tfdist uses that is private or experimental-internal.

Kept in one place so that a TensorFlow upgrade that moves or drops one breaks
here, loudly, in ``tests/test_tf_private.py``, instead of somewhere deep in a
stage run. Nothing else in tfdist reaches into ``tensorflow.python`` or
``tf.__internal__``. One trick lives elsewhere by necessity:
:func:`tfdist.runtime.loading.tensorflow_without_keras` hides tf_keras from TensorFlow's
package init, so it must run before TensorFlow loads, which importing this
module does; its test is ``tests/test_runtime.py``.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tensorflow.python.distribute import input_lib as _input_lib
from tensorflow.python.eager import context as _eager_context
from tensorflow.python.util import _pywrap_util_port
from tf_keras.src.engine import training as _keras_training

from tfdist.native_logs import ends_without_teardown
from tfdist.tf_imports import tf

#: Decorates a Keras layer/model method whose attribute assignments must not be
#: tracked as dependencies (so they are neither weights nor saved).
untracked: Callable[[Callable[..., Any]], Callable[..., Any]] = tf.__internal__.tracking.no_automatic_dependency_tracking


def reset_eager_context() -> None:
    """Drop this process's eager context, and with it its connections to remote tasks.

    A parameter_server coordinator calls it before its workers are stopped:
    otherwise TensorFlow deletes its functions on the (stopped) workers at
    interpreter exit and prints dozens of gRPC errors.
    """
    gc.collect()
    _eager_context._reset_context()


#: Training inputs :func:`inputs_kept_alive` keeps from their destructors until the process ends.
_kept_inputs: list[Any] = []
_kept_classes: dict[type, type] = {}


def inputs_kept_alive(strategy: tf.distribute.Strategy, dataset: Any, coordinated: bool) -> Any:
    """``fit``'s training input under a distributing ``strategy``, its iterators kept until the process ends.

    Destroying an iterator over an endless input spread over several devices or
    processes blocks for seconds (TensorFlow 2.21, ``py-spy dump --native``:
    ``~MultiDeviceIterator`` waits in ``UnboundedThreadPool``'s
    ``~LogicalThreadWrapper`` for the iterator's background thread, every
    process idle): each worker's ``fit`` under MultiWorkerMirrored, and some
    under Mirrored, stalled when it returned and dropped its iterator
    (docs/performance.md, "Start-up"). Under ParameterServer (``coordinated``)
    the iterators and datasets the coordinator creates on each worker are
    destroyed remotely, and the coordinator's next eager op can wait behind that
    destruction (``EagerContext::MaybeRegisterFunctionRemotely``). Kept
    referenced here, they are never destroyed, in a process that ends without
    the interpreter's teardown (:func:`tfdist.native_logs.end_without_teardown`);
    elsewhere (a test, a notebook) they would be destroyed at exit, stalls and
    all, and ``dataset`` is returned as it is.

    Returns:
        ``dataset`` distributed, as an instance of a subclass of its distributed
        dataset class that records each iterator (tf_keras sees the distributed
        dataset it expects); under ParameterServer, ``dataset`` itself, the
        coordinator recording every per-worker resource it creates.
    """
    if not ends_without_teardown():
        return dataset
    if coordinated:
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)  # the strategy's one
        create = coordinator._create_per_worker_resources

        def kept_resources(*args: Any, **kwargs: Any) -> Any:
            resources = create(*args, **kwargs)
            _kept_inputs.append(resources)
            return resources

        coordinator._create_per_worker_resources = kept_resources
        return dataset
    distributed = (dataset if isinstance(dataset, tf.distribute.DistributedDataset)
                   else strategy.experimental_distribute_dataset(dataset))
    base = type(distributed)
    if base not in _kept_classes:
        def __iter__(self: Any) -> Any:  # noqa: N807
            iterator = base.__iter__(self)
            _kept_inputs.append(iterator)
            return iterator

        _kept_classes[base] = type(f"Kept{base.__name__}", (base,), {"__iter__": __iter__})
    distributed.__class__ = _kept_classes[base]
    return distributed


def one_device_input_options(strategy: tf.distribute.Strategy) -> Any:
    """``InputOptions`` under which each worker reads its batches from a plain tf.data iterator, or None.

    tf.distribute (2.21) reads a worker's input through a ``MultiDeviceIterator``
    even when the worker has one device and ``experimental_fetch_to_device`` is
    off: a generator dataset that calls a function for every batch, on the
    worker's one core beside its step (parameter_server's profile:
    ``InstantiatedCapturedFunction::RunWithBorrowedArgs`` 15-17 % of a worker;
    docs/performance/parallelism.md 8b). With one device per worker there is nothing
    to spread or copy: these options, with the two predicates below taught to
    honour them, give the worker ``iter(dataset)`` itself. None (tf.distribute's
    default) where a worker has several devices (GPUs), which need the copy.
    """
    if len(strategy.extended.worker_devices) != 1:
        return None
    _install_host_input()
    return tf.distribute.InputOptions(experimental_fetch_to_device=False)


def _install_host_input() -> None:
    """Make tf.distribute read a plain iterator wherever ``experimental_fetch_to_device`` is off (once)."""
    if getattr(_input_lib, "_tfdist_host_input", False):
        return
    uses_multi_device = _input_lib._should_use_multi_device_iterator
    as_list = _input_lib._SingleWorkerDatasetIteratorBase._format_data_list_with_options

    def multi_device(options: Any) -> bool:
        return uses_multi_device(options) and (options is None or options.experimental_fetch_to_device)

    def formatted(self: Any, data: Any) -> Any:  # a plain iterator's element is the one device's batch
        options = self._options
        return [data] if options is not None and not options.experimental_fetch_to_device else as_list(self, data)

    spec_of = _input_lib.get_iterator_spec_from_dataset

    def iterator_spec(strategy: Any, dataset: Any) -> Any:  # ParameterServer's coordinator drops the options here
        spec = spec_of(strategy, dataset)
        if isinstance(spec, _input_lib.DistributedIteratorSpec):
            spec._options = getattr(dataset, "_options", None)
        return spec

    _input_lib._should_use_multi_device_iterator = multi_device
    _input_lib._SingleWorkerDatasetIteratorBase._format_data_list_with_options = formatted
    _input_lib.get_iterator_spec_from_dataset = iterator_spec
    _input_lib._tfdist_host_input = True


def create_optimizer_slots(optimizer: Any, variables: list[Any]) -> None:
    """Create a tf_keras legacy optimizer's slot variables (Adam's moments...) for ``variables`` now.

    The legacy optimizers (and their LossScaleOptimizer wrapper) create them on the first
    ``apply_gradients``; the newer ones have a public ``build`` for it.
    """
    build = getattr(optimizer, "build", None)
    if build is not None:
        build(variables)
    else:
        optimizer._create_all_weights(variables)


def tracing_count(function: Any) -> int:
    """How often a ``tf.function`` was traced (0 for anything else, or one never called)."""
    count = getattr(function, "experimental_get_tracing_count", None)
    return int(count()) if count else 0


def configure_collective_coordination(cluster: dict[str, list[str]], heartbeat_timeout: float) -> None:
    """Configure TensorFlow's coordination service as MultiWorkerMirroredStrategy does, with our heartbeat timeout.

    MultiWorkerMirroredStrategy sets the service up itself (chief and worker
    jobs, led by the chief or worker 0) only when nothing has yet, and with
    TensorFlow's fixed heartbeat timeout; configured first, it keeps ours.
    Call before the strategy is built.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util

    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(cluster[job]))
            for job in ("chief", "worker") if job in cluster]
    _eager_context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(heartbeat_timeout * 1000))


def train_function_reading_metrics_last(model: Any, reading: Callable[[bool], Any], waited: Any = None
                                        ) -> Callable[[Any], Any]:
    """tf_keras ``fit``'s multi-step train function, with the metrics read only on the execution's last step.

    tf_keras's own (``Model.make_train_function``) runs ``steps_per_execution``
    steps in one ``tf.function`` and returns the last step's logs, but every
    step reads every metric: under strategies without merge calls
    (MultiWorkerMirrored) each read is a cross-worker all-reduce of the metric's
    variables, four collectives a step for loss and accuracy beside the one of
    the gradients. Here the steps before the last are traced inside
    ``reading(False)`` (a context manager of the model's: its ``train_step``
    updates the metrics without reading them), the last inside ``reading(True)``,
    and its logs are reduced as tf_keras reduces them: the same values reach the
    callbacks. The context is entered around ``strategy.run``, not inside a
    replica: MirroredStrategy traces its replicas in threads side by side.
    Under ParameterServer the coordinator schedules the function on a worker,
    with the step count of the moment, as tf_keras does. ``waited``: :func:`_waited_for`.
    """
    strategy, coordinator = model.distribute_strategy, model._cluster_coordinator
    timed = waited is not None and coordinator is None

    def one(data: Any) -> Any:
        outputs = model.train_step(data)
        with tf.control_dependencies(_keras_training._minimum_control_deps(outputs)):
            model._train_counter.assign_add(1)
        return outputs

    def step(iterator: Any, read: bool, previous_done: Any) -> tuple[Any, Any]:
        """One step; with ``timed``, the time from the step before's end (``previous_done``) to its batch's arrival
        added to ``waited`` (nothing where the batch came first), and this step's end returned."""
        run = tf.function(one, jit_compile=True, reduce_retracing=True) if model.jit_compile else one
        data = next(iterator)
        if timed:
            _waited_for(data, previous_done, waited)
        with reading(read):
            outputs = strategy.run(run, args=(data,))
        if not timed:
            return outputs, previous_done
        with tf.control_dependencies(tf.nest.flatten(strategy.experimental_local_results(outputs))):
            updated = model.optimizer.iterations.read_value()  # after the step's every update (ordered on the variable)
        with tf.control_dependencies([updated]):
            return outputs, tf.timestamp()

    def steps(iterator: Any, count: Any) -> Any:
        done = tf.timestamp() if timed else tf.constant(0.0, tf.float64)
        for _ in tf.range(count - 1):
            _, done = step(iterator, False, done)
        outputs, _ = step(iterator, True, done)
        return _keras_training.reduce_per_replica(outputs, strategy, reduction=model.distribute_reduction_method)

    if coordinator is not None:
        scheduled = tf.function(steps, reduce_retracing=True)
        return lambda iterator: coordinator.schedule(scheduled, args=(iterator, model._steps_per_execution.value()))
    model.train_tf_function = tf.function(lambda iterator: steps(iterator, model._steps_per_execution),
                                          reduce_retracing=True)
    return model.train_tf_function


def _waited_for(data: Any, previous_done: Any, waited: Any) -> None:
    """Add to ``waited`` (a float64 variable of this process, not the strategy's) how long a step waited for its
    batch ``data``, in the graph: from the end of the step before (``previous_done``) to the batch's arrival, nothing
    where the batch came first.

    That end is a timestamp carried through fit's loop, taken once the optimizer's step count can be read, which is
    after the step's every update: the loop's iterations overlap (a timestamp before ``next`` runs while the step
    before computes), and the loss exists before the backward pass. Not under ParameterServer: its steps run on the
    workers.
    """
    with tf.control_dependencies(tf.nest.flatten(data, expand_composites=True)):
        arrived = tf.timestamp()
    waited.assign_add(tf.maximum(arrived - previous_done, 0.0))


#: Where tf_keras's ``BackupAndRestore`` keeps its last finished epoch (0-based), and the chief's checkpoint folder.
_BACKUP_EPOCH = "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"
_BACKUP_CHIEF_FOLDER = "chief"


def backup_and_restore_checkpoint(folder: Path) -> str | None:
    """The newest checkpoint tf_keras ``BackupAndRestore(folder)`` saved for the chief, or None."""
    return tf.train.latest_checkpoint(str(folder / _BACKUP_CHIEF_FOLDER))


def backup_and_restore_epochs(reader: Any) -> int:
    """The epochs a ``BackupAndRestore`` checkpoint (read by ``tf.train.load_checkpoint``) had finished."""
    return int(reader.get_tensor(_BACKUP_EPOCH)) + 1


def runs_steps_in_one_function(model: Any) -> bool:
    """Whether ``fit`` runs several steps per call into the runtime (``steps_per_execution`` > 1, not autotuned)."""
    count = getattr(model, "_steps_per_execution", None)
    return count is not None and int(count.numpy()) > 1 and not model.autotune_steps_per_execution


def onednn_in_use() -> bool:
    """Whether this process's TensorFlow runs oneDNN's kernels (read once at load, from TF_ENABLE_ONEDNN_OPTS and the CPU).

    What ``runtime.onednn`` asked for is a wish; this is what TensorFlow did,
    and what a run's report records.
    """
    return bool(_pywrap_util_port.IsMklEnabled())


def start_fit_at(model: Any, epoch: int, step: int) -> None:
    """Make the ``fit`` under way (from its ``on_train_begin``) start at batch ``step`` of epoch ``epoch``.

    ``fit`` asks the model's training state for its first epoch and step after
    ``on_train_begin``; tf_keras's ``BackupAndRestore`` sets that state to its
    own, whose step is the epoch's first. This one answers ``(epoch, step)``.
    """

    previous = getattr(model, "_training_state", None)
    answer = _StartAt(epoch, step)
    if previous is None:
        model._training_state = answer
    else:  # BackupAndRestore's: still its to back up with and to delete at the end
        previous.maybe_load_initial_counters_from_ckpt = answer.maybe_load_initial_counters_from_ckpt


def end_fit_at(model: Any) -> None:
    """Forget :func:`start_fit_at`'s answer once its ``fit`` ends (BackupAndRestore removes its own state)."""
    if isinstance(getattr(model, "_training_state", None), _StartAt):
        model._training_state = None


class _StartAt:
    def __init__(self, epoch: int, step: int):
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch: int, initial_epoch: int, mode: Any
                                              ) -> tuple[int, int]:
        return self.epoch, self.step


def build_metrics(model: Any) -> None:
    """Build ``model``'s compiled loss and metrics containers now, as its first training step would, so that
    ``model.metrics`` lists them (their variables exist since ``compile``) before any step runs."""
    prediction, truth = tf.zeros((1, 1)), tf.zeros((1,), tf.int64)
    if model.compiled_loss is not None and not model.compiled_loss.built:
        model.compiled_loss.build(prediction)
    if model.compiled_metrics is not None and not model.compiled_metrics.built:
        model.compiled_metrics.build(prediction, truth)


def write_dirpath(folder: Path, strategy: Any) -> str:
    """Where this task writes a checkpoint every task of ``strategy`` saves: ``folder`` on the chief, a scratch
    folder inside it on the others (tf_keras's rule for its own backups)."""
    from tf_keras.src.distribute import distributed_file_utils

    return str(distributed_file_utils.write_dirpath(str(folder), strategy))


def cluster_key_claim(key: str, value: str, seconds: float | None = None) -> bool:
    """Set ``key`` in the cluster's coordination service (a synchronous cluster's: multi_worker_mirrored's); False
    when another task set it first, or the service is gone, or after ``seconds`` (None: as long as the call takes): a
    call to a service cut off by the network waits without end, and the process must still exit (the call's thread
    is left to the exit). TensorFlow's PreemptionCheckpointHandler agrees on its step the same way."""
    if seconds is not None:
        claimed: list[bool] = []
        thread = threading.Thread(target=lambda: claimed.append(cluster_key_claim(key, value)),
                                  name="cluster-key-claim", daemon=True)
        thread.start()
        thread.join(seconds)
        return bool(claimed and claimed[0])
    try:
        _eager_context.context().set_config_key_value(key, value)
    except tf.errors.OpError:  # AlreadyExists; Unavailable or Aborted once the chief that serves it is gone
        return False
    return True


def cluster_key_wait(key: str, seconds: float | None = None) -> str | None:
    """``key``'s value in the cluster's coordination service once a task sets it; None after ``seconds`` (None: wait
    as long as the service lives), when the service is gone, or where there is none."""
    timeout_in_ms = 0 if seconds is None else max(1, int(seconds * 1000))
    try:
        return _eager_context.context().get_config_key_value(key, timeout_in_ms)
    except tf.errors.OpError:  # DeadlineExceeded; Unavailable once its chief is gone; FailedPrecondition: no service
        return None


@contextmanager
def function_graphs_collected() -> Iterator[list[Any]]:
    """Collect the graphs (``RunMetadata.FunctionGraphs``: before, after and partitioned) of the functions first
    instantiated inside; the list is filled on leaving. Collection costs only as a function is instantiated."""
    graphs: list[Any] = []
    runtime = _eager_context.context()
    runtime.enable_graph_collection()
    try:
        yield graphs
    finally:
        graphs += runtime.export_run_metadata().function_graphs
        runtime.disable_graph_collection()
