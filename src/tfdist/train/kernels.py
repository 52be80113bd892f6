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

from tfdist.tf_private import function_graphs_collected

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
            if _plain(op) is None and (op in rewritten or op.removesuffix("Grad") in rewritten)}


@contextmanager
def collected_graphs() -> Iterator[list[str]]:
    """The ops of the functions first instantiated inside, after every rewrite (their partition graphs' nodes); the
    list is filled on leaving. Around a function's first call only: later calls instantiate nothing."""
    ops: list[str] = []
    with function_graphs_collected() as functions:
        yield ops
    ops += [node.op for function in functions for graph in function.partition_graphs for node in graph.node]
