"""Mixed-precision policies: set them without leaking, and say what the hardware can do.

A Keras policy is process-global and captured by each layer when it is built,
so :func:`policy` sets it only around building (and compiling) one model. The
hardware check is honest rather than hopeful: float16 and bfloat16 run on any
CPU, but are only faster where there are units to run them fast.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from tfdist.hardware import cpu_flags
from tfdist.tf_imports import keras, tf

log = logging.getLogger(__name__)

_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@contextlib.contextmanager
def policy(precision: str) -> Iterator[None]:
    """Set the Keras global dtype policy to ``precision`` inside the block only.

    Build and compile the model inside it: layers keep the policy they were
    built with, and the next model built in this process starts from the
    policy that was there before.
    """
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


@dataclass(frozen=True)
class HardwareSupport:
    """Whether ``precision`` can be faster than float32 here, and why.

    Attributes:
        precision: the policy name.
        can_be_faster: False where no unit computes that type faster than float32.
        reason: one sentence naming the hardware found.
    """

    precision: str
    can_be_faster: bool
    reason: str


def hardware_support(precision: str) -> HardwareSupport:
    """What this machine offers ``precision`` (float16: GPU compute capability >= 7.0;
    bfloat16: a TPU, a GPU of compute capability >= 8.0, or a CPU with AVX512-BF16 or AMX)."""
    if precision == "float32":
        return HardwareSupport(precision, True, "float32 is the baseline")
    capabilities = [
        tf.config.experimental.get_device_details(gpu).get("compute_capability") or (0, 0)
        for gpu in tf.config.list_physical_devices("GPU")
    ]
    best = max(capabilities, default=None)
    gpu = f"GPU compute capability {best[0]}.{best[1]}" if best else "no GPU"
    if precision == "mixed_float16":
        if best and best >= (7, 0):
            return HardwareSupport(precision, True, f"{gpu} has float16 tensor cores")
        return HardwareSupport(
            precision, False, f"float16 is fast only on GPUs of compute capability 7.0 or more, and this machine has {gpu}"
        )
    if tf.config.list_logical_devices("TPU"):
        return HardwareSupport(precision, True, "a TPU computes in bfloat16 natively")
    if best and best >= (8, 0):
        return HardwareSupport(precision, True, f"{gpu} has bfloat16 tensor cores")
    flags = cpu_flags()
    found = [flag for flag in _BF16_CPU_FLAGS if flag in flags]
    if found:
        return HardwareSupport(precision, True, f"the CPU has {' and '.join(found)}")
    return HardwareSupport(
        precision, False,
        f"bfloat16 is fast only on TPUs, GPUs of compute capability 8.0 or more, or CPUs with AVX512-BF16 or AMX, "
        f"and this machine has {gpu} and a CPU without them",
    )


def announce(precision: str) -> HardwareSupport:
    """Log, once, when ``precision`` cannot be faster than float32 on this machine; return the finding."""
    support = hardware_support(precision)
    if not support.can_be_faster:
        slower = (" On a CPU it runs many times slower than float32 (docs/performance/training.md, section 12)."
                  if precision == "mixed_float16" and not tf.config.list_physical_devices("GPU") else "")
        log.warning("train.precision %s cannot be faster than float32 here: %s.%s Training runs anyway.",
                    precision, support.reason, slower)
    return support
