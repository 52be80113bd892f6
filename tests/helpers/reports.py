"""Train and eval reports with the real schema, for the tests of what reads them (compare, render)."""

from __future__ import annotations

from typing import Any

from tfdist.compare.compute import build_comparison
from tfdist.hardware import Hardware
from tfdist.records.reports import EvalReport, PrecisionSupport, ThreadSettings, TrainReport
from tfdist.records.run_names import run_label
from tfdist.tf_imports import tf

from helpers.devices import SPLIT_REPLICAS


def default_labels() -> dict[str, str]:
    """The MLflow run names of the default pipeline's runs on this machine."""
    split = {"replicas": SPLIT_REPLICAS, "workers": 1, "ps": 0}
    scale = {"normal": {"replicas": 1, "workers": 1, "ps": 0}, "mirrored": split, "central_storage": split,
             "multi_worker_mirrored": {"replicas": 2, "workers": 2, "ps": 0},
             "parameter_server": {"replicas": 1, "workers": 2, "ps": 1}}
    return {name: run_label(name, strategy="default" if name == "normal" else name, loop="fit", precision="float32",
                            distributes=name != "normal", **counts) for name, counts in scale.items()}


def train_report(strategy: str, seconds: float, replicas: int = 1, devices: tuple | list = ("/cpu:0",),
                 **fields: Any) -> TrainReport:
    """A train report with every field the train stage writes (the real schema), for the readers' tests.

    ``fields`` override any field; ``precision_support`` may be given as plain dicts.
    The hardware is one 2-core machine, with GPUs when ``devices`` name them.
    """
    support = fields.pop("precision_support", {
        "mixed_float16": {"can_be_faster": False, "reason": "no GPU"},
        "mixed_bfloat16": {"can_be_faster": False, "reason": "no AVX512-BF16"}})
    kinds = ["GPU"] if any("gpu" in d for d in devices) else ["CPU"]
    values = dict(
        name=strategy if strategy != "default" else "normal", strategy=strategy,
        paradigm="none" if strategy in ("default", "one_device") else "data", strategy_class="X", replicas=replicas,
        devices=list(devices), workers=1, ps=0, synchronous=True, loop="fit", precision="float32",
        precision_can_be_faster=True,
        precision_support={p: PrecisionSupport(**s) if isinstance(s, dict) else s for p, s in support.items()},
        run_label=strategy, clip_method="none", clip_value=1.0, global_batch_size=25 * replicas, lr_scaling="none",
        base_learning_rate=0.001, learning_rate=0.001, warmup_steps=0, epochs=2, resumed_at_epoch=0,
        steps_per_epoch=100, traces={"train": 1, "test": 1}, train_seconds=seconds,
        samples_per_second=1000 / seconds, steady_epoch_seconds=seconds / 2, first_epoch_overhead_seconds=0.0,
        steady_samples_per_second=1000 / seconds, startup_seconds=5.0, cpu_percent=90.0, params_per_device=[101_770],
        bytes_per_step=0, stages=1, micro_batches=1, bubble_theory=None, bubble=None, loss=0.3, accuracy=0.9, val_loss=0.3,
        val_accuracy=0.9, weights_sha256="0" * 64, mlflow_run_id=f"id-{strategy}", tensorflow=tf.__version__,
        hardware=Hardware(["host-a"], 2, "test CPU", kinds, ["test GPU"] * (kinds == ["GPU"])),
        threads=ThreadSettings(2, 1, 2),
    )
    values.update(fields)
    return TrainReport(**values)


def eval_report(name: str, accuracy: float, loss: float = 0.2) -> EvalReport:
    """An eval report as the evaluate stage writes it (per-class numbers left out)."""
    return EvalReport(name=name, loss=loss, accuracy=accuracy, samples=1000)


def scaled_runs(mirrored_sps, accuracy=0.95):
    """normal: 25 examples per 25 ms step; mirrored: 2 replicas; parameter_server: 2 workers at 500 samples/s."""
    normal = train_report("default", 10.0, steady_samples_per_second=1000.0, steady_epoch_seconds=5.0,
                          precision_support={"mixed_bfloat16": {"can_be_faster": True, "reason": "the CPU has avx512_bf16"},
                                             "mixed_float16": {"can_be_faster": False, "reason": "no GPU"}})
    mirrored = train_report("mirrored", 10.0, 2, ["/cpu:0", "/cpu:1"], steady_samples_per_second=mirrored_sps,
                            steady_epoch_seconds=5 * 1000 / mirrored_sps)
    ps = train_report("parameter_server", 30.0, 1, ["/job:worker/task:0"], workers=2, ps=1,
                      synchronous=False, steady_samples_per_second=500.0, steady_epoch_seconds=10.0)
    return build_comparison(
        {"normal": normal, "mirrored": mirrored, "parameter_server": ps},
        {"normal": eval_report("normal", 0.95, 0.2), "mirrored": eval_report("mirrored", accuracy),
         "parameter_server": eval_report("parameter_server", 0.95, 0.2)},
    )
