"""A private Slurm for the tests: munge, slurmctld and slurmd from Debian's packages.

Its config, state and logs live in a temp folder; ``SLURM_CONF`` points the
client commands (``srun``, ``sbatch``, ``sinfo``) at it. A cluster on test
hosts (:class:`helpers.netns.TestHosts`): slurmctld on host 0 and a slurmd
on every host, each node named after its host and reached at its address
(``NodeAddr``), each daemon in the foreground as a process of its host, 2 CPUs
declared a node. The client commands run on host 0
(:meth:`PrivateSlurm.client`), as a user's do on a login node. One munged
serves every host: its socket is a file, which the hosts share, as a
cluster's nodes share munge's key.

Needs root (the daemons run as root; munged as munge).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from helpers import netns

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch")


def available() -> str:
    """Why a private Slurm cannot run here, or '' when it can."""
    if os.geteuid() != 0:
        return "slurmd runs as root"
    missing = [name for name in DAEMONS if not (shutil.which(name) or Path("/usr/sbin", name).exists())]
    return f"not installed: {', '.join(missing)} (make slurm installs Debian's slurm-wlm and munge)" if missing else ""


class PrivateSlurm:
    """Start with :meth:`start`, stop with :meth:`stop`; :attr:`env` is the environment for its client commands."""

    def __init__(self, root: Path, hosts: netns.TestHosts):
        self.root, self.hosts = root, hosts
        self.nodes, self.addresses = list(hosts.names), list(hosts.addresses)
        self.node = self.nodes[0]
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: dict[str, subprocess.Popen] = {}  # "slurmctld" and each node's slurmd

    def start(self, timeout: float = 60) -> None:
        for folder in ("state", "spool"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self.conf.write_text(self._config())
        self._daemons["slurmctld"] = self.hosts.start(0, ["slurmctld", "-D", "-i", "-f", str(self.conf)], self.env,
                                                      self.root, self.root / "slurmctld.out", as_machine=True)
        for index in range(len(self.nodes)):
            self.start_slurmd(index)
        self.wait_until_idle(timeout)

    def wait_until_idle(self, timeout: float = 60) -> None:
        """Until every node is idle (registered, and free), bounded."""
        deadline = time.monotonic() + timeout
        while (states := self.node_states()).count("idle") < len(self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"private Slurm nodes not all idle ({states}); see the logs in {self.root}")
            time.sleep(0.5)

    def _config(self) -> str:
        per_node = "-%n"  # several slurmd on one machine: a spool, pid and log each
        return "\n".join([
            "ClusterName=tfdist-tests", f"SlurmctldHost={self.node}({self.addresses[0]})",
            "SlurmctldPort=6817", "SlurmdPort=6818",  # Slurm's own ports: each host has its own
            # a job credential lives 15 s, not 120: a requeued job waits that long (plus 1 s) before it may run again
            "AuthType=auth/munge", "AuthInfo=cred_expire=15",
            f"StateSaveLocation={self.root}/state", f"SlurmdSpoolDir={self.root}/spool{per_node}",
            f"SlurmctldPidFile={self.root}/slurmctld.pid", f"SlurmdPidFile={self.root}/slurmd{per_node}.pid",
            f"SlurmctldLogFile={self.root}/slurmctld.log", f"SlurmdLogFile={self.root}/slurmd{per_node}.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=2",  # a requeued job, eligible again, waits at most 2 s for a pass
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SlurmdParameters=config_overrides",
            "ReturnToService=2", "SlurmUser=root", "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none", "MpiDefault=none",
            # A node that stops answering is DOWN after SlurmdTimeout, and its jobs' steps end.
            "SlurmdTimeout=10", "MessageTimeout=5", "KillWait=5",
            *(f"NodeName={node} NodeAddr={address} CPUs=2 State=UNKNOWN"
              for node, address in zip(self.nodes, self.addresses, strict=True)),
            f"PartitionName=tests Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP", ""])

    def start_slurmd(self, index: int) -> None:
        """(Re)start the slurmd of test host ``index``, as that host's node."""
        node = self.nodes[index]
        (self.root / f"spool-{node}").mkdir(exist_ok=True)
        self._daemons[node] = self.hosts.start(index, ["slurmd", "-D", "-N", node, "-f", str(self.conf)], self.env,
                                               self.root, self.root / f"slurmd-{node}.out", as_machine=True)

    def client(self, command: Sequence[str]) -> list[str]:
        """``command`` (srun, sbatch, sinfo...) as run where a user runs it: on test host 0."""
        return [*self.hosts.enter(0, as_machine=True), *command]

    def node_states(self) -> list[str]:
        """Each node's state as ``sinfo`` says it (idle, alloc, down...)."""
        shown = subprocess.run(self.client(["sinfo", "-h", "-N", "-o", "%T"]), env=self.env, capture_output=True,
                               text=True, timeout=30)
        return shown.stdout.split()

    def _start_munge(self) -> None:
        """munged as the munge user with Debian's key, unless one already answers."""
        if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
            return
        Path("/run/munge").mkdir(exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True, timeout=30)

    def wait_for_job(self, job: str, timeout: float) -> dict[str, str]:
        """Wait for batch job ``job`` to end (requeued: to end again); its ``JobState``, ``ExitCode`` and
        ``Restarts`` as ``scontrol`` tells them."""
        deadline = time.monotonic() + timeout
        while True:
            shown = subprocess.run(self.client(["scontrol", "-o", "show", "job", job]), env=self.env,
                                   capture_output=True, text=True, timeout=30).stdout
            fields = dict(item.split("=", 1) for item in shown.split() if "=" in item)
            if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", None):
                return {"JobState": fields["JobState"], "ExitCode": fields.get("ExitCode", ""),
                        "Restarts": fields.get("Restarts", "0")}
            if time.monotonic() > deadline:
                subprocess.run(self.client(["scancel", job]), env=self.env)
                raise TimeoutError(f"Slurm job {job} still {fields.get('JobState')} after {timeout} s")
            time.sleep(0.5)

    def stop(self) -> None:
        for process in self._daemons.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._daemons.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
