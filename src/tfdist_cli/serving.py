"""What ``tfdist ui`` and ``tfdist server`` share: a free address, the doors, then MLflow's server with tfdist's app.

Both exec ``mlflow server --app-name tfdist`` (:mod:`tfdist.tracking.server_app`: the
UI opens experiments on their training runs, behind :mod:`tfdist.tracking.server_doors`),
after checking, in one line each, what would otherwise fail inside MLflow with a
traceback. Everything the server is told goes through its environment, which only
its owner can read: a store URI with a password never appears on a command line.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from tfdist import native_logs
from tfdist.errors import InputError
from tfdist.tracking.server_doors import FEATURES, TOKEN_QUERY, DoorPolicy, loopback_hosts, with_port

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::")
#: MLflow's server runs GenAI jobs (prompt optimisation, scorers, trace roll-ups) in huey consumers it starts
#: beside the server, several processes each importing MLflow (their cost: docs/teams.md) for
#: features tfdist does not use. Off unless ``--enable jobs``.
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
GATEWAY_ENV = "MLFLOW_ENABLE_AI_GATEWAY"
#: ``mlflow server`` options tfdist sets itself, or that would take its doors down (one line each, exit 2).
REFUSED_MLFLOW_OPTIONS = {
    "--gunicorn-opts": "tfdist's doors need uvicorn, MLflow's default",
    "--waitress-opts": "tfdist's doors need uvicorn, MLflow's default",
    "--disable-security-middleware": "it would drop MLflow's own checks behind tfdist's",
    "--allowed-hosts": "use tfdist's --allowed-host",
    "--cors-allowed-origins": "use tfdist's --cors-origin",
    "--app-name": "tfdist chooses its app (--auth for basic-auth)",
    "--host": "use tfdist's --host",
    "--port": "use tfdist's --port",
    "--backend-store-uri": "use tfdist's --backend-store-uri",
}


def door_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that open a door, shared by ``ui`` and ``server``: each names what it opens."""
    options = [
        click.option("--enable", "enabled", multiple=True, type=click.Choice(FEATURES),
                     help="Open one of MLflow's features tfdist keeps off (assistant: an AI agent that runs "
                          "commands on this machine; gateway: stored LLM provider keys; jobs: GenAI job runner), "
                          "to you only (a token in the printed address), on a loopback --host only. Repeatable."),
        click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
                     help="Another name clients reach the server by (a proxy's, a DNS name), besides the "
                          "address it binds. Repeatable."),
        click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
                     help="A page (scheme://host:port) allowed to call the server from a browser, besides "
                          "the server's own. Repeatable."),
    ]
    return functools.reduce(lambda wrapped, option: option(wrapped), reversed(options), command)


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


def door_policy(*, host: str, port: int, enabled: Sequence[str] = (), allowed_hosts: Sequence[str] = (),
                cors_origins: Sequence[str] = ()) -> DoorPolicy:
    """The doors of a server bound to ``host:port``: its own names, what the flags add, and the owner's token."""
    if enabled and host not in LOOPBACK_HOSTS:
        raise InputError(f"--enable {enabled[0]} needs a loopback --host (127.0.0.1): on {host} its token would "
                         "cross the network in clear; reach the server through an SSH tunnel instead")
    for origin in cors_origins:
        if origin == "*" or "://" not in origin:
            raise InputError(f"--cors-origin {origin}: name one page as scheme://host:port (no wildcard)")
    names = {host} if host not in WILDCARD_HOSTS else machine_names()
    hosts = set(with_port(names | set(allowed_hosts), port))
    if host in LOOPBACK_HOSTS or host in WILDCARD_HOSTS:
        hosts.update(loopback_hosts(port))
    return DoorPolicy(hosts=frozenset(hosts), origins=frozenset(cors_origins), opened=frozenset(enabled),
                      token=secrets.token_urlsafe(32) if enabled else "")


def machine_names() -> set[str]:
    """What clients may call this machine: its host names and every address of its interfaces."""
    import psutil

    names = {socket.gethostname(), socket.getfqdn()}
    for addresses in psutil.net_if_addrs().values():
        names.update(a.address.split("%")[0] for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6))
    return names


def warn_if_published(host: str, port: int, *, authenticated: bool) -> None:
    """One warning line when the server is reachable from the network without a login."""
    if host not in LOOPBACK_HOSTS and not authenticated:
        log.warning("serving on %s without --auth: anyone who reaches port %d can read, change and delete runs",
                    host, port)


def owner_address(policy: DoorPolicy, base: str, page: str = "") -> str:
    """The address to print: with the owner's token when a feature is opened (the server turns it into a cookie)."""
    token = f"?{TOKEN_QUERY}={policy.token}" if policy.token else ""
    return f"{base}/{token}{page}"


def exec_mlflow_server(*, store: str, options: Sequence[str], host: str, port: int, app: str, policy: DoorPolicy,
                       banner: str, extra: Sequence[str] = ()) -> None:
    """Print ``banner`` and replace this process by ``mlflow server`` behind ``policy``'s doors. Never returns."""
    for option in extra:
        reason = REFUSED_MLFLOW_OPTIONS.get(option.split("=", 1)[0])
        if reason is not None:
            raise InputError(f"{option} after --: {reason}")
    os.environ.update(policy.to_env())
    os.environ["MLFLOW_BACKEND_STORE_URI"] = store  # not on the command line: /proc/PID/cmdline is world-readable
    os.environ[JOB_EXECUTION_ENV] = "true" if "jobs" in policy.opened else "false"
    os.environ[GATEWAY_ENV] = "true" if "gateway" in policy.opened else "false"
    os.environ["MLFLOW_SERVER_ALLOWED_HOSTS"] = ",".join(sorted(policy.hosts))
    os.environ["MLFLOW_SERVER_CORS_ALLOWED_ORIGINS"] = ",".join(sorted(policy.allowed_origins()))
    os.umask(0o077)  # what the server writes (an auth database, proxied artifacts) is its owner's alone
    click.echo(f"{banner}\n(Ctrl-C stops it)", err=True)
    sys.stderr.flush()
    command = [sys.executable, "-m", "mlflow", "server", *options, "--host", host, "--port", str(port),
               "--app-name", app, *extra]
    native_logs.exec_program(sys.executable, command)
