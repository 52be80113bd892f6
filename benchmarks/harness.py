"""The benchmark harness: the shared options parsed once, rounds alternated over every cell, results stored as data.

A benchmark is a module of this package that declares what it measures (asv's
and pyperf's shape):

- ``TITLE``: one line, what it measures;
- ``DEFAULTS``: its defaults for the shared options (:class:`Options`);
- ``cells(options)``: the cells, each a dict of parameters (a model kind, a batch, a setting);
- ``setup(options)``: what every cell shares (a scratch folder, the data, test hosts), once per run;
  ``teardown(context)`` (optional) releases it, whatever happened;
- ``measure(cell, context, options)``: one round of one cell, as ``{metric: value}``;
- ``table(result)`` (optional): its table's headers and rows, from the stored result
  (:func:`benchmarks.results.default_table` otherwise: a row per cell, every metric's median and range).

The harness runs round after round, each round every cell once, so that a machine's slow and
quiet spells fall on every cell alike, and writes every round of every cell with the machine
(CPU, cores, the flags that matter), the commit, the date and the command
(:mod:`benchmarks.results`). A cell whose ``measure`` raises :class:`Unsupported` is skipped on
this machine, and the result says why.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import itertools
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks import results
from tfdist.hardware import steal_seconds

PACKAGE = Path(__file__).parent
#: Modules of this package that are not benchmarks.
NOT_BENCHMARKS = {"__init__", "__main__", "harness", "results", "docs", "common", "procfs", "stage", "traces"}


class Unsupported(Exception):
    """A cell this machine cannot run (no GPU, no AVX512-BF16, not root): skipped, and the result says why."""


@dataclass(frozen=True)
class Options:
    """The options every benchmark shares, parsed once (``python -m benchmarks NAME --help``).

    Attributes:
        rounds: rounds of every cell, alternated.
        models: model kinds (``model.kind``) the cells cover.
        batches: per-replica batch sizes the cells cover.
        epochs: epochs of each training run.
        store: whether the result is written under benchmarks/results/ (``--no-store``: printed only).
        extra: the benchmark's own options, ``--set key=value`` (YAML-typed).
    """

    rounds: int = 3
    models: tuple[str, ...] = ("mlp", "cnn")
    batches: tuple[int, ...] = (25, 256)
    epochs: int = 3
    store: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def grid(options: Options, **axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every model kind and batch of ``options``, each with every combination of ``axes``' values, in order."""
    names = ["model", "batch", *axes]
    values = [options.models, options.batches, *axes.values()]
    return [dict(zip(names, combination, strict=True)) for combination in itertools.product(*values)]


def benchmark_names() -> list[str]:
    """Every module of this package, benchmarks that store results and scripts not yet moved onto the harness."""
    return sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem not in NOT_BENCHMARKS)


def describe(name: str) -> tuple[bool, str]:
    """Whether benchmark ``name`` stores results, and its title: read from its source, without importing it."""
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    title = next((node.value.value for node in tree.body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "TITLE" for t in node.targets)
                  and isinstance(node.value, ast.Constant)), None)
    return {"cells", "measure"} <= defined, title or (ast.get_docstring(tree) or "").splitlines()[0]


def load(name: str) -> ModuleType:
    """The benchmark module ``name``; SystemExit naming the benchmarks there are."""
    if name not in benchmark_names():
        raise SystemExit(f"error: no benchmark {name!r}; benchmarks: {', '.join(benchmark_names())}")
    return importlib.import_module(f"benchmarks.{name}")


def is_harnessed(module: ModuleType) -> bool:
    """Whether ``module`` declares cells for the harness (else it is a script with its own ``main``)."""
    return hasattr(module, "cells") and hasattr(module, "measure")


def parse_options(module: ModuleType, argv: Sequence[str]) -> Options:
    """The shared options from ``argv``, the benchmark's ``DEFAULTS`` where not given."""
    import yaml

    defaults = replace(Options(), **getattr(module, "DEFAULTS", {}))
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {module.__name__.rsplit('.', 1)[-1]}",
                                     description=module.TITLE)
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="rounds of every cell, alternated")
    parser.add_argument("--models", nargs="+", default=list(defaults.models), help="model kinds")
    parser.add_argument("--batches", type=int, nargs="+", default=list(defaults.batches), help="per-replica batches")
    parser.add_argument("--epochs", type=int, default=defaults.epochs, help="epochs of each training run")
    parser.add_argument("--no-store", dest="store", action="store_false", help="print the table, store nothing")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a benchmark's own option")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    extra = dict(defaults.extra)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r} must look like key=value")
        extra[key] = yaml.safe_load(value)
    return Options(args.rounds, tuple(args.models), tuple(args.batches), args.epochs, args.store, extra)


def run(name: str, argv: Sequence[str]) -> results.Result | None:
    """Run benchmark ``name`` with ``argv``: every round of every cell, stored; None for a script not yet moved."""
    module = load(name)
    if not is_harnessed(module):
        sys.argv = [f"benchmarks/{name}.py", *argv]
        module.main()
        return None
    options = parse_options(module, argv)
    cells = module.cells(options)
    context = module.setup(options) if hasattr(module, "setup") else None
    machine, commit = results.machine(), results.commit()  # what ran: read before, not after
    started, steal = time.time(), steal_seconds()
    rounds: list[list[dict[str, float]]] = [[] for _ in cells]
    skipped: dict[int, str] = {}
    try:
        for round_ in range(options.rounds):
            for index, cell in enumerate(cells):
                if index in skipped:
                    continue
                try:
                    measured = module.measure(cell, context, options)
                except Unsupported as why:
                    skipped[index] = str(why)
                    continue
                rounds[index].append(measured)
                shown = ", ".join(f"{key} {value:.4g}" for key, value in measured.items() if value is not None)
                print(f"round {round_ + 1}/{options.rounds} {results.cell_label(cell)}: {shown}", file=sys.stderr,
                      flush=True)
    finally:
        if hasattr(module, "teardown"):
            module.teardown(context)
    result = results.Result(
        benchmark=name, title=module.TITLE, command=f"python -m benchmarks {name} {shlex.join(argv)}".strip(),
        date=time.strftime("%Y-%m-%d", time.gmtime(started)), commit=commit, machine=machine,
        options={"rounds": options.rounds, "models": list(options.models), "batches": list(options.batches),
                 "epochs": options.epochs, **options.extra},
        seconds=round(time.time() - started, 1), steal_seconds=round(steal_seconds() - steal, 2),
        cells=[results.Cell(cell, rounds[i], skipped.get(i)) for i, cell in enumerate(cells)])
    print(results.render(result, module))
    if options.store:
        print(f"stored {results.store(result)}", file=sys.stderr)
    return result
