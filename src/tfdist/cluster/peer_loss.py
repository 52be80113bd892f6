"""A peer lost in the middle of training, told as one line: which task, how it was noticed, what to do.

When a multi_worker_mirrored task stops (a crash, a kill, a cut cable),
TensorFlow's coordination service misses its heartbeats for
``distributed.heartbeat_timeout`` seconds and aborts every collective still
running on the other tasks ("The following tasks are unhealthy"); the task
cut off from the service sees its own heartbeat call time out instead. A
parameter_server chief sees a lost ps as an unavailable remote. Either way
``fit`` raises a TensorFlow error with a 40-line traceback; :func:`peers_watched`
turns it into a :class:`~tfdist.errors.PeerLost` naming the lost task and its
address, so the stage exits 1 with one line and its MLflow run ends FAILED.
Meanwhile TensorFlow's executors, deleted as the failed steps unwind, raise the
same error where Python can only print it ("Exception ignored in:
Executor.__del__", a traceback each); those are dropped too, and nothing else.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.errors import PeerLost
from tfdist.tf_imports import tf

_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
_GRPC_MESSAGE = re.compile(r'grpc_message:"([^"]+)"')
#: What TensorFlow raises when a remote task goes away; other errors of these kinds keep their traceback.
_REMOTE_FAULTS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
                  tf.errors.CancelledError, tf.errors.InternalError)
_CONNECTION_WORDS = ("Socket closed", "Connection reset", "Connection refused", "failed to connect",
                     "Failed to connect", "Collective ops is aborted", "is unavailable", "Broken pipe")
_WHAT_TO_DO = ("check that task's log and its host's network, then start every task again: "
               "training resumes from the last backed-up epoch")


@contextmanager
def peers_watched(task: ClusterTask | None, heartbeat_timeout: float) -> Iterator[None]:
    """Inside this block, a lost peer of cluster task ``task`` raises a one-line :class:`PeerLost`."""
    if task is None:
        yield
        return
    before = sys.unraisablehook
    sys.unraisablehook = _quiet_about_lost_peers(task, heartbeat_timeout, before)
    try:
        yield
    except BaseException as error:
        message = _lost_peer(error, task, heartbeat_timeout)
        if message is None:
            sys.unraisablehook = before
            raise
        raise PeerLost(message) from None  # the stage exits at once: the quiet hook stays for its teardown
    sys.unraisablehook = before


def _lost_peer(error: BaseException, task: ClusterTask, heartbeat_timeout: float) -> str | None:
    """The one line for ``error`` when it says a peer of ``task`` was lost (:func:`explain`), else None."""
    return explain(str(error.message), task, heartbeat_timeout) if isinstance(error, _REMOTE_FAULTS) else None


def _quiet_about_lost_peers(task: ClusterTask, heartbeat_timeout: float,
                            before: Callable[[sys.UnraisableHookArgs], object]) -> Callable[[sys.UnraisableHookArgs], None]:
    """An unraisable-exception hook that drops what a lost peer raises and passes the rest on."""

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if unraisable.exc_value is None or _lost_peer(unraisable.exc_value, task, heartbeat_timeout) is None:
            before(unraisable)

    return hook


def explain(text: str, task: ClusterTask, heartbeat_timeout: float) -> str | None:
    """The line to show for TensorFlow error text ``text`` seen by ``task``, or None when it is not a lost peer."""
    if "unhealthy" in text:
        lost = _named_tasks(text[text.index("unhealthy"):], task)
        return (f"{task.name} lost {lost} during training: no heartbeat for {heartbeat_timeout:.0f} s "
                f"(distributed.heartbeat_timeout): it crashed, was stopped, or its network is cut; {_WHAT_TO_DO}")
    if "CoordinationService/Heartbeat" in text:
        leader = _describe(task, *_leader(task))
        return (f"{task.name} lost the cluster's coordination service on {leader} during training: its heartbeats "
                f"went unanswered (that task stopped, or the network between them is cut); {_WHAT_TO_DO}")
    detail = next((line.strip() for line in text.splitlines() if any(word in line for word in _CONNECTION_WORDS)), "")
    if detail:
        lost = _addressed_tasks(text, task) or _named_tasks(text, task) or "a peer"
        grpc = _GRPC_MESSAGE.search(text)
        return f"{task.name} lost {lost} during training: {grpc.group(1) if grpc else detail[:160]}; {_WHAT_TO_DO}"
    return None


def _named_tasks(text: str, task: ClusterTask) -> str:
    found = dict.fromkeys((job, int(index)) for job, index in _TASK.findall(text))
    found.pop((task.task_type, task.task_index), None)
    return ", ".join(_describe(task, job, index) for job, index in _the_lost(list(found)))


def _addressed_tasks(text: str, task: ClusterTask) -> str:
    """The tasks whose cluster address the text names (a failed connection names where it went)."""
    named = [(job, index, address) for job, addresses in task.cluster.items()
             for index, address in enumerate(addresses)
             if (job, index) != (task.task_type, task.task_index) and re.search(rf"\b{re.escape(address)}\b", text)]
    return ", ".join(f"{job}-{index} ({address})" for job, index, address in _the_lost(named))


def _the_lost(named: list) -> list:
    """Of the tasks an error names (each a tuple, job first), the lost ones: a named ps when there is one.

    A parameter_server chief's error can name a worker too: the worker whose
    closure reached for the lost ps and reported it. ClusterCoordinator
    reschedules a lost worker's closures on the others, so only a lost ps ends
    training; when the text names a ps, the ps is what was lost.
    """
    return [found for found in named if found[0] == "ps"] or named


def _describe(task: ClusterTask, job: str, index: int) -> str:
    addresses = task.cluster.get(job, [])
    return f"{job}-{index} ({addresses[index]})" if index < len(addresses) else f"{job}-{index}"


def _leader(task: ClusterTask) -> tuple[str, int]:
    """The task leading the coordination service: MultiWorkerMirroredStrategy's choice."""
    for job in ("chief", "worker"):
        if job in task.cluster:
            return job, 0
    return task.task_type, 0
