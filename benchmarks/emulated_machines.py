"""Benchmark: multi_worker_mirrored on two emulated machines, against normal training on one core.

Each machine is a test host (a network namespace with its own address,
tests/helpers/netns.py) whose worker is pinned to a CPU core of its own
(``taskset``), and the cable between them is shaped with ``tc`` tbf at each
``--links`` rate (``none``: the veth's own, several Gbit/s), both ways. The
workers run the real train stage in cluster mode (TF_CONFIG naming the hosts'
addresses, as on two machines); normal training runs on one core the same way.
Per-replica batch 25 and 256 on the prepared digits tiled to 12,000. Each
link is measured as TCP sees it (rate of an 8 MB transfer, round trip of
one-byte pings), since tbf only sets a ceiling and no delay can be added here.

Then checks the compare stage's projection (tfdist.compare.compute): calibrated
as the pipeline calibrates it (multi_worker_mirrored x2 on loopback through the
local launcher, a core each, its all-reduce timed by the train stage), and
pointed at each link as measured, it projects the step of 2 machines; the
table sets that beside the step measured on them. Needs root, iproute2 and tc.

    python benchmarks/emulated_machines.py [--links none 1gbit 100mbit] [--batches 25 256] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import pinned, table  # noqa: E402
from strategies import data_folder, report, run, stage_command  # noqa: E402

from tfdist.cluster.processes import task_cpus  # noqa: E402
from tfdist.compare.compute import Network, projection  # noqa: E402

from helpers import netns  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PORT = 2222


def cluster_run(hosts: netns.TestHosts, root: Path, data: Path, name: str, sets: list[str]) -> dict:
    """multi_worker_mirrored with one worker per host, each on CPU core i; the chief's report."""
    cpus = task_cpus(len(hosts.names))
    cluster = {"worker": [f"{address}:{PORT}" for address in hosts.addresses]}
    processes = []
    for i in range(len(hosts.names)):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
        command = pinned(stage_command(root, data, name, "multi_worker_mirrored", sets), cpus[i])
        processes.append(hosts.start(i, command, env, REPO, root / f"{name}-worker-{i}.log"))
    for i, process in enumerate(processes):
        if process.wait(timeout=900):
            raise SystemExit(f"{name}: worker {i} exited {process.returncode}:\n"
                             f"{(root / f'{name}-worker-{i}.log').read_text()[-3000:]}")
    return report(root, name)


def projected_step_ms(normal: dict, calibrated: dict, link: dict) -> float:
    """The compare stage's step for 2 machines, from the loopback run's calibration, on ``link`` as measured."""
    rows = [{"name": r["name"], "paradigm": r["paradigm"], "global_batch_size": r["global_batch_size"],
             "replicas": r["replicas"], "samples_per_second": r["steady_samples_per_second"],
             "collectives": r.get("collectives")} for r in (normal, calibrated)]
    network = Network(link["mbit_per_s"] / 1000, link["round_trip_us"] / 2)
    (found,) = projection(rows, network)
    return found["step_on_network_ms"]["2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", nargs="+", default=["none", "1gbit", "100mbit"])
    parser.add_argument("--batches", type=int, nargs="+", default=[25, 256])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if why := netns.available():
        raise SystemExit(f"emulated machines need network namespaces: {why}")
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-emulated-"))
    data = data_folder(root)
    rows = []
    with netns.TestHosts(2) as hosts:
        for batch in args.batches:
            sets = [f"train.batch_size={batch}", f"train.epochs={args.epochs}"]
            one_core = tuple(pinned([], task_cpus(1)[0]))
            normal = run(root, data, f"b{batch}-normal", "default", sets, prefix=one_core)
            normal_ms = 1000 * normal["steady_epoch_seconds"] / normal["steps_per_epoch"]
            rows.append([batch, "normal, 1 core", "", "", f"{normal_ms:.2f}", "", f"{normal['steady_samples_per_second']:,.0f}",
                         "1.00x", f"{normal['val_accuracy']:.4f}"])
            calibrated = run(root, data, f"b{batch}-loopback", "multi_worker_mirrored", sets)  # as the pipeline runs it
            costs = calibrated["collectives"]
            loopback_ms = 1000 * calibrated["steady_epoch_seconds"] / calibrated["steps_per_epoch"]
            rows.append([batch, "multi_worker_mirrored x2, loopback (the calibration)", "", "", f"{loopback_ms:.2f}",
                         f"all-reduce {1e3 * costs['latency_seconds']:.2f} ms + {1e9 * costs['seconds_per_byte']:.2f} ns/B",
                         "", "", f"{calibrated['val_accuracy']:.4f}"])
            for link in args.links:
                hosts.shape(None if link == "none" else link)
                measured = hosts.measure_link(0, 1)
                mwms = cluster_run(hosts, root, data, f"b{batch}-{link}", sets)
                ms = 1000 * mwms["steady_epoch_seconds"] / mwms["steps_per_epoch"]
                speed = mwms["steady_samples_per_second"]
                projected = projected_step_ms(normal, calibrated, measured)
                rows.append([batch, f"multi_worker_mirrored x2, link {link}", f"{measured['mbit_per_s']:,.0f}",
                             f"{measured['round_trip_us']:.0f}", f"{ms:.2f}",
                             f"{projected:.2f} ({(projected - ms) / ms:+.0%})", f"{speed:,.0f}",
                             f"{speed / normal['steady_samples_per_second']:.2f}x", f"{mwms['val_accuracy']:.4f}"])
                print(f"batch {batch} link {link} ({measured['mbit_per_s']:,.0f} Mbit/s): {ms:.2f} ms/step "
                      f"(projected {projected:.2f}), {speed / normal['steady_samples_per_second']:.2f}x normal; "
                      f"all-reduce on it {mwms['collectives']}", file=sys.stderr, flush=True)
            hosts.shape(None)
    print(f"2 emulated machines (a core and a namespace each), 12,000 digits, {args.epochs} epochs")
    print(table(["per-replica batch", "run", "link Mbit/s (measured)", "round trip (µs)", "ms/step",
                 "projected ms/step (error)", "samples/s", "vs normal", "val accuracy"], rows))


if __name__ == "__main__":
    main()
