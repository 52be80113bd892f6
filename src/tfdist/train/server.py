"""A cluster task that only serves: a parameter_server worker or ps, and TensorFlow's profiler in any task.

A server runs what the coordinating chief sends it and builds no model, so
it loads TensorFlow without tf_keras (:func:`tfdist.runtime.loading.tensorflow_without_keras`):
less CPU in each of the servers a parameter_server stage starts beside its
chief, on the same cores (docs/performance.md, "Start-up").
"""

from __future__ import annotations

import logging
import os
import signal
import time

from tfdist.cluster.ports import PROFILER_PORT_ENV
from tfdist.config.knobs import Config
from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.runtime.loading import tensorflow, tensorflow_without_keras
from tfdist.runtime.onednn import configure_onednn
from tfdist.runtime.threads import configure_threads, op_threads, server_config

log = logging.getLogger(__name__)

_profiler_served: list[int] = []  # the port this process serves on, once it does


def profiler_order(counts: dict[str, int]) -> list[tuple[str, int]]:
    """The cluster's tasks in the order their profiler ports follow: the chief, then the ps tasks, then the workers."""
    return [(job, index) for job in ("chief", "ps", "worker") for index in range(counts.get(job, 0))]


def serve_profiler(task: ClusterTask) -> None:
    """Serve TensorFlow's profiler in this task, when :data:`PROFILER_PORT_ENV` asks for it (once a process)."""
    base = os.environ.get(PROFILER_PORT_ENV)
    if not base or _profiler_served:
        return
    order = profiler_order({job: task.count(job) for job in task.cluster})
    port = int(base) + order.index((task.task_type, task.task_index))
    tensorflow().profiler.experimental.server.start(port)
    _profiler_served.append(port)
    log.info("%s serves TensorFlow's profiler on port %d (%s)", task.name, port, PROFILER_PORT_ENV)


def serve(task: ClusterTask, config: Config) -> None:
    """Run this process as a server task (a parameter_server worker or ps), with ``config``'s ``runtime:``, until stopped.

    The chief sends these tasks their work; they never finish on their own (a
    TFJob ends when its chief succeeds; the local launcher stops them; a Slurm
    step's chief scancels them).
    """
    # Nothing to save: stopped, a server has done its part and exits 0 at once, so that a Slurm
    # step its chief stops ends with the chief's exit code (tfdist.cluster.slurm.stop_step_servers).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    configure_onednn(config.runtime.onednn, config.model.kind, config.train.precision)  # a worker runs the steps
    tf = tensorflow_without_keras()
    intra_op, inter_op = op_threads(config)
    configure_threads(intra_op, inter_op)
    serve_profiler(task)
    server = tf.distribute.Server(  # noqa: F841  (held: a collected server stops serving)
        tf.train.ClusterSpec(dict(task.cluster)), job_name=task.task_type, task_index=task.task_index,
        protocol="grpc", config=server_config(intra_op), start=True,
    )
    log.info("%s serving on %s for the chief", task.name, task.cluster[task.task_type][task.task_index])
    while True:  # not server.join(): a C++ wait in which no Python signal handler, the one above, runs
        time.sleep(3600)
