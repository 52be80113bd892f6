"""A tracking server for a team: ``mlflow server`` on PostgreSQL, proxying artifacts (``tfdist server``).

The pipeline's clients then set ``mlflow.tracking_uri: http://HOST:PORT``:
runs go to the database, artifacts (models, reports) through the server to
``--artifacts-destination``, so clients need no database driver and no
shared disk. Binds to 127.0.0.1 unless ``--host`` says otherwise; on a
shared host use ``--auth`` (MLflow's basic-auth, see docs/teams.md).
Arguments after ``--`` go to ``mlflow server`` as they are.
"""

from __future__ import annotations

import getpass
import os

import click

from tfdist.errors import InputError
from tfdist.files.workspace import private_folder, workspace_root
from tfdist.tracking import object_store
from tfdist.tracking.store import probe_store, redact, store_uri
from tfdist_cli.contract import stage_errors
from tfdist_cli.serving import (
    WILDCARD_HOSTS,
    check_free,
    door_options,
    door_policy,
    exec_mlflow_server,
    owner_address,
    warn_if_published,
)

#: What ``make postgres`` creates: a database named tfdist for you, over the local socket (peer auth).
DEFAULT_STORE = f"postgresql://{getpass.getuser()}@/tfdist?host=/var/run/postgresql"
#: Basic-auth needs both before the server starts (MLflow refuses a default admin password).
AUTH_ENV = ("MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_AUTH_ADMIN_PASSWORD")


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--backend-store-uri", default=DEFAULT_STORE, show_default=True, envvar="TFDIST_SERVER_STORE",
              help="Where runs are kept: a postgresql:// database (or any store MLflow takes).")
@click.option("--artifacts-destination", default="mlartifacts", show_default=True,
              help="Where the server keeps artifacts: a folder (relative: in the workspace) or s3://, gs://, ... URI.")
@click.option("--s3-endpoint-url", envvar=object_store.MLFLOW_ENDPOINT_ENV, default=None,
              help="The S3 API's address for an s3:// --artifacts-destination that is not AWS (tfdist s3's: "
                   "http://127.0.0.1:8333); also read from " + object_store.MLFLOW_ENDPOINT_ENV + ".")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 publishes it).")
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535), help="Port to serve on.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="Server processes.")
@click.option("--auth", is_flag=True, help="Require MLflow's basic-auth (needs " + " and ".join(AUTH_ENV) + ").")
@door_options
@click.argument("mlflow_args", nargs=-1, type=click.UNPROCESSED)
def server(backend_store_uri: str, artifacts_destination: str, s3_endpoint_url: str | None, host: str, port: int,
           workers: int, auth: bool, enabled: tuple[str, ...], allowed_hosts: tuple[str, ...],
           cors_origins: tuple[str, ...], mlflow_args: tuple[str, ...]) -> None:
    """Serve MLflow for a team: runs in PostgreSQL, artifacts proxied to --artifacts-destination."""
    with stage_errors():
        store = store_uri(backend_store_uri)
        if probe_store(store) in ("http", "https"):
            raise InputError(f"--backend-store-uri {redact(store)}: a server is not a store; "
                             "give the database it should use (postgresql://...)")
        missing = [name for name in AUTH_ENV if auth and not os.environ.get(name)]
        if missing:
            raise InputError(f"--auth needs {' and '.join(missing)} in the environment (see docs/teams.md)")
        policy = door_policy(host=host, port=port, enabled=enabled, allowed_hosts=allowed_hosts,
                             cors_origins=cors_origins)
        warn_if_published(host, port, authenticated=auth)
        check_free(host, port)
        destination = artifacts_destination
        if destination.startswith("s3://"):  # checked now: the server would take it and fail each upload later
            bucket = object_store.parse_s3_url(destination, s3_endpoint_url, "--artifacts-destination")
            object_store.check_bucket(bucket, "--artifacts-destination")
            if s3_endpoint_url:
                os.environ[object_store.MLFLOW_ENDPOINT_ENV] = s3_endpoint_url
            # boto3 retries a store that does not answer for minutes, holding the upload's request (and
            # the client's patience) meanwhile: one attempt, so the client hears HTTP 500 and retries.
            for key, value in object_store.FAIL_FAST_ENV.items():
                os.environ.setdefault(key, value)
        elif "://" not in destination:
            destination = str(private_folder((workspace_root() / destination).resolve(), key="--artifacts-destination"))
        shown = "127.0.0.1" if host in WILDCARD_HOSTS else host
        exec_mlflow_server(
            store=store, options=["--serve-artifacts", "--artifacts-destination", destination, "--workers", str(workers)],
            host=host, port=port, app="tfdist-basic-auth" if auth else "tfdist", policy=policy,
            banner=f"MLflow tracking server on {redact(store)}, artifacts in {destination}: "
                   f"{owner_address(policy, f'http://{shown}:{port}')}\n"
                   f"point the pipeline at it: dvc exp run -S mlflow.tracking_uri=http://{shown}:{port}",
            extra=mlflow_args,
        )

