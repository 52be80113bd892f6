"""Open the MLflow UI on the project's tracking store (not a DVC stage: a command for people).

Reads ``mlflow.tracking_uri`` from params.yaml, so the UI shows the store the
pipeline writes to, and binds to 127.0.0.1 by default: the UI has no
authentication, so it is not published on the network unless asked.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import click

from stages._cli import config_options, stage_errors
from tfdist import native_logs
from tfdist.config import load_config
from tfdist.errors import InputError


@click.command()
@config_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 publishes it).")
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535), help="Port to serve on.")
def main(params_path: Path, overrides: tuple[str, ...], host: str, port: int) -> None:
    """Serve the MLflow UI for this project's runs and print its URL (Ctrl-C stops it)."""
    with stage_errors():
        config = load_config(params_path, overrides)
        uri = config.mlflow.tracking_uri
        if uri.startswith(("http://", "https://")):
            click.echo(f"mlflow.tracking_uri is a server already: open {uri}")
            return
        if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
            raise InputError(f"mlflow.tracking_uri {uri}: no store there yet; run the pipeline first (dvc repro)")
        _check_free(host, port)
        click.echo(f"MLflow UI for {uri}, experiment {config.mlflow.experiment}: http://{host}:{port}  (Ctrl-C stops it)",
                   err=True)
        sys.stderr.flush()
        command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
        native_logs.exec_program(sys.executable, command)


def _check_free(host: str, port: int) -> None:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as err:
            raise InputError(f"cannot serve on {host}:{port} ({err.strerror}); pass another --port") from None


if __name__ == "__main__":
    main()
