"""Benchmark: where the test suite's CPU goes, process by process, each charged to the test that started it.

The suite is CPU-bound on these 2-core machines (busy 0.9 of both over a run),
so its wall time is its CPU work over two: this finds the work. It runs
``make test``'s pytest command with itself as a plugin (each test's start and
end on its xdist worker, to a file) while a thread samples every process's
CPU time and command line from /proc twice a second. A process is charged to
the test running on the xdist worker it descends from when it was first seen;
daemons that leave their parent (``ray start``, ``dvc queue``'s workers) are
charged to no test and listed by command.

    python -m benchmarks suite_cpu                     # the whole suite, as make test runs it (about 20 min)
    python -m benchmarks suite_cpu tests/pipeline -m slow -n 2 --dist loadscope

How the 20-minute CI was reached with it: docs/performance.md, "Where the CPU went".

Not on the harness, on purpose: it profiles one run of the whole test suite (about
20 minutes), charging its CPU to the tests; alternated rounds of it would take hours
and compare nothing.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.procfs import process_stat  # noqa: E402

#: The file the plugin half (in each pytest process) appends test starts and ends to.
TIMELINE_ENV = "TFDIST_SUITE_TIMELINE"
MAKE_TEST = ["-n", "2", "--dist", "loadscope", "--no-loadscope-reorder"]
#: What a process is, by its command line: the first pattern that matches names it.
KINDS = [("stage train", r"stages[./]train"), ("stage evaluate", r"stages[./]evaluate"),
         ("stage compare", r"stages[./]compare"), ("stage preprocess", r"stages[./]preprocess"),
         ("MLflow job runner (huey)", r"huey"), ("uvicorn (MLflow server)", r"uvicorn"),
         ("tfdist / mlflow server", r"tfdist_cli|bin/tfdist|-m mlflow"), ("dvc", r"\bdvc\b"),
         ("ray", r"\bray\b|raylet|gcs_server"), ("slurm", r"slurm|srun|munge"), ("chromium", r"chrom"),
         ("pytest and its workers (in-process tests)", r"pytest|execnet|exec\(eval")]


# -- the plugin half: loaded by pytest (-p benchmarks.suite_cpu) in the controller and each xdist worker ------------------

def _log(phase: str, nodeid: str) -> None:
    path = os.environ.get(TIMELINE_ENV)
    if path:
        with open(path, "a") as timeline:
            timeline.write(f"{time.time()}\t{os.getpid()}\t{phase}\t{nodeid}\n")


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _log("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _log("end", nodeid)


# -- the sampling half ----------------------------------------------------------------------------------------

class Sampler(threading.Thread):
    """Every process's command line, parent, and CPU seconds at first and last sight, twice a second.

    Processes already there at the first pass (``before``) are charged only what they use after it.
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[tuple[int, str], dict] = {}
        self.done = threading.Event()

    def run(self) -> None:
        first_pass = True
        while not self.done.is_set():
            now = time.time()
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    stat = process_stat(pid)
                    key = (int(pid), stat.started)
                    if key in self.seen:
                        self.seen[key]["last_cpu"] = stat.cpu_seconds
                        continue
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self.seen[key] = {"pid": int(pid), "ppid": stat.ppid, "command": command.strip(), "first": now,
                                      "first_cpu": stat.cpu_seconds, "last_cpu": stat.cpu_seconds, "before": first_pass}
                except (OSError, ValueError, IndexError):
                    continue
            first_pass = False
            self.done.wait(0.5)


def used_during(process: dict) -> float:
    """CPU seconds a process used while sampled (all of it, if it started meanwhile)."""
    return process["last_cpu"] - process["first_cpu"] if process["before"] else process["last_cpu"]


def kind(command: str) -> str:
    return next((name for name, pattern in KINDS if re.search(pattern, command)), command[:60] or "(kernel)")


def charge(processes: list[dict], timeline: Path) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """CPU seconds by test, by test file, and (for processes under no test) by kind."""
    events: dict[int, list[tuple[float, str, str]]] = collections.defaultdict(list)
    for line in timeline.read_text().splitlines():
        moment, pid, phase, nodeid = line.split("\t")
        events[int(pid)].append((float(moment), phase, nodeid))
    by_pid = {process["pid"]: process for process in processes}

    def worker_of(process: dict | None) -> int | None:
        for _ in range(40):
            if process is None or process["pid"] in events:
                return None if process is None else process["pid"]
            process = by_pid.get(process["ppid"])
        return None

    def test_at(worker: int, moment: float) -> str:
        current = "(between tests)"
        for when, phase, nodeid in events[worker]:
            if when > moment:
                break
            current = nodeid if phase == "start" else "(between tests)"
        return current

    by_test, by_file, unowned = (collections.defaultdict(float) for _ in range(3))
    for process in processes:
        used = used_during(process)
        worker = worker_of(process)
        if worker is None or worker == process["pid"]:
            unowned[kind(process["command"])] += used
            continue
        test = test_at(worker, process["first"])
        by_test[test] += used
        by_file[test.split("::")[0]] += used
    return by_test, by_file, unowned


def top(title: str, seconds: dict[str, float], count: int) -> None:
    print(f"\n| {title} | CPU (s) |\n|---|---:|")
    for name, value in sorted(seconds.items(), key=lambda item: -item[1])[:count]:
        print(f"| {name[:140]} | {value:,.0f} |")


def main() -> None:
    pytest_args = sys.argv[1:] or MAKE_TEST
    descriptor, name = tempfile.mkstemp(prefix="tfdist-suite-timeline-", suffix=".tsv")
    os.close(descriptor)  # the plugin in each pytest process appends to it by name
    timeline = Path(name)
    env = {**os.environ, TIMELINE_ENV: str(timeline)}  # pytest -m runs from the project root: the package imports
    sampler = Sampler()
    sampler.start()
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "benchmarks.suite_cpu", *pytest_args], env=env)
    wall = time.monotonic() - began
    sampler.done.set()
    sampler.join()
    processes = list(sampler.seen.values())
    by_test, by_file, unowned = charge(processes, timeline)
    total = sum(by_test.values()) + sum(unowned.values())
    print(f"\npytest exit {result.returncode}, {wall:,.0f} s wall; {total:,.0f} s of CPU sampled "
          f"({total / wall / os.cpu_count():.2f} of {os.cpu_count()} CPUs busy)")
    top("test file", by_file, 25)
    top("test", by_test, 40)
    top("processes under no test, by kind", unowned, 15)
    kinds: dict[str, float] = collections.defaultdict(float)
    for process in processes:
        kinds[kind(process["command"])] += used_during(process)
    top("every process, by kind", kinds, 20)
    timeline.unlink()
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
