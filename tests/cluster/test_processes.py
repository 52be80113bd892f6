"""The local process group, with small Python programs as tasks: waited for, prefixed, stopped together."""

import io
import logging
import os
import signal
import sys
import textwrap
import time

import pytest

from tfdist.cluster import preemption
from tfdist.cluster.processes import ProcessGroup, task_cpus
from tfdist.errors import PREEMPTED_EXIT, Interrupted, Preempted, RunError

from helpers.project import process_alive


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_tasks_that_finish_are_waited_for_with_prefixed_output():
    out = io.StringIO()
    with ProcessGroup(out=out) as group:
        group.start("worker-0", python("import os; print('hello from', os.environ['TF_CONFIG'])"), {"TF_CONFIG": "x"})
        group.start("worker-1", python("print('second')"), {})
        group.wait()
    lines = out.getvalue().splitlines()
    assert "[worker-0] hello from x" in lines and "[worker-1] second" in lines


def test_a_task_given_cpus_runs_on_them_alone_and_others_on_every_cpu():
    cpus = sorted(os.sched_getaffinity(0))
    out = io.StringIO()
    with ProcessGroup(out=out) as group:
        group.start("worker-0", python("import os; print(sorted(os.sched_getaffinity(0)))"), {}, cpus={cpus[-1]})
        group.start("ps-0", python("import os; print(sorted(os.sched_getaffinity(0)))"), {})
        group.wait()
    lines = out.getvalue().splitlines()
    assert f"[worker-0] {[cpus[-1]]}" in lines and f"[ps-0] {cpus}" in lines


def test_a_task_killed_by_a_signal_is_named_before_the_peer_that_exited_because_of_it():
    with ProcessGroup(out=io.StringIO()) as group:
        group.start("worker-0", python("import sys, time; time.sleep(1); sys.exit(1)"), {})  # "lost worker-1"
        victim = group.start("worker-1", python("import time; time.sleep(60)"), {})
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(task.process.poll() is None for task in group.tasks):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert not group.poll()
    assert group.failure.startswith(f"task worker-1 (pid {victim}) was killed by SIGKILL")


def test_tasks_get_a_cpu_each_round_robin():
    cpus = sorted(os.sched_getaffinity(0))
    assigned = task_cpus(len(cpus) + 1)
    assert assigned[:len(cpus)] == [{c} for c in cpus], "one CPU of its own each, while there are enough"
    assert assigned[-1] == {cpus[0]}, "then they share, in turn"


def test_a_failing_task_stops_the_others_and_is_named_with_its_output():
    out = io.StringIO()
    started = time.monotonic()
    with pytest.raises(RunError) as raised, ProcessGroup(out=out, stop_timeout=2) as group:
        sleeper = group.start("worker-0", python("import time; time.sleep(60)"), {})
        group.start("worker-1", python("import sys, time; time.sleep(0.5); print('out of memory'); sys.exit(3)"), {})
        group.wait()
    message = str(raised.value)
    assert "task worker-1" in message and "exited with code 3" in message
    assert "[worker-1] out of memory" in message
    assert time.monotonic() - started < 10
    assert not process_alive(sleeper)


def test_a_killed_task_is_reported_with_its_signal():
    with pytest.raises(RunError, match=r"task worker-1 \(pid \d+\) was killed by SIGKILL"), ProcessGroup() as group:
        group.start("worker-0", python("import time; time.sleep(60)"), {})
        victim = group.start("worker-1", python("import time; time.sleep(60)"), {})
        time.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        group.wait()


def test_a_server_that_exits_at_all_is_a_failure():
    with pytest.raises(RunError, match="task ps-0 .* stopped unexpectedly"), ProcessGroup() as group:
        group.start("worker-0", python("import time; time.sleep(60)"), {})
        group.start("ps-0", python("pass"), {}, must_finish=False)
        group.wait()


def test_watch_interrupts_the_main_thread_when_a_task_dies():
    started = time.monotonic()
    with pytest.raises(RunError, match=r"task worker-0 .* stopped unexpectedly \(exit code 1\)"), ProcessGroup() as group:
        group.start("worker-0", python("import sys, time; time.sleep(0.5); sys.exit(1)"), {}, must_finish=False)
        group.watch(interval=0.1)
        time.sleep(30)  # the coordinator's training, in real use
    assert time.monotonic() - started < 10


def test_a_task_dying_while_the_main_thread_logs_is_not_swallowed_by_logging():
    """The watcher's signal lands wherever the main thread is: in logging's emit, whose ``except Exception`` took it."""

    class SlowStream(io.StringIO):
        def write(self, text):
            time.sleep(5)  # the task fails meanwhile: the watcher's signal lands here, inside the handler's emit
            return super().write(text)

    logger = logging.getLogger("tests.training")
    handler = logging.StreamHandler(SlowStream())
    logger.addHandler(handler)
    started = time.monotonic()
    try:
        with pytest.raises(RunError, match=r"task worker-0 .* \(exit code 1\)"), ProcessGroup(failure_grace=60) as group:
            group.start("worker-0", python("import sys; sys.exit(1)"), {}, must_finish=False)
            group.watch(interval=0.1)
            logger.warning("epoch 1 of 10")
            time.sleep(10)  # the coordinator's training, in real use
    finally:
        logger.removeHandler(handler)
    assert time.monotonic() - started < 5, "noticed within the log line, not after the training"


#: A task that trains as a preempted one does: SIGTERM is its notice; it "backs up", says where, and exits 75.
BACKS_UP = """
    import signal, sys, time
    def preempted(signum, frame):
        print("error: preempted (SIGTERM): backed up at epoch 2, step 40; run the same command again", flush=True)
        sys.exit(75)
    signal.signal(signal.SIGTERM, preempted)
    print("training", flush=True)
    time.sleep(60)
"""


def _training(group, *names):
    """Start tasks ``names`` that back up; return once every task that must finish is training (its handler set)."""
    for name in names:
        group.start(name, python(BACKS_UP), {})
    while not all("training" in task.tail for task in group.tasks if task.must_finish):
        time.sleep(0.05)


def test_a_sigterm_is_passed_on_to_the_tasks_that_train_and_the_group_ends_preempted_where_they_backed_up():
    with pytest.raises(Preempted, match="backed up at epoch 2, step 40; run the same"), ProcessGroup(out=io.StringIO()) as group:
        server = group.start("ps-0", python("import time; time.sleep(60)"), {}, must_finish=False)
        _training(group, "worker-0", "worker-1")
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's notice, to the launcher
        group.wait()
    assert [task.process.returncode for task in group.tasks[1:]] == [PREEMPTED_EXIT] * 2, "both were passed it"
    assert not process_alive(server), "the server is stopped once they are done"


def test_a_task_preempted_on_its_own_ends_the_group_preempted_not_restarted():
    with pytest.raises(Preempted, match="backed up at epoch 2, step 40; run the same"), ProcessGroup(out=io.StringIO()) as group:
        _training(group, "worker-0")
        os.kill(group.tasks[0].process.pid, signal.SIGTERM)  # e.g. one pod evicted
        group.wait()


def test_a_second_sigterm_or_tasks_that_never_back_up_stop_every_task_at_once(monkeypatch):
    with pytest.raises(Interrupted, match="every task was stopped"), ProcessGroup(out=io.StringIO(), stop_timeout=0.5) as group:
        stubborn = group.start("worker-0", python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                                  "print('training', flush=True); time.sleep(60)"), {})
        _training(group)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)
        group.wait()
    assert not process_alive(stubborn)
    monkeypatch.setattr(preemption, "PREEMPTED_TASKS_BOUND", 1)
    started = time.monotonic()
    with pytest.raises(Interrupted, match="did not back up within 1 s"), \
            ProcessGroup(out=io.StringIO(), stop_timeout=0.5) as group:
        group.start("worker-0", python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                       "print('training', flush=True); time.sleep(60)"), {})
        _training(group)
        os.kill(os.getpid(), signal.SIGTERM)
        group.wait()
    assert time.monotonic() - started < 10


def test_a_task_ended_by_the_sigterm_passed_on_is_stopped_not_failed_and_only_then():
    notice = preemption.Notice()
    assert not notice.stopped(128 + signal.SIGTERM), "no notice yet: a task's SIGTERM is its failure"
    with pytest.raises(Interrupted):
        notice.take(signal.SIGTERM, lambda: [])  # no task to pass it on to: the launcher is interrupted itself
    notice.take(signal.SIGTERM, lambda: ["worker-0"])
    assert notice.stopped(-signal.SIGTERM) and notice.stopped(128 + signal.SIGTERM) and not notice.stopped(1)
    with pytest.raises(Interrupted, match="every task was stopped"):
        notice.take(signal.SIGTERM, lambda: ["worker-0"])
