"""What the train stage refuses at start, in one line: params a strategy cannot train with.

The facts come from the strategy's record (:mod:`tfdist.distribute.registry`);
the checks live here, beside the stage that calls them, so that neither the
registry nor the config has to know the other. Each runs before TensorFlow
is imported: a bad param fails in well under a second.
"""

from __future__ import annotations

from tfdist.config.knobs import Config, ModelConfig
from tfdist.distribute.registry import REGISTRY, StrategySpec, check_pipeline
from tfdist.errors import StrategyError
from tfdist.model_kinds import model_kind


def check_config(spec: StrategySpec, config: Config) -> None:
    """Refuse a combination of params ``spec`` cannot train.

    Raises:
        StrategyError: an unknown ``distributed.strategies`` entry; see :func:`check_precision`; a loop it does not
            train with; for a layer split, more devices than layers, XLA, or micro-batches that do not divide the batch.
    """
    check_pipeline(config.distributed.strategies)
    check_precision(spec, config.train.precision)
    check_compression(spec, config)
    if config.train.loop not in spec.loops:
        raise StrategyError(
            f"strategy {spec.name} needs train.loop {' or '.join(spec.loops)}, not {config.train.loop}: its "
            "GPipe step (micro-batches, accumulated gradients) replaces Keras's built-in train step; "
            f"set train.loop: {spec.loops[0]}"
        )
    if not spec.splits_layers:
        return
    layers = layers_with_weights(config.model)
    if layers is not None and config.distributed.devices > layers:
        raise too_few_layers(config.model, config.distributed.devices, layers)
    if config.train.jit_compile:
        raise StrategyError(
            f"train.jit_compile true: XLA compiles a step for one device, which would undo {spec.name}'s "
            "placement; set train.jit_compile: false"
        )
    if spec.pipelined and config.train.batch_size % config.distributed.micro_batches:
        raise StrategyError(
            f"distributed.micro_batches {config.distributed.micro_batches} does not divide train.batch_size "
            f"{config.train.batch_size}: GPipe cuts each batch into equal micro-batches; pick a divisor"
        )


def layers_with_weights(model: ModelConfig) -> int | None:
    """The layers with weights of ``model.kind`` (its record), known before TensorFlow starts.

    None for a builder's model: known once built (:func:`tfdist.train.models.build_model` checks it then).
    """
    return model_kind(model.kind).weighted_layers(model)


def too_few_layers(model: ModelConfig, devices: int, layers: int) -> StrategyError:
    """The one line for a layer split over more devices than the model has layers with weights."""
    kind = model_kind(model.kind)
    return StrategyError(
        f"distributed.devices {devices} > the {layers} layer(s) with weights of the model ({kind.weighted_words(model)}): "
        f"model and pipeline parallelism put whole layers on devices; lower distributed.devices{kind.split_hint}")


def check_compression(spec: StrategySpec, config: Config) -> None:
    """Refuse ``distributed.gradient_compression`` where a run would not all-reduce between processes.

    Checked for every listed strategy whichever one trains, so a pipeline that
    cannot apply it stops at its first training, normal's, not after it.

    Raises:
        StrategyError: naming the first strategy (this one, or a listed one) without such an all-reduce.
    """
    compression = config.distributed.gradient_compression
    if compression == "none":
        return
    names = [*([spec.name] if spec.distributes else []), *config.distributed.strategies]
    refused = next((name for name in names if not REGISTRY[name].all_reduces_between_processes), None)
    if refused is None:
        return
    able = [name for name, other in REGISTRY.items() if other.all_reduces_between_processes]
    raise StrategyError(
        f"distributed.gradient_compression {compression} compresses the gradients {', '.join(able)} all-reduces "
        f"between processes; {refused} has no such all-reduce to compress: list only {', '.join(able)} "
        f"(-S 'distributed.strategies=[{able[0]}]') or set distributed.gradient_compression: none")


def applied_compression(spec: StrategySpec, config: Config) -> str:
    """The dtype this run's gradients cross the wire in: ``none`` for normal training (the baseline) and any run
    without an all-reduce between processes (:func:`check_compression` refused those beforehand)."""
    return config.distributed.gradient_compression if spec.all_reduces_between_processes else "none"


def check_precision(spec: StrategySpec, precision: str) -> None:
    """Refuse a precision TensorFlow cannot train under ``spec``.

    Raises:
        StrategyError: mixed_float16 (which needs loss scaling) under a strategy
            whose variables are not copied per replica (tf_keras's
            LossScaleOptimizer refuses CentralStorage and ParameterServer).
    """
    if precision == "mixed_float16" and not spec.loss_scaling:
        able = [name for name, other in REGISTRY.items() if other.loss_scaling]
        raise StrategyError(
            f"train.precision mixed_float16 needs loss scaling, which TensorFlow supports only under "
            f"{', '.join(able)}, not {spec.name}; use mixed_bfloat16 (no loss scaling) or float32"
        )

