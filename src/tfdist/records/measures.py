"""What a measured number is, declared once on the field that holds it: every view derives from the declaration.

A field of a report (:class:`tfdist.records.reports.TrainReport`, the evaluate stage's
report, the comparison's row) says in its metadata how MLflow logs it, whether
the comparison's tables show it (which table, under which heading, in which
format), whether higher or lower is better, and whether the comparison sets it
against normal training as a ratio. :func:`mlflow_metrics`, :func:`columns`
and :func:`ratios` read those declarations, so adding a measured number is one
field with its metadata: the MLflow metrics, compare.json, metrics.json and
the report's tables follow.

Example::

    @dataclass(frozen=True)
    class Report:
        step_ms: float | None = field(default=None, metadata=measure(
            mlflow="step_ms", table="results", heading="step (ms)", format="{:.2f}", better="lower"))
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: The comparison's tables: the runs' setup, their results, what each kind of distribution holds and moves.
Table = Literal["setup", "results", "costs", "parts"]
Better = Literal["higher", "lower"]
_KEY = "measure"


@dataclass(frozen=True)
class Ratio:
    """A number set against normal training's: better-than-normal is above 1 whichever way the number improves.

    Attributes:
        name: its key in the comparison row's ``vs_normal`` (and in metrics.json where ``headline``).
        heading: its column in the results table (None: not shown).
        headline: whether metrics.json (``dvc exp show``) lists it.
        samples: the per-epoch history column whose steady epochs give the ratio its interval
            (:mod:`tfdist.compare.noise`; None: it has none). The row holds the interval in
            ``vs_normal_low`` and ``vs_normal_high``, and the cell, metrics.json and MLflow show it.
    """

    name: str
    heading: str | None = None
    headline: bool = False
    samples: str | None = None


@dataclass(frozen=True)
class Measure:
    """How one field is logged, shown and compared (``field(metadata=measure(...))``).

    Attributes:
        mlflow: its MLflow metric name (a dict field: a pattern with ``{key}``); None: not a metric.
        scale: the metric is the value times this (seconds logged as milliseconds: 1e3).
        table, heading, format: the comparison table that shows it, the column's heading, the cell's format
            (a ``str.format`` pattern, or a function of the value).
        numeric: whether its column aligns right, as numbers do.
        missing: a cell whose value is None.
        better: which way the number improves ("higher", "lower"; None: neither, a setting).
        ratio: its ratio against normal training (normal's over the run's where lower is better).
        headline: its key in metrics.json (None: not listed).
        reduce: what of a list value is logged and shown (``max``).
        interval: the fields of the same record holding its interval's low and high ends, shown beside it.
    """

    mlflow: str | None = None
    scale: float = 1.0
    table: Table | None = None
    heading: str = ""
    format: str | Callable[[Any], str] = "{}"
    numeric: bool = True
    missing: str = "–"
    better: Better | None = None
    ratio: Ratio | None = None
    headline: str | None = None
    reduce: Callable[[Any], Any] | None = None
    interval: tuple[str, str] | None = None

    def value(self, raw: Any) -> Any:
        """The value as logged and shown: ``reduce`` applied."""
        return self.reduce(raw) if self.reduce is not None and raw is not None else raw

    def cell(self, raw: Any) -> str:
        """The value in a table's cell."""
        value = self.value(raw)
        if value is None:
            return self.missing
        return self.format(value) if callable(self.format) else self.format.format(value)


def measure(**declared: Any) -> dict[str, Measure]:
    """A field's metadata declaring it a measured number (the keywords are :class:`Measure`'s)."""
    return {_KEY: Measure(**declared)}


def declared(record: Any) -> list[tuple[str, Measure]]:
    """The fields of a dataclass (or an instance) that declare a :class:`Measure`, in field order."""
    return [(f.name, f.metadata[_KEY]) for f in dataclasses.fields(record) if _KEY in f.metadata]


def mlflow_metrics(record: Any, *, nested: bool = True) -> dict[str, float]:
    """A record's MLflow metrics: each declared field's value (scaled), and with ``nested`` its records' too.

    None values are left out: a run that has no such number logs no metric.
    """
    metrics: dict[str, float] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        found = f.metadata.get(_KEY)
        if nested and dataclasses.is_dataclass(value) and not isinstance(value, type):
            metrics.update(mlflow_metrics(value))
        elif found is not None and found.mlflow is not None and value is not None:
            if isinstance(value, Mapping):
                metrics.update({found.mlflow.format(key=key): float(item) * found.scale for key, item in value.items()})
            else:
                metrics[found.mlflow] = float(found.value(value)) * found.scale
    return metrics


def headlines(record: Any) -> dict[str, float]:
    """The declared fields metrics.json lists, under their headline keys (None values left out)."""
    return {found.headline: found.value(getattr(record, name)) for name, found in declared(record)
            if found.headline is not None and getattr(record, name) is not None}


def ratio(found: Measure, value: float | None, normal: float | None) -> float | None:
    """``value`` against normal training's: above 1 is better than normal (None where either is missing or zero)."""
    if value is None or normal is None or value == 0 or normal == 0:
        return None
    return normal / value if found.better == "lower" else value / normal


def ratios(record: Any, normal: Any) -> dict[str, float | None]:
    """Every declared ratio of ``record`` against ``normal`` (records of one kind), by the ratio's name."""
    return {found.ratio.name: ratio(found, found.value(getattr(record, name)), found.value(getattr(normal, name)))
            for name, found in declared(record) if found.ratio is not None}


def median_record(records: Sequence[Any]) -> Any:
    """The first of ``records`` (one kind) with each measured number the median of theirs: what repeats report.

    A measured number is a declared field that improves one way (``better``) and
    holds a number in every record; anything else (names, settings, lists,
    nested records) is the first record's. An int field stays an int.
    """
    first, changes = records[0], {}
    for name, found in declared(first):
        values = [getattr(record, name) for record in records]
        if found.better is None or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            continue
        middle = statistics.median(values)
        changes[name] = round(middle) if isinstance(values[0], int) else float(middle)
    return dataclasses.replace(first, **changes)


@dataclass(frozen=True)
class Column:
    """One column of a comparison table: its heading, and how a row's cell is read and formatted."""

    heading: str
    numeric: bool
    cell: Callable[[Any], str]


def columns(table: Table, sources: Mapping[str, Any]) -> list[Column]:
    """The columns of ``table`` declared by the records in ``sources`` (name -> a record of each kind), in order.

    ``sources`` maps an attribute of the row (``""``: the row itself) to a
    record of the kind found there; each declared field of that kind with this
    ``table`` is a column, followed by its ratio's column where that has a
    heading (read from the row's ``vs_normal``).
    """
    found: list[Column] = []
    for attribute, record in sources.items():
        for name, declaration in declared(record):
            if declaration.table != table:
                continue
            found.append(Column(declaration.heading, declaration.numeric, _reader(attribute, name, declaration)))
            if declaration.ratio is not None and declaration.ratio.heading:
                found.append(Column(declaration.ratio.heading, True, _ratio_reader(declaration.ratio.name)))
    return found


def _reader(attribute: str, name: str, declaration: Measure) -> Callable[[Any], str]:
    def cell(row: Any) -> str:
        holder = getattr(row, attribute) if attribute else row
        text = declaration.cell(getattr(holder, name))
        if declaration.interval is None:
            return text
        low, high = (getattr(holder, end) for end in declaration.interval)
        return text if low is None or high is None else f"{text} {interval_text(low, high)}"
    return cell


def _ratio_reader(name: str) -> Callable[[Any], str]:
    def cell(row: Any) -> str:
        value = row.vs_normal.get(name)
        if value is None:
            return "–"
        return banded(value, row.vs_normal_low.get(name), row.vs_normal_high.get(name))
    return cell


def interval_text(low: float, high: float) -> str:
    """A ratio's interval beside it in a cell: ``(0.47-0.55)``."""
    return f"({low:.2f}-{high:.2f})"


def banded(value: float, low: float | None, high: float | None) -> str:
    """A ratio and its interval where it has one: ``0.51x (0.47-0.55)``, or ``0.51x``."""
    return f"{value:.2f}x" + ("" if low is None or high is None else f" {interval_text(low, high)}")
