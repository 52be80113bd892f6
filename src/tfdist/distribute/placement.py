"""Model and pipeline parallelism: a model's layers placed on devices.

No ``tf.distribute`` strategy splits one model across devices, so the model
does it: each layer is wrapped in :class:`OnDevice`, which creates the
layer's variables and runs its ops on one device. Activations cross to the
next stage's device in the forward pass, their gradients cross back in the
backward pass (TensorFlow puts each gradient op with its forward op). The
math is one device's; only where it runs changes.
"""

from __future__ import annotations

from typing import Any

from tfdist.tf_imports import keras, tf


class OnDevice(keras.layers.Wrapper):
    """``layer`` with its variables and its computation on ``device``."""

    def __init__(self, layer: keras.layers.Layer, device: str, **kwargs: Any):
        super().__init__(layer, name=f"{layer.name}_on_{device.strip('/').replace(':', '')}",
                         dtype=layer.dtype_policy, **kwargs)
        self.device = device

    def build(self, input_shape: Any) -> None:
        with tf.device(self.device):
            self.layer.build(input_shape)
        super().build(input_shape)

    def call(self, inputs: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        with tf.device(self.device):
            return self.layer(inputs, training=training)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return self.layer.compute_output_shape(input_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "device": self.device}


def stage_of_layers(layers: int, stages: int) -> list[int]:
    """The stage of each of ``layers`` layers: contiguous groups, as even as possible, the first ones larger.

    >>> stage_of_layers(3, 2)
    [0, 0, 1]
    """
    if not 1 <= stages <= layers:
        raise ValueError(f"{layers} layers cannot fill {stages} stages")
    size, extra = divmod(layers, stages)
    return [stage for stage in range(stages) for _ in range(size + (stage < extra))]


def place(layers: list[keras.layers.Layer], holds_weights: list[bool], devices: list[str]) -> list[Any]:
    """``layers`` (input to output), each wrapped onto its stage's device.

    The layers holding weights are spread over the devices in contiguous
    stages (:func:`stage_of_layers`); a layer without weights (a reshape, a
    pooling, a dropout) runs where the one before it does, so a pooling stays
    with its convolution and the smaller activation is what crosses devices.
    """
    stages = stage_of_layers(sum(holds_weights), len(devices))
    placed, stage, seen = [], stages[0], 0
    for layer, weights in zip(layers, holds_weights, strict=True):
        if weights:
            stage, seen = stages[seen], seen + 1
        placed.append(OnDevice(layer, devices[stage]))
    return placed


def device_of(variable: Any) -> str:
    """The short device name a variable lives on (``/cpu:1``, ``/gpu:0``)."""
    spec = tf.DeviceSpec.from_string(variable.device)
    return f"/{(spec.device_type or 'cpu').lower()}:{spec.device_index or 0}"
