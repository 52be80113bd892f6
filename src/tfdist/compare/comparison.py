"""The comparison, typed: a row per run, the projection to more machines, the advice, and the whole.

Frozen records computed by :mod:`tfdist.compare.compute` and worded by
:mod:`tfdist.compare.advice`; :mod:`tfdist.compare.render` lays them out.
:func:`to_json` is the one place they become ``compare.json``'s dict (field
order kept: it is the file's key order).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tfdist.reports import CollectiveCosts, PrecisionSupport


@dataclass(frozen=True)
class RunRow:
    """One run's line of the comparison: its setup, its costs, and how it compares with normal training.

    Attributes:
        name ... run_label: copied from the run's :class:`~tfdist.reports.TrainReport` (same names and meaning),
            with ``clip`` its ``clip_method`` and ``samples_per_second`` its steady throughput.
        processes: "workers + ps" as one label ("2 + 1"), or the workers alone.
        given: the CPUs and op threads its processes were given, as one label
            ("2 CPUs, 2 threads per op"; "2 x 1 CPU, ..." for pinned workers).
        hosts, device_kinds, cpu_cores, shared_cpu: where it trained (:class:`~tfdist.hardware.Hardware`).
        max_params_per_device: the most parameters any one of its devices held.
        speedup: normal training's steady epoch time over this run's.
        wall_speedup: normal training's ``fit`` wall time over this run's.
        test_accuracy, test_loss: on the test split (the evaluate stage's).
        accuracy_delta_points: test accuracy against normal training's, in points.
        target_accuracy: ``compare.target_accuracy``.
        epochs_to_target, seconds_to_target: until validation accuracy first reached it (None: never).
        time_to_accuracy_speedup: normal training's seconds to the target over this run's (None: either never did).
    """

    name: str
    strategy: str
    paradigm: str
    strategy_class: str
    loop: str
    precision: str
    clip: str
    precision_can_be_faster: bool
    synchronous: bool
    replicas: int
    workers: int
    ps: int
    processes: str
    given: str
    devices: list[str]
    hosts: list[str]
    device_kinds: list[str]
    cpu_cores: int
    shared_cpu: bool
    global_batch_size: int
    learning_rate: float
    lr_scaling: str
    warmup_steps: int
    epochs: int
    train_seconds: float
    samples_per_second: float
    steady_epoch_seconds: float
    first_epoch_overhead_seconds: float
    startup_seconds: float | None
    cpu_percent: float
    params_per_device: list[int]
    max_params_per_device: int
    bytes_per_step: int
    stages: int
    micro_batches: int
    bubble: float | None
    bubble_theory: float | None
    speedup: float
    wall_speedup: float
    test_accuracy: float
    test_loss: float
    accuracy_delta_points: float
    mlflow_run_id: str
    run_label: str
    collectives: CollectiveCosts | None
    target_accuracy: float
    epochs_to_target: int | None
    seconds_to_target: float | None
    time_to_accuracy_speedup: float | None


@dataclass(frozen=True)
class Network:
    """The network between machines the projection assumes (``compare.network_gbit``, ``compare.network_latency_us``)."""

    gbit: float
    latency_us: float

    @property
    def seconds_per_byte(self) -> float:
        return 8 / (self.gbit * 1e9)


@dataclass(frozen=True)
class Projection:
    """One all-reducing run projected onto N machines: ``step(N) = compute + ring all-reduce(N)``.

    Attributes:
        name: the run.
        workers: the workers its all-reduce was calibrated between.
        step_ms, all_reduce_here_ms, compute_ms: its measured step, the all-reduce's share of it, the rest.
        gradient_bytes: what one all-reduce carries.
        normal_step_ms: normal training's step at the same per-replica batch.
        examples_per_machine: examples a worker takes per step.
        step_on_network_ms, projected_speedup: per machine count (as a string: a JSON key), the step on the
            assumed network and the speed against normal training.
        break_even_machines: the fewest machines that match normal training (None: never, or not within reach).
        ceiling_speedup: the speed-up however many machines (each adds 2 messages to every step).
    """

    name: str
    workers: int
    step_ms: float
    all_reduce_here_ms: float
    compute_ms: float
    gradient_bytes: int
    normal_step_ms: float
    examples_per_machine: float
    step_on_network_ms: dict[str, float]
    projected_speedup: dict[str, float]
    break_even_machines: int | None
    ceiling_speedup: float


@dataclass(frozen=True)
class Advice:
    """The answers, in words: what to use here, with more machines, which kind of parallelism, which precision."""

    use: str
    scale: str
    paradigms: str
    precision: str


@dataclass(frozen=True)
class Comparison:
    """Every run side by side (``normal`` first), the verdict, the advice and the projection (``compare.json``)."""

    verdict: str
    advice: Advice
    network: Network
    scaling: list[Projection]
    precision_support: dict[str, PrecisionSupport]
    cpu_count: int
    measured_on: str
    runs: dict[str, RunRow]

    @property
    def rows(self) -> list[RunRow]:
        """The runs in order, ``normal`` first."""
        return list(self.runs.values())


def to_json(comparison: Comparison) -> dict[str, Any]:
    """``comparison`` as compare.json holds it (nested records as dicts, in field order)."""
    return dataclasses.asdict(comparison)

