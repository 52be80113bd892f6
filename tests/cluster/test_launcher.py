"""The local launcher: a cluster on distinct free loopback ports, and nothing left behind when it is stopped."""

import signal
import subprocess
import sys
import time

import pytest

from tfdist.cluster.launcher import local_cluster
from tfdist.config.knobs import DistributedConfig
from tfdist.distribute.registry import get_spec

from helpers.project import REPO, process_alive

LAUNCHER = """
import sys, time
sys.path.insert(0, {src!r})
from tfdist.cluster.processes import ProcessGroup
with ProcessGroup() as group:
    pid = group.start("worker-0", [sys.executable, "-c", "import time; time.sleep(60)"], {{}})
    print(pid, flush=True)
    group.wait()
"""


def test_local_clusters_use_distinct_free_loopback_ports():
    mwms = local_cluster(get_spec("multi_worker_mirrored"), DistributedConfig(workers=3, ps=1))
    assert list(mwms) == ["worker"] and len(mwms["worker"]) == 3
    ps = local_cluster(get_spec("parameter_server"), DistributedConfig(workers=2, ps=2))
    assert {job: len(addresses) for job, addresses in ps.items()} == {"chief": 1, "worker": 2, "ps": 2}
    addresses = [a for spec in (mwms, ps) for job in spec.values() for a in job]
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert len({a for a in ps["chief"] + ps["worker"] + ps["ps"]}) == 5


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
