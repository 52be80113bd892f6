"""``tfdist tensorboard``: TensorBoard on the project's runs, their curves and their traces, beside ``tfdist ui``.

Reads ``mlflow.tracking_uri`` from params.yaml, as ``tfdist ui`` does, and
gathers the experiment's training runs into a folder only its owner can read
(:mod:`tfdist.tracking.board_folder`: their curves, and the traces of runs
profiled with ``train.profile_steps``, the Profile tab's trace viewer,
input-pipeline analyser and memory). Then serves it with TensorBoard's own
server, bound to 127.0.0.1 by default behind the doors of tfdist's MLflow
servers (the ``Host`` and ``Origin`` checks), with the profile plugin's
"Capture profile" shut: it would connect anywhere asked and write what it got
into the folder.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import click

from tfdist.config.params import load_config
from tfdist.errors import InputError
from tfdist.records.run_names import PROFILE_FOLDER
from tfdist.tracking.board_folder import gathered
from tfdist.tracking.store import probe_store, redact, store_uri
from tfdist_cli.contract import config_options, stage_errors
from tfdist_cli.serving import WILDCARD_HOSTS, check_free, door_policy, warn_if_published


@click.command()
@config_options
@click.option("--run", "run", default=None, metavar="NAME_OR_ID",
              help="One run only (its MLflow run id, or its name); default: every training run of the experiment.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 publishes it).")
@click.option("--port", default=6006, show_default=True, type=click.IntRange(1, 65535), help="Port to serve on.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Another name clients reach the server by (a proxy's, a DNS name). Repeatable.")
def tensorboard(params_path: Path, overrides: tuple[str, ...], run: str | None, host: str, port: int,
                allowed_hosts: tuple[str, ...]) -> None:
    """Serve TensorBoard on this project's training runs: their curves, and the traces of profiled runs."""
    with stage_errors():
        if importlib.util.find_spec("tensorboard") is None or importlib.util.find_spec("xprof") is None:
            raise InputError("tfdist tensorboard needs TensorBoard and its profile plugin: make install (or "
                             "pip install 'tfdist[tensorboard]')")
        config = load_config(params_path, overrides)
        uri = store_uri(config.mlflow.tracking_uri)
        probe_store(uri, busy_timeout=config.mlflow.busy_timeout)
        policy = door_policy(host=host, port=port, allowed_hosts=allowed_hosts)
        check_free(host, port)
        with gathered(uri, config.mlflow.experiment, run, PROFILE_FOLDER) as (logdir, runs, traced):
            warn_if_published(host, port, authenticated=False)
            shown = "127.0.0.1" if host in WILDCARD_HOSTS else host
            click.echo(f"TensorBoard on {len(runs)} training run{'s' if len(runs) != 1 else ''} of {redact(uri)}, "
                       f"experiment {config.mlflow.experiment} ({traced} with traces: the Profile tab):\n"
                       f"  http://{shown}:{port}/\n(Ctrl-C stops it)", err=True)
            serve(logdir, host, port, policy)


def serve(logdir: Path, host: str, port: int, policy: Any) -> None:
    """TensorBoard with its plugins (the profile plugin among them) on ``logdir``, behind ``policy``'s doors, until
    stopped."""
    from tensorboard import default, program

    from tfdist.tracking.server_doors import WsgiDoors

    board = program.TensorBoard(plugins=default.get_plugins(),
                                server_class=lambda app, flags: program.WerkzeugServer(WsgiDoors(app, policy), flags))
    board.configure(logdir=str(logdir), host=host, port=port, reload_interval=0, load_fast="false")
    try:
        board.main()
    except KeyboardInterrupt:
        pass
