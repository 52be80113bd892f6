"""The MLflow UI's pages of an execution's training runs: what ``tfdist ui`` and the compare report link to."""

from __future__ import annotations

import urllib.parse

import mlflow
from mlflow.exceptions import MlflowException

from tfdist.config.knobs import MlflowConfig
from tfdist.errors import InputError
from tfdist.tracking.runs import EXECUTION_ROLE, EXECUTION_TAG, ROLE_TAG
from tfdist.tracking.store import redact, store_uri


def latest_runs_page(config: MlflowConfig) -> str:
    """The UI address (after the server's URL) of the newest execution's training runs in ``config``'s store.

    The experiment's runs page when it has no execution yet; ``""`` when the
    store has no such experiment. Reads only: nothing is created.

    Raises:
        InputError: the store cannot be read.
    """
    mlflow.set_tracking_uri(store_uri(config.tracking_uri))
    try:
        experiment = mlflow.MlflowClient().get_experiment_by_name(config.experiment)
        if experiment is None:
            return ""
        runs = mlflow.search_runs(experiment_ids=[experiment.experiment_id], max_results=1, output_format="list",
                                  filter_string=f"tags.`{ROLE_TAG}` = '{EXECUTION_ROLE}'",
                                  order_by=["attributes.start_time DESC"])
    except MlflowException as err:
        raise InputError(f"mlflow.tracking_uri {redact(config.tracking_uri)}: cannot read the store ({err.message})") from None
    if not runs:
        return f"#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning"
    return runs_page(experiment.experiment_id, runs[0].data.tags[EXECUTION_TAG])


def runs_page(experiment_id: str, execution: str) -> str:
    """The UI's address (after the server's URL) of one execution's training runs, charted.

    ``workflowType=machine_learning`` opens MLflow 3's runs page instead of
    its GenAI overview; the filter keeps the execution's training runs (their
    parent holds the comparison as artifacts), fastest first.
    """
    query = urllib.parse.urlencode({
        "workflowType": "machine_learning",
        "compareRunsMode": "CHART",
        "searchFilter": f"tags.`{EXECUTION_TAG}` = '{execution}' and tags.stage = 'train'",
        "orderByKey": "metrics.`samples_per_second`",
        "orderByAsc": "false",
    }, quote_via=urllib.parse.quote)
    return f"#/experiments/{experiment_id}/runs?{query}"
