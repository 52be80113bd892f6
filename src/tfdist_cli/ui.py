"""``tfdist ui``: the MLflow UI on the project's tracking store.

Reads ``mlflow.tracking_uri`` from params.yaml, so the UI shows the store the
pipeline writes to (the workspace's, also for runs of queued experiments),
prints the address of the newest execution's training runs, and binds to
127.0.0.1 by default: this UI has no authentication, so it is not published
on the network unless asked (a shared server: ``tfdist server``).
"""

from __future__ import annotations

from pathlib import Path

import click

from tfdist.config.params import load_config
from tfdist.errors import InputError
from tfdist.tracking import addresses
from tfdist.tracking.store import probe_store, redact, sqlite_path, store_uri
from tfdist_cli.contract import config_options, stage_errors
from tfdist_cli.serving import (
    WILDCARD_HOSTS,
    check_free,
    door_options,
    door_policy,
    exec_mlflow_server,
    owner_address,
    warn_if_published,
)


@click.command()
@config_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 publishes it).")
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535), help="Port to serve on.")
@door_options
def ui(params_path: Path, overrides: tuple[str, ...], host: str, port: int, enabled: tuple[str, ...],
       allowed_hosts: tuple[str, ...], cors_origins: tuple[str, ...]) -> None:
    """Serve the MLflow UI for this project's runs and print the address of the newest training runs."""
    with stage_errors():
        config = load_config(params_path, overrides)
        uri = store_uri(config.mlflow.tracking_uri)
        scheme = probe_store(uri, busy_timeout=config.mlflow.busy_timeout)
        if scheme in ("http", "https"):
            page = addresses.latest_runs_page(config.mlflow)
            click.echo(f"mlflow.tracking_uri is a server already: open {uri.rstrip('/')}/{page}")
            return
        if scheme == "sqlite" and not sqlite_path(uri).is_file():
            raise InputError(f"mlflow.tracking_uri {config.mlflow.tracking_uri}: no store there yet; "
                             "run the pipeline first (dvc repro)")
        policy = door_policy(host=host, port=port, enabled=enabled, allowed_hosts=allowed_hosts,
                             cors_origins=cors_origins)
        check_free(host, port)
        warn_if_published(host, port, authenticated=False)
        page = addresses.latest_runs_page(config.mlflow)
        shown = "127.0.0.1" if host in WILDCARD_HOSTS else host
        exec_mlflow_server(
            store=uri, options=["--workers", "1"], host=host, port=port, app="tfdist", policy=policy,
            banner=f"MLflow UI for {redact(uri)}, experiment {config.mlflow.experiment}; "
                   f"the newest execution's training runs:\n  {owner_address(policy, f'http://{shown}:{port}', page)}",
        )

