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

from matplotlib.figure import Figure  # pyplot-free: files only, no display or backend needed

from tfdist.compare.comparison import ROW_RECORDS, Comparison, Projection, RunRow
from tfdist.compare.compute import training_seconds
from tfdist.compare.noise import median_interval, steady
from tfdist.files import atomic
from tfdist.records.measures import Table, banded, columns

#: Figure file names, in the order the document shows them (the projection's only where a run was projected).
FIGURES = (
    ("time_to_accuracy.png", "Validation accuracy against training seconds, the target a line"),
    ("throughput.png", "Throughput and train time per run"),
    ("accuracy_vs_time.png", "Test accuracy vs train time"),
    ("loss_curves.png", "Training and validation loss, every run overlaid"),
    ("projection.png", "Projected speed-up against machines, break-even marked"),
)
PROJECTION_FIGURE = "projection.png"
#: One marker a run, so that runs tell apart without colour too.
_MARKERS = "osD^v<>Pph*X"

Block = tuple  # ("h1" | "h2" | "p", text) | ("ul", [text]) | ("table", headers, aligns, rows) | ("img", file, alt)


def document(comparison: Comparison) -> list[Block]:
    """The report's blocks: verdict, advice, the two tables, notes, figures."""
    rows = comparison.rows
    advice = comparison.advice
    dataset = rows[0].report.dataset
    blocks: list[Block] = [("h1", "Normal vs distributed training" + (f" on {dataset}" if dataset else "")),
                           ("p", comparison.verdict),
                           ("p", f"*{comparison.measured_on}*"),
                           ("h2", "Advice"),
                           ("ul", [f"**Here:** {advice.use}", f"**With more machines:** {advice.scale}",
                                   f"**Data, model or pipeline parallelism:** {advice.paradigms}",
                                   f"**Mixed precision:** {advice.precision}",
                                   *([f"**Input:** {advice.input}"] if advice.input else [])])]
    if comparison.scaling:
        blocks.append(_scaling_table(comparison.scaling))
    blocks += [
        ("h2", "Runs"),
        _table("setup", rows),
        ("h2", "Results"),
        _table("results", rows),
        ("h2", "What each kind of distribution holds and moves"),
        _table("costs", rows),
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
        _interval_note(rows),
        *_rounds_table(rows),
        *_disturbed_note(rows),
        *_profiled_note(rows),
        *_kernels_note(rows),
        ("p", "Global batch is examples per optimizer step (per-replica `train.batch_size` × replicas in sync); "
              "learning rate is the effective rate after `train.lr_scaling` (and the one warm-up ramps to)."),
        *_asynchronous_note(rows),
        *_precision_note(rows),
        ("h2", "Figures"),
        *[("img", f"figures/{name}", alt) for name, alt in figures_of(comparison)],
    ]
    return blocks


def _interval_note(rows: list[RunRow]) -> Block:
    """What the intervals in brackets rest on: the steady epochs within one run, or the spread between repeats."""
    decide = ("A verdict says \"paid off\" or \"did not pay off\" only where the whole interval lies above or below "
              "1.0, otherwise \"within noise\".")
    if rows[0].rounds:
        return ("p", f"Every run trained {len(rows[0].rounds)} times, interleaved (normal, then each strategy, round "
                     "after round: `compare.repeats`), so a machine that drifted did so under every run alike. Each "
                     "number is the median of the rounds' (a round's own number is its median steady epoch), and in "
                     "brackets is each speed-up's 95% interval between the rounds: a bootstrap of the ratio of the "
                     "runs' medians, every run's rounds resampled. " + decide)
    return ("p", "In brackets, each speed-up's 95% interval. With one run each it rests on the steady epochs within "
                 "the run (a bootstrap of the ratio of the two runs' median epochs): it says how steady each run was, "
                 "not how much a run on another day would differ (`compare.repeats` measures that). The speed-up to "
                 "target's rests on its resolution: a run is seen to reach the target only at an epoch's end. " + decide)


def _rounds_table(rows: list[RunRow]) -> list[Block]:
    """With repeats, every round of every run: its steady throughput, and its speed-up against normal's same round."""
    if not rows[0].rounds:
        return []
    normal = rows[0].rounds
    table = [[row.name if index == 0 else "", str(index + 1), f"{report.steady_samples_per_second:,.0f}",
              f"{report.steady_epoch_seconds:.3f}", f"{normal[index].steady_epoch_seconds / report.steady_epoch_seconds:.2f}x",
              report.disturbed or "–"]
             for row in rows for index, report in enumerate(row.rounds)]
    return [("h2", "Rounds"),
            ("table", ["run", "round", "samples/s", "s/epoch", "vs normal's round", "machine disturbed"],
             [False, True, True, True, True, False], table)]


def _disturbed_note(rows: list[RunRow]) -> list[Block]:
    """The runs whose machine was busy with something else while they trained: their numbers are partly the machine's."""
    flagged = [f"{row.name} ({row.disturbed})" for row in rows if row.disturbed]
    if not flagged:
        return []
    return [("p", "**Disturbed while training:** " + "; ".join(flagged) + ". Their timings are partly the machine's: "
                  "run them again on a quiet machine before trusting a close call.")]


def _kernels_note(rows: list[RunRow]) -> list[Block]:
    """The runs where oneDNN's pass left a kernel to Eigen's on a task: whether a retrace was rid of it."""
    flagged = []
    for row in rows:
        first, last = row.report.kernel_fallbacks
        retraces = len(row.report.kernel_checks) - 1
        if first:
            flagged.append(f"{row.name}: {first}" + (f", still after {retraces} retrace(s)" if last else
                                                     f", gone after {retraces} retrace(s)"))
    if not flagged:
        return []
    return [("p", "**Eigen's kernels:** " + "; ".join(flagged) + ". oneDNN's pass leaves a kernel (the pooling's "
                  "gradient) to Eigen's by chance, 20-35 % slower, and in a synchronous cluster the other workers "
                  "wait for it every step; every task retraced together to draw again (runtime.onednn_retraces). A "
                  "run still on it is slower for that, not for its strategy.")]


def _profiled_note(rows: list[RunRow]) -> list[Block]:
    """The runs traced in TensorFlow's profiler: the epoch captured was slowed by it, and left out of steady figures."""
    flagged = [f"{row.name} ({row.report.profiled_steps} steps of epoch {row.report.profiled_epoch})"
               for row in rows if row.report.profiled_steps]
    if not flagged:
        return []
    split = [row for row in rows if row.report.traced_step_ms is not None]
    return [("p", "**Profiled:** " + "; ".join(flagged) + ". The capture slows the epoch it watches: the steady "
                  "figures leave that epoch out, the whole run's do not. The traces are in each run's MLflow artifacts "
                  "(profile/): `tfdist tensorboard` shows them."),
            *([("h2", "The step's parts, from the workers' traces"), _table("parts", split),
               ("p", "Each traced step split on the worker that came last to the gradients' all-reduce: its ops' "
                     "time (compute), the rest until it reached the all-reduce (between ops: the executor's "
                     "hand-offs, the next batch), and the all-reduce itself (the wire); the three add up to the "
                     "step. Beside them, how long the earlier worker waited for the later one. Means over the "
                     "profiled steps within the epoch (so that they add up), slowed a little by the capture.")] if split else [])]


def table_markdown(table: Table, rows: list[RunRow]) -> str:
    """One of the comparison's tables alone, as markdown (README's copy of the baseline's results)."""
    return to_markdown([_table(table, rows)]).rstrip("\n")


def _table(table: Table, rows: list[RunRow]) -> Block:
    """One of the comparison's tables, its columns the fields declared for it (:mod:`tfdist.records.measures`), run first."""
    found = columns(table, {attribute: getattr(rows[0], attribute) if attribute else rows[0] for attribute in ROW_RECORDS})
    return ("table", ["run", *[column.heading for column in found]], [False, *[column.numeric for column in found]],
            [[row.name, *[column.cell(row) for column in found]] for row in rows])


def _scaling_table(projections: list[Projection]) -> Block:
    counts = list(projections[0].projected_speedup)
    headers = ["run", "step here (ms)", "all-reduce here (ms)", "compute (ms)", "overhead (ms)", "to break even",
               *[f"speed-up with {n}" for n in counts], "ceiling"]
    rows = [
        [p.name, f"{p.step_ms:.2f}", f"{p.all_reduce_here_ms:.2f}", f"{p.compute_ms:.2f}", f"{p.overhead_ms:.2f}",
         p.break_even_text(), *[banded(p.projected_speedup[n], p.speedup_low.get(n), p.speedup_high.get(n))
                                for n in counts],
         banded(p.ceiling_speedup, p.ceiling_low, p.ceiling_high)]
        for p in projections
    ]
    return ("table", headers, [False, True, True, True, True, True, *[True] * len(counts), True], rows)


def _asynchronous_note(rows: list[RunRow]) -> list[Block]:
    names = [row.name for row in rows if not row.report.synchronous]
    if not names:
        return []
    return [("p", f"**Asynchronous:** {', '.join(names)} trained with parameter servers: each worker runs whole "
                  "steps on its own and applies its updates to the variables on the ps without waiting for the other "
                  "workers, so workers can compute on slightly stale weights. Its global batch is one worker's step "
                  "(replicas per worker × batch size); an epoch is still one pass over the training data, shared by "
                  "the workers. The other runs are synchronous: all replicas combine their gradients before every "
                  "update.")]


def _precision_note(rows: list[RunRow]) -> list[Block]:
    slow = sorted({row.report.precision for row in rows if not row.report.precision_can_be_faster})
    if not slow:
        return []
    return [("p", f"**Precision:** this machine has no hardware that computes {', '.join(slow)} faster than float32 "
                  "(see the run's `precision.hardware` tag in MLflow), so those runs show its cost, not a speed-up.")]


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


def figures_of(comparison: Comparison) -> list[tuple[str, str]]:
    """The :data:`FIGURES` the comparison has data for (the projection's only where a run was projected), in order."""
    return [(name, alt) for name, alt in FIGURES if name != PROJECTION_FIGURE or comparison.scaling]


def plot_figures(comparison: Comparison, histories: dict[str, list[dict]], out_dir: Path) -> list[Path]:
    """Draw :func:`figures_of` the comparison into ``out_dir``; returns the PNGs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = comparison.rows
    drawn = {
        "time_to_accuracy.png": lambda: _time_to_accuracy_figure(rows, histories),
        "throughput.png": lambda: _throughput_figure(rows, histories),
        "accuracy_vs_time.png": lambda: _accuracy_vs_time_figure(rows),
        "loss_curves.png": lambda: _loss_figure(rows, histories),
        PROJECTION_FIGURE: lambda: _projection_figure(comparison),
    }
    return [_save(drawn[name](), out_dir / name) for name, _ in figures_of(comparison)]


def _time_to_accuracy_figure(rows: list[RunRow], histories: dict[str, list[dict]]) -> Figure:
    """Validation accuracy against training seconds per run, the target a line: time to accuracy at a glance."""
    fig = Figure(figsize=(8, 4.5))
    axis = fig.subplots()
    for index, row in enumerate(rows):
        history = histories.get(row.name, [])
        if history and all("val_accuracy" in h for h in history):
            line, = axis.plot(training_seconds(history), [h["val_accuracy"] for h in history],
                              marker=_MARKERS[index % len(_MARKERS)], label=_reached(row))
            if row.epochs_to_target and row.epochs_to_target > 1:  # reached somewhere within that epoch
                ends = training_seconds(history)
                start, end = ends[row.epochs_to_target - 2], ends[row.epochs_to_target - 1]
                axis.errorbar((start + end) / 2, row.target_accuracy, xerr=(end - start) / 2, color=line.get_color(),
                              capsize=4, linewidth=2, alpha=0.6)
    target = rows[0].target_accuracy
    axis.axhline(target, color="black", linestyle="--", linewidth=1)
    axis.annotate(f"target {target:.2f} (compare.target_accuracy)", (0, target), xycoords=("axes fraction", "data"),
                  xytext=(4, 4), textcoords="offset points", fontsize=8,
                  bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})
    axis.set(title="Time to accuracy (bars: the epoch each run reached the target in)", xlabel="training seconds",
             ylabel="validation accuracy")
    axis.legend(fontsize=8, loc="lower right")
    return fig


def _reached(row: RunRow) -> str:
    if row.seconds_to_target is None:
        return f"{row.name}: target not reached"
    return f"{row.name}: {row.seconds_to_target:.1f} s to target"


def _throughput_figure(rows: list[RunRow], histories: dict[str, list[dict]]) -> Figure:
    """Steady throughput per run, each bar with its error bar, and wall time.

    The error bar is the bootstrap interval of its median epoch, or with repeats of the median of its rounds.
    """
    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    names = [r.name for r in rows]
    values = [r.report.steady_samples_per_second for r in rows]
    spans = [median_interval([round_.steady_samples_per_second for round_ in r.rounds] if r.rounds else
                             steady(histories.get(r.name, []), "samples_per_second")) for r in rows]
    errors = [[max(0.0, v - s[0]) if s else 0.0 for v, s in zip(values, spans, strict=True)],
              [max(0.0, s[1] - v) if s else 0.0 for v, s in zip(values, spans, strict=True)]]
    left.bar(names, values, color="tab:blue", yerr=errors, capsize=4, ecolor="black")
    spread = f"between {len(rows[0].rounds)} repeats" if rows[0].rounds else "of the steady epochs"
    left.set(title=f"Training throughput (bars: 95% interval {spread})", ylabel="samples / s")
    right.bar(names, [r.report.train_seconds for r in rows], color="tab:orange")
    right.set(title="Train time (fit wall time)", ylabel="seconds")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30)
        for label in axis.get_xticklabels():
            label.set_horizontalalignment("right")
    return fig


def _accuracy_vs_time_figure(rows: list[RunRow]) -> Figure:
    """Each run a marker named in the legend, not a label beside its point: close points never print over each other."""
    fig = Figure(figsize=(9, 4))
    axis = fig.subplots()
    for index, row in enumerate(rows):
        axis.scatter(row.report.train_seconds, row.test_accuracy, marker=_MARKERS[index % len(_MARKERS)], s=60,
                     label=f"{row.name} ({row.report.train_seconds:.1f} s, {row.test_accuracy:.4f})")
    axis.set(title="Test accuracy vs train time", xlabel="train time (s)", ylabel="test accuracy")
    axis.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return fig


def _loss_figure(rows: list[RunRow], histories: dict[str, list[dict]]) -> Figure:
    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2, sharey=True)
    for row in rows:
        history = histories[row.name]
        epochs = [h["epoch"] for h in history]
        left.plot(epochs, [h["loss"] for h in history], marker="o", label=row.name)
        if all("val_loss" in h for h in history):
            right.plot(epochs, [h["val_loss"] for h in history], marker="o", label=row.name)
    left.set(title="Training loss", xlabel="epoch", ylabel="loss")
    right.set(title="Validation loss", xlabel="epoch")
    left.legend()
    return fig


def _projection_figure(comparison: Comparison) -> Figure:
    """Projected speed-up against machines on the assumed network, with 1x (break-even) a line and each run's ceiling."""
    network = comparison.network
    fig = Figure(figsize=(8, 4.5))
    axis = fig.subplots()
    for index, projection in enumerate(comparison.scaling):
        machines = [int(n) for n in projection.projected_speedup]
        line, = axis.plot(machines, list(projection.projected_speedup.values()), marker=_MARKERS[index % len(_MARKERS)],
                          label=_break_even(projection))
        if projection.speedup_low:  # the band the measured terms' spread gives
            axis.fill_between(machines, list(projection.speedup_low.values()), list(projection.speedup_high.values()),
                              color=line.get_color(), alpha=0.2, linewidth=0)
        axis.axhline(projection.ceiling_speedup, color=line.get_color(), linestyle=":", linewidth=1)
        if projection.break_even_machines is not None and projection.break_even_machines <= machines[-1]:
            axis.plot([projection.break_even_machines], [1.0], marker="|", markersize=18, color=line.get_color())
    axis.axhline(1.0, color="black", linestyle="--", linewidth=1, label="break-even: normal training's speed")
    axis.set(title=f"Projected speed-up on a {network.gbit:g} Gbit/s, {network.latency_us:g} µs network "
                   "(dotted: ceiling; shaded: 95% band)", xlabel="machines (a worker each)",
             ylabel="speed-up vs normal training")
    axis.set_xscale("log", base=2)
    axis.set_xticks(machines, [str(n) for n in machines])
    axis.set_ylim(bottom=0)
    axis.legend(fontsize=8)
    return fig


def _break_even(projection: Projection) -> str:
    if projection.break_even_machines is None:
        return f"{projection.name}: never breaks even (ceiling {projection.ceiling_speedup:.2f}x)"
    return f"{projection.name}: breaks even with {projection.break_even_text()}"




def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    return path
