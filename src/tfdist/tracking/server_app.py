"""MLflow's server with its UI opening experiments on their training runs: ``mlflow server --app-name tfdist``.

MLflow 3's UI decides what clicking an experiment opens from a "workflow
type" kept in the browser's local storage, GenAI unless the user switched
it: an experiment of training runs then opens on an empty GenAI overview
(traces, judges), whatever the experiment's tags say. This plugin (entry
point ``mlflow.app``) serves the same UI with one line added to its page:
where the browser has no choice stored yet, it stores "machine learning".
A user who switches to GenAI in the sidebar keeps that choice.

A plugin of MLflow's server (it runs inside ``mlflow server``, never in a
stage), so it imports ``mlflow.server`` at its top. ``tfdist-basic-auth`` is
the same behind MLflow's basic-auth, for a shared host.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, request
from mlflow.server import app as mlflow_app
from mlflow.server.fastapi_app import create_fastapi_app

from tfdist.tracking.mlflow_private import served_by_uvicorn
from tfdist.tracking.server_doors import DoorPolicy, ServerDoors

#: The UI's local-storage key for the workflow type (its useLocalStorage hook appends ``_v<version>``).
WORKFLOW_KEY = "mlflow.workflowType_v1"
DEFAULT_WORKFLOW = "machine_learning"
_SCRIPT = (
    f'<script>try{{if(!localStorage.getItem("{WORKFLOW_KEY}"))'
    f'localStorage.setItem("{WORKFLOW_KEY}",JSON.stringify("{DEFAULT_WORKFLOW}"))}}catch(e){{}}</script>'
)


def default_to_training_runs(response: Response) -> Response:
    """Add the workflow default to the UI's page (index.html), and to nothing else."""
    if request.method != "GET" or response.status_code != 200 or response.mimetype != "text/html":
        return response
    if not request.path.endswith("/") and not request.path.endswith("/index.html"):
        return response
    response.direct_passthrough = False
    page = response.get_data(as_text=True)
    if "<head>" not in page or WORKFLOW_KEY in page:
        return response
    response.set_data(page.replace("<head>", "<head>" + _SCRIPT, 1))
    response.headers.pop("ETag", None)  # the page is not the file any more
    response.headers["Cache-Control"] = "no-cache"
    return response


def create_app(app: Flask = mlflow_app) -> Any:
    """MLflow's app with :func:`default_to_training_runs`, behind the doors the CLI chose (:mod:`server_doors`)."""
    app.after_request(default_to_training_runs)
    require_uvicorn()
    return ServerDoors(create_fastapi_app(app), DoorPolicy.from_env())


def require_uvicorn() -> None:
    """Refuse gunicorn and waitress: the doors are ASGI middleware, and MLflow's own checks are off under them."""
    if not served_by_uvicorn():
        raise RuntimeError("tfdist's MLflow app guards its doors as an ASGI app: serve it with uvicorn "
                           "(drop --gunicorn-opts / --waitress-opts)")


def create_auth_app(app: Flask = mlflow_app) -> Any:
    """:func:`create_app` behind MLflow's basic-auth (``mlflow server --app-name tfdist-basic-auth``).

    Needs the ``auth`` extra (Flask-WTF), ``MLFLOW_FLASK_SERVER_SECRET_KEY``
    and ``MLFLOW_AUTH_ADMIN_PASSWORD``; imported here, not at the top, so
    that the plain app works without that extra.
    """
    from mlflow.server.auth import create_app as with_basic_auth

    app.after_request(default_to_training_runs)
    require_uvicorn()
    return ServerDoors(with_basic_auth(app), DoorPolicy.from_env())
