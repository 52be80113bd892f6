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

Every cell runs ``--rounds`` times (3 by default), the rounds one after another
so that every cell sees the machine's slow and quiet spells alike; the table
gives the medians, the spread (lowest to highest), and the projection's error
on the medians. Needs root, iproute2, tc and cgroup v1's cpu controller.

    python -m benchmarks emulated_machines [--models mlp cnn] [--machines 2 4] [--links none 1gbit]
        [--batches 25 256] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/helpers: the test hosts
from benchmarks.common import median, spread, table  # noqa: E402
from benchmarks.strategies import TARGETS, add_against, data_folder, measured, run, stage_command  # noqa: E402
from tfdist.cluster.processes import task_cpus  # noqa: E402
from tfdist.compare.compute import build_comparison, time_to_accuracy  # noqa: E402
from tfdist.config import CompareConfig  # noqa: E402
from tfdist.reports import EvalReport, TrainReport, read_report  # noqa: E402

from helpers import cpu_share, netns  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PORT = 2222
#: A machine's share of a core, by how many machines there are (2 CPUs here).
CORES_PER_MACHINE = {2: 1.0, 4: 0.5}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=sorted(TARGETS))
    parser.add_argument("--machines", type=int, nargs="+", default=[2, 4], choices=sorted(CORES_PER_MACHINE))
    parser.add_argument("--links", nargs="+", default=["none", "1gbit"])
    parser.add_argument("--batches", type=int, nargs="+", default=[25, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if why := netns.available() or cpu_share.available():
        raise SystemExit(f"emulated machines need network namespaces and CPU quotas: {why}")
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-emulated-"))
    data = data_folder(root)
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    links: dict[tuple[str, int], dict] = {}  # the last round's measurement of each link, ring by ring
    with netns.TestHosts(max(args.machines)) as hosts:
        for round_ in range(args.rounds):
            for model in args.models:
                for batch in args.batches:
                    sets = [f"model.kind={model}", f"train.batch_size={batch}", f"train.epochs={args.epochs}",
                            "train.lr_scaling=linear"]  # as a user scaling out would: N machines, N x the batch
                    for machines in args.machines:
                        cores = CORES_PER_MACHINE[machines]
                        tag = f"r{round_}-{model}-b{batch}-m{machines}"
                        normal = local_run(root, data, f"{tag}-normal", "default", sets,
                                           cpu_share.CpuShare(task_cpus(1)[0], cores))
                        calibrated = local_run(root, data, f"{tag}-loopback", "multi_worker_mirrored",
                                               [*sets, "distributed.workers=2"], cpu_share.CpuShare(None, 2 * cores))
                        normal_tta = time_to_accuracy(normal["history"], TARGETS[model])
                        key = (model, batch, machines)
                        cells[(*key, "normal")]["step"].append(normal["step_ms"])
                        cells[(*key, "normal")]["speed"].append(normal["steady_samples_per_second"])
                        cells[(*key, "normal")]["accuracy"].append(normal["val_accuracy"])
                        if normal_tta:
                            cells[(*key, "normal")]["tta"].append(normal_tta[1])
                        for link in args.links:
                            hosts.shape(None if link == "none" else link)
                            links[(link, machines)] = hosts.measure_ring(machines)
                            mwms = cluster_run(hosts, machines, root, data, f"{tag}-{link}", sets)
                            cell = cells[(*key, link)]
                            add_against(cell, mwms, normal, TARGETS[model])
                            cell["projected"].append(
                                projected_step_ms(root, normal["name"], calibrated["name"], links[(link, machines)], machines))
                            print(f"round {round_ + 1} {model} batch {batch} x{machines} link {link}: "
                                  f"{mwms['step_ms']:.2f} ms/step (projected {cell['projected'][-1]:.2f}), "
                                  f"{cell['speed'][-1]:.2f}x normal ({normal['step_ms']:.2f} ms/step), "
                                  f"time to accuracy {cell['tta'][-1] if cell['tta'] else float('nan'):.2f}x",
                                  file=sys.stderr, flush=True)
                        hosts.shape(None)
    rows = []
    for model in args.models:
        for batch in args.batches:
            for machines in args.machines:
                normal = cells[(model, batch, machines, "normal")]
                rows.append([model, batch, f"normal, {CORES_PER_MACHINE[machines]:g} core", "", spread(normal["step"]), "",
                             "1.00x", "1.00x" if normal["tta"] else "not reached", f"{median(normal['accuracy']):.4f}"])
                for link in args.links:
                    cell = cells[(model, batch, machines, link)]
                    step, projected = median(cell["step"]), median(cell["projected"])
                    rows.append([model, batch, f"{machines} machines, link {link}",
                                 f"{links[(link, machines)]['mbit_per_s']:,.0f} / {links[(link, machines)]['round_trip_us']:.0f}",
                                 spread(cell["step"]), f"{projected:.2f} ({(projected - step) / step:+.0%})",
                                 spread(cell["speed"]) + "x",
                                 spread(cell["tta"]) + "x" if len(cell["tta"]) == args.rounds else "not reached",
                                 f"{median(cell['accuracy']):.4f}"])
    print(f"multi_worker_mirrored on emulated machines (2: a core each; 4: half a core each), 12,000 digits, "
          f"{args.epochs} epochs, median (lowest-highest) of {args.rounds} rounds; time to accuracy to "
          + ", ".join(f"{model} {TARGETS[model]}" for model in args.models))
    print(table(["model", "per-replica batch", "run", "link Mbit/s / round trip µs (measured, ring loaded)", "ms/step",
                 "projected ms/step (error on the medians)", "speed vs normal", "time to accuracy vs normal",
                 "val accuracy"], rows))


if __name__ == "__main__":
    main()
