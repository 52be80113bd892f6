"""The stage contract every command shares: one line and the exit code for each kind of failure, the libraries'
chatter kept out of the log, the programs a command runs found or named."""

import errno
import logging
import signal
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tfdist.errors import DiskFull, InputError, RunError
from tfdist_cli.contract import config_options, stage_errors
from tfdist_cli.programs import program, required_program
from tfdist_cli.stage_logs import configure_stage_logging


def failing_with(error: BaseException) -> click.Command:
    @click.command()
    @config_options
    def command(params_path, overrides):
        with stage_errors():
            raise error

    return command


@pytest.mark.parametrize(("error", "code", "line"), [
    (InputError("train.epochs must be >= 1; got 0"), 2, "error: train.epochs must be >= 1; got 0"),
    (RunError("task worker-1 exited with code 1"), 1, "error: task worker-1 exited with code 1"),
    (DiskFull("no space left on the device of models"), 1, "error: no space left on the device of models"),
    (OSError(errno.ENOSPC, "No space left on device"), 1, "error: [Errno 28] No space left on device; free some space"),
    (OSError(errno.EROFS, "Read-only file system"), 2, "error: [Errno 30] Read-only file system; free some space"),
    (KeyboardInterrupt(), 128 + signal.SIGINT, "error: interrupted by SIGINT"),
])
def test_each_failure_is_one_line_and_the_contracts_exit_code(error, code, line):
    before = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(failing_with(error), [])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == code
    assert result.output.strip().splitlines()[-1].startswith(line) and "Traceback" not in result.output


def test_a_bug_keeps_its_traceback():
    result = CliRunner().invoke(failing_with(ZeroDivisionError("a bug")), [])
    assert isinstance(result.exception, ZeroDivisionError), "not worded as a user's mistake"


def test_parameter_server_warnings_are_dropped_and_a_coordinators_report_is_one_line():
    configure_stage_logging()
    tensorflow = logging.getLogger("tensorflow")
    kept = []
    handler = logging.Handler()
    handler.emit = kept.append
    tensorflow.addHandler(handler)
    try:
        tensorflow.warning("Found source dataset of type <class 'FromTensors'>")
        report = logging.LogRecord("tensorflow", logging.ERROR, "/x/cluster_coordinator.py", 1,
                                   "Failed to run closure on worker 0\n  node A\n  node B\nUNAVAILABLE: Socket closed\n",
                                   (), None)
        tensorflow.handle(report)
    finally:
        tensorflow.removeHandler(handler)
    assert [record.getMessage() for record in kept] == ["Failed to run closure on worker 0 UNAVAILABLE: Socket closed"]


def test_a_program_beside_this_python_is_found_first_and_a_missing_one_named_with_its_fix():
    assert program(Path(sys.executable).name) == str(Path(sys.executable).with_name(Path(sys.executable).name))
    with pytest.raises(InputError, match="^no-such-tfdist-program is not on PATH; install it$"):
        required_program("no-such-tfdist-program", "install it")
