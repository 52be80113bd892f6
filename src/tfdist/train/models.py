"""The model of ``model.kind`` (:mod:`tfdist.train.architectures`), as Keras's Sequential
(``train.loop: fit``) or as a subclassed model with its own train and test steps
(``train.loop: custom``).

Both have the same layers in the same order, so their weights are
interchangeable: whatever trained it, the saved model is the Sequential one.
The last layer always computes in float32, so that under a mixed-precision
policy the softmax and the loss stay accurate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from tfdist.config.knobs import ClipConfig, ModelConfig, TrainConfig
from tfdist.data.prepared import DataSpec
from tfdist.distribute.placement import place
from tfdist.tf_imports import keras, tf
from tfdist.tf_private import create_optimizer_slots, runs_steps_in_one_function, train_function_reading_metrics_last, untracked
from tfdist.train.architectures import layer_stack, weighted
from tfdist.train.checks import too_few_layers
from tfdist.train.compression import compress_gradients
from tfdist.train.precision import policy

#: Each optimizer twice: tf_keras's original ("legacy") one, whose update is one fused
#: kernel per variable (``ResourceApplyAdam``...), and the newer one, a dozen small ops per
#: variable. At small batches a step is bound by per-op overhead, so the fused one trains
#: faster (docs/performance.md) and is used, with the same algorithm and
#: arguments, unless gradients are clipped: the original optimizers refuse clipping under
#: CentralStorage and ParameterServer, the newer ones clip under every strategy.
_OPTIMIZERS = {
    "adam": (keras.optimizers.legacy.Adam, keras.optimizers.Adam),
    "sgd": (keras.optimizers.legacy.SGD, keras.optimizers.SGD),
    "rmsprop": (keras.optimizers.legacy.RMSprop, keras.optimizers.RMSprop),
}


class ReadsMetricsOncePerExecution(keras.Model):
    """A model whose ``fit`` reads its metrics once per call into the runtime, not after every step.

    ``fit`` runs ``train.steps_per_execution`` steps per call and hands the
    callbacks the last step's logs only, yet tf_keras reads every metric after
    every step; under MultiWorkerMirrored each read is an all-reduce between
    the workers (four a step for loss and accuracy), which cost more than the
    gradients' own (docs/performance.md). Here the steps before the last update the
    metrics without reading them, and the last reads them: the same logs.
    """

    _reads_metrics = True
    _input_waited: Any = None
    train_function: Any  # Keras's, until make_train_function sets it

    def make_train_function(self, force: bool = False) -> Any:
        if (self.train_function is not None and not force) or not runs_steps_in_one_function(self):
            return super().make_train_function(force)
        self.train_function = train_function_reading_metrics_last(self, self._reading_metrics, self._input_waited)
        return self.train_function

    @untracked
    def time_input_waits(self, waited: Any) -> None:
        """Add the seconds each training step waits for its batch to ``waited`` (a float64 variable made outside
        the strategy's scope; not a weight): the input's share of the step (:class:`tfdist.train.callbacks.InputWait`)."""
        self._input_waited = waited

    @contextlib.contextmanager
    def _reading_metrics(self, read: bool) -> Iterator[None]:
        """Whether the steps traced in the block read the metrics (the default) or only update them."""
        self._reads_metrics = read
        try:
            yield
        finally:
            self._reads_metrics = True

    def compute_metrics(self, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> dict[str, Any]:
        if self._reads_metrics:
            return super().compute_metrics(x, y, y_pred, sample_weight)
        self.compiled_metrics.update_state(y, y_pred, sample_weight)
        return {}


class FitSequential(ReadsMetricsOncePerExecution, keras.Sequential):
    """The Sequential model as ``fit`` trains it; what is saved is a plain Sequential (:func:`export_copy`)."""


def build_sequential(config: ModelConfig, data: DataSpec, devices: list[str] | None = None,
                     kind: type[keras.Sequential] = keras.Sequential, exported: bool = False) -> keras.Model:
    """The layers of ``model.kind`` for ``data``, after an image's flat pixels, as a ``kind`` of Sequential.

    Call inside ``strategy.scope()`` so the variables are created by the strategy.
    With ``devices``, the layers are split over them (model parallelism);
    ``exported``: the model that is saved (:func:`tfdist.train.architectures.layer_stack`).
    """
    layers = layer_stack(config, data, exported) if exported else _layers(config, data, devices)
    return kind([keras.Input(shape=(data.features,), name="pixels"), *layers], name=config.kind)


def build_model(config: ModelConfig, data: DataSpec, loop: str, devices: list[str] | None = None,
                micro_batches: int = 1, pipelined: bool = False) -> keras.Model:
    """The model of ``model.kind`` for ``loop``: Sequential for ``fit``, :class:`CustomLoopClassifier` for ``custom``.

    ``devices`` splits its layers over them; ``pipelined`` (with ``devices``)
    makes it a :class:`PipelineClassifier` cutting each batch into ``micro_batches``.
    """
    if loop == "custom":
        model = (PipelineClassifier(config, data, devices, micro_batches) if pipelined else
                 CustomLoopClassifier(config, data, devices))
        model.build((None, data.features))
        return model
    return build_sequential(config, data, devices, FitSequential)


def _layers(config: ModelConfig, data: DataSpec, devices: list[str] | None) -> list[keras.layers.Layer]:
    """The kind's layers, the output last, placed on ``devices`` if given.

    Raises:
        StrategyError: more devices than layers with weights (a builder's model is
            known only once built, which fixes TensorFlow's devices: checked here).
    """
    stack = layer_stack(config, data)
    if not devices:
        return stack
    holds_weights = weighted(stack, data)
    if len(devices) > sum(holds_weights):
        raise too_few_layers(config, len(devices), sum(holds_weights))
    return place(stack, holds_weights, devices)


class MaxMetric(keras.metrics.Metric):
    """The largest value seen since the last reset.

    Under several replicas it reports the first replica's maximum: TensorFlow
    has no MAX aggregation for per-replica metric variables.
    """

    def __init__(self, name: str, **kwargs: Any):
        super().__init__(name=name, **kwargs)
        self.maximum = self.add_weight(
            name="maximum", initializer="zeros", aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
        )

    def update_state(self, value: tf.Tensor, sample_weight: Any = None) -> None:
        self.maximum.assign(tf.maximum(self.maximum, tf.cast(value, self.dtype)))

    def result(self) -> tf.Tensor:
        return tf.identity(self.maximum)


class CustomLoopClassifier(ReadsMetricsOncePerExecution):
    """The model of ``model.kind``, subclassed: ``call`` drives Dropout, and the steps are its own.

    ``train_step`` follows the custom-training-loop recipe: forward pass under a
    ``GradientTape``, loss scaled and gradients unscaled when the optimizer is a
    LossScaleOptimizer (mixed_float16), then ``apply_gradients``, where the
    optimizer combines the replicas' gradients, clips them (``train.clip``) and,
    under loss scaling, skips a step whose gradients are not finite. Each step
    also measures the gradients' global norm before clipping (this replica's,
    unscaled), reported per epoch as ``gradient_norm`` (mean) and
    ``gradient_norm_max``, so ``train.clip.value`` can be chosen from data;
    ``nonfinite_steps`` counts steps whose gradients held inf or NaN.
    """

    def __init__(self, config: ModelConfig, data: DataSpec, devices: list[str] | None = None, **kwargs: Any):
        super().__init__(name="digit_classifier", **kwargs)
        self.stack = _layers(config, data, devices)
        self._hold_untracked((
            keras.metrics.Mean(name="gradient_norm"),
            MaxMetric(name="gradient_norm_max"),
            keras.metrics.Sum(name="nonfinite_steps"),
        ))

    @untracked
    def _hold_untracked(self, step_metrics: tuple) -> None:
        # Listed by `metrics` rather than tracked: tracked metrics would count among
        # the model's weights, and ParameterServer's exact evaluation refuses models
        # carrying metrics of their own.
        self._step_metrics = step_metrics

    _evaluating = False

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """Keras's metrics (loss, compiled ones) and, while training, the train step's own; Keras resets them every epoch."""
        return [*super().metrics, *(() if self._evaluating else self._step_metrics)]

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluate (``fit``'s validation too) with the loss and the compiled metrics only.

        tf_keras reads the metrics again across workers once the loop is done
        only when the step's results name exactly :attr:`metrics`; otherwise it
        keeps the last step's results, which it sums over the replicas, so under
        MultiWorkerMirrored validation accuracy came out as the sum of every
        worker's (1.8 for two). Leaving the train step's own metrics out of
        :attr:`metrics` here keeps the names equal.
        """
        self._evaluating = True
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self._evaluating = False

    def call(self, inputs: tf.Tensor, training: bool = False) -> tf.Tensor:
        x = inputs
        for layer in self.stack:
            x = layer(x, training=training)
        return x

    def train_step(self, data: tuple) -> dict[str, tf.Tensor]:
        x, y = data
        scaling = isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer)
        with tf.GradientTape() as tape:
            predictions = self(x, training=True)
            loss = self.compute_loss(x, y, predictions)
            scaled_loss = self.optimizer.get_scaled_loss(loss) if scaling else loss
        variables = self.trainable_variables
        gradients = tape.gradient(scaled_loss, variables)
        if scaling:
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.apply_and_measure(gradients, variables)
        return self.compute_metrics(x, y, predictions, sample_weight=None)

    def apply_and_measure(self, gradients: list[tf.Tensor], variables: list[tf.Variable]) -> None:
        """Apply unscaled ``gradients``, recording their global norm and whether it was finite."""
        norm = tf.linalg.global_norm(gradients)
        finite = tf.math.is_finite(norm)
        self.optimizer.apply_gradients(zip(gradients, variables, strict=True))
        mean_norm, max_norm, nonfinite = self._step_metrics
        mean_norm.update_state(tf.where(finite, norm, 0.0), sample_weight=tf.cast(finite, tf.float32))
        max_norm.update_state(tf.where(finite, norm, 0.0))
        nonfinite.update_state(1.0 - tf.cast(finite, tf.float32))

    def test_step(self, data: tuple) -> dict[str, tf.Tensor]:
        x, y = data
        predictions = self(x, training=False)
        self.compute_loss(x, y, predictions)
        self.compute_metrics(x, y, predictions, sample_weight=None)
        return {m.name: m.result() for m in self.metrics}


class PipelineClassifier(CustomLoopClassifier):
    """The model split into stages on devices, trained GPipe style (pipeline parallelism).

    Each global batch is cut into ``micro_batches`` equal pieces. For each, a
    forward and a backward pass; the gradients add up, and one optimizer step
    applies them (synchronous: the same update as the whole batch's). The
    micro-batch loop is unrolled in one traced function, and a micro-batch's
    stage-1 ops do not depend on the previous one's stage-2 ops, so
    TensorFlow's executor runs stage 1 of micro-batch i+1 while stage 2 works
    on micro-batch i: the pipeline. What stays idle while it fills and drains
    is the bubble, (S-1)/(M+S-1) of the time for S stages and M micro-batches.
    """

    def __init__(self, config: ModelConfig, data: DataSpec, devices: list[str] | None, micro_batches: int,
                 **kwargs: Any):
        super().__init__(config, data, devices, **kwargs)
        self.micro_batches = micro_batches

    def train_step(self, data: tuple) -> dict[str, tf.Tensor]:
        x, y = data
        scaling = isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer)
        variables = self.trainable_variables

        def piece_loss(piece_x: tf.Tensor, piece_y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            piece = self(piece_x, training=True)
            loss = self.compute_loss(piece_x, piece_y, piece) / self.micro_batches
            return (self.optimizer.get_scaled_loss(loss) if scaling else loss), piece

        accumulated, predictions = accumulate_micro_batches(piece_loss, x, y, self.micro_batches, variables)
        if scaling:
            accumulated = self.optimizer.get_unscaled_gradients(accumulated)
        self.apply_and_measure(accumulated, variables)
        return self.compute_metrics(x, y, tf.concat(predictions, axis=0), sample_weight=None)


def accumulate_micro_batches(piece_loss: Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, Any]], x: tf.Tensor,
                             y: tf.Tensor, micro_batches: int, variables: list[tf.Variable]) -> tuple[list[Any], list[Any]]:
    """GPipe's step: the batch cut into ``micro_batches``, each one's gradients of ``piece_loss`` added up.

    ``piece_loss(x_piece, y_piece)`` gives a micro-batch's loss (its mean over
    ``micro_batches``, so the pieces add up to the batch's mean) and its outputs.

    Returns:
        The summed gradients of ``variables``, and each micro-batch's outputs in order.
    """
    accumulated: list[Any] = []
    outputs = []
    for piece_x, piece_y in zip(tf.split(x, micro_batches), tf.split(y, micro_batches), strict=True):
        with tf.GradientTape() as tape:
            loss, output = piece_loss(piece_x, piece_y)
        gradients = tape.gradient(loss, variables)
        accumulated = [a + g for a, g in zip(accumulated, gradients, strict=True)] if accumulated else list(gradients)
        outputs.append(output)
    return accumulated, outputs


def compile_model(model: keras.Model, config: TrainConfig, learning_rate: Any, compression: str = "none",
                  **options: Any) -> None:
    """Attach optimizer, loss and accuracy; also inside ``strategy.scope()``.

    ``learning_rate`` is a float or a Keras learning-rate schedule; ``options``
    go to ``compile`` as they are (e.g. ``pss_evaluation_shards``). Clipping is
    the optimizer's own, so both loops clip the same way: after the replicas'
    gradients are combined and, under loss scaling, unscaled. Under a
    mixed_float16 policy ``compile`` wraps the optimizer in a LossScaleOptimizer.
    ``compression``: the dtype the replicas' gradients are all-reduced in
    (:mod:`tfdist.train.compression`; ``none``: their own).
    """
    fused, general = _OPTIMIZERS[config.optimizer]
    optimizer = (fused if config.clip.method == "none" else general)(learning_rate=learning_rate,
                                                                     **clip_options(config.clip))
    compress_gradients(optimizer, compression)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=config.steps_per_execution,
        jit_compile=config.jit_compile,
        **options,
    )
    # Create the optimizer's slots now: created inside the first step instead,
    # they make tf.function trace the step twice for one input signature.
    create_optimizer_slots(model.optimizer, model.trainable_variables)


def clip_options(clip: ClipConfig) -> dict[str, float]:
    """Optimizer arguments for ``train.clip``: Keras clips with exactly the three tf ops."""
    argument = {"global_norm": "global_clipnorm", "norm": "clipnorm", "value": "clipvalue"}.get(clip.method)
    return {argument: clip.value} if argument else {}


def export_copy(model: keras.Model, config: ModelConfig, data: DataSpec) -> keras.Model:
    """The trained weights in a fresh model built outside any strategy.

    What gets saved and evaluated: it loads anywhere, and predicting with it
    needs no other worker (under MultiWorkerMirrored, ``predict`` on the
    distributed model is a collective every worker must join). Built in
    float32 whatever the training precision: the variables were float32 anyway.
    """
    with policy("float32"):
        copy = build_sequential(config, data, exported=True)
    copy.set_weights(trained_weights(model))
    return copy


def trained_weights(model: keras.Model) -> list[Any]:
    """The learned parameters as arrays, in layer order, the same for both loops.

    Not ``get_weights()``: a subclassed model also counts the state of the
    metrics it holds as attributes (gradient norms) among its weights.
    """
    return [variable.numpy() for variable in model.trainable_weights]
