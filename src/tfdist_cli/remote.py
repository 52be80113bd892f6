"""``tfdist push``, ``pull``, ``status``: dvc push, pull and status --cloud on the team's remote, its bucket checked first.

The remote is DVC's default (``core.remote``: ``team`` in .dvc/config, the
bucket ``tfdist s3`` serves). A teammate who pushed lets a fresh clone
``tfdist pull`` then ``dvc repro`` without training anything. Before DVC runs,
the bucket is listed once with short timeouts: a wrong endpoint, keys DVC
does not have or a missing bucket is one line naming the remote's URL (keys
never shown) and the fix, exit 2, in seconds, instead of DVC's retries and
its traceback. Keys come from the environment (``AWS_ACCESS_KEY_ID``...) or
DVC's local config (``dvc remote modify --local team access_key_id ...``),
never from a committed file. Other arguments go to DVC as they are.
"""

from __future__ import annotations

import click

from tfdist import native_logs
from tfdist.errors import InputError
from tfdist.tracking import object_store
from tfdist_cli.contract import stage_errors
from tfdist_cli.programs import required_program

COMMANDS = {"push": ["push"], "pull": ["pull"], "status": ["status", "--cloud"]}


def remote_location(name: str | None = None) -> tuple[str, object_store.S3Location, dict]:
    """The remote ``name`` (default: DVC's default remote) as its name, S3 location and DVC config section."""
    from dvc.config import Config, ConfigError

    try:
        config = Config.from_cwd(fs=None, validate=True)
    except ConfigError as err:
        raise InputError(f".dvc/config: {err}") from None
    name = name or config["core"].get("remote")
    remotes = config.get("remote", {})
    if not name:
        raise InputError("no DVC remote is set: dvc remote add -d team s3://BUCKET/PREFIX (docs/teams.md)")
    if name not in remotes:
        raise InputError(f"DVC remote {name!r} is not configured (known: {', '.join(remotes) or 'none'}); "
                         "dvc remote add -d team s3://BUCKET/PREFIX (docs/teams.md)")
    section = remotes[name]
    url = section["url"]
    if not url.startswith("s3://"):
        raise InputError(f"DVC remote {name} is {url}: only S3 remotes are checked here; run dvc itself")
    return name, object_store.parse_s3_url(url, section.get("endpointurl"), f"DVC remote {name}"), section


def _on_the_remote(command: str, remote: str | None, dvc_args: tuple[str, ...]) -> None:
    """Check the team's S3 remote in seconds, then run dvc ``command`` on it (this process becomes dvc)."""
    with stage_errors():
        dvc = required_program("dvc", "make install (or pip install -e '.[s3]') installs it")
        name, location, section = remote_location(remote)
        object_store.check_bucket(location, f"DVC remote {name}", access_key=section.get("access_key_id"),
                                  secret_key=section.get("secret_access_key"))
        native_logs.exec_program(dvc, ["dvc", *COMMANDS[command], "-r", name, *dvc_args])


def _remote_command(command: str, summary: str) -> click.Command:
    @click.command(command, context_settings={"ignore_unknown_options": True}, help=summary)
    @click.option("-r", "--remote", default=None, help="The DVC remote (default: core.remote, i.e. team).")
    @click.argument("dvc_args", nargs=-1, type=click.UNPROCESSED)
    def run(remote: str | None, dvc_args: tuple[str, ...]) -> None:
        _on_the_remote(command, remote, dvc_args)

    return run


push = _remote_command("push", "Check the team's S3 remote in seconds, then dvc push the pipeline's outputs to it. "
                               "DVC_ARGS go to dvc as they are.")
pull = _remote_command("pull", "Check the team's S3 remote in seconds, then dvc pull: a fresh clone's dvc repro is "
                               "then a no-op. DVC_ARGS go to dvc as they are.")
status = _remote_command("status", "Check the team's S3 remote in seconds, then dvc status --cloud: what it lacks. "
                                   "DVC_ARGS go to dvc as they are.")

