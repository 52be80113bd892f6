"""What the stages hand each other, typed: one schema for the writer, every reader and the tests.

The train stage writes a :class:`TrainReport` per run (``reports/train/NAME.json``)
and its per-epoch history (``history/NAME.csv``); the evaluate stage an
:class:`EvalReport`. Reading is strict: a report with a field missing, an
unknown field, or a value of the wrong type is refused with the file and the
field named, so a reader never silently runs on a default.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tfdist.errors import InputError
from tfdist.files import atomic
from tfdist.hardware import Hardware, MachineNoise
from tfdist.records.measures import Ratio, measure
from tfdist.records.strict import build_record

T = TypeVar("T")

#: What one check of a train function's kernels found: each task's ops left to Eigen's kernel (op -> nodes), None for
#: a task whose finding never came (:class:`tfdist.train.kernels.KernelCheck`).
Findings = dict[str, dict[str, int] | None]


@dataclass(frozen=True)
class PrecisionSupport:
    """Whether a mixed precision can be faster than float32 where training ran, and why."""

    can_be_faster: bool
    reason: str


@dataclass(frozen=True)
class CollectiveCosts:
    """What an all-reduce cost between a cluster's workers where it trained: the projection's calibration.

    Measured after training by every worker together (:mod:`tfdist.train.collectives`):
    a 4-byte all-reduce gives the latency, a gradient-sized one the cost per byte.

    Attributes:
        workers: the workers that took part.
        small_bytes, small_seconds: the latency probe and its median time.
        large_bytes, large_seconds: the gradient-sized probe (the model's gradients) and its median time.
        latency_seconds: an all-reduce's fixed cost (the small probe's time).
        seconds_per_byte: what each further byte added.
        small_samples, large_samples: each probe's timings, one per call (their spread is the projection's;
            empty in reports written before they were kept).
        compute_seconds: one replica's step timed alone in a worker process, without a strategy: the same
            model, batch, precision and threads, no all-reduce and no distributed input (None in reports
            written before it was timed). The step less it and the all-reduce is the step's own overhead.
        compute_samples: its timings, one per call.
    """

    workers: int
    small_bytes: int
    small_seconds: float
    large_bytes: int
    large_seconds: float
    latency_seconds: float = field(metadata=measure(mlflow="allreduce_latency_ms", scale=1e3, better="lower"))
    seconds_per_byte: float = field(metadata=measure(mlflow="allreduce_ns_per_byte", scale=1e9, better="lower"))
    small_samples: list[float] = field(default_factory=list)
    large_samples: list[float] = field(default_factory=list)
    compute_seconds: float | None = field(default=None, metadata=measure(mlflow="compute_alone_ms", scale=1e3,
                                                                          better="lower"))
    compute_samples: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ThreadSettings:
    """What each training process of a run was given: the CPUs it could run on, TensorFlow's thread pools there.

    Attributes:
        cpus: CPUs the chief (or only) process could run on (its affinity: a pinned task has 1).
        intra_op: threads one op could use (``runtime.intra_op_threads``, ``auto`` resolved; 0: TensorFlow's choice).
        inter_op: ops that could run at once (0: TensorFlow's choice).
        onednn: whether TensorFlow ran oneDNN's kernels (``runtime.onednn``; None in reports written before it
            was recorded).
    """

    cpus: int
    intra_op: int
    inter_op: int
    onednn: bool | None = None


def _sync(synchronous: bool) -> str:
    return "sync" if synchronous else "async"


@dataclass(frozen=True)
class TrainReport:
    """What one training run did and cost (``reports/train/NAME.json``).

    Each measured field declares how MLflow logs it and how the comparison shows
    and compares it (:mod:`tfdist.records.measures`): a field added here, with its
    metadata, reaches the run's MLflow metrics, compare.json and the report's
    tables. A field added after reports were first written takes a default
    (None), so older reports still load, and show a dash.

    Attributes:
        name: the run name (``normal``, a strategy's name, or any plain name).
        strategy: the registry name of its strategy; ``paradigm`` its kind
            of parallelism (``none``, ``data``).
        strategy_class, replicas, devices, workers, ps, synchronous: what the
            strategy resolved to (:class:`tfdist.distribute.registry.StrategyInfo`).
        loop, precision, clip_method, clip_value, lr_scaling: the knobs that shaped the run.
        precision_can_be_faster: whether its precision has a faster unit here.
        precision_support: the same, for each mixed precision.
        run_label: its MLflow run name.
        global_batch_size, base_learning_rate, learning_rate, warmup_steps,
            steps_per_epoch: batch and optimiser as trained.
        epochs, resumed_at_epoch: epochs in the history; epochs restored from a backup.
        traces: times each step function was traced.
        steady_samples_per_second, steady_epoch_seconds, first_epoch_overhead_seconds: steady state
            (epochs after the first) and what the first cost more.
        train_seconds, samples_per_second: wall time of ``fit`` and mean throughput.
        startup_seconds: process start to ``fit`` (None where unknown).
        cpu_percent: mean CPU utilisation of the chief's machine while ``fit`` ran (% of all its cores).
        params_per_device, bytes_per_step, stages, micro_batches, bubble, bubble_theory:
            what a step holds and moves (:class:`tfdist.train.step_costs.Costs`).
        loss, accuracy, val_loss, val_accuracy: the last epoch's.
        weights_sha256: digest of the trained weights (equal digests: identical weights).
        mlflow_run_id: the run holding it in MLflow ("" when not tracked).
        tensorflow: TensorFlow's version.
        hardware: where training ran.
        collectives: the all-reduce's cost between the workers (synchronous
            multi-worker runs only; None elsewhere).
        threads: the CPUs and thread pools of its processes (None in reports
            written before it was recorded).
        machine: what else the machine did while it trained: steal, other programs (None in older reports).
        dataset: what it trained on, as :meth:`tfdist.data.prepared.DataSpec.describe` words it
            (``MNIST sample (28x28x1, 10 classes)``; "" in older reports).
        gradient_compression: the dtype its gradients crossed the wire in (``none``: their own;
            ``distributed.gradient_compression``, :mod:`tfdist.train.compression`).
        allocator: the C allocator its process ran with (``runtime.allocator``; ``system`` in older reports).
        input_share: the share of its training time the chief's steps waited for their batch (epochs after the
            first; None where not timed: one step per call, ParameterServer, older reports).
        profiled_steps, profiled_epoch: the steps its tasks captured in TensorFlow's profiler, and the epoch (1-based)
            they were in (0: not profiled; ``train.profile_steps``); its steady figures leave that epoch out.
        traced_step_ms, traced_compute_ms, traced_between_ops_ms, traced_wire_ms, traced_waiting_ms: a profiled
            synchronous cluster's step split from two workers' traces, the mean of ``traced_steps`` steady steps
            (:mod:`tfdist.train.trace_parts`; None elsewhere). The first four add up; the wait is the earlier
            worker's, for the later.
        kernel_checks: what each check of its train function's kernels found on each task: the ops oneDNN's pass
            left to Eigen's kernel (op -> nodes; None: the task's finding never came), the first check after the
            function's first call, one more after each retrace every task made together to be rid of them
            (:class:`tfdist.train.kernels.KernelCheck`; empty: not checked, oneDNN off or ParameterServer).
    """

    name: str
    strategy: str = field(metadata=measure(table="setup", heading="strategy", numeric=False))
    paradigm: str = field(metadata=measure(table="costs", heading="paradigm", numeric=False))
    strategy_class: str
    loop: str = field(metadata=measure(table="setup", heading="loop", numeric=False))
    precision: str = field(metadata=measure(table="setup", heading="precision", numeric=False))
    synchronous: bool = field(metadata=measure(table="setup", heading="sync", format=_sync))
    replicas: int = field(metadata=measure(table="setup", heading="replicas"))
    devices: list[str]
    workers: int
    ps: int
    precision_can_be_faster: bool
    precision_support: dict[str, PrecisionSupport]
    run_label: str
    clip_method: str
    clip_value: float
    global_batch_size: int = field(metadata=measure(mlflow="global_batch_size", table="setup", heading="global batch"))
    lr_scaling: str
    base_learning_rate: float
    learning_rate: float = field(metadata=measure(mlflow="effective_learning_rate", table="setup",
                                                  heading="learning rate", format="{:g}"))
    warmup_steps: int = field(metadata=measure(mlflow="warmup_steps"))
    epochs: int
    resumed_at_epoch: int = field(metadata=measure(mlflow="resumed_at_epoch"))
    steps_per_epoch: int
    traces: dict[str, int] = field(metadata=measure(mlflow="{key}_function_traces"))
    steady_samples_per_second: float = field(metadata=measure(
        mlflow="steady_samples_per_second", table="results", heading="samples/s", format="{:,.0f}", better="higher",
        headline="samples_per_second", ratio=Ratio("throughput_speedup", headline=True, samples="samples_per_second")))
    steady_epoch_seconds: float = field(metadata=measure(
        mlflow="steady_epoch_seconds", table="results", heading="s/epoch", format="{:.3f}", better="lower",
        ratio=Ratio("speedup", "speed-up vs normal", headline=True, samples="epoch_seconds")))
    first_epoch_overhead_seconds: float = field(metadata=measure(
        mlflow="first_epoch_overhead_seconds", table="results", heading="1st-epoch overhead (s)", format="{:.2f}",
        better="lower"))
    train_seconds: float = field(metadata=measure(
        mlflow="train_seconds", table="results", heading="train time (s)", format="{:.1f}", better="lower",
        ratio=Ratio("wall_speedup")))
    samples_per_second: float = field(metadata=measure(mlflow="samples_per_second", better="higher"))
    startup_seconds: float | None = field(metadata=measure(mlflow="startup_seconds", better="lower"))
    cpu_percent: float = field(metadata=measure(mlflow="cpu_percent", table="results", heading="CPU use",
                                                format="{:.0f}%"))
    params_per_device: list[int] = field(metadata=measure(
        mlflow="max_params_per_device", reduce=max, table="costs", heading="parameters per device", format="{:,}"))
    bytes_per_step: int = field(metadata=measure(mlflow="bytes_per_step", table="costs", heading="bytes moved per step",
                                                 format="{:,}", better="lower"))
    stages: int
    micro_batches: int = field(metadata=measure(table="costs", heading="micro-batches"))
    bubble: float | None = field(metadata=measure(mlflow="bubble", table="costs", heading="bubble measured",
                                                  format="{:.0%}", better="lower"))
    bubble_theory: float | None = field(metadata=measure(mlflow="bubble_theory", table="costs",
                                                         heading="bubble in theory", format="{:.0%}"))
    loss: float
    accuracy: float
    val_loss: float
    val_accuracy: float
    weights_sha256: str
    mlflow_run_id: str
    tensorflow: str
    hardware: Hardware
    collectives: CollectiveCosts | None = None
    threads: ThreadSettings | None = None
    machine: MachineNoise | None = None
    dataset: str = ""
    gradient_compression: str = "none"
    allocator: str = "system"
    input_share: float | None = field(default=None, metadata=measure(
        mlflow="input_share", table="results", heading="input wait", format="{:.0%}", better="lower"))
    profiled_steps: int = 0
    profiled_epoch: int = 0
    traced_step_ms: float | None = field(default=None, metadata=measure(
        mlflow="traced_step_ms", table="parts", heading="step (ms, traced)", format="{:.2f}", better="lower"))
    traced_compute_ms: float | None = field(default=None, metadata=measure(
        mlflow="traced_compute_ms", table="parts", heading="compute", format="{:.2f}", better="lower"))
    traced_between_ops_ms: float | None = field(default=None, metadata=measure(
        mlflow="traced_between_ops_ms", table="parts", heading="between ops", format="{:.2f}", better="lower"))
    traced_wire_ms: float | None = field(default=None, metadata=measure(
        mlflow="traced_wire_ms", table="parts", heading="the wire", format="{:.2f}", better="lower"))
    traced_waiting_ms: float | None = field(default=None, metadata=measure(
        mlflow="traced_waiting_ms", table="parts", heading="(the earlier worker waited)", format="{:.2f}",
        better="lower"))
    traced_steps: int = 0
    kernel_checks: list[Findings] = field(default_factory=list)

    @property
    def kernel_fallbacks(self) -> tuple[str, str]:
        """The kernels oneDNN's pass left to Eigen's, in words, at the first check and at the last ("" for none)."""
        if not self.kernel_checks:
            return "", ""
        return fallbacks_in_words(self.kernel_checks[0]), fallbacks_in_words(self.kernel_checks[-1])

    @property
    def disturbed(self) -> str:
        """What disturbed its machine while it trained, in words ("" where nothing did, or it was not recorded)."""
        return self.machine.what() if self.machine is not None else ""


@dataclass(frozen=True)
class ClassMetrics:
    """Precision, recall and support of one class on the test split."""

    precision: float
    recall: float
    support: int


@dataclass(frozen=True)
class EvalReport:
    """A model's results on the test split (``reports/eval/NAME.json``)."""

    name: str
    loss: float = field(metadata=measure(mlflow="test_loss", better="lower"))
    accuracy: float = field(metadata=measure(mlflow="test_accuracy", table="results", heading="test accuracy",
                                             format="{:.4f}", better="higher", headline="test_accuracy"))
    samples: int
    per_class: dict[str, ClassMetrics] = field(default_factory=dict)


def fallbacks_in_words(findings: Findings) -> str:
    """One check's fallbacks (task -> op -> nodes) in words: ``MaxPoolGrad x2 in worker-1``; "" for none."""
    return "; ".join(f"{', '.join(f'{op} x{n}' for op, n in ops.items())} in {task}"
                     for task, ops in findings.items() if ops)


def to_dict(report: Any) -> dict[str, Any]:
    """The report as JSON-ready data, fields in their declared order."""
    return dataclasses.asdict(report)


def write_report(path: Path | str, report: Any, *, outputs: atomic.Outputs | None = None) -> None:
    """Write a report atomically as indented JSON (with ``outputs``: staged there, with the others)."""
    atomic.write_json(path, to_dict(report), outputs=outputs)


def read_report(path: Path | str, kind: type[T]) -> T:
    """Read and check one report of dataclass ``kind``.

    Raises:
        InputError: the file is missing, not JSON, or does not match the schema
            (the field is named); the message says which stage to run.
    """
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{path} not found; run the stages that write it (dvc repro)") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path} is not valid JSON ({err}); rerun the stage that writes it") from None
    return from_dict(kind, data, str(path))


def from_dict(kind: type[T], data: Any, source: str) -> T:
    """Build dataclass ``kind`` from JSON data, checking every field (:func:`tfdist.config.build_record`).

    Raises:
        InputError: naming ``source``, the field, and that the stage which writes it should run again.
    """
    return build_record(kind, data, "", lambda problem: InputError(
        f"{source}: {problem}; rerun the stage that writes it (dvc repro)"), empty_strings=True)


@dataclass(frozen=True)
class TrainOutputs:
    """What the train stage writes: the report and the per-epoch history."""

    report: TrainReport
    history: list[dict[str, float]]
