"""Benchmark: what starting a tracking server costs, with MLflow's GenAI job runners on and off.

``tfdist server`` (sqlite store, one worker) until its ``/health`` answers, then the
CPU time of every process of its session 20 s later (the job runners start beside
the server and import MLflow each). tfdist leaves them off
(``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``, tfdist_cli.serving); the rounds
alternate the two settings, and the table gives medians and ranges.

    python -m benchmarks server_start            # 3 rounds, about 4 min
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import table, tracking_server  # noqa: E402
from benchmarks.procfs import process_stat  # noqa: E402
from benchmarks.results import spread  # noqa: E402

SETTLE_SECONDS = 20


def session_usage(leader: int) -> tuple[float, int]:
    """CPU seconds used so far by the processes of session ``leader``, and how many there are."""
    seconds, count = 0.0, 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = process_stat(pid)
        except OSError:
            continue
        if stat.session == leader:
            seconds += stat.cpu_seconds
            count += 1
    return seconds, count


def start_once(job_execution: bool) -> tuple[float, float, int]:
    """Seconds until the server answers, CPU seconds of its start, processes: one server, started and stopped."""
    scratch = Path(tempfile.mkdtemp(prefix="tfdist-bench-server-"))
    started = time.monotonic()
    with tracking_server(f"sqlite:///{scratch}/store.db", scratch / "artifacts",
                         {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": str(job_execution).lower()}, "--workers", "1") as (_, server):
        answered = time.monotonic() - started
        time.sleep(SETTLE_SECONDS)
        cpu, processes = session_usage(server.pid)
    shutil.rmtree(scratch, ignore_errors=True)
    return answered, cpu, processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for job_execution in (False, True):
            results[job_execution].append(start_once(job_execution))
            answered, cpu, processes = results[job_execution][-1]
            print(f"job runners {'on' if job_execution else 'off'}: answered after {answered:.1f} s, "
                  f"{cpu:.1f} s of CPU, {processes} processes", flush=True)
    rows = [[label, spread([r[0] for r in results[on]], 1), spread([r[1] for r in results[on]], 1),
             max(r[2] for r in results[on])]
            for label, on in (("on (MLflow's default)", True), ("off (tfdist's default)", False))]
    print(table(["MLflow's job runners", "answers after (s)", "CPU of the start (s)", "processes"], rows))


if __name__ == "__main__":
    main()
