"""Which kernels a training graph got: the ops oneDNN's layout pass left to Eigen where it rewrote their kind.

TensorFlow's oneDNN pass (``mkl_layout_pass.cc``) rewrites ``MaxPoolGrad`` only
when its input comes from an already rewritten ``_MklNativeMaxPool``; in a graph
with a cycle (``train.steps_per_execution`` above 1) its visiting order follows
pointer hashes, so some processes keep Eigen's pooling gradient, 20-35 % slower
(docs/performance/parallelism.md, "The pooling gradient"), and in a synchronous
cluster every other worker waits for that one. The pass's output is in the
partition graphs TensorFlow collects as a function is first instantiated
(``enable_graph_collection``): no profiler needed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

#: The prefix of oneDNN's rewritten ops (``_MklNativeMaxPool``; ``_Mkl`` for the few with layout tensors).
_REWRITTEN = ("_MklNative", "_Mkl")


def _plain(op: str) -> str | None:
    """The op a rewritten op replaced (``_MklNativeMaxPool`` -> ``MaxPool``), None for an op not rewritten."""
    for prefix in _REWRITTEN:
        if op.startswith(prefix):
            return op[len(prefix):]
    return None


def fallbacks(ops: Iterable[str]) -> dict[str, int]:
    """The op types a graph's nodes (``ops``, one entry a node) kept Eigen's kernel for where oneDNN rewrote the
    same kind, or the op a gradient belongs to, elsewhere in it; with how many nodes each."""
    counts = Counter(ops)
    rewritten = {plain for op in counts if (plain := _plain(op))}
    return {op: n for op, n in sorted(counts.items())
            if _plain(op) is None and (op in rewritten or op.removesuffix("Grad") in rewritten and op.endswith("Grad"))}


def partition_ops(run_metadata: Any) -> list[str]:
    """Every node's op in the partition graphs (after every rewrite) of the functions a RunMetadata collected."""
    return [node.op for function in run_metadata.function_graphs for graph in function.partition_graphs
            for node in graph.node]


@contextmanager
def collected_graphs() -> Iterator[list[str]]:
    """Collect the graphs of the functions first instantiated inside; the list is filled with their nodes' ops on
    leaving (graph collection costs only at instantiation, so it is on for the first call only)."""
    from tensorflow.python.eager import context

    ops: list[str] = []
    runtime = context.context()
    runtime.enable_graph_collection()
    try:
        yield ops
    finally:
        ops += partition_ops(runtime.export_run_metadata())
        runtime.disable_graph_collection()
