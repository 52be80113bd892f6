"""Benchmark: where a parameter_server step's time goes, from TensorFlow's profiler in every task.

Runs the train stage for parameter_server (2 workers, 1 ps, the local
launcher) on the prepared digits tiled to 12,000, every task serving
TensorFlow's profiler (``TFDIST_PROFILER_PORT``); once training is past its
first epochs it captures ``--ms`` of all tasks at once, then sums each
task's host events by name (the TensorFlow ops and runtime activities each
thread ran) and prints the largest, with the share of the capture each took.

    python -m benchmarks ps_profile [--ms 2000] [--top 12]

Not on the harness, on purpose: it is a profiler's reading (which ops each task
ran, by name), not numbers to compare in alternated rounds; what it finds is
measured by the harness's benchmarks (multi_process_step, ps_exchange).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

from benchmarks.stage import data_folder  # noqa: E402
from benchmarks.traces import profiled_stage  # noqa: E402
from tfdist.train.server import profiler_order  # noqa: E402
from tfdist.train.trace_parts import host_events  # noqa: E402

#: The local cluster profiled: the coordinating chief, 1 ps, 2 workers, in the order of their profiler ports.
COUNTS = {"chief": 1, "ps": 1, "worker": 2}
TASKS = [f"{job}-{index}" for job, index in profiler_order(COUNTS)]


def summarize(logdir: Path, ms: int, top: int) -> None:
    """Each task's host events summed by name, largest first."""
    for path in sorted(logdir.rglob("*.xplane.pb")):
        totals: collections.Counter[str] = collections.Counter()
        for name, start, end in host_events(path):
            totals[name] += (end - start) / 1e9  # ms
        print(f"\n{path.name}: top events (ms in {ms} ms, % of it)")
        for name, total in totals.most_common(top):
            print(f"  {total:9.1f}  {100 * total / ms:5.1f}%  {name[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", type=int, default=2000)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-ps-profile-"))
    data = data_folder(root)
    print(f"capturing {args.ms} ms of {', '.join(TASKS)} from epoch 3", file=sys.stderr, flush=True)
    logdir = profiled_stage(root, data, "ps", "parameter_server", [
        "train.epochs=6", f"distributed.workers={COUNTS['worker']}", f"distributed.ps={COUNTS['ps']}"], len(TASKS),
        args.ms)
    summarize(logdir, args.ms, args.top)


if __name__ == "__main__":
    main()
