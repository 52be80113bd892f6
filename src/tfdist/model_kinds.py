"""The kinds of model tfdist trains (``model.kind``), one record each, as the strategies are.

Pure data: no TensorFlow. The config takes its choices from here, the layer
split's check and the runtime's thread and oneDNN defaults read a record
before TensorFlow starts, and :mod:`tfdist.train.architectures` builds the
layers the record names. No other module names a kind
(tests/train/test_model_kinds.py), so a kind is one record here and one
function of layers there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from tfdist.errors import InputError


class ModelKnobs(Protocol):
    """The ``model:`` knobs a record reads (:class:`tfdist.config.ModelConfig`)."""

    @property
    def hidden_units(self) -> list[int]: ...

    @property
    def builder(self) -> str: ...


@dataclass(frozen=True)
class ModelKind:
    """One kind of model.

    Attributes:
        name: its ``model.kind``.
        summary: what it is made of, in one line (docs and the config's help).
        layers: the function of :mod:`tfdist.train.architectures` that gives its fresh layers, from the
            flat pixels to the float32 class probabilities.
        weighted_layers: how many of its layers hold weights, for the ``model:`` knobs (None: known
            only once the model is built), so a layer split over too many devices is refused before
            TensorFlow starts.
        weighted_words: those layers in words, for that refusal.
        split_hint: what else the refusal suggests ("" for nothing).
        threads_per_op: what ``runtime.intra_op_threads: auto`` gives a training process: ``one``
            (ops too small to split across cores) or ``share`` (the process's CPUs shared among its replicas).
        onednn: whether ``runtime.onednn: auto`` turns TensorFlow's oneDNN kernels on for it.
        preloads_allocator: whether ``runtime.allocator: auto`` preloads jemalloc (or tcmalloc) for it, or
            keeps glibc's malloc (docs/performance/parallelism.md 8b and 8c: faster for the mlp's
            multi-worker step, slower for the convnet's at batch 256).
        takes_builder: whether it is the user's own, built by ``model.builder``.
    """

    name: str
    summary: str
    layers: str
    weighted_layers: Callable[[ModelKnobs], int | None]
    weighted_words: Callable[[ModelKnobs], str]
    split_hint: str
    threads_per_op: Literal["one", "share"]
    onednn: bool
    preloads_allocator: bool
    takes_builder: bool = False


KINDS: dict[str, ModelKind] = {kind.name: kind for kind in (
    ModelKind("mlp", "an MLP: the flat pixels -> Dense(relu) per model.hidden_units -> Dropout -> Dense(K, softmax)",
              layers="mlp_layers", weighted_layers=lambda model: len(model.hidden_units) + 1,
              weighted_words=lambda model: f"model.hidden_units {model.hidden_units} and the output",
              split_hint=" or add hidden layers", threads_per_op="one", onednn=False,
              preloads_allocator=True),
    ModelKind("cnn", "Keras's Simple MNIST convnet: Conv2D(32, 3) -> MaxPool -> Conv2D(64, 3) -> MaxPool -> Flatten "
                     "-> Dropout -> Dense(K, softmax)",
              layers="cnn_layers", weighted_layers=lambda model: 3,
              weighted_words=lambda model: "two convolutions and the output", split_hint="", threads_per_op="share",
              onednn=True, preloads_allocator=False),
    ModelKind("builder", "the user's own model: model.builder names package.module:function",
              layers="user_layers", weighted_layers=lambda model: None,
              weighted_words=lambda model: f"model.builder {model.builder}: a Sequential is its layers, any other model one",
              split_hint="", threads_per_op="share", onednn=True, preloads_allocator=False, takes_builder=True),
)}
#: ``model.kind``'s default: the seed's model.
DEFAULT_KIND = next(iter(KINDS))


def model_kind(name: str) -> ModelKind:
    """The record of ``model.kind`` ``name``.

    Raises:
        InputError: no kind of that name, naming the kinds there are.
    """
    try:
        return KINDS[name]
    except KeyError:
        raise InputError(f"model.kind {name!r} is not a kind of model; choose one of {', '.join(KINDS)}") from None
