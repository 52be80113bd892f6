"""Benchmark: what starting a tracking server costs, with MLflow's GenAI job runners on and off.

``tfdist server`` (sqlite store, one worker) until its ``/health`` answers, then the
CPU time of every process of its session 20 s later (the job runners start beside
the server and import MLflow each). tfdist leaves them off unless ``--enable
jobs`` (tfdist_cli.serving); the rounds alternate the two settings, and the
table gives medians and ranges.

    python -m benchmarks server_start [--rounds 3]     # about 4 min
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import tracking_server
from benchmarks.harness import Options
from benchmarks.procfs import process_stat
from benchmarks.results import Result, spread

TITLE = "starting tfdist server (sqlite, one worker) with MLflow's GenAI job runners on and off"
DEFAULTS = {"models": ("mlp",), "batches": (25,)}

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
    with tracking_server(f"sqlite:///{scratch}/store.db", scratch / "artifacts", None, "--workers", "1",
                         *(("--enable", "jobs") if job_execution else ())) as (_, server):
        answered = time.monotonic() - started
        time.sleep(SETTLE_SECONDS)
        cpu, processes = session_usage(server.pid)
    shutil.rmtree(scratch, ignore_errors=True)
    return answered, cpu, processes


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"job_runners": "off"}, {"job_runners": "on"}]


def measure(cell: dict[str, Any], context: Any, options: Options) -> dict[str, float]:
    answered, cpu, processes = start_once(cell["job_runners"] == "on")
    return {"answers_after_s": answered, "cpu_s": cpu, "processes": float(processes)}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    labels = {"on": "on (MLflow's default; tfdist's --enable jobs)", "off": "off (tfdist's default)"}
    rows = [[labels[cell.params["job_runners"]], spread(cell.values("answers_after_s"), 1),
             spread(cell.values("cpu_s"), 1), f"{max(cell.values('processes')):.0f}"] for cell in result.cells]
    return ["MLflow's job runners", "answers after (s)", "CPU of the start (s)", "processes"], rows
