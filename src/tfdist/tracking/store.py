"""Where runs are kept: a tracking store's URI, checked in seconds, before MLflow is imported.

``import mlflow`` costs seconds (docs/performance.md, "Start-up"); a command
that only needs to know whether a store answers (``tfdist ui``, ``tfdist server``,
a stage's first check) asks here, and a wrong URI fails at once, naming it
with its password hidden.
"""

from __future__ import annotations

import importlib
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tfdist.errors import InputError
from tfdist.workspace import workspace_root

#: URI schemes of a database MLflow opens directly, and the Python driver SQLAlchemy (2.1+) loads for each.
DATABASE_DRIVERS = {"postgresql": "psycopg", "postgresql+psycopg2": "psycopg2", "postgresql+psycopg": "psycopg"}
#: Seconds to wait for a database server before saying it does not answer (MLflow itself retries for ~100 s).
_DATABASE_CONNECT_TIMEOUT = 5


def store_uri(uri: str, cwd: Path | None = None) -> str:
    """``uri`` with a relative sqlite path made absolute in the workspace (not in DVC's experiment copy)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(workspace_root(cwd) / uri[len("sqlite:///"):])
    return uri


def redact(uri: str) -> str:
    """``uri`` without its password, for messages and logs."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def probe_store(uri: str) -> str:
    """Check in seconds that a server answers at ``uri``, or that its database driver is here and the database answers.

    Returns the URI's scheme. Raises InputError naming the URI (password
    hidden) and the fix.
    """
    scheme = uri.split(":", 1)[0].lower()
    if scheme in ("http", "https"):
        _probe_server(uri, redact(uri))
    elif scheme in DATABASE_DRIVERS:
        _probe_database(uri, redact(uri), DATABASE_DRIVERS[scheme])
    return scheme



def _probe_database(uri: str, shown: str, driver: str) -> None:
    """Fail in seconds, naming the URI and the fix, when the driver is missing or the database does not answer."""
    try:
        importlib.import_module(driver)
    except ImportError:
        fix = "install the postgres extra: pip install -e '.[postgres]'"
        if driver != "psycopg":
            fix = f"pip install {driver}-binary, or use postgresql://... with the postgres extra"
        raise InputError(f"mlflow.tracking_uri {shown}: the PostgreSQL driver ({driver}) is not installed; {fix}") from None
    import sqlalchemy
    import sqlalchemy.exc

    engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": _DATABASE_CONNECT_TIMEOUT})
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as err:
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise InputError(f"mlflow.tracking_uri {shown}: cannot connect to the database ({reason})") from None
    finally:
        engine.dispose()



#: MLflow retries a failing HTTP request 7 times with backoff (minutes); a stage should fail in seconds.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def _probe_server(uri: str, shown: str, timeout: float = 5.0) -> None:
    """Fail in seconds, naming the URI, when no MLflow server answers there."""
    for key, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as response:
            response.read(64)
    except urllib.error.HTTPError as err:
        if err.code >= 500:
            raise InputError(f"mlflow.tracking_uri {shown}: the server answers with HTTP {err.code}; check it") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise InputError(
            f"mlflow.tracking_uri {shown}: no MLflow server answers ({reason}); start one "
            "(tfdist server) or fix the URI"
        ) from None
