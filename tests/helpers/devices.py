"""The devices tests run on: this process's CPU is split into 2 logical devices once, before any TensorFlow op.

TensorFlow can split the CPU into logical devices only before its first op,
so the first import of this module (conftest.py's) does it: Mirrored and
CentralStorage tests get 2 replicas, everything else uses /cpu:0. On a
machine with GPUs the replicas are the GPUs: tests that count logical CPUs
carry ``cpu_only``.
"""

from __future__ import annotations

import pytest

from tfdist.runtime.onednn import configure_onednn
from tfdist.runtime.threads import configure_cpu_devices

# The in-process tests train the tiny config's MLP: TensorFlow loads here with oneDNN as its train stage would
# (``runtime.onednn: auto``), not with TensorFlow's default for this CPU (on where it has AVX-512).
configure_onednn("auto", "mlp")

from tfdist.tf_imports import tf  # noqa: E402  (after oneDNN's setting: TensorFlow reads it once, at load)

LOGICAL_CPUS = 2
configure_cpu_devices(LOGICAL_CPUS)
HAS_GPU = bool(tf.config.list_physical_devices("GPU"))
#: Replicas of mirrored and central_storage here: one per GPU, else one per logical CPU.
SPLIT_REPLICAS = len(tf.config.list_physical_devices("GPU")) or LOGICAL_CPUS
#: Two devices to split a model over: two GPUs, else the two logical CPUs.
TWO_DEVICES = ["/gpu:0", "/gpu:1"] if HAS_GPU else [f"/cpu:{i}" for i in range(LOGICAL_CPUS)]
#: For tests of the logical-CPU split, which tfdist makes only where there is no GPU.
cpu_only = pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: replicas run on it, not on logical CPUs")
