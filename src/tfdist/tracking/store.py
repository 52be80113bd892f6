"""Where runs are kept: a tracking store's URI, checked in seconds, before MLflow is imported.

``import mlflow`` costs seconds (docs/performance.md, "Start-up"); a command
that only needs to know whether a store answers (``tfdist ui``, ``tfdist server``,
a stage's first check) asks here, and a wrong URI fails at once, naming it
with its password hidden.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sqlite3
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tfdist.errors import InputError, RunError
from tfdist.files.workspace import workspace_root

log = logging.getLogger(__name__)

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


def probe_store(uri: str, busy_timeout: float = 30.0) -> str:
    """Check in seconds that the store at ``uri`` can be used: a server answers, a database answers, a sqlite file is a store.

    Returns the URI's scheme. Raises InputError naming the URI (password
    hidden) and the fix; RunError for a sqlite store another program keeps
    locked for longer than ``busy_timeout`` seconds.
    """
    scheme = uri.split(":", 1)[0].lower()
    if scheme == "sqlite":
        probe_sqlite(uri, redact(uri), busy_timeout)
    elif scheme in ("http", "https"):
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


def sqlite_path(uri: str) -> Path:
    """The file of a ``sqlite:///`` URI (a query string, if any, left out)."""
    return Path(uri[len("sqlite:///"):].split("?", 1)[0])


def probe_sqlite(uri: str, shown: str, busy_timeout: float) -> None:
    """Refuse a sqlite file that is not a store (garbage, damaged, foreign); wait, bounded, for one another program locks.

    Read with Python's own sqlite3, before MLflow (which would say
    ``file is not a database`` in a 40-line SQLAlchemy traceback, or wait on a
    lock and then fail the same way). A missing or empty file is a new store.
    """
    path = sqlite_path(uri)
    if path.is_dir():
        raise InputError(f"mlflow.tracking_uri {shown}: {path} is a folder, not a store; point the URI at a file")
    if not path.exists() or path.stat().st_size == 0:
        return
    deadline = time.monotonic() + busy_timeout
    waiting = False
    while True:
        try:
            tables = _read_tables(path, timeout=min(1.0, busy_timeout))
            break
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) and "busy" not in str(err):
                raise _damaged(shown, path, err) from None
            if time.monotonic() >= deadline:
                raise RunError(
                    f"mlflow.tracking_uri {shown}: still locked by another program after {busy_timeout:.0f} s "
                    "(mlflow.busy_timeout); close what holds it (a SQLite browser, a backup job, another tfdist on a "
                    "shared folder) and run again"
                ) from None
            if not waiting:
                log.warning("waiting up to %.0f s (mlflow.busy_timeout) for %s: another program holds it locked",
                            busy_timeout, path)
                waiting = True
        except sqlite3.DatabaseError as err:
            raise _damaged(shown, path, err) from None
    if tables and "alembic_version" not in tables:
        raise InputError(
            f"mlflow.tracking_uri {shown}: an SQLite database but not an MLflow store (no alembic_version table); "
            "point mlflow.tracking_uri at another file"
        )


def _read_tables(path: Path, timeout: float) -> set[str]:
    """The names of ``path``'s tables, once SQLite's own quick check passes and a write lock could be taken."""
    with contextlib.closing(sqlite3.connect(path, timeout=timeout, isolation_level=None)) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        problem = connection.execute("PRAGMA quick_check(1)").fetchone()[0]
        if problem != "ok":
            raise sqlite3.DatabaseError(problem)
        connection.execute("BEGIN IMMEDIATE")  # what MLflow's first write will need
        connection.execute("ROLLBACK")
    return tables


def _damaged(shown: str, path: Path, err: Exception) -> InputError:
    return InputError(
        f"mlflow.tracking_uri {shown}: not a readable MLflow store ({err}); move it aside "
        f"(mv {path} {path}.damaged) to start a new one there, or point mlflow.tracking_uri at another file"
    )


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
