"""What the machine gave a training: a real CPU hog beside it is counted as other programs' and flags the run."""

import os
import signal
import subprocess
import sys
import time

from tfdist.hardware import OTHERS_DISTURB_PERCENT, CpuMeter, MachineNoise


def spin(seconds: float) -> None:
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        pass


def test_a_cpu_hog_beside_the_training_is_other_programs_and_the_training_s_own_children_are_not():
    # The measured block's own child burns a core: the training's own work, not noise.
    with CpuMeter() as own:
        child = subprocess.Popen([sys.executable, "-c", "import time\nd = time.process_time() + 1.5\n"
                                  "while time.process_time() < d: pass"])
        child.wait(timeout=60)
    # A hog outside this process's tree (its shell exits, so init adopts it, as another program's) burns a core meanwhile.
    started = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True)
    hog = int(started.stdout)
    try:
        time.sleep(0.3)  # under way
        with CpuMeter(root=os.getpid()) as disturbed:
            spin(1.5)
    finally:
        os.kill(hog, signal.SIGKILL)
    cores = os.cpu_count() or 1
    assert disturbed.noise is not None and disturbed.noise.others_percent >= 50 / cores, \
        "a core busy with another program for the whole block is its share of the machine"
    assert disturbed.noise.disturbed and "other programs used" in disturbed.noise.what()
    assert own.noise is not None and own.noise.usable_cpus == len(os.sched_getaffinity(0))
    assert own.own_seconds >= 1.4, "the block's own child, ended and reaped, is the training's CPU time"


def test_steal_past_its_bound_flags_the_run_and_says_so():
    quiet = MachineNoise(steal_percent=0.5, others_percent=2.0, usable_cpus=2)
    assert not quiet.disturbed and quiet.what() == ""
    stolen = MachineNoise(steal_percent=12.0, others_percent=OTHERS_DISTURB_PERCENT, usable_cpus=2)
    assert stolen.disturbed
    assert stolen.what() == "the host took 12% of the machine's CPU time (steal) and other programs used 10% of it"
