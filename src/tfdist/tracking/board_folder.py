"""The project's training runs as a TensorBoard folder: each run's per-epoch curves and its traces (``tfdist tensorboard``).

One folder per training run (``<run name>-<id>``): its per-epoch metrics as
TensorBoard scalars (written with TensorBoard's own event writer, without
TensorFlow), and the traces it logged with ``train.profile_steps``
(``profile/<task>/``, TensorBoard's layout: the Profile tab shows one run per
task). The folder is made 0700 and removed once served.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow

from tfdist.errors import InputError
from tfdist.tracking.store import redact

#: The per-epoch metrics shown as curves, where a run has them.
CURVES = ("loss", "accuracy", "val_loss", "val_accuracy", "epoch_seconds", "samples_per_second", "input_share")
#: Training runs gathered at most (the newest first).
MAX_RUNS = 200


@contextmanager
def gathered(uri: str, experiment: str, wanted: str | None, traces: str) -> Iterator[tuple[Path, list[Any], int]]:
    """A 0700 folder holding each training run's curves and traces (removed after), its runs, how many have traces
    (the runs' artifacts under ``traces``).

    Raises:
        InputError: no such experiment, no training run, or no run ``wanted``.
    """
    runs = training_runs(uri, experiment, wanted)
    logdir = Path(tempfile.mkdtemp(prefix="tfdist-tensorboard-"))
    try:
        traced = sum(gather_run(found, logdir / folder_name(found), traces) for found in runs)
        yield logdir, runs, traced
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def training_runs(uri: str, experiment: str, wanted: str | None) -> list[Any]:
    """The experiment's training runs (those with per-epoch ``loss``), newest first; or the one named ``wanted``."""
    mlflow.set_tracking_uri(uri)
    found = mlflow.MlflowClient().get_experiment_by_name(experiment)
    if found is None:
        raise InputError(f"mlflow.experiment {experiment}: no such experiment in {redact(uri)}; run the pipeline "
                         "first (dvc repro)")
    runs = mlflow.search_runs(experiment_ids=[found.experiment_id], filter_string="metrics.loss >= 0",
                              max_results=MAX_RUNS, output_format="list", order_by=["attributes.start_time DESC"])
    if wanted is not None:
        runs = [one for one in runs if wanted in (one.info.run_id, one.info.run_name)]
        if not runs:
            raise InputError(f"--run {wanted}: no training run of experiment {experiment} has that id or name; "
                             "tfdist ui lists them")
    if not runs:
        raise InputError(f"mlflow.experiment {experiment}: no training run yet; run the pipeline first (dvc repro)")
    return runs


def folder_name(run: Any) -> str:
    """The run's folder, so TensorBoard's run selector reads as the MLflow UI does: its name, then its id's start."""
    name = re.sub(r"[^\w.+-]+", "_", run.info.run_name or "run").strip("_")
    return f"{name}-{run.info.run_id[:8]}"


def gather_run(run: Any, folder: Path, traces: str) -> bool:
    """Write ``run``'s per-epoch metrics into ``folder`` as scalars and download its traces beside them; whether it
    had traces."""
    client = mlflow.MlflowClient()
    write_scalars(folder, {key: [(m.step, m.value, m.timestamp) for m in client.get_metric_history(run.info.run_id, key)]
                           for key in CURVES if key in run.data.metrics})
    if not client.list_artifacts(run.info.run_id, traces):
        return False
    mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=traces, dst_path=str(folder))
    return True


def write_scalars(folder: Path, curves: dict[str, list[tuple[int, float, int]]]) -> None:
    """One TensorBoard event file in ``folder`` with each curve's ``(step, value, ms timestamp)`` points."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(folder))
    try:
        for key, points in curves.items():
            for step, value, stamp in points:
                summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=key, simple_value=value)])
                writer.add_event(event_pb2.Event(wall_time=stamp / 1000 or time.time(), step=step, summary=summary))
    finally:
        writer.close()
