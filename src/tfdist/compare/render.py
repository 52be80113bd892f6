"""Renders the comparison (computed by :mod:`tfdist.compare.compute`) for people: markdown, HTML, figures.

The document is a list of blocks (headings, paragraphs, lists, tables,
figures) built once from the comparison, so the markdown and the HTML say
the same things. The HTML inlines its figures and style: it opens from a
file, an artifact store or a mail attachment without fetching anything.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure  # pyplot-free: files only, no display or backend needed

from tfdist import atomic
from tfdist.compare.comparison import Comparison, Projection, RunRow

#: Figure file names, in the order the document shows them.
FIGURES = (
    ("throughput.png", "Throughput and train time per run"),
    ("accuracy_vs_time.png", "Test accuracy vs train time"),
    ("loss_curves.png", "Training and validation loss, every run overlaid"),
)

SETUP_COLUMNS = (
    ("name", "run"),
    ("strategy", "strategy"),
    ("loop", "loop"),
    ("precision", "precision"),
    ("synchronous", "sync"),
    ("replicas", "replicas"),
    ("processes", "workers + ps"),
    ("global_batch_size", "global batch"),
    ("learning_rate", "learning rate"),
)
RESULT_COLUMNS = (
    ("name", "run"),
    ("samples_per_second", "samples/s"),
    ("cpu_percent", "CPU use"),
    ("steady_epoch_seconds", "s/epoch"),
    ("first_epoch_overhead_seconds", "1st-epoch overhead (s)"),
    ("train_seconds", "train time (s)"),
    ("speedup", "speed-up vs normal"),
    ("epochs_to_target", "epochs to target"),
    ("seconds_to_target", "time to target (s)"),
    ("time_to_accuracy_speedup", "speed-up to target"),
    ("test_accuracy", "test accuracy"),
    ("accuracy_delta_points", "Δ accuracy (points)"),
)
#: Time-to-accuracy cells of a run that never reached the target.
_TO_TARGET = ("epochs_to_target", "seconds_to_target", "time_to_accuracy_speedup")
COST_COLUMNS = (
    ("name", "run"),
    ("paradigm", "paradigm"),
    ("max_params_per_device", "parameters per device"),
    ("bytes_per_step", "bytes moved per step"),
    ("micro_batches", "micro-batches"),
    ("bubble", "bubble measured"),
    ("bubble_theory", "bubble in theory"),
)
_TEXT_COLUMNS = ("name", "strategy", "loop", "precision", "unit", "paradigm")

Block = tuple  # ("h1" | "h2" | "p", text) | ("ul", [text]) | ("table", headers, aligns, rows) | ("img", file, alt)


def document(comparison: Comparison) -> list[Block]:
    """The report's blocks: verdict, advice, the two tables, notes, figures."""
    rows = comparison.rows
    advice = comparison.advice
    blocks: list[Block] = [("h1", "Normal vs distributed training"), ("p", comparison.verdict),
                           ("p", f"*{comparison.measured_on}*"),
                           ("h2", "Advice"),
                           ("ul", [f"**Here:** {advice.use}", f"**With more machines:** {advice.scale}",
                                   f"**Data, model or pipeline parallelism:** {advice.paradigms}",
                                   f"**Mixed precision:** {advice.precision}"])]
    if comparison.scaling:
        blocks.append(_scaling_table(comparison.scaling))
    blocks += [
        ("h2", "Runs"),
        _table(SETUP_COLUMNS, rows),
        ("h2", "Results"),
        _table(RESULT_COLUMNS, rows),
        ("h2", "What each kind of distribution holds and moves"),
        _table(COST_COLUMNS, rows),
        ("p", "Parameters per device: the most any one device holds (a data-parallel replica holds them all; a layer "
              "split, its layers'). Bytes moved per step: counted from tensor shapes and the strategy's pattern "
              "(gradients reduced to one device and back, variables read from the central device, a ring "
              "all-reduce, a worker's pull and push, or activations and their gradients across each stage "
              "boundary). Bubble: the share of a step the split's devices were idle, measured (each stage timed "
              "alone against the whole step) and in theory, (S-1)/(M+S-1) for S stages and M micro-batches."),
        ("p", "Samples/s and s/epoch are steady state: training examples per second, and the median training time "
              "of the epochs after the first. The first epoch also traces the step functions (and connects a "
              "cluster): its overhead is shown apart. Speed-up is normal s/epoch divided by the run's. Train time "
              "is the wall time of Keras `fit` (all epochs, validation, tracing, per-epoch backups). Test accuracy "
              "is on the held-out test split; Δ accuracy is against normal training."),
        ("p", f"Time to target: the epochs, and the training seconds (the epochs' training time, first epoch "
              f"included, validation left out), until validation accuracy first reached "
              f"{rows[0].target_accuracy:.2f} (`compare.target_accuracy`), as MLPerf Training scores time to a "
              "quality: a run with a larger global batch may need more epochs. Speed-up to target is normal "
              "training's time to it divided by the run's."),
        ("p", "Global batch is examples per optimizer step (per-replica `train.batch_size` × replicas in sync); "
              "learning rate is the effective rate after `train.lr_scaling` (and the one warm-up ramps to)."),
        *_asynchronous_note(rows),
        *_precision_note(rows),
        ("h2", "Figures"),
        *[("img", f"figures/{name}", alt) for name, alt in FIGURES],
    ]
    return blocks


def _table(columns: tuple[tuple[str, str], ...], rows: list[RunRow]) -> Block:
    return ("table", [title for _, title in columns], [key not in _TEXT_COLUMNS for key, _ in columns],
            [[_cell(key, getattr(row, key)) for key, _ in columns] for row in rows])


def _scaling_table(projections: list[Projection]) -> Block:
    counts = list(projections[0].projected_speedup)
    headers = ["run", "step here (ms)", "all-reduce here (ms)", "compute (ms)", "to break even",
               *[f"speed-up with {n}" for n in counts], "ceiling"]
    rows = [
        [p.name, f"{p.step_ms:.2f}", f"{p.all_reduce_here_ms:.2f}", f"{p.compute_ms:.2f}",
         "never" if p.break_even_machines is None else f"{p.break_even_machines} machines",
         *[f"{p.projected_speedup[n]:.2f}x" for n in counts], f"{p.ceiling_speedup:.2f}x"]
        for p in projections
    ]
    return ("table", headers, [False, True, True, True, True, *[True] * len(counts), True], rows)


def _asynchronous_note(rows: list[RunRow]) -> list[Block]:
    names = [row.name for row in rows if not row.synchronous]
    if not names:
        return []
    return [("p", f"**Asynchronous:** {', '.join(names)} trained with parameter servers: each worker runs whole "
                  "steps on its own and applies its updates to the variables on the ps without waiting for the other "
                  "workers, so workers can compute on slightly stale weights. Its global batch is one worker's step "
                  "(replicas per worker × batch size); an epoch is still one pass over the training data, shared by "
                  "the workers. The other runs are synchronous: all replicas combine their gradients before every "
                  "update.")]


def _precision_note(rows: list[RunRow]) -> list[Block]:
    slow = sorted({row.precision for row in rows if not row.precision_can_be_faster})
    if not slow:
        return []
    return [("p", f"**Precision:** this machine has no hardware that computes {', '.join(slow)} faster than float32 "
                  "(see the run's `precision.hardware` tag in MLflow), so those runs show its cost, not a speed-up.")]


def _cell(key: str, value: Any) -> str:
    formats = {
        "train_seconds": "{:.1f}", "steady_epoch_seconds": "{:.3f}", "first_epoch_overhead_seconds": "{:.2f}",
        "samples_per_second": "{:,.0f}", "cpu_percent": "{:.0f}%", "speedup": "{:.2f}x", "test_accuracy": "{:.4f}",
        "accuracy_delta_points": "{:+.2f}", "learning_rate": "{:g}", "max_params_per_device": "{:,}",
        "bytes_per_step": "{:,}", "bubble": "{:.0%}", "bubble_theory": "{:.0%}",
        "seconds_to_target": "{:.1f}", "time_to_accuracy_speedup": "{:.2f}x",
    }
    if key == "synchronous":
        return "sync" if value else "async"
    if value is None:
        # a run that never reached the target; otherwise not measured for this kind of run (a bubble without a split)
        return "not reached" if key in _TO_TARGET else "–"
    return formats[key].format(value) if key in formats else str(value)


def to_markdown(blocks: list[Block]) -> str:
    """GitHub-flavoured markdown; figures are linked relative to the report's folder."""
    out: list[str] = []
    for kind, *body in blocks:
        if kind == "h1":
            out += [f"# {body[0]}", ""]
        elif kind == "h2":
            out += [f"## {body[0]}", ""]
        elif kind == "p":
            out += [body[0], ""]
        elif kind == "ul":
            out += [*(f"- {item}" for item in body[0]), ""]
        elif kind == "table":
            headers, numeric, rows = body
            out += ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
            out += ["| " + " | ".join(row) + " |" for row in rows] + [""]
        elif kind == "img":
            out += [f"![{body[1]}]({body[0]})", ""]
    return "\n".join(out)


_STYLE = """
body { font: 15px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #1f2328; }
h1, h2 { border-bottom: 1px solid #d1d9e0; padding-bottom: .3em; }
table { border-collapse: collapse; margin: 1em 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #d1d9e0; padding: 4px 10px; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { background: #eff1f3; padding: .1em .3em; border-radius: 4px; font-size: 90%; }
img { max-width: 100%; display: block; margin: 1em 0; }
"""


def to_html(blocks: list[Block], base_dir: Path) -> str:
    """One self-contained HTML page: style inline, figures read from ``base_dir`` and embedded as data URIs."""
    title = next((body[0] for kind, *body in blocks if kind == "h1"), "Comparison")
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"]
    for kind, *body in blocks:
        if kind in ("h1", "h2", "p"):
            out.append(f"<{kind}>{_inline(body[0])}</{kind}>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in body[0]) + "</ul>")
        elif kind == "table":
            headers, numeric, rows = body
            head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
            cells = ("".join(f'<td class="num">{html.escape(c)}</td>' if n else f"<td>{html.escape(c)}</td>"
                             for c, n in zip(row, numeric, strict=True)) for row in rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>"
                       + "".join(f"<tr>{c}</tr>" for c in cells) + "</tbody></table>")
        elif kind == "img":
            data = base64.b64encode((base_dir / body[0]).read_bytes()).decode("ascii")
            out.append(f'<img src="data:image/png;base64,{data}" alt="{html.escape(body[1])}">')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _inline(text: str) -> str:
    """Escape, then the two markdown marks the document uses: **bold** and `code`."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def render_markdown(comparison: Comparison) -> str:
    """The comparison as GitHub markdown."""
    return to_markdown(document(comparison))


def render_html(comparison: Comparison, base_dir: Path) -> str:
    """The comparison as one HTML page; its figures must already be in ``base_dir/figures``."""
    return to_html(document(comparison), base_dir)


def plot_figures(comparison: Comparison, histories: dict[str, list[dict]], out_dir: Path) -> list[Path]:
    """Throughput bars, accuracy against time, and loss curves overlaid; returns the PNGs."""
    rows = comparison.rows
    names = [r.name for r in rows]
    out_dir.mkdir(parents=True, exist_ok=True)
    throughput_png, accuracy_png, loss_png = (out_dir / name for name, _ in FIGURES)
    paths = []

    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    left.bar(names, [r.samples_per_second for r in rows], color="tab:blue")
    left.set(title="Training throughput", ylabel="samples / s")
    right.bar(names, [r.train_seconds for r in rows], color="tab:orange")
    right.set(title="Train time (fit wall time)", ylabel="seconds")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30)
    paths.append(_save(fig, throughput_png))

    fig = Figure(figsize=(6, 4))
    axis = fig.subplots()
    for row in rows:
        axis.scatter(row.train_seconds, row.test_accuracy)
        axis.annotate(row.name, (row.train_seconds, row.test_accuracy), textcoords="offset points", xytext=(5, 5))
    axis.set(title="Test accuracy vs train time", xlabel="train time (s)", ylabel="test accuracy")
    paths.append(_save(fig, accuracy_png))

    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2, sharey=True)
    for name in names:
        epochs = [h["epoch"] for h in histories[name]]
        left.plot(epochs, [h["loss"] for h in histories[name]], marker="o", label=name)
        if all("val_loss" in h for h in histories[name]):
            right.plot(epochs, [h["val_loss"] for h in histories[name]], marker="o", label=name)
    left.set(title="Training loss", xlabel="epoch", ylabel="loss")
    right.set(title="Validation loss", xlabel="epoch")
    left.legend()
    paths.append(_save(fig, loss_png))
    return paths


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    return path
