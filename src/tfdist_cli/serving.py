"""What ``tfdist ui`` and ``tfdist server`` share: a free address, then MLflow's server with tfdist's UI plugin.

Both exec ``mlflow server --app-name tfdist`` (:mod:`tfdist.tracking.server_app`: the
UI opens experiments on their training runs), after checking, in one line
each, what would otherwise fail inside MLflow with a traceback.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence

import click

from tfdist import native_logs
from tfdist.errors import InputError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: MLflow's server runs GenAI jobs (prompt optimisation, scorers, trace roll-ups) in huey consumers it starts
#: beside the server, several processes each importing MLflow (their cost: docs/teams.md) for
#: features tfdist does not use. Off unless the environment says otherwise (true turns them back on).
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def check_free(host: str, port: int) -> None:
    """Raise InputError naming ``host:port`` when nothing can listen there.

    Binds as the servers do, with SO_REUSEADDR: a server restarted on its port
    leaves connections in TIME_WAIT there, which do not stop it listening.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise InputError(f"cannot serve on {host}:{port} ({err.strerror}); pass another --port") from None


def exec_mlflow_server(options: Sequence[str], host: str, port: int, app: str, url: str, extra: Sequence[str] = ()) -> None:
    """Print ``url`` and replace this process by ``mlflow server`` (Ctrl-C stops it). Never returns."""
    os.environ.setdefault(JOB_EXECUTION_ENV, "false")
    click.echo(f"{url}\n(Ctrl-C stops it)", err=True)
    sys.stderr.flush()
    command = [sys.executable, "-m", "mlflow", "server", *options, "--host", host, "--port", str(port),
               "--app-name", app, *extra]
    native_logs.exec_program(sys.executable, command)
