"""The train stage's entry: find this process's role in a training run, and play it.

One function a role (:mod:`tfdist.cluster.roles` tells which):

* a **launcher** (a multi-process strategy, no cluster in the environment)
  starts the cluster's task processes and waits for them; it never trains;
* a coordinated strategy's **server** (parameter_server's workers and ps)
  serves until stopped (:mod:`tfdist.train.server`, TensorFlow without tf_keras);
* the **chief** or the **only process** trains, records and writes the outputs;
  another **worker** trains beside it (both :func:`tfdist.train.phases.train_task`).

The training modules are imported where a role trains, not at the top: a
launcher only waits for its tasks, and must not pay TensorFlow's and MLflow's
seconds of import before it starts them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from tfdist.cluster import roles
from tfdist.config.knobs import Config
from tfdist.distribute.registry import get_spec
from tfdist.errors import InputError
from tfdist.files.workspace import private_folder
from tfdist.records.reports import TrainOutputs
from tfdist.records.run_names import RunPaths
from tfdist.resume.backup import close_stopped_runs
from tfdist.runtime.onednn import configure_onednn
from tfdist.tracking.object_store import MLFLOW_ENDPOINT_ENV
from tfdist.train.checks import check_config


def train(config: Config, *, strategy_name: str, name: str, paths: RunPaths, launch: Sequence[str] = ()
          ) -> TrainOutputs | None:
    """Train one model under ``strategy_name`` as MLflow run ``name``, in whatever role this process has.

    Every epoch is backed up under ``paths.backups`` (see :mod:`tfdist.resume`):
    run again after a crash with the same params, training resumes where it stopped.

    Args:
        launch: the command that runs this same stage as one task of a local cluster.

    Returns:
        The report and history for the process that writes the stage outputs;
        None for any other (a launcher, a non-chief worker, a server).
    """
    spec = get_spec(strategy_name)  # resolved once: everything below is handed the record
    check_config(spec, config)
    private_folder(paths.backups, key="--backups")  # the run's weights and optimizer state: the owner's alone
    task = roles.this_task(spec, config.distributed)
    if roles.launches(spec, task):
        if not launch:
            raise InputError(f"strategy {spec.name} without a cluster in the environment needs a launch command")
        roles.launch(spec, config.distributed, launch,
                     on_stop=functools.partial(close_stopped_runs, config, paths.backups, name),
                     outside=(config.mlflow.tracking_uri, os.environ.get(MLFLOW_ENDPOINT_ENV, "")))
        return None
    if task is not None and roles.serves(spec, task):
        from tfdist.train.server import serve  # TensorFlow without tf_keras: a server builds no model

        serve(task, config)
        return None
    configure_onednn(config.runtime.onednn, config.model.kind, config.train.precision)  # read as TensorFlow loads
    from tfdist.train.phases import train_task  # TensorFlow and tf_keras: only where a role trains

    return train_task(config, spec, name, paths, task)
