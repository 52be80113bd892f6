"""What each stage does, end to end: the stage scripts call one function here.

These functions join the pieces (data, strategy, training, evaluation,
reporting) with tracking, and return what the stage writes. Outputs that must
exist while the MLflow run is open (the saved model) are written here, atomically.
"""

from __future__ import annotations

import logging
import platform
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfdist import atomic
from tfdist.config import MIXED_PRECISIONS, Config, to_flat_dict
from tfdist.data import PreparedData, load_split, prepare, save_prepared, splits_digest, summarize
from tfdist.errors import InputError, Interrupted, RunError
from tfdist.reporting import build_comparison, read_history, read_json, run_label

if TYPE_CHECKING:
    from tfdist.cluster import ClusterTask
    from tfdist.resume import RunBackup

log = logging.getLogger(__name__)

#: Where training runs back up their state (outside DVC's outputs; gitignored).
DEFAULT_BACKUPS = Path(".tfdist/backups")


def preprocess(config: Config, prepared_dir: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """Prepare the configured source into ``prepared_dir``; return the data summary."""
    data: PreparedData = prepare(config.data, config.seed, cache_dir)
    save_prepared(data, prepared_dir)
    summary = summarize(data)
    log.info("prepared %s: %s", data.source, {k: v["total"] for k, v in summary["splits"].items()})
    return summary


def train(
    config: Config, strategy_name: str, name: str, prepared_dir: Path, model_dir: Path, launch: Sequence[str] = (),
    backups: Path = DEFAULT_BACKUPS,
) -> tuple[dict, list[dict]] | None:
    """Train one model under ``strategy_name`` as MLflow run ``name``.

    Every epoch is backed up under ``backups`` (see :mod:`tfdist.resume`): run
    again after a crash with the same params, training resumes where it stopped.

    Single-process strategies train here. The multi-process ones follow
    TF_CONFIG when it is set (cluster mode: this process is one task), else
    start a local cluster on loopback (local mode): ``launch`` is the command
    that runs this same stage as one task of it.

    Returns:
        The train report and the per-epoch history, for the process that must
        write the stage outputs; None for any other: a non-chief worker, or a
        local multi_worker_mirrored launcher whose chief worker wrote them.
    """
    from tfdist import cluster
    from tfdist.precision import check_supported
    from tfdist.strategies import MULTI_PROCESS_STRATEGIES, check_strategy_name, configure_threads

    strategy_name = check_strategy_name(strategy_name)
    check_supported(config.train.precision, strategy_name)
    task = cluster.read_tf_config()
    if not (task is None and strategy_name == "multi_worker_mirrored"):  # all but the MWMS launcher run TensorFlow
        configure_threads(config.runtime.intra_op_threads, config.runtime.inter_op_threads)
    if strategy_name not in MULTI_PROCESS_STRATEGIES:
        if task is not None:
            log.warning("%s is set but strategy %s runs in one process: ignoring it", cluster.TF_CONFIG, strategy_name)
        return _train_task(config, strategy_name, name, prepared_dir, model_dir, None, backups)
    if task is not None:
        cluster.check_cluster(task, strategy_name)
        log.info("cluster mode: this process is %s of %s", task.name, _describe_cluster(task.cluster))
        if strategy_name == "parameter_server" and task.task_type != "chief":
            cluster.serve(task)
            return None
        return _train_task(config, strategy_name, name, prepared_dir, model_dir, task, backups)
    return _launch_local(config, strategy_name, name, prepared_dir, model_dir, launch, backups)


def _launch_local(
    config: Config, strategy_name: str, name: str, prepared_dir: Path, model_dir: Path, launch: Sequence[str],
    backups: Path,
) -> tuple[dict, list[dict]] | None:
    """Local mode: start the cluster's tasks as processes on 127.0.0.1 and see them through.

    When a task dies, every task is stopped and the whole group starts again,
    up to ``distributed.max_restarts`` times; training resumes from the last
    backed-up epoch. Under parameter_server this process is the chief, so the
    stage restarts by executing itself anew (a TensorFlow runtime cannot join
    a second cluster).
    """
    from tfdist import cluster

    if not launch:
        raise InputError(f"strategy {strategy_name} without {cluster.TF_CONFIG} needs a launch command for its tasks")
    limit = config.distributed.max_restarts
    restart = cluster.restarts_done()
    while True:
        try:
            return _run_local_group(config, strategy_name, name, prepared_dir, model_dir, launch, backups)
        except Interrupted:
            raise
        except RunError as err:
            if restart >= limit:
                raise RunError(f"{err}\n(gave up after {restart} restart(s): distributed.max_restarts is {limit})") from None
            restart += 1
            log.warning("%s\nrestarting every task (restart %d of %d); training resumes from the last backed-up epoch",
                        err, restart, limit)
            if strategy_name == "parameter_server":
                cluster.restart_self(launch, restart)


def _run_local_group(
    config: Config, strategy_name: str, name: str, prepared_dir: Path, model_dir: Path, launch: Sequence[str],
    backups: Path,
) -> tuple[dict, list[dict]] | None:
    """One attempt of a local cluster: start its tasks, train, stop them all."""
    import tempfile

    from tfdist import cluster

    spec = cluster.local_cluster(strategy_name, config.distributed.workers, config.distributed.ps)
    log.info("local mode: starting %s on loopback for %s", _describe_cluster(spec), strategy_name)
    with tempfile.TemporaryDirectory(prefix="tfdist-scratch-") as scratch:
        try:
            with cluster.ProcessGroup() as group:
                for task in cluster.tasks_of(spec):
                    if task.task_type == "chief":
                        continue  # parameter_server: this process coordinates
                    env = {cluster.TF_CONFIG: task.to_tf_config(), cluster.SCRATCH_ENV: scratch}
                    group.start(task.name, launch, env, must_finish=strategy_name == "multi_worker_mirrored")
                if strategy_name == "multi_worker_mirrored":
                    group.wait()
                    log.info("all %d workers finished; worker-0 wrote the outputs", len(group.tasks))
                    return None
                group.watch()
                try:
                    chief = cluster.ClusterTask(spec, "chief", 0)
                    result = _train_task(config, strategy_name, name, prepared_dir, model_dir, chief, backups)
                except BaseException:
                    cluster.mute_native_stderr()
                    raise
                cluster.disconnect_remote()
                return result
        except BaseException as err:
            _close_chief_run(config, backups, name, "KILLED" if isinstance(err, Interrupted) else "FAILED")
            raise


def _close_chief_run(config: Config, backups: Path, name: str, status: str) -> None:
    """Close the MLflow run a stopped chief left RUNNING; its backup names the run."""
    from tfdist.resume import backups_of

    run_ids = [backup.run_id for backup in backups_of(backups, name) if backup.run_id]
    if not run_ids:
        return
    from tfdist import tracking

    tracking.configure(config.mlflow)
    for run_id in run_ids:
        if tracking.close_if_running(run_id, status):
            log.info("marked MLflow run %s %s: its chief was stopped before it could", run_id, status)


def _describe_cluster(spec: Mapping[str, list[str]]) -> str:
    return ", ".join(f"{len(addrs)} {job}{'s' if job == 'worker' and len(addrs) > 1 else ''}" for job, addrs in spec.items())


def _train_task(
    config: Config, strategy_name: str, name: str, prepared_dir: Path, model_dir: Path, task: ClusterTask | None,
    backups: Path,
) -> tuple[dict, list[dict]] | None:
    """Train in this process, as the only process or as one task of a cluster.

    The strategy is made first, before any TensorFlow op, so logical CPU
    devices can still be configured; the tracking store is checked before
    training so a bad URI fails in seconds. Only the chief (or the only
    process) tracks, saves and keeps the backup's state; another worker saves
    to a scratch folder.
    """
    from tfdist.resume import open_backup, run_key
    from tfdist.strategies import make_strategy

    resolver = task.resolver() if task is not None else None
    strategy, info = make_strategy(strategy_name, config.distributed.devices, resolver)
    if strategy_name == "multi_worker_mirrored" and task is not None:
        # MWMS installs TensorFlow's SIGTERM preemption notifier, which swallows the
        # signal; and unwinding mid-step would wait forever on an all-reduce the
        # peers never finish. A stopped worker dies at once; its launcher closes the run.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    train_split, val_split = load_split(prepared_dir, "train"), load_split(prepared_dir, "val")
    key = run_key(config, strategy_name, [prepared_dir / "train.npz", prepared_dir / "val.npz"])
    backup, stale = open_backup(backups, name, key)

    from tfdist.models import export_copy
    from tfdist.runtime import keras, tf
    from tfdist.training import Diverged, train_model, weights_digest

    if task is not None and not task.is_chief:
        result = train_model(config, strategy, info, train_split, val_split, backup=backup, record_backup=False)
        _save_scratch(task, name, weights_digest(result.model), result.history)
        return None

    from tfdist import tracking
    from tfdist.precision import announce, hardware_support

    tracking.configure(config.mlflow)
    _retire(stale)
    support = announce(config.train.precision)
    params = {**to_flat_dict(config), "strategy": info.to_dict(), "tensorflow": tf.__version__, "tf_keras": keras.__version__}
    tags = {
        "strategy": info.name, "stage": "train", "model_name": name, "synchronous": str(info.synchronous),
        "loop": config.train.loop, "precision": config.train.precision,
        "precision.can_be_faster": str(support.can_be_faster), "precision.hardware": support.reason,
        tracking.EXECUTION_TAG: tracking.execution_id(config),
    }
    title = run_label(name, info.name, info.replicas, info.workers, info.ps, config.train.loop, config.train.precision,
                      config.train.clip.method)
    # the sha256 reports/data.json gives, from the splits in memory (and the test split)
    data_sha256 = splits_digest({"train": train_split, "val": val_split, "test": load_split(prepared_dir, "test")})
    resumed_run_id = backup.run_id
    with tracking.start_run(title, params, tags, resume_run_id=resumed_run_id) as run_id:
        backup.save(mlflow_run_id=run_id, name=name, strategy=strategy_name, key=key)
        if run_id != resumed_run_id:  # a resumed run has its input already
            tracking.log_dataset(train_split.x, train_split.y, "mnist", data_sha256, source=str(prepared_dir.resolve()),
                                 context="training")
        try:
            result = train_model(config, strategy, info, train_split, val_split, [tracking.EpochMetricsLogger()], backup)
        except Diverged as err:
            tracking.set_tags({"diverged.epoch": err.epoch, "diverged.step": err.step})
            raise
        model = export_copy(result.model, config.model)
        digest = weights_digest(model)
        log.info("%s: final weights sha256 %s", task.name if task else name, digest)
        with atomic.atomic_path(model_dir) as tmp:
            tracking.save_model(
                model, tmp, train_split.x[:5], log_to_run=config.mlflow.log_models,
                register_as=config.mlflow.registered_model if config.mlflow.register_models else None,
                version_tags={"strategy": info.name, "run_name": name, "loop": config.train.loop,
                              "precision": config.train.precision},
            )
        summary = {
            "train_seconds": result.train_seconds,
            "samples_per_second": result.samples_per_second,
            "global_batch_size": result.global_batch_size,
            "effective_learning_rate": result.learning_rate,
            "warmup_steps": result.warmup_steps,
            "resumed_at_epoch": result.resumed_at_epoch,
            "steady_epoch_seconds": result.steady_epoch_seconds,
            "first_epoch_overhead_seconds": result.first_epoch_overhead,
            "steady_samples_per_second": result.steady_samples_per_second,
            **({"startup_seconds": result.startup_seconds} if result.startup_seconds is not None else {}),
            **{f"{kind}_function_traces": count for kind, count in result.traces.items()},
        }
        tracking.log_metrics(summary)
    backup.remove()
    report = {
        "name": name,
        **{k: v for k, v in info.to_dict().items() if k != "name"},
        "strategy": info.name,
        "loop": config.train.loop,
        "precision": config.train.precision,
        "precision_can_be_faster": support.can_be_faster,
        "precision_support": {
            p: {"can_be_faster": found.can_be_faster, "reason": found.reason}
            for p, found in ((p, hardware_support(p)) for p in MIXED_PRECISIONS)
        },
        "run_label": title,
        "clip_method": config.train.clip.method,
        "clip_value": config.train.clip.value,
        "global_batch_size": result.global_batch_size,
        "lr_scaling": config.train.lr_scaling,
        "base_learning_rate": config.train.learning_rate,
        "learning_rate": result.learning_rate,
        "warmup_steps": result.warmup_steps,
        "epochs": len(result.history),
        "resumed_at_epoch": result.resumed_at_epoch,
        "steps_per_epoch": result.steps_per_epoch,
        "traces": result.traces,
        "train_seconds": result.train_seconds,
        "samples_per_second": result.samples_per_second,
        "steady_epoch_seconds": result.steady_epoch_seconds,
        "first_epoch_overhead_seconds": result.first_epoch_overhead,
        "steady_samples_per_second": result.steady_samples_per_second,
        "startup_seconds": result.startup_seconds,
        **result.final(),
        "weights_sha256": digest,
        "mlflow_run_id": run_id,
        "tensorflow": tf.__version__,
        "host": platform.node(),
    }
    return report, result.history


def _retire(stale: list[RunBackup]) -> None:
    """Backups of this run name under other params: close their runs (never resumed) and delete them."""
    from tfdist import tracking

    for backup in stale:
        if backup.run_id and tracking.close_if_running(backup.run_id, "KILLED"):
            log.info("closed MLflow run %s as KILLED: it stopped before finishing and its params changed since",
                     backup.run_id)
        backup.remove()


def _save_scratch(task: ClusterTask, name: str, digest: str, history: list[dict]) -> None:
    """A non-chief worker's record: its final weights digest and history, outside the stage outputs."""
    import os
    import tempfile

    from tfdist import cluster

    root = os.environ.get(cluster.SCRATCH_ENV) or tempfile.mkdtemp(prefix="tfdist-scratch-")
    path = Path(root) / name / f"{task.name}.json"
    atomic.write_json(path, {"task": task.name, "weights_sha256": digest, "history": history})
    log.info("%s: final weights sha256 %s; not the chief, so saved only %s", task.name, digest, path)


def evaluate(config: Config, name: str, prepared_dir: Path, model_dir: Path, train_report: Path) -> tuple[dict, Any, Any]:
    """Evaluate model ``name`` on the test split and log the result onto its run.

    Returns:
        The eval report, the true labels and the predicted labels.
    """
    from tfdist import tracking
    from tfdist.evaluation import evaluate_model

    test = load_split(prepared_dir, "test")
    run_id = read_json(train_report).get("mlflow_run_id")
    tracking.configure(config.mlflow)
    model = tracking.load_model(model_dir)
    metrics, predicted = evaluate_model(model, test)
    if run_id:
        tracking.log_metrics({"test_loss": metrics["loss"], "test_accuracy": metrics["accuracy"]}, run_id=run_id)
    log.info("%s: test accuracy %.4f, loss %.4f on %d digits", name, metrics["accuracy"], metrics["loss"], len(test))
    return {"name": name, **metrics}, test.y, predicted


#: Per-epoch columns the compare stage gathers from every run for ``dvc plots``.
CURVE_COLUMNS = ("loss", "accuracy", "val_loss", "val_accuracy")
#: What ``dvc exp show`` lists per run (reports/compare/metrics.json): the numbers a decision rests on.
HEADLINE_METRICS = ("samples_per_second", "speedup", "test_accuracy")


def compare(config: Config, names: list[str], train_dir: Path, eval_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Compare runs ``names`` into ``out_dir`` and log a compare run linking them.

    Writes compare.json (everything), compare.md and compare.html (the same
    report), figures/, metrics.json (the headline numbers, for ``dvc exp
    show``) and curves.csv (every run's epochs, for ``dvc plots``).
    """
    from tfdist.report_pages import plot_figures, render_html, render_markdown

    train_reports = {n: read_json(train_dir / f"{n}.json") for n in names}
    eval_reports = {n: read_json(eval_dir / f"{n}.json") for n in names}
    histories = {n: read_history(train_dir / "history" / f"{n}.csv") for n in names}
    comparison = build_comparison(train_reports, eval_reports)
    with atomic.atomic_path(out_dir) as tmp:
        figures = plot_figures(comparison, histories, tmp / "figures")
        atomic.write_json(tmp / "compare.json", comparison)
        atomic.write_json(tmp / "metrics.json", {
            name: {key: round(row[key], 4) for key in HEADLINE_METRICS} for name, row in comparison["runs"].items()
        })
        curves = [{"run": name, **row, "epoch": int(row["epoch"])} for name in names for row in histories[name]]
        atomic.write_csv(tmp / "curves.csv", curves, ("run", "epoch", *CURVE_COLUMNS))
        atomic.write_text(tmp / "compare.md", render_markdown(comparison))
        atomic.write_text(tmp / "compare.html", render_html(comparison, tmp))
        _track_comparison(config, comparison, [tmp / f"compare.{kind}" for kind in ("json", "md", "html")], figures)
    log.info("%s", comparison["verdict"])
    return comparison


def _track_comparison(config: Config, comparison: dict, files: list[Path], figures: list[Path]) -> None:
    """The compare run: its report, its figures, and a link to every run it compared (tags and description)."""
    from tfdist import tracking

    experiment_id = tracking.configure(config.mlflow)
    runs = comparison["runs"]
    params = {"compared": ",".join(runs), "cpu_count": comparison["cpu_count"]}
    links = [
        f"- [{row['run_label']}](#/experiments/{experiment_id}/runs/{row['mlflow_run_id']}): "
        f"{row['speedup']:.2f}x, test accuracy {row['test_accuracy']:.4f}"
        for row in runs.values() if row["mlflow_run_id"]
    ]
    tags = {
        "stage": "compare",
        tracking.EXECUTION_TAG: tracking.execution_id(config),
        **{f"compared.{name}": row["mlflow_run_id"] for name, row in runs.items() if row["mlflow_run_id"]},
        "mlflow.note.content": "\n".join([comparison["verdict"], "", "Runs compared:", *links]),
    }
    with tracking.start_run("compare", params, tags):
        tracking.log_metrics({
            f"{name}.{key}": row[key]
            for name, row in runs.items()
            for key in ("train_seconds", "samples_per_second", "speedup", "test_accuracy")
        })
        tracking.log_artifacts(files)
        tracking.log_artifacts(figures, "figures")
