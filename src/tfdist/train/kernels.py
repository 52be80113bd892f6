"""Which kernels a training graph got: the ops oneDNN's layout pass left to Eigen where it rewrote their kind.

TensorFlow's oneDNN pass (``mkl_layout_pass.cc``) rewrites ``MaxPoolGrad`` only
when its input comes from an already rewritten ``_MklNativeMaxPool``; in a graph
with a cycle (``train.steps_per_execution`` above 1) its visiting order follows
pointer hashes, so some processes keep Eigen's pooling gradient, 20-35 % slower
(docs/performance/parallelism.md, "The pooling gradient"), and in a synchronous
cluster every other worker waits for that one. The pass's output is in the
partition graphs TensorFlow collects as a function is first instantiated
(``enable_graph_collection``): no profiler needed. A retrace is a new graph, its
order drawn anew; in a synchronous cluster every worker must retrace with the
others (:class:`ClusterTally`). The rate, with and without: docs/performance/parallelism.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from tfdist.records.reports import Findings, fallbacks_in_words
from tfdist.tf_imports import keras
from tfdist.tf_private import cluster_key_claim, cluster_key_wait, function_graphs_collected, onednn_in_use

log = logging.getLogger(__name__)

#: The prefix of oneDNN's rewritten ops (``_MklNativeMaxPool``; ``_Mkl`` for the few with layout tensors).
_REWRITTEN = ("_MklNative", "_Mkl")


def _plain(op: str) -> str | None:
    """The op a rewritten op replaced (``_MklNativeMaxPool`` -> ``MaxPool``), None for an op not rewritten."""
    for prefix in _REWRITTEN:
        if op.startswith(prefix):
            return op[len(prefix):]
    return None


def fallbacks(ops: Iterable[str]) -> dict[str, int]:
    """The gradients a graph's nodes (``ops``, one entry a node) kept Eigen's kernel for where oneDNN rewrote their
    forward op; with how many nodes each. Only gradients: an op of a kind rewritten elsewhere may be left alone for
    its dtype or shape, every time, and retracing would not change it."""
    counts = Counter(ops)
    rewritten = {plain for op in counts if (plain := _plain(op))}
    return {op: n for op, n in sorted(counts.items())
            if op.endswith("Grad") and _plain(op) is None and op.removesuffix("Grad") in rewritten}


@contextmanager
def collected_graphs() -> Iterator[list[str]]:
    """The ops of the functions first instantiated inside, after every rewrite (their partition graphs' nodes); the
    list is filled on leaving. Around a function's first call only: later calls instantiate nothing."""
    ops: list[str] = []
    with function_graphs_collected() as functions:
        yield ops
    ops += [node.op for function in functions for graph in function.partition_graphs for node in graph.node]


#: Seconds the first task waits for every other task's finding; the others wait for its decision 30 s longer.
TALLY_BOUND = 60.0
_FITS = itertools.count()


class Tally:
    """The findings of one check: this process's own (normal training, one process's replicas)."""

    def __init__(self, me: str = "chief"):
        self.me = me

    def __call__(self, check: int, found: dict[str, int]) -> Findings:
        return {self.me: found}


class ClusterTally(Tally):
    """Every worker's findings of one check, the same on all of them (a synchronous cluster: multi_worker_mirrored).

    Every worker must retrace together or none: a collective traced on one
    worker only waits for ever for its peer. So, through the coordination
    service's key-value store, each task posts its finding, the first task
    gathers them (``bound`` seconds at most; a task whose finding never came
    counts as None) and posts the lot, and every task acts on that one post.
    ``fit_number`` keeps one ``fit``'s keys apart from the next's.
    """

    def __init__(self, tasks: list[str], me: str, fit_number: int, bound: float = TALLY_BOUND):
        super().__init__(me)
        self.tasks, self.fit_number, self.bound = tasks, fit_number, bound

    def __call__(self, check: int, found: dict[str, int]) -> Findings:
        prefix = f"tfdist/kernels/{self.fit_number}/{check}"
        cluster_key_claim(f"{prefix}/{self.me}", json.dumps(found), self.bound)
        if self.me == self.tasks[0]:
            deadline = time.monotonic() + self.bound
            posts = {task: cluster_key_wait(f"{prefix}/{task}", max(0.001, deadline - time.monotonic()))
                     for task in self.tasks}
            cluster_key_claim(f"{prefix}/all", json.dumps({task: post and json.loads(post)
                                                            for task, post in posts.items()}), 30)
        posted = cluster_key_wait(f"{prefix}/all", self.bound + 30)
        if posted is None:
            log.warning("kernels: no tally of check %d from %s (the coordination service gone?): %s goes on alone",
                        check, self.tasks[0], self.me)
            return {self.me: found}
        return json.loads(posted)


def kernel_check(strategy: Any, multi_process: bool, retraces: int) -> KernelCheck | None:
    """The check of a synchronous ``fit`` under ``strategy`` where this process runs oneDNN's kernels; None elsewhere."""
    return KernelCheck(tally_for(strategy, multi_process), retraces) if onednn_in_use() else None


def tally_for(strategy: Any, multi_process: bool) -> Tally:
    """The tally of a ``fit`` under ``strategy``: this process's alone, or its synchronous cluster's."""
    if not multi_process:
        return Tally()
    resolver = strategy.cluster_resolver
    tasks = [f"{job}-{index}" for job, addresses in sorted(resolver.cluster_spec().as_dict().items())
             for index in range(len(addresses))]
    return ClusterTally(tasks, f"{resolver.task_type}-{resolver.task_id}", next(_FITS))


class KernelCheck(keras.callbacks.Callback):
    """After the train function's first call, which kernels its graph got on every task; where oneDNN's pass left
    one to Eigen on any task, every task retraces its train function together (at most ``retraces`` times: each
    retrace is a new graph, its pass's order drawn anew) and checks again after the new one's first call.

    ``checks`` holds each check's findings (:data:`Findings`): the first is the run as it would have been, the last
    as it trained on.
    """

    def __init__(self, tally: Tally, retraces: int):
        super().__init__()
        self.tally, self.retraces = tally, retraces
        self.checks: list[Findings] = []
        self._collecting: Any = None
        self._ops: list[str] = []

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._collect()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._collecting is None:
            return
        self._stop()
        findings = self.tally(len(self.checks), fallbacks(self._ops))
        self.checks.append(findings)
        slow = fallbacks_in_words(findings)
        if not slow:
            if len(self.checks) > 1:
                log.info("kernels: oneDNN's kernels on every task after %d retrace(s)", len(self.checks) - 1)
            return
        if len(self.checks) > self.retraces:
            log.warning("kernels: Eigen's %s after %d retraces (runtime.onednn_retraces); training goes on with it",
                        slow, self.retraces)
            return
        log.warning("kernels: oneDNN's pass left Eigen's %s (20-35 %% slower, and a synchronous cluster waits for "
                    "it every step): every task retraces its train function (%d of %d)",
                    slow, len(self.checks), self.retraces)
        self.model.train_function = self.model.make_train_function(force=True)
        self._collect()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._collecting is not None:
            self._stop()

    def _collect(self) -> None:
        self._collecting = collected_graphs()
        self._ops = self._collecting.__enter__()

    def _stop(self) -> None:
        collecting, self._collecting = self._collecting, None
        collecting.__exit__(None, None, None)

