"""Two local launches at once never get the same ports (the port book), tested where ports are scarce.

In a network namespace of our own, the kernel's ephemeral range is cut to 4
ports, so a second launcher probing with bind(0) is offered the first one's
ports again as soon as that one's probes close: only the book keeps them apart.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2 (netns)")

RANGE = (40000, 40003)
#: Prints the ports a launcher process gets, then holds them (sleeps) until killed.
HOLD = textwrap.dedent("""
    import sys, time
    from tfdist.errors import RunError
    from tfdist.cluster.ports import free_ports
    try:
        print(*free_ports(int(sys.argv[1])), flush=True)
    except RunError as err:
        print("error:", err, flush=True)
        sys.exit(1)
    time.sleep(float(sys.argv[2]))
""")
#: Prints the ports of a local 2-worker multi_worker_mirrored cluster (TFDIST_PROFILER_PORT comes from the env).
CLUSTER = textwrap.dedent("""
    from tfdist.cluster.launcher import cluster_ports, local_cluster
    from tfdist.config.knobs import DistributedConfig
    from tfdist.distribute.registry import REGISTRY
    print(*sorted(cluster_ports(local_cluster(REGISTRY["multi_worker_mirrored"], DistributedConfig(workers=2)))))
""")


@pytest.fixture
def scarce_ports(tmp_path):
    """A namespace whose loopback has 4 ephemeral ports, and a private port book; runs a holder in it."""
    name = f"tfdist-ports-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw",
                        f"net.ipv4.ip_local_port_range={RANGE[0]} {RANGE[1]}"], check=True)
        env = {**os.environ, "TMPDIR": str(tmp_path)}  # the book lives in TMPDIR
        processes = []

        def start(count: int, hold: float = 60.0, script: str = HOLD, **more_env: str) -> tuple[subprocess.Popen, str]:
            process = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c", script, str(count), str(hold)],
                                       stdout=subprocess.PIPE, text=True, env={**env, **more_env})
            processes.append(process)
            return process, process.stdout.readline().strip()

        yield start
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)
        subprocess.run(["ip", "netns", "delete", name], check=False)


def test_a_second_launch_gets_other_ports_and_a_third_a_clear_error_until_the_first_dies(scarce_ports):
    first, first_ports = scarce_ports(2)
    _, second_ports = scarce_ports(2)
    ports = set(range(RANGE[0], RANGE[1] + 1))
    assert set(map(int, first_ports.split())) | set(map(int, second_ports.split())) == ports, (first_ports, second_ports)

    third, line = scarce_ports(1)
    assert third.wait(timeout=30) == 1
    assert line.startswith("error: no 1 free ports on 127.0.0.1 that another tfdist launch does not hold (4 held)")

    first.kill()  # a killed launcher's ports are free again
    first.wait(timeout=10)
    _, fourth_ports = scarce_ports(2)
    assert set(map(int, fourth_ports.split())) == set(map(int, first_ports.split()))


def test_a_local_cluster_leaves_the_ports_its_tasks_serve_the_profiler_on(scarce_ports):
    # 4 ports in all: the tasks' profilers take 40000 and 40001, so the cluster must take the other two
    cluster, line = scarce_ports(0, script=CLUSTER, TFDIST_PROFILER_PORT=str(RANGE[0]))
    assert cluster.wait(timeout=60) == 0
    assert line == f"{RANGE[0] + 2} {RANGE[0] + 3}"


@pytest.fixture
def own_temp(tmp_path, monkeypatch):
    """A temp folder of the test's, world-writable as /tmp is, where the book is looked for."""
    import tempfile

    tmp_path.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_port_book_is_the_users_own(own_temp):
    from tfdist.cluster.ports import PORT_BOOK, free_ports, release_ports

    ports = free_ports(2)
    folder = own_temp / f"tfdist-{os.getuid()}"
    assert oct(folder.stat().st_mode & 0o777) == "0o700" and (folder / PORT_BOOK).is_file()
    release_ports(ports)


@pytest.mark.parametrize("planted", ["another user's folder", "a link", "a folder open to all"])
def test_a_port_book_planted_by_another_user_is_refused_by_name(own_temp, planted):
    from tfdist.cluster.ports import free_ports
    from tfdist.errors import RunError

    folder = own_temp / f"tfdist-{os.getuid()}"
    if planted == "a link":
        (own_temp / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(own_temp / "elsewhere")
    else:
        folder.mkdir(mode=0o777 if planted == "a folder open to all" else 0o700)
        folder.chmod(0o777 if planted == "a folder open to all" else 0o700)
        if planted == "another user's folder":
            os.chown(folder, 65534, 65534)
    with pytest.raises(RunError, match=f"{folder} is not a folder of this user's alone"):
        free_ports(1)
    if planted == "a link":
        assert not list((own_temp / "elsewhere").iterdir()), "nothing was written through the link"
