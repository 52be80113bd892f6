"""Benchmark results as data: every round of every cell, with the machine, the commit and the command that made them.

Stored as JSON under ``benchmarks/results/NAME/DATE-COMMIT.json``, which the
repository keeps: the docs' tables are rendered from them
(:mod:`benchmarks.docs`), and two results of one benchmark compare cell by cell
(:func:`compare`), so "did this change make it slower?" is answered side by
side, not against another day's number.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).parent / "results"
#: CPU flags that change what a benchmark measures (vector width, 16-bit units).
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


@dataclass(frozen=True)
class Cell:
    """One cell: its parameters, each round's measurements (``{metric: value}``), or why it was skipped here."""

    params: dict[str, Any]
    rounds: list[dict[str, float]]
    skipped: str | None = None

    def values(self, metric: str) -> list[float]:
        return [measured[metric] for measured in self.rounds if measured.get(metric) is not None]


@dataclass(frozen=True)
class Result:
    """One run of one benchmark (``benchmarks/results/NAME/DATE-COMMIT.json``).

    Attributes:
        benchmark, title, command: which, what it measures, and the command that ran it.
        date, commit: when (UTC) and from which commit (``+dirty``: with uncommitted changes).
        machine: CPU model, cores, usable CPUs, the flags that matter, memory, kernel, Python, TensorFlow.
        options: the shared options and the benchmark's own, as run.
        seconds: the run's wall time; steal_seconds: CPU time the host gave other guests meanwhile.
        cells: every cell with every round.
    """

    benchmark: str
    title: str
    command: str
    date: str
    commit: str
    machine: dict[str, Any]
    options: dict[str, Any]
    seconds: float
    steal_seconds: float
    cells: list[Cell] = field(default_factory=list)

    def cell(self, **params: Any) -> Cell | None:
        """The cell with these parameters (None: this run has none)."""
        return next((cell for cell in self.cells if all(cell.params.get(k) == v for k, v in params.items())), None)


def machine() -> dict[str, Any]:
    """This machine as a benchmark depends on it, read now (the CPU differs from session to session)."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        tensorflow = metadata.version("tensorflow")
    except metadata.PackageNotFoundError:
        tensorflow = None
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "flags": [flag for flag in FLAGS if flag in flags], "memory_gib": round(memory, 1),
            "kernel": platform.release(), "python": platform.python_version(), "tensorflow": tensorflow}


def commit() -> str:
    """The checkout's commit, ``+dirty`` where its code differs from it (unknown outside git)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short=10", "HEAD") or "unknown"
    # what can change a measurement: the code and its lock, not the docs or the stored results
    code = ("src", "stages", "benchmarks", ":!benchmarks/results", "pyproject.toml", "uv.lock", "params.yaml")
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no", "--", *code) else "")


def store(result: Result, root: Path | None = None) -> Path:
    """Write ``result`` under ``root/NAME/`` (default :data:`ROOT`; a new file: a later run never overwrites an earlier one)."""
    folder = (root or ROOT) / result.benchmark
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{result.date}-{result.commit.replace('+', '-')}"
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    staged = path.with_suffix(".json.tmp")
    staged.write_text(json.dumps(asdict(result), indent=1) + "\n")
    staged.rename(path)
    return path


def read(path: Path | str) -> Result:
    """A stored result; SystemExit naming the file where it is missing or not one."""
    try:
        data = json.loads(Path(path).read_text())
        return Result(**{**data, "cells": [Cell(**cell) for cell in data["cells"]]})
    except FileNotFoundError:
        raise SystemExit(f"error: no stored result {path}") from None
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        raise SystemExit(f"error: {path} is not a stored benchmark result ({err})") from None


def spread(values: list[float], digits: int = 2) -> str:
    """The median and the lowest-highest range of repeated measurements: ``1.23 (1.10-1.40)``; a dash for none."""
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def median(values: list[float]) -> float:
    return statistics.median(values)


def cell_label(params: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in params.items())


def metrics_of(result: Result) -> list[str]:
    """Every metric some cell measured, in the order first measured."""
    found: dict[str, None] = {}
    for cell in result.cells:
        for measured in cell.rounds:
            found.update(dict.fromkeys(measured))
    return list(found)


def default_table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per cell: its parameters, then each metric's median (lowest-highest) over the rounds."""
    params = list(result.cells[0].params) if result.cells else []
    metrics = metrics_of(result)
    rows = [[str(cell.params.get(p, "")) for p in params]
            + ([f"skipped: {cell.skipped}"] + [""] * (len(metrics) - 1) if cell.skipped else
               [spread(cell.values(metric)) for metric in metrics]) for cell in result.cells]
    return [*params, *metrics], rows


def caption(result: Result) -> str:
    """Where and from what a table came: the machine, the commit, the command, the rounds."""
    m = result.machine
    flags = ", ".join(m.get("flags", [])) or "no AVX2"
    return (f"*{result.title}: median (lowest-highest) of {result.options.get('rounds')} alternated rounds. "
            f"Measured on {m.get('cpu')} ({m.get('usable_cpus')} of {m.get('cores')} CPUs; {flags}), "
            f"commit {result.commit}, {result.date}, `{result.command}`; the host took "
            f"{result.steal_seconds:.1f} s of CPU (steal) during its {result.seconds:.0f} s.*")


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table, the first column left-aligned and the rest right-aligned."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def render(result: Result, module: ModuleType | None = None) -> str:
    """The result's table (the benchmark's own ``table`` if it has one) under its caption."""
    headers, rows = module.table(result) if module is not None and hasattr(module, "table") else default_table(result)
    return caption(result) + "\n\n" + markdown_table(headers, rows)


def compare(old: Result, new: Result) -> str:
    """Two results of one benchmark side by side: per cell and metric, new over old, with the range of that ratio.

    The range sets each run's lowest against the other's highest: a ratio whose
    range holds 1.00 is within the two runs' noise.
    """
    if old.benchmark != new.benchmark:
        raise SystemExit(f"error: {old.benchmark} and {new.benchmark} are different benchmarks; compare one with itself")
    metrics = [metric for metric in metrics_of(new) if metric in metrics_of(old)]
    rows = []
    for cell in new.cells:
        before = old.cell(**cell.params)
        if before is None:
            continue
        row = [cell_label(cell.params)]
        for metric in metrics:
            a, b = before.values(metric), cell.values(metric)
            row.append(f"{median(b) / median(a):.2f}x ({min(b) / max(a):.2f}-{max(b) / min(a):.2f})"
                       if a and b and min(a) > 0 else "–")
        rows.append(row)
    head = (f"{new.benchmark}: {new.commit} on {new.machine.get('cpu')} ({new.date}) over "
            f"{old.commit} on {old.machine.get('cpu')} ({old.date}); new / old, median (range)")
    return head + "\n\n" + markdown_table(["cell", *metrics], rows)
