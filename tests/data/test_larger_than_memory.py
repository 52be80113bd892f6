"""A data set larger than the memory the stages are given is prepared, trained on (alone and by two workers) and
evaluated, each stage in a cgroup whose limit is below the set's pixels, and the kernel kills nothing."""

import json
import subprocess
import sys

import pytest

from benchmarks.own_data_memory import write_set

from helpers import memory_limit
from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(memory_limit.available()), reason=memory_limit.available() or "")]

#: 144,000 images of 64x64x3: 1.77 GB of pixels (1.65 GiB), against a limit of 1.5 GiB a stage, its processes together
#: (multi_worker_mirrored's launcher and two workers take about 1 GiB on the bundled sample: design.md).
IMAGES, SIDE, LIMIT = 144_000, 64, 3 << 29


def test_a_set_larger_than_the_memory_limit_is_prepared_trained_and_evaluated(tmp_path):
    assert IMAGES * SIDE * SIDE * 3 > LIMIT
    write_set(tmp_path / "large.npz", IMAGES, side=SIDE)
    tiny_params(tmp_path, data={"source": str(tmp_path / "large.npz")}, model={"hidden_units": [8]},
                train={"epochs": 1, "batch_size": 128, "steps_per_execution": 50},
                distributed={"strategies": ["multi_worker_mirrored"], "workers": 2})
    prepared = tmp_path / "data" / "prepared"
    stages = {
        "preprocess": [sys.executable, "stages/preprocess.py", "--params", str(tmp_path / "params.yaml"),
                       "--out", str(prepared), "--report", str(tmp_path / "data.json")],
        "normal": train_stage_command(tmp_path, "default", "normal"),
        "multi_worker_mirrored": train_stage_command(tmp_path, "multi_worker_mirrored"),
        "evaluate": [sys.executable, "stages/evaluate.py", "--params", str(tmp_path / "params.yaml"),
                     "--data", str(prepared), "--models", str(tmp_path / "models"),
                     "--train-reports", str(tmp_path / "reports"), "--reports", str(tmp_path / "eval"),
                     "--name", "normal", "--name", "multi_worker_mirrored"],
    }
    peaks = {}
    for stage, command in stages.items():
        limit = memory_limit.MemoryLimit(LIMIT)
        try:
            done = subprocess.run(limit.wrap(command), cwd=REPO, env=local_mode_environment(), capture_output=True,
                                  text=True, timeout=900)
            peaks[stage] = limit.peak
            assert limit.oom_kills == 0, f"{stage}: the kernel killed a process for memory\n{done.stderr[-3000:]}"
            assert done.returncode == 0, f"{stage} exited {done.returncode}:\n{done.stderr[-3000:]}"
        finally:
            limit.close()
    print("peaks (MiB, page cache included):", {stage: peak >> 20 for stage, peak in peaks.items()})
    assert sum(path.stat().st_size for path in prepared.glob("*.tfrecord")) > LIMIT
    for name in ("normal", "multi_worker_mirrored"):
        assert json.loads((tmp_path / "eval" / f"{name}.json").read_text())["accuracy"] > 0.9, "it learned"
