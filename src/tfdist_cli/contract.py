"""What every stage command shares: --params/--set, logging, and exit codes.

Exit codes follow the stage contract: 0 success; 2 a usage or configuration
error, one line on stderr naming the key or path; 1 a failure while running.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from tfdist import crash_points, native_logs
from tfdist.errors import Interrupted, TaskFailed, TfdistError
from tfdist.files import atomic, disk
from tfdist_cli.stage_logs import configure_stage_logging


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
    configure_stage_logging()
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


@contextlib.contextmanager
def stage_outputs(*, summary: bool = False) -> Iterator[atomic.Outputs]:
    """A stage's outputs, replaced together once the block ends (:func:`tfdist.files.atomic.atomic_outputs`).

    The commit passes the ``outputs.*`` crash points; with ``summary`` (the
    block logged the stage's results to MLflow), ``run.summary`` is passed as
    the block ends, before any output is in place.
    """
    with atomic.atomic_outputs(crash_points.crash_point) as outputs:
        yield outputs
        if summary:
            crash_points.crash_point("run.summary")


def _disk_trouble(err: Exception) -> int | None:
    """The exit code for a disk that filled (1) or cannot be written (2); None for any other error (a bug: traceback)."""
    if disk.is_disk_full(err):
        return 1
    if isinstance(err, OSError) and err.errno == errno.EROFS:
        return 2
    return None


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signum)
