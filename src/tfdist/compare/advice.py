"""The comparison in words: the verdict and the advice, each sentence from the numbers.

:mod:`tfdist.compare.compute` computes the rows and the projection; this
module says what they mean for the user's choice (distribute or not, with
which strategy, on how many machines, in which precision) and why. Thresholds
are named here so that a test can drive each branch.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfdist.compare.comparison import Advice, Network, Projection, RunRow
from tfdist.compare.noise import Decision
from tfdist.config.knobs import MIXED_PRECISIONS
from tfdist.distribute.registry import splits_layers
from tfdist.records.measures import banded
from tfdist.records.reports import PrecisionSupport

# Below this ratio either way, a speed difference is taken for noise where it has no measured interval
# (runs of a single steady epoch, and the projection, whose terms carry none yet).
_NOISE = 0.10
# The most repeats a verdict within noise suggests running; more, and the difference is too small to matter here.
_REPEATS_WORTH_SUGGESTING = 10
# Test accuracy lost (points) past which the advice says so.
_ACCURACY_LOSS_POINTS = 1.0
# The all-reduce's share of a step projected on 2 machines past which the advice suggests sending gradients
# in 16 bits: halving the bytes can then cut the step by more than the noise between runs.
_WIRE_SHARE_TO_COMPRESS = 0.25
#: The share of its training time a run's steps waited for their batch past which the advice calls it input-bound.
INPUT_BOUND = 0.25
#: Machine counts the projection shows.
PROJECTED_MACHINES = (2, 4, 8, 16)
#: How far the projection was checked: where, not one session's figures (the docs hold those, with their machine).
CHECKED = ("The projection was checked against runs on 2 and 4 emulated machines (a core or half a core and a network "
           "namespace each, the cables shaped with tc): docs/performance.md, \"The projection to more machines, "
           "checked\", gives how close it came on the machine that ran them; beyond 4 machines, and on a real network, "
           "it is unchecked.")


def decision(row: RunRow, ratio: str = "speedup") -> Decision:
    """Whether ``row``'s ratio against normal training is ``above`` or ``below`` 1.0, or ``within`` noise.

    By its interval (:mod:`tfdist.compare.noise`): decided only when the whole
    interval lies on one side. A ratio without one is taken for noise within
    :data:`_NOISE` of 1.0.
    """
    interval = row.interval(ratio)
    if interval is not None:
        return interval.decision
    value = row.speedup if ratio == "speedup" else row.time_to_accuracy_speedup or 0.0
    return "above" if value >= 1 + _NOISE else "below" if value <= 1 - _NOISE else "within"


def stated(row: RunRow, ratio: str = "speedup") -> str:
    """The ratio with its interval and what it rests on: ``1.26x (1.18x-1.31x, steady epochs within one run)``."""
    value = row.speedup if ratio == "speedup" else row.time_to_accuracy_speedup or 0.0
    interval = row.interval(ratio)
    return f"{value:.2f}x" + (f" ({interval}, {interval.basis})" if interval else "")


def verdict(rows: list[RunRow], projections: Sequence[Projection] = (), network: Network | None = None) -> str:
    """One or two sentences, from the numbers, on whether distributing paid off and why; and where more machines would.

    "Paid off" or "did not pay off" only where the fastest run's interval lies
    wholly above or below 1.0; otherwise "within noise", and how many runs of
    each the spread measured would need to decide.
    """
    normal, others = rows[0], rows[1:]
    if not others:
        return "Only normal training ran; list strategies under distributed.strategies to compare."
    best = max(others, key=lambda r: r.speedup)
    accuracy = f"test accuracy {best.test_accuracy:.3f} vs {normal.test_accuracy:.3f}"
    pace = (f"{best.report.steady_epoch_seconds:.3f} s vs {normal.report.steady_epoch_seconds:.3f} s per epoch at "
            "steady state")
    decided = decision(best)
    if decided == "above":
        head = (f"Distribution paid off: {best.name} trained {stated(best)} as fast as normal training "
                f"({pace}, {accuracy}).")
    elif decided == "within":
        needed = best.repeats_to_decide
        repeats = (f"; the spread measured would need about {needed} runs of each to tell"
                   + (f" (`dvc exp run -S compare.repeats={needed}` runs them, interleaved)"
                      if needed <= _REPEATS_WORTH_SUGGESTING and needed > len(best.rounds) else "")
                   if needed else "")
        head = (f"Within noise: the fastest strategy, {best.name}, ran at {stated(best)} the speed of normal "
                f"training ({pace}, {accuracy}), which this measurement cannot tell from normal training's{repeats}.")
    else:
        head = (f"Distribution did not pay off on this hardware: the fastest strategy, {best.name}, ran at "
                f"{stated(best)} the speed of normal training ({pace}, {accuracy}).")
    beyond = _across_machines(rows, projections, network) if decided != "above" and network else ""
    disturbed = " ".join(f"While {row.name} trained, {row.disturbed}: this verdict rests partly on the machine."
                         for row in (normal, best) if row.disturbed)
    return " ".join(part for part in (head, _to_target(best, normal, others), _why(best, normal), beyond, disturbed)
                    if part)


def _across_machines(rows: list[RunRow], projections: Sequence[Projection], network: Network) -> str:
    """Where the projection says distributing pays across machines: which run, how many, on which network, what it gains.

    The machine count named is the largest of :data:`PROJECTED_MACHINES` at which
    every machine still adds at least half a machine's worth (speed-up / N >= 1/2),
    else the fewest that pay at all. Empty where no projected run pays.
    """
    paying = [(p, n) for p in projections for n in PROJECTED_MACHINES
              if p.projected_speedup[str(n)] >= 1 + _NOISE]
    if not paying:
        return ""
    efficient = [(p, n) for p, n in paying if p.projected_speedup[str(n)] / n >= 0.5]
    p, n = max(efficient, key=lambda pn: pn[1]) if efficient else min(paying, key=lambda pn: pn[1])
    speedup = p.projected_speedup[str(n)]
    text = (f"Across machines it pays: {p.name} on {n} machines of a {network.gbit:g} Gbit/s network "
            f"({network.latency_us:g} µs latency) is projected at {speedup:.2f}x normal training's speed"
            + (f" (breaking even at {p.break_even_text()}, "
               f"{p.projected_speedup[str(PROJECTED_MACHINES[-1])]:.2f}x with {PROJECTED_MACHINES[-1]})"
               if p.break_even_machines else ""))
    run, normal = next((row for row in rows if row.name == p.name), None), rows[0]
    if run is not None and run.epochs_to_target and normal.epochs_to_target and normal.seconds_to_target:
        # as many epochs to the target as the run needed here (its global batch), each at the projected speed
        seconds = normal.seconds_to_target * run.epochs_to_target / normal.epochs_to_target / speedup
        text += (f", and to {normal.target_accuracy:.2f} validation accuracy in about {seconds:.1f} s of training "
                 f"against normal training's {normal.seconds_to_target:.1f} s")
    return text + "."


def _to_target(best: RunRow, normal: RunRow, others: list[RunRow]) -> str:
    """What time to accuracy adds to the throughput verdict: said only where it tells a different story."""
    target = f"{best.target_accuracy:.2f} validation accuracy"
    if all(row.seconds_to_target is None for row in (normal, *others)):
        return (f"No run reached {target} (`compare.target_accuracy`) in its {normal.report.epochs} epochs, so time to "
                "accuracy was not measured: set the target to one this data reaches, or train longer.")
    if normal.seconds_to_target is None:
        return ""  # nothing to compare with: the report's table says "not reached"
    if best.seconds_to_target is None:
        return (f"But {best.name} never reached {target} in its {best.report.epochs} epochs, which normal training did "
                f"in {normal.epochs_to_target} ({normal.seconds_to_target:.1f} s of training).")
    first = min((row for row in others if row.seconds_to_target is not None),
                key=lambda row: row.seconds_to_target or 0.0)
    if decision(best) == decision(best, "time_to_accuracy_speedup") and first is best:
        return ""
    epochs = "epoch" if best.epochs_to_target == 1 else "epochs"
    text = (f"To {target}, {best.name} took {best.epochs_to_target} {epochs} and "
            f"{best.seconds_to_target:.1f} s against normal training's {normal.epochs_to_target} and "
            f"{normal.seconds_to_target:.1f} s ({stated(best, 'time_to_accuracy_speedup')} in time to accuracy"
            f"{', within noise' if decision(best, 'time_to_accuracy_speedup') == 'within' else ''})")
    if first is not best:
        text += (f"; {first.name} got there first of the distributed runs, "
                 f"{stated(first, 'time_to_accuracy_speedup')} normal training's pace")
    return text + "."


def _why(best: RunRow, normal: RunRow) -> str:
    """Why the best run went as fast as it did, from the hardware its report recorded where it trained."""
    run, hardware = best.report, best.report.hardware
    cores = hardware.cpu_cores
    if run.stages > 1:
        shared = f", logical devices sharing the same {cores} CPU cores" if hardware.shared_cpu else ""
        overlap = ("its micro-batches overlap the stages only in part" if run.micro_batches > 1
                   else "only one stage works at a time")
        return (f"It split the model's layers over {run.stages} devices ({', '.join(run.devices)}{shared}): "
                f"every step moves activations and their gradients between them, and {overlap}; "
                "a split pays when the model does not fit one device.")
    if hardware.shared_cpu and run.workers > 1:
        servers = f" and {run.ps} parameter server(s)" if run.ps else ""
        if decision(best) == "above":  # the cores, not more of them: the processes used them better
            return (f"Its {run.workers} worker processes{servers} shared the same {cores} CPU cores of one machine "
                    f"({best.given}) as normal training ({normal.given}): each computed its own batch on its "
                    "own core, which used the cores better than normal training's op threads did (small ops "
                    "split poorly across cores), though every step pays for gRPC traffic between the processes; "
                    "the same cores, not more of them.")
        return (f"Its {run.workers} worker processes{servers} shared the same {cores} CPU cores of one machine, "
                "so they add no compute, while every step pays for gRPC traffic between the processes "
                "(all-reduce, or pushing updates to the ps); distribution pays with separate machines or GPUs.")
    if hardware.shared_cpu and run.replicas > 1:
        return (f"Its {run.replicas} replicas are logical devices carved out of the same "
                f"{cores} CPU cores, so they add no compute, while every step pays for "
                "splitting the batch and combining gradients; distribution pays with separate GPUs or machines.")
    if run.workers > 1 and len(hardware.hosts) > 1:
        return (f"It ran {run.workers} workers on {len(hardware.hosts)} machines ({', '.join(hardware.hosts)}), "
                f"{run.replicas} replicas in all, each taking part of a {run.global_batch_size}-example global batch.")
    if run.replicas > normal.report.replicas:
        return (f"It ran {run.replicas} replicas on {', '.join(run.devices)}, each taking "
                f"1/{run.replicas} of a {run.global_batch_size}-example global batch.")
    return "It ran one replica, so it could only add overhead."


def advice(rows: list[RunRow], projections: list[Projection], support: dict[str, PrecisionSupport],
           network: Network) -> Advice:
    """Answers from the numbers (and their :func:`~tfdist.compare.compute.projection`) and the hardware.

    What to use here, with more machines, which kind of parallelism, and which precision.
    """
    return Advice(use=_use_advice(rows, projections, network), scale=_scale_advice(rows, projections, network),
                  paradigms=_paradigm_advice(rows), precision=_precision_advice(rows, support),
                  input=_input_advice(rows))


def _input_advice(rows: list[RunRow]) -> str:
    """Whether a run waited for its input (:data:`INPUT_BOUND` of its training time), and what to turn then."""
    timed = [row for row in rows if row.report.input_share is not None]
    if not timed:
        return "Not timed: the steps' wait for their input is measured in normal training (one replica in one " \
               "process) where fit runs several steps a call (train.steps_per_execution > 1); a profiled run's " \
               "traces show every worker's (tfdist tensorboard, the input-pipeline analyser)."
    bound = [row for row in timed if (row.report.input_share or 0.0) >= INPUT_BOUND]
    shares = ", ".join(f"{row.name} {row.report.input_share:.0%}" for row in timed)
    if not bound:
        return f"No run waited for its input for {INPUT_BOUND:.0%} of its training time or more ({shares}): " \
               "the steps set the pace."
    names = ", ".join(row.name for row in bound)
    return (f"Input-bound: {names} waited between its steps for the next batch for {INPUT_BOUND:.0%} or more of "
            f"its training time ({shares}): the input's making and its hand-over, which a step too short to hide "
            "it pays each time. More replicas or machines do not cure that: each needs its batches as fast. A "
            "larger per-replica batch (fewer hand-overs, each step longer), fewer tasks per machine (each keeps a "
            "core for its input), more shards of the prepared data (each worker reads its own, in parallel), "
            "lighter decoding or faster storage; a profiled run's trace (tfdist tensorboard, the input-pipeline "
            "analyser) tells the making from the hand-over.")


def _paradigm_advice(rows: list[RunRow]) -> str:
    """When data, model and pipeline parallelism each pay, with what these runs held, moved and idled."""
    split = [row for row in rows if splits_layers(row.report.paradigm)]
    data = [row for row in rows if row.report.paradigm == "data"]
    when = ("Data parallelism pays when the model fits one device and each replica gets a batch big enough to hide "
            "the gradient exchange; model parallelism pays only when the model (with its optimizer state) does not "
            "fit one device, as its stages work one after the other; pipeline parallelism then keeps them busy "
            "together, the more so the more micro-batches per stage (bubble (S-1)/(M+S-1)), if the link between "
            "devices carries the activations faster than a stage computes them.")
    if not split:
        return (when + " Only data parallelism ran here: add `model_parallel` and `pipeline_parallel` (with "
                "`train.loop: custom`) to `distributed.strategies` to measure the other two.")
    parts = []
    for row in split:
        run = row.report
        bubble = "" if run.bubble is None or run.bubble_theory is None else (
            f", and its devices idled {run.bubble:.0%} of a step (theory {run.bubble_theory:.0%} for "
            f"{run.stages} stages and {run.micro_batches} micro-batch{'es' if run.micro_batches > 1 else ''})")
        parts.append(f"{row.name} held at most {max(run.params_per_device):,} parameters on a device and moved "
                     f"{_kilobytes(run.bytes_per_step)} of activations per step{bubble}; it ran at "
                     f"{stated(row)} normal speed")
    text = when + " Here: " + "; ".join(parts) + "."
    if data:
        least = min(data, key=lambda row: row.report.bytes_per_step)
        text += (f" Data parallelism kept all {max(least.report.params_per_device):,} parameters on every replica and "
                 f"moved {_kilobytes(least.report.bytes_per_step)} per step at the least ({least.name}).")
    if rows[0].report.hardware.cpu_cores <= 2 and all(kind == "CPU" for kind in rows[0].report.hardware.device_kinds):
        text += (" The devices here are logical CPU devices sharing the same cores, so a split adds per-op "
                 "overhead and no compute: the measured idle share reflects that overhead more than the schedule.")
    return text


def _kilobytes(count: int) -> str:
    return f"{count / 1024:,.0f} KiB" if count >= 1024 else f"{count} bytes"


def _use_advice(rows: list[RunRow], projections: Sequence[Projection] = (), network: Network | None = None) -> str:
    others = rows[1:]
    if not others:
        return "Train without distribution: it is the only run. List strategies under distributed.strategies to compare."
    best = max(others, key=lambda r: r.speedup)
    if decision(best) != "above":
        noise = " beyond noise" if decision(best) == "within" else ""
        text = (f"Train without distribution on this machine (the `normal` run): no strategy beat it{noise} at steady "
                f"state; the closest, {best.name}, ran at {stated(best)}. Distribution spends time coordinating "
                f"replicas that, here, share {rows[0].report.hardware.cpu_cores} CPU cores instead of adding compute.")
        beyond = _across_machines(rows, projections, network) if network else ""
        return text + (" " + beyond if beyond else "")
    text = (f"Use {best.name}: it trained {stated(best)} as fast as normal training at steady state, "
            f"with test accuracy {best.accuracy_delta_points:+.1f} points.")
    if decision(best, "time_to_accuracy_speedup") != "above" and best.time_to_accuracy_speedup is not None:
        text += (f" In time to {best.target_accuracy:.2f} validation accuracy it is "
                 f"{stated(best, 'time_to_accuracy_speedup')}: "
                 + ("within noise." if decision(best, "time_to_accuracy_speedup") == "within" else "slower."))
    if best.accuracy_delta_points < -_ACCURACY_LOSS_POINTS:
        text += (f" The accuracy it lost comes with its {best.report.global_batch_size}-example global batch: try "
                 "`train.lr_scaling: linear` with `train.warmup_epochs: 1`, or more epochs.")
    return text


def _scale_advice(rows: list[RunRow], projections: list[Projection], network: Network) -> str:
    unprojected = [row for row in rows[1:] if row.report.paradigm == "data" and not row.report.collectives]
    one_machine = [row.name for row in unprojected if row.report.synchronous]
    pulls = [row.name for row in unprojected if not row.report.synchronous]
    reasons = [*([f"{' and '.join(one_machine)} (one machine's devices)"] if one_machine else []),
               *([f"{' and '.join(pulls)} (its pulls and pushes to the parameter servers are not modelled)"]
                 if pulls else [])]
    left_out = f" Not projected: {'; '.join(reasons)}." if reasons else ""
    if not projections:
        return ("No run all-reduced across workers, so there is nothing to project to more machines: add "
                "`multi_worker_mirrored` to `distributed.strategies`." + left_out)
    p = min(projections, key=lambda p: (p.break_even_machines or 1 << 30, -p.ceiling_speedup))
    n = str(PROJECTED_MACHINES[-1])
    measured = (f"its measured {p.step_ms:.2f} ms a step, less the {p.all_reduce_here_ms:.2f} ms its all-reduce of "
                f"{_kilobytes(p.gradient_bytes)} of gradients cost between the {p.workers} workers here, as the train "
                "stage calibrated it")
    split = (f"{p.compute_ms:.2f} ms of compute and {p.overhead_ms:.2f} ms of the strategy's own overhead ({measured}; "
             "the compute timed alone in a worker, the overhead the rest, the same on any number of machines)"
             if p.overhead_ms else f"{p.compute_ms:.2f} ms of compute ({measured})")
    rests = (f"{p.name}'s step is modelled as compute, overhead and a ring all-reduce: {split}, and per machine "
             f"2(N-1) messages and 2(N-1)/N of the bytes on a "
             f"{network.gbit:g} Gbit/s network with {network.latency_us:g} µs latency (`compare.network_gbit`, "
             f"`compare.network_latency_us`).")
    ceiling = (f"however many machines, each adds 2 messages to every step, which caps it at "
               f"{banded(p.ceiling_speedup, p.ceiling_low, p.ceiling_high)} normal speed")
    at_most = banded(p.projected_speedup[n], p.speedup_low.get(n), p.speedup_high.get(n))
    if p.break_even_machines is None:
        verdict_text = (f" On that network it never matches normal training's {p.normal_step_ms:.2f} ms step "
                        f"({at_most} with {n} machines): {ceiling}.")
    else:
        verdict_text = (f" It would need {p.break_even_text()} to match normal training "
                        f"({p.normal_step_ms:.2f} ms a step) and would run {at_most} as fast "
                        f"with {n}; {ceiling}.")
    if p.speedup_low:
        verdict_text += (" In brackets, the 95% band the spread of its measured terms gives (the steady epochs, "
                         "the all-reduce probes' calls).")
    row = next((row for row in rows if row.name == p.name), None)
    compression = _compression_advice(p, row.report.gradient_compression) if row else ""
    return rests + verdict_text + compression + " " + CHECKED + left_out


def _compression_advice(p: Projection, sent: str) -> str:
    """Whether its gradients crossed in 16 bits, or would gain by it: the wire's share of the step on 2 machines."""
    if sent != "none":
        return (f" Its gradients crossed the wire as {sent} (`distributed.gradient_compression`): the bytes above are "
                "half float32's.")
    two = p.step_on_network_ms.get("2")
    wire = 1 - (p.compute_ms + p.overhead_ms) / two if two else 0.0  # what is not compute or overhead is the wire
    if wire < _WIRE_SHARE_TO_COMPRESS:
        return ""
    return (f" On 2 machines the all-reduce would be {wire:.0%} of its step: sending the gradients in 16 bits halves "
            f"its bytes (`dvc exp run -S 'distributed.strategies=[{p.name}]' -S "
            "distributed.gradient_compression=bfloat16`: Horovod's fp16 compression, for the runs that all-reduce "
            "between processes; bfloat16 keeps float32's range, float16 more of its digits; "
            "docs/performance/machines.md has what each gave here).")


def _precision_advice(rows: list[RunRow], support: dict[str, PrecisionSupport]) -> str:
    used = sorted({row.report.precision for row in rows})
    per_replica_batch = rows[0].report.global_batch_size // rows[0].report.replicas
    # bfloat16 first: it needs no loss scaling, so it works under every strategy.
    faster = sorted((p for p in MIXED_PRECISIONS if p in support and support[p].can_be_faster),
                    key=lambda p: p != "mixed_bfloat16")
    text = ""
    slow_used = [name for name in used if name != "float32" and name not in faster and name in support]
    if slow_used:
        text = (f"These runs used {', '.join(slow_used)}, which no unit here computes faster than float32: "
                "switch back to float32, it only costs here. ")
    if faster:
        choice = faster[0]
        return text + (
            f"{choice} can pay off here ({support[choice].reason}) once matrix multiplies dominate a step: a "
            f"per-replica batch well above {per_replica_batch}, or wider layers. At small batches a step is mostly "
            "per-op overhead and the casts cost about what they save. Measure it side by side: "
            f"`dvc exp run -S train.precision={choice} -S train.batch_size=256`, then `dvc exp show`."
            + ("" if choice != "mixed_float16" else
               " mixed_float16 needs loss scaling, which central_storage and parameter_server do not support.")
        )
    if not support:
        return text + "The train report does not say what this machine's hardware supports; rerun the train stages."
    reasons = "; ".join(support[name].reason for name in MIXED_PRECISIONS if name in support)
    return text + (f"Mixed precision would not pay off on this machine: {reasons}. Without such a unit each 16-bit op "
                   "is emulated, which costs more than it saves, many times over for a convnet (docs/performance.md, "
                   "\"Precision and loop\"). It pays on GPUs with tensor cores (float16 from compute capability 7.0, "
                   "bfloat16 from 8.0), "
                   "on TPUs, and on CPUs with AVX512-BF16 or AMX.")
