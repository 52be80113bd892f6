"""A private single-node Slurm for the tests: munge, slurmctld and slurmd from Debian's packages, on free loopback ports.

Its config, state and logs live in a temp folder; ``SLURM_CONF`` points the
client commands (``srun``, ``sbatch``, ``sinfo``) at it. The node is this
machine (its hostname, at 127.0.0.1) with 4 CPUs declared, so a step of 4
tasks fits on 2 cores. Needs root (the daemons run as root; munged as munge).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch")


def available() -> str:
    """Why a private Slurm cannot run here, or '' when it can."""
    if os.geteuid() != 0:
        return "slurmd runs as root"
    missing = [name for name in DAEMONS if not (shutil.which(name) or Path("/usr/sbin", name).exists())]
    return f"not installed: {', '.join(missing)} (make slurm installs Debian's slurm-wlm and munge)" if missing else ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateSlurm:
    """Start with :meth:`start`, stop with :meth:`stop`; :attr:`env` is the environment for its client commands."""

    def __init__(self, root: Path):
        self.root, self.node = root, socket.gethostname()
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60) -> None:
        for folder in ("state", "spool"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self.conf.write_text("\n".join([
            "ClusterName=tfdist-tests", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}", "AuthType=auth/munge",
            f"StateSaveLocation={self.root}/state", f"SlurmdSpoolDir={self.root}/spool",
            f"SlurmctldPidFile={self.root}/slurmctld.pid", f"SlurmdPidFile={self.root}/slurmd.pid",
            f"SlurmctldLogFile={self.root}/slurmctld.log", f"SlurmdLogFile={self.root}/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SlurmdParameters=config_overrides",
            "ReturnToService=2", "SlurmUser=root", "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none", "MpiDefault=none",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN",
            f"PartitionName=tests Nodes={self.node} Default=YES MaxTime=INFINITE State=UP", ""]))
        subprocess.run(["slurmctld", "-f", str(self.conf), "-i"], env=self.env, check=True, timeout=30)
        subprocess.run(["slurmd", "-f", str(self.conf)], env=self.env, check=True, timeout=30)
        deadline = time.monotonic() + timeout
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True,
                                           text=True).stdout:
            if time.monotonic() > deadline:
                raise RuntimeError(f"private Slurm node never became idle; see {self.root}/slurmd.log")
            time.sleep(0.5)

    def _start_munge(self) -> None:
        """munged as the munge user with Debian's key, unless one already answers."""
        if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
            return
        Path("/run/munge").mkdir(exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True, timeout=30)

    def wait_for_job(self, job: str, timeout: float) -> dict[str, str]:
        """Wait for batch job ``job`` to end; its ``JobState`` and ``ExitCode`` as ``scontrol`` tells them."""
        deadline = time.monotonic() + timeout
        while True:
            shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=self.env, capture_output=True,
                                   text=True, timeout=30).stdout
            fields = dict(item.split("=", 1) for item in shown.split() if "=" in item)
            if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", None):
                return {"JobState": fields["JobState"], "ExitCode": fields.get("ExitCode", "")}
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job], env=self.env)
                raise TimeoutError(f"Slurm job {job} still {fields.get('JobState')} after {timeout} s")
            time.sleep(0.5)

    def stop(self) -> None:
        for daemon in ("slurmd", "slurmctld"):
            pid_file = self.root / f"{daemon}.pid"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text().split()[0]), 15)
                except (ProcessLookupError, ValueError):
                    pass
