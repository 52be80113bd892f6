"""Train and eval reports with the real schema, for the tests of what reads them (compare, render)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdist.compare.compute import build_comparison
from tfdist.hardware import Hardware
from tfdist.records.reports import EvalReport, PrecisionSupport, ThreadSettings, TrainReport, read_report
from tfdist.records.run_names import run_label

from helpers.devices import SPLIT_REPLICAS
from helpers.project import REPO


def default_labels() -> dict[str, str]:
    """The MLflow run names of the default pipeline's runs on this machine."""
    split = {"replicas": SPLIT_REPLICAS, "workers": 1, "ps": 0}
    scale = {"normal": {"replicas": 1, "workers": 1, "ps": 0}, "mirrored": split, "central_storage": split,
             "multi_worker_mirrored": {"replicas": 2, "workers": 2, "ps": 0},
             "parameter_server": {"replicas": 1, "workers": 2, "ps": 1}}
    return {name: run_label(name, strategy="default" if name == "normal" else name, loop="fit", precision="float32",
                            distributes=name != "normal", **counts) for name, counts in scale.items()}


#: A report the train stage wrote: the committed baseline's normal run (``dvc repro`` keeps it in the schema).
BASELINE_REPORT = REPO / "reports" / "train" / "normal.json"


def train_report(strategy: str, seconds: float, replicas: int = 1, devices: tuple | list = ("/cpu:0",),
                 **fields: Any) -> TrainReport:
    """A train report as the train stage writes it, for the readers' tests: the baseline's, with what they vary.

    Every field not set here is the baseline's (so a field the stage adds is
    in it); the numbers the readers compute from are set from ``seconds`` and
    ``replicas``, and ``fields`` override any field (``precision_support`` may
    be given as plain dicts). The hardware is one 2-core machine (1 thread per op), with
    GPUs when ``devices`` name them; no machine noise and no data set's name are recorded.
    """
    support = fields.pop("precision_support", {
        "mixed_float16": {"can_be_faster": False, "reason": "no GPU"},
        "mixed_bfloat16": {"can_be_faster": False, "reason": "no AVX512-BF16"}})
    kinds = ["GPU"] if any("gpu" in d for d in devices) else ["CPU"]
    values = dict(
        name=strategy if strategy != "default" else "normal", strategy=strategy, run_label=strategy,
        paradigm="none" if strategy in ("default", "one_device") else "data", replicas=replicas, devices=list(devices),
        workers=1, ps=0, synchronous=True,
        precision_support={p: PrecisionSupport(**s) if isinstance(s, dict) else s for p, s in support.items()},
        global_batch_size=25 * replicas, epochs=2, steps_per_epoch=100, train_seconds=seconds,
        samples_per_second=1000 / seconds, steady_epoch_seconds=seconds / 2, first_epoch_overhead_seconds=0.0,
        steady_samples_per_second=1000 / seconds, startup_seconds=5.0, cpu_percent=90.0,
        loss=0.3, accuracy=0.9, val_loss=0.3, val_accuracy=0.9, mlflow_run_id=f"id-{strategy}",
        hardware=Hardware(["host-a"], 2, "test CPU", kinds, ["test GPU"] * (kinds == ["GPU"])), machine=None,
        threads=ThreadSettings(2, 1, 2), dataset="",
    )
    return dataclasses.replace(read_report(BASELINE_REPORT, TrainReport), **{**values, **fields})


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
