"""What every stage command shares: --params/--set, logging, and exit codes.

Exit codes follow the stage contract: 0 success; 2 a usage or configuration
error, one line on stderr naming the key or path; 1 a failure while running.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import shutil
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from tfdist import crash_points, native_logs
from tfdist.errors import InputError, Interrupted, TaskFailed, TfdistError
from tfdist.files import atomic, disk


def program(name: str) -> str | None:
    """The executable ``name`` beside this Python (the venv's: dvc, weed), else on PATH, else None."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if os.access(beside, os.X_OK) else shutil.which(name)


def required_program(name: str, fix: str) -> str:
    """:func:`program` ``name``, or InputError "NAME is not on PATH; FIX"."""
    found = program(name)
    if found is None:
        raise InputError(f"{name} is not on PATH; {fix}")
    return found


def run_stage(command: click.Command) -> None:
    """Run a pipeline stage's command, then end its process without the interpreter's teardown.

    Once a stage has written its outputs and Python has run its exit work
    (non-daemon threads joined, every ``atexit`` handler registered after this
    call: MLflow's, TensorFlow's), what is left is tearing down the modules and
    TensorFlow's C++ runtime, seconds of every process that loaded TensorFlow
    (docs/performance.md, "Start-up"). A distributed run also keeps its
    training input's iterators, whose destruction stalls for seconds
    (:func:`tfdist.tf_private.inputs_kept_alive`). The process
    ends with the stage's exit code at that point, after stdout and stderr are
    flushed and the native-log filter has passed on everything.
    """
    exit_code = [1]  # an uncaught exception: Python prints the traceback, exit 1
    atexit.register(_end_now, exit_code)
    native_logs.end_without_teardown()
    try:
        command()
    except SystemExit as stop:
        exit_code[0] = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        raise


def _end_now(exit_code: list[int]) -> None:
    logging.shutdown()  # registered before this handler, so it would not run
    native_logs.exit_now(exit_code[0])


def config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--params PATH`` and repeatable ``--set dotted.key=value``."""
    command = click.option(
        "--set", "overrides", multiple=True, metavar="KEY=VALUE",
        help="Override a param for this run, e.g. --set train.epochs=3 (value parsed as YAML; repeatable).",
    )(command)
    return click.option(
        "--params", "params_path", type=click.Path(path_type=Path), default="params.yaml", show_default=True,
        help="The params file holding every knob.",
    )(command)


@contextlib.contextmanager
def stage_errors() -> Iterator[None]:
    """Turn user and run errors into one stderr line and the contract's exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True)
    # TensorFlow's own INFO lines (one per all-reduce, per closure) drown the stage's.
    for noisy in ("tensorflow", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # A tracking store that does not answer: tfdist.tracking.outage says so once, not per retried request.
    for noisy in ("urllib3.connectionpool", "mlflow.system_metrics.system_metrics_monitor"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # MLflow logs each database error with its traceback before raising it; the raised one is reported here.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    # Warnings ParameterServer training gives for what it is meant to do here: in-memory per-worker
    # datasets, and a backup each epoch (whose saver TensorFlow traces anew, and calls that retracing).
    logging.getLogger("tensorflow").addFilter(_not_parameter_server_noise)
    logging.getLogger("tensorflow").addFilter(_coordinator_errors_on_one_line)
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options across serialization")
    # SIGTERM (a scheduler, a launcher stopping its tasks) unwinds like Ctrl-C: the
    # MLflow run is closed and temporary outputs are removed on the way out.
    signal.signal(signal.SIGTERM, _raise_interrupted)
    crash_points.arm_crash_points()
    try:
        yield
    except KeyboardInterrupt:
        click.echo("error: interrupted by SIGINT", err=True)
        raise click.exceptions.Exit(128 + signal.SIGINT) from None
    except (TfdistError, Interrupted, TaskFailed) as err:  # TaskFailed: raised as its group was being left
        # The error line is the last word: a coordinator's threads still logging the same loss (a lost ps's
        # closures, "UnavailableError …") would otherwise print after it, under load.
        logging.getLogger("tensorflow").setLevel(logging.CRITICAL)
        click.echo(f"error: {err}", err=True)
        if err.exit_at_once:
            native_logs.exit_now(err.exit_code)
        raise click.exceptions.Exit(err.exit_code) from None
    except Exception as err:  # a full or read-only disk met outside tfdist's own writes (MLflow's, TensorFlow's)
        exit_code = _disk_trouble(err)
        if exit_code is None:
            raise
        what = disk.disk_full_line(err) if exit_code == 1 else str(err)
        if "database or disk is full" in what and "mlflow" in sys.modules:  # SQLite's words: the tracking store's disk
            what = f"mlflow.tracking_uri {sys.modules['mlflow'].get_tracking_uri()}: {what}"
        click.echo(f"error: {what}; free some space or make the folder writable, and run again", err=True)
        raise click.exceptions.Exit(exit_code) from None


def stage_started(*outputs: Path) -> None:
    """What every stage does once its params are read: remove what a killed run left of its ``outputs``, then go on.

    The staging folders of ``outputs`` no living process holds are swept
    (:func:`tfdist.files.atomic.sweep_staging`); then the ``start`` crash point.
    """
    atomic.sweep_staging(*outputs)
    crash_points.crash_point("start")


def _disk_trouble(err: Exception) -> int | None:
    """The exit code for a disk that filled (1) or cannot be written (2); None for any other error (a bug: traceback)."""
    if disk.is_disk_full(err):
        return 1
    if isinstance(err, OSError) and err.errno == errno.EROFS:
        return 2
    return None


def _not_parameter_server_noise(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.startswith("Found source dataset of type")
                or ("MultiDeviceSaver.save" in message and "triggered tf.function retracing" in message))


def _coordinator_errors_on_one_line(record: logging.LogRecord) -> bool:
    """A parameter_server coordinator's report of a failed remote step, in one line instead of twenty.

    Its first line says where, the first UNAVAILABLE or connection line says why;
    the stack of graph nodes between says nothing a user can act on.
    """
    if not record.pathname.endswith("cluster_coordinator.py") or record.levelno < logging.ERROR:
        return True
    lines = [line.strip() for line in record.getMessage().splitlines() if line.strip()]
    why = next((line for line in lines[1:] if "UNAVAILABLE" in line or "connect" in line or "CANCELLED" in line), "")
    record.msg, record.args = " ".join(filter(None, [lines[0] if lines else "", why])), ()
    return True


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signum)
