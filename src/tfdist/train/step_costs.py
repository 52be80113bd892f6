"""What a kind of distribution costs a step: parameters per device, bytes moved, and a pipeline's bubble.

Counted from the model's variables and the strategy's communication pattern
(:attr:`tfdist.distribute.registry.StrategySpec.communication`), so the compare report
can say what data, model and pipeline parallelism each pay, beside their
timings:

- data parallelism keeps the whole model on every replica and moves
  gradients (and variables) every step;
- model parallelism keeps each layer on one device and moves activations
  forward and their gradients back across each stage boundary; only one
  stage works at a time, so S stages idle (S-1)/S of the time;
- pipeline parallelism moves the same activations, in M micro-batches that
  keep the stages busy together; the idle share (the bubble) falls to
  (S-1)/(M+S-1), and :func:`measure_bubble` measures it.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfdist.config.knobs import Config
from tfdist.data.prepared import DataSpec
from tfdist.distribute.builders import StrategyInfo
from tfdist.distribute.placement import device_of
from tfdist.distribute.registry import StrategySpec
from tfdist.tf_imports import keras, tf
from tfdist.train.checks import applied_compression
from tfdist.train.collectives import gradient_bytes
from tfdist.train.models import accumulate_micro_batches

#: Timed repetitions of each stage and of the whole pipelined step (after warm-up), median taken.
_REPEATS = 30


@dataclass(frozen=True)
class Costs:
    """What one optimizer step of a run holds and moves.

    Attributes:
        params_per_device: parameters held on each device the model uses, in
            device order (a data-parallel replica holds them all).
        bytes_per_step: bytes sent between devices (or processes) per optimizer
            step, counted from tensor shapes and the strategy's pattern.
        stages: devices the model's layers are split over (1: not split).
        micro_batches: micro-batches per step (1: none).
        bubble_theory: the idle share a layer split implies, (S-1)/(M+S-1)
            (None when the model is not split).
        bubble: the idle share measured here (None when not split): 1 - the
            stages' busy time (each timed alone, x M) / (S x the pipelined step's time).
    """

    params_per_device: list[int]
    bytes_per_step: int
    stages: int = 1
    micro_batches: int = 1
    bubble_theory: float | None = None
    bubble: float | None = None


def step_costs(config: Config, data: DataSpec, spec: StrategySpec, info: StrategyInfo, model: keras.Model,
               global_batch: int) -> Costs:
    """The costs of a trained ``model`` (of ``data``'s images) under ``spec``; measures the bubble of a layer split."""
    variables = model.trainable_variables
    total = sum(int(np.prod(v.shape)) for v in variables)
    nbytes = gradient_bytes(model, applied_compression(spec, config))
    devices = max(1, info.replicas if spec.communication in ("reduce_to_one", "central") else info.workers)
    moved = {
        "none": 0,
        "reduce_to_one": 2 * (devices - 1) * nbytes,  # every other replica's gradients in, the result back out
        "central": 2 * devices * nbytes,  # every replica reads the variables and sends its gradients
        "ring": 2 * (devices - 1) * nbytes,  # ring all-reduce: 2(N-1)/N of the gradients from each of N workers
        "push_pull": 2 * nbytes,  # the stepping worker pulls the variables and pushes its gradients
    }
    if not spec.splits_layers:
        held = [total] * (len(info.devices) if spec.communication in ("reduce_to_one", "ring") else 1)
        return Costs(held, moved[spec.communication])
    per_device = {device: 0 for device in info.devices}
    for variable in variables:
        per_device[device_of(variable)] = per_device.get(device_of(variable), 0) + int(np.prod(variable.shape))
    stages = len(info.devices)
    micro_batches = spec.micro_batches(config.distributed.micro_batches)
    return Costs(
        params_per_device=[per_device[device] for device in info.devices],
        bytes_per_step=_activation_bytes(config, data, model, global_batch),
        stages=stages,
        micro_batches=micro_batches,
        bubble_theory=(stages - 1) / (micro_batches + stages - 1),
        bubble=measure_bubble(model, data, global_batch, micro_batches),
    )


def _activation_bytes(config: Config, data: DataSpec, model: keras.Model, global_batch: int) -> int:
    """Activations forward and their gradients back, across every stage boundary, for one global batch."""
    itemsize = 2 if config.train.precision.startswith("mixed") else 4  # activations in the compute dtype
    shape: Any = (None, data.features)
    crossing = 0
    for stage in _stage_layers(model)[:-1]:
        for layer in stage:
            shape = layer.compute_output_shape(shape)
        crossing += math.prod(int(d) for d in tuple(shape)[1:])
    return 2 * global_batch * crossing * itemsize


def measure_bubble(model: keras.Model, data: DataSpec, global_batch: int, micro_batches: int) -> float:
    """The measured idle share of a layer-split model's devices over one step's forward and backward passes.

    Three timings, each of one traced call, less the cost of calling an empty
    traced function: each stage alone working through the M micro-batches one
    after the other (its busy time), and the whole step as
    :class:`tfdist.train.models.PipelineClassifier` runs it (every micro-batch
    through every stage, gradients accumulated). The S devices were busy the
    stages' summed time out of S x the step's. The model's weights are not
    changed (no optimizer step).
    """
    groups = _stage_layers(model)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((global_batch, data.features), dtype=np.float32))
    y = tf.constant(rng.integers(0, data.classes, global_batch))
    loss = keras.losses.SparseCategoricalCrossentropy()
    overhead = _median_seconds(tf.function(lambda: tf.constant(0.0)))

    busy = 0.0
    inputs = tf.split(x, micro_batches)
    for layers in groups:
        variables = [v for layer in layers for v in layer.trainable_variables]

        @tf.function
        def stage_alone(pieces: list, layers: list = layers, variables: list = variables) -> list:
            outputs, carry = [], tf.constant(0.0)
            for piece in pieces:  # one after the other, as on a device that runs one op at a time
                with tf.GradientTape() as tape:
                    tape.watch(piece)
                    out = piece + tf.cast(0.0 * carry, piece.dtype)
                    for layer in layers:
                        out = layer(out, training=True)
                    total = tf.reduce_sum(out)
                gradients = tape.gradient(total, [piece, *variables])
                carry = tf.reduce_sum(gradients[0])
                outputs.append(out)
            return outputs

        busy += max(0.0, _median_seconds(stage_alone, inputs) - overhead)
        inputs = stage_alone(inputs)

    @tf.function
    def pipelined_step(x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        gradients, _ = accumulate_micro_batches(lambda piece_x, piece_y: (
            loss(piece_y, model(piece_x, training=True)) / micro_batches, None), x, y, micro_batches,
            model.trainable_variables)
        return gradients

    step = max(1e-9, _median_seconds(pipelined_step, x, y) - overhead)
    return float(min(1.0, max(0.0, 1.0 - busy / (len(groups) * step))))


def _stage_layers(model: keras.Model) -> list[list[keras.layers.Layer]]:
    """The model's placed layers grouped by device, in order (consecutive layers on one device form a stage)."""
    groups: list[list[Any]] = []
    last = None
    for layer in _placed(model):
        if layer.device != last:
            groups.append([])
            last = layer.device
        groups[-1].append(layer)
    return groups


def _placed(model: keras.Model) -> list[Any]:
    """The model's :class:`tfdist.distribute.placement.OnDevice` layers in the order a batch goes through them."""
    if hasattr(model, "stack"):  # the subclassed models hold their layers in order
        return list(model.stack)
    return [layer for layer in model.layers if hasattr(layer, "device") and hasattr(layer, "layer")]


def _median_seconds(function: Any, *args: Any) -> float:
    for _ in range(3):  # trace and warm up
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, function(*args))
    times = []
    for _ in range(_REPEATS):
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, function(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)
