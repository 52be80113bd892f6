"""Benchmark: multi_worker_mirrored on 2 and 4 emulated machines, against normal training on one of them.

Each machine is a test host (a network namespace with its own address,
tests/helpers/netns.py) whose worker is pinned to a CPU and, on 4 machines,
held to half a core by a cgroup v1 CPU quota (tests/helpers/cpu_share.py):
2 machines get a core each, 4 get half a core each, and normal training gets
what one machine has. The cables between them are shaped with ``tc`` tbf at
each ``--links`` rate (``none``: the veth's own, several Gbit/s), both ways.
The workers run the real train stage in cluster mode (TF_CONFIG naming the
hosts' addresses, as on separate machines). Every model (``--models``) at
per-replica batch 25 and 256, on the prepared digits tiled to 12,000, the
learning rate scaled with the global batch (``train.lr_scaling: linear``). Each
link is measured as TCP sees it (rate of a 32 MB transfer, round trip of
one-byte pings), since tbf only sets a ceiling and no delay can be added here,
and as the ring all-reduce loads it: every machine sending to the next at once
(``TestHosts.measure_ring``), since all the emulated cables and the switch are
processed by this machine's two cores, and four transfers at once each get
less than one alone.

Then checks the compare stage's projection (tfdist.compare.compute): calibrated
as the pipeline calibrates it (multi_worker_mirrored x2 through the local
launcher, on loopback, each worker given what one machine has), and pointed
at each link as measured, it projects the step on N machines; the table sets
that beside the step measured on them, and gives each run's speed and time to
accuracy against normal training on one machine.

``--set 'compression=[none, float16]'`` runs each cluster (and its loopback
calibration) with its gradients sent as each (``distributed.gradient_compression``);
normal training is never compressed. ``--set 'allocator=[system, auto]'`` runs
every process of a cell (normal training's too) with each ``runtime.allocator``.

Every cell runs ``--rounds`` times (3 by default), the rounds one after another
so that every cell sees the machine's slow and quiet spells alike; the table
gives the medians, the spread (lowest to highest), and the projection's error
on the medians. Needs root, iproute2, tc and cgroup v1's cpu controller.

    python -m benchmarks emulated_machines [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]
        [--set 'machines=[2, 4]'] [--set 'links=[none, 1gbit]'] [--set 'compression=[none, float16]']
        [--set 'allocator=[system, auto]']
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/helpers: the test hosts
from benchmarks.harness import Options, grid  # noqa: E402
from benchmarks.results import Result, median, spread  # noqa: E402
from benchmarks.stage import TARGETS, data_folder, measured, model_settings, run, stage_command  # noqa: E402
from tfdist.cluster.processes import task_cpus  # noqa: E402
from tfdist.compare.compute import build_comparison, time_to_accuracy  # noqa: E402
from tfdist.config.knobs import CompareConfig  # noqa: E402
from tfdist.records.reports import EvalReport, TrainReport, read_report  # noqa: E402

from helpers import cpu_share, netns  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PORT = 2222
#: A machine's share of a core, by how many machines there are (2 CPUs here).
CORES_PER_MACHINE = {2: 1.0, 4: 0.5}


@dataclass(frozen=True)
class Context:
    """What every cell shares: the scratch folder, the tiled data, the test hosts, a counter for run names."""

    root: Path
    data: Path
    hosts: netns.TestHosts
    runs: itertools.count


def cluster_run(hosts: netns.TestHosts, machines: int, root: Path, data: Path, name: str, sets: list[str]) -> dict:
    """multi_worker_mirrored with one worker on each of the first ``machines`` hosts, each given a machine's CPU."""
    cpus = task_cpus(machines)
    cluster = {"worker": [f"{address}:{PORT}" for address in hosts.addresses[:machines]]}
    shares = [cpu_share.CpuShare(cpus[i], CORES_PER_MACHINE[machines]) for i in range(machines)]
    try:
        processes = []
        for i in range(machines):
            env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
            command = stage_command(root, data, name, "multi_worker_mirrored", sets)
            processes.append(hosts.start(i, command, env, REPO, root / f"{name}-worker-{i}.log", outside=shares[i].wrap([])))
        for i, process in enumerate(processes):
            if process.wait(timeout=1800):
                raise SystemExit(f"{name}: worker {i} exited {process.returncode}:\n"
                                 f"{(root / f'{name}-worker-{i}.log').read_text()[-3000:]}")
    finally:
        for share in shares:
            share.close()
    return measured(root, name)


def local_run(root: Path, data: Path, name: str, strategy: str, sets: list[str], share: cpu_share.CpuShare) -> dict:
    """One train stage on this machine under ``share`` (its local launcher's tasks share it too)."""
    with share:
        run(root, data, name, strategy, sets, prefix=tuple(share.wrap([])))
    return measured(root, name)


def projected_step_ms(root: Path, normal: str, calibrated: str, link: dict, machines: int) -> float:
    """The compare stage's step for ``machines`` machines, from the loopback run's calibration, on ``link`` as measured."""
    train = {run: read_report(root / "reports" / f"{name}.json", TrainReport)
             for run, name in (("normal", normal), ("multi_worker_mirrored", calibrated))}
    evaluation = {run: EvalReport(run, report.val_loss, report.val_accuracy, 0) for run, report in train.items()}
    network = CompareConfig(network_gbit=link["mbit_per_s"] / 1000, network_latency_us=link["round_trip_us"] / 2)
    (found,) = build_comparison(train, evaluation, settings=network).scaling
    return found.step_on_network_ms[str(machines)]


TITLE = "multi_worker_mirrored on emulated machines against normal training on one of them, and the projection"
DEFAULTS = {"extra": {"machines": [2, 4], "links": ["none", "1gbit"], "compression": ["none"], "allocator": ["auto"]}}


def cells(options: Options) -> list[dict[str, Any]]:
    machines = options.extra["machines"]
    if unknown := sorted(set(machines) - set(CORES_PER_MACHINE)):
        raise SystemExit(f"error: --set machines: {unknown} not emulated here; choose from {sorted(CORES_PER_MACHINE)}")
    if unknown := sorted(set(options.models) - set(TARGETS)):
        raise SystemExit(f"error: --models {unknown}: no target accuracy for them; choose from {sorted(TARGETS)}")
    return grid(options, machines=machines, compression=options.extra["compression"],
                allocator=options.extra["allocator"])


def setup(options: Options) -> Context:
    if why := netns.available() or cpu_share.available():
        raise SystemExit(f"error: emulated machines need network namespaces and CPU quotas: {why}")
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-emulated-"))
    hosts = netns.TestHosts(max(options.extra["machines"]))
    hosts.__enter__()
    return Context(root, data_folder(root), hosts, itertools.count())


def teardown(context: Context) -> None:
    context.hosts.__exit__(None, None, None)


def measure(cell: dict[str, Any], context: Context, options: Options) -> dict[str, float]:
    """Normal training on one machine's share, the loopback calibration, then the cluster over every link."""
    model, machines = cell["model"], cell["machines"]
    sets = [*model_settings(cell, options), "train.lr_scaling=linear",  # as a user scaling out: N machines, N x batch
            f"runtime.allocator={cell['allocator']}"]
    cores, tag = CORES_PER_MACHINE[machines], f"run{next(context.runs)}"
    root, data, hosts = context.root, context.data, context.hosts
    normal = local_run(root, data, f"{tag}-normal", "default", sets, cpu_share.CpuShare(task_cpus(1)[0], cores))
    clustered = [*sets, "distributed.strategies=[multi_worker_mirrored]",
                 f"distributed.gradient_compression={cell['compression']}"]
    calibrated = local_run(root, data, f"{tag}-loopback", "multi_worker_mirrored", [*clustered, "distributed.workers=2"],
                           cpu_share.CpuShare(None, 2 * cores))
    normal_tta = time_to_accuracy(normal["history"], TARGETS[model])
    found = {"normal_ms": normal["step_ms"], "normal_accuracy": normal["val_accuracy"]}
    try:
        for link in options.extra["links"]:
            hosts.shape(None if link == "none" else link)
            measured_link = hosts.measure_ring(machines)
            mwms = cluster_run(hosts, machines, root, data, f"{tag}-{link}", clustered)
            tta = time_to_accuracy(mwms["history"], TARGETS[model])
            costs = mwms["collectives"]
            if costs.get("compute_seconds") is not None:  # the step's parts, as the cluster's own report has them
                found.update({f"{link}_compute_ms": 1e3 * costs["compute_seconds"],
                              f"{link}_all_reduce_ms": 1e3 * costs["large_seconds"]})
            found.update({
                f"{link}_ms": mwms["step_ms"],
                f"{link}_projected_ms": projected_step_ms(root, normal["name"], calibrated["name"], measured_link, machines),
                f"{link}_speed": mwms["steady_samples_per_second"] / normal["steady_samples_per_second"],
                f"{link}_tta": normal_tta[1] / tta[1] if tta and normal_tta else None,
                f"{link}_accuracy": mwms["val_accuracy"],
                f"{link}_mbit_per_s": measured_link["mbit_per_s"], f"{link}_round_trip_us": measured_link["round_trip_us"]})
    finally:
        hosts.shape(None)
    return found


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """Per model, batch and machines: normal training's row, then a row per link with the projection's error."""
    rows = []
    for cell in result.cells:
        model, batch, machines = cell.params["model"], str(cell.params["batch"]), cell.params["machines"]
        compression = cell.params.get("compression", "none")
        sent = "" if compression == "none" else f", {compression} gradients"
        allocator = cell.params.get("allocator", "auto")  # results stored before the axis name none
        malloc = "" if allocator == "auto" else f", {allocator} malloc"
        rows.append([model, batch, f"normal, {CORES_PER_MACHINE[machines]:g} core{malloc}", "", spread(cell.values("normal_ms")),
                     "", "", "1.00x", f"{median(cell.values('normal_accuracy')):.4f}", ""])
        for link in result.options["links"]:
            step, projected = cell.values(f"{link}_ms"), cell.values(f"{link}_projected_ms")
            tta = cell.values(f"{link}_tta")
            error = (median(projected) - median(step)) / median(step)
            compute, wire = cell.values(f"{link}_compute_ms"), cell.values(f"{link}_all_reduce_ms")
            parts = (f"{median(compute):.2f} + {median(wire):.2f} + {median(step) - median(compute) - median(wire):.2f}"
                     if len(compute) == len(cell.rounds) else "")
            rows.append([model, batch, f"{machines} machines, link {link}{sent}{malloc}",
                         f"{median(cell.values(f'{link}_mbit_per_s')):,.0f} / {median(cell.values(f'{link}_round_trip_us')):.0f}",
                         spread(step), parts, f"{median(projected):.2f} ({error:+.0%})",
                         spread(cell.values(f"{link}_speed")) + "x",
                         f"{median(cell.values(f'{link}_accuracy')):.4f}",
                         spread(tta) + "x" if len(tta) == len(cell.rounds) else "not reached"])
    return (["model", "per-replica batch", "run", "link Mbit/s / round trip µs (measured, ring loaded)", "ms/step",
             "compute + all-reduce + overhead (ms, medians)", "projected ms/step (error on the medians)",
             "speed vs normal", "val accuracy", "time to accuracy vs normal"],
            rows)


