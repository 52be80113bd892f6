"""TF_CONFIG parsing and the local process group, with small Python programs as tasks."""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfdist.cluster_spec import ClusterError, ClusterTask, check_cluster, parse_tf_config, read_tf_config, tasks_of
from tfdist.config import DistributedConfig
from tfdist.errors import RunError
from tfdist.launcher import local_cluster
from tfdist.process_group import ProcessGroup
from tfdist.strategies import get_spec

from conftest import REPO, process_alive

PS_CLUSTER = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]}


def tf_config(cluster, task_type, index, **extra):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, **extra})


def test_a_kubeflow_tf_config_is_understood():
    task = parse_tf_config(tf_config(PS_CLUSTER, "worker", 1, environment="cloud"))
    assert (task.task_type, task.task_index, task.name) == ("worker", 1, "worker-1")
    assert task.count("worker") == 2 and task.count("ps") == 1
    assert not task.is_chief
    check_cluster(task, get_spec("parameter_server"))


@pytest.mark.parametrize(("cluster", "task_type", "index", "chief"), [
    ({"worker": ["a:1", "b:1"]}, "worker", 0, True),
    ({"worker": ["a:1", "b:1"]}, "worker", 1, False),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "chief", 0, True),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "worker", 0, False),
])
def test_the_chief_is_the_chief_task_else_worker_0(cluster, task_type, index, chief):
    assert ClusterTask(cluster, task_type, index).is_chief is chief


def test_unset_or_blank_tf_config_means_local_mode():
    assert read_tf_config({}) is None
    assert read_tf_config({"TF_CONFIG": "  "}) is None
    assert read_tf_config({"TF_CONFIG": tf_config({"worker": ["a:1"]}, "worker", 0)}).name == "worker-0"


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"task": {"type": "worker", "index": 0}}', "'cluster' must map job names"),
    (tf_config({"trainer": ["a:1"]}, "trainer", 0), "unknown job 'trainer'"),
    (tf_config({"worker": []}, "worker", 0), "cluster.worker must be a non-empty list"),
    (tf_config({"worker": ["no-port"]}, "worker", 0), "address 'no-port' must look like host:port"),
    (tf_config({"worker": ["a:99999"]}, "worker", 0), "address 'a:99999'"),
    (tf_config({"worker": ["a:1"]}, "ps", 0), "task.type 'ps' is not a job of the cluster"),
    (tf_config({"worker": ["a:1"]}, "worker", 1), "task.index 1 is out of range for job 'worker'"),
    (tf_config({"worker": ["a:1"]}, "worker", "0"), "task.index '0' is out of range"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "'task' must be an object"),
])
def test_a_malformed_tf_config_names_the_problem(text, message):
    with pytest.raises(ClusterError, match="TF_CONFIG") as raised:
        parse_tf_config(text)
    assert message in str(raised.value)
    assert raised.value.exit_code == 2


@pytest.mark.parametrize(("cluster", "strategy", "message"), [
    (PS_CLUSTER, "multi_worker_mirrored", "takes no 'ps' job"),
    ({"worker": ["a:1"], "ps": ["p:1"]}, "parameter_server", "missing chief"),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "parameter_server", "missing ps"),
    ({"worker": ["a:1"], "evaluator": ["e:1"]}, "multi_worker_mirrored", "'evaluator' is not supported"),
    ({"chief": ["c:1", "d:1"], "worker": ["a:1"]}, "multi_worker_mirrored", "cluster.chief must list one task"),
])
def test_a_cluster_that_does_not_fit_the_strategy_is_refused(cluster, strategy, message):
    task = ClusterTask(cluster, "worker", 0)
    with pytest.raises(ClusterError, match=message):
        check_cluster(task, get_spec(strategy))


def test_local_clusters_use_distinct_free_loopback_ports():
    mwms = local_cluster(get_spec("multi_worker_mirrored"), DistributedConfig(workers=3, ps=1))
    assert list(mwms) == ["worker"] and len(mwms["worker"]) == 3
    ps = local_cluster(get_spec("parameter_server"), DistributedConfig(workers=2, ps=2))
    assert {job: len(addresses) for job, addresses in ps.items()} == {"chief": 1, "worker": 2, "ps": 2}
    addresses = [a for spec in (mwms, ps) for job in spec.values() for a in job]
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert len({a for a in ps["chief"] + ps["worker"] + ps["ps"]}) == 5


def test_tasks_of_lists_chief_then_workers_then_ps_and_round_trips_tf_config():
    tasks = tasks_of({"ps": ["p:1"], "worker": ["a:1", "b:1"], "chief": ["c:1"]})
    assert [t.name for t in tasks] == ["chief-0", "worker-0", "worker-1", "ps-0"]
    again = parse_tf_config(tasks[2].to_tf_config())
    assert (again.task_type, again.task_index, dict(again.cluster)) == ("worker", 1, dict(tasks[2].cluster))


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


LAUNCHER = """
import sys, time
sys.path.insert(0, {src!r})
from tfdist.process_group import ProcessGroup
with ProcessGroup() as group:
    pid = group.start("worker-0", [sys.executable, "-c", "import time; time.sleep(60)"], {{}})
    print(pid, flush=True)
    group.wait()
"""


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_a_stopped_launcher_leaves_no_task_behind(signum, code):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER.format(src=str(REPO / "src"))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    child = int(launcher.stdout.readline())
    assert process_alive(child)
    launcher.send_signal(signum)
    launcher.wait(timeout=15)
    if code > 0:
        assert f"interrupted by {signal.Signals(signum).name}" in launcher.stderr.read()
    else:
        assert launcher.returncode == code
    for _ in range(50):  # the parent-death signal is delivered asynchronously
        if not process_alive(child):
            break
        time.sleep(0.1)
    assert not process_alive(child)
