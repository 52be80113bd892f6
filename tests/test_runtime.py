"""TensorFlow's runtime as a process sets it up: oneDNN as runtime.onednn says; a server loads TensorFlow without tf_keras."""

import ctypes.util
import os
import subprocess
import sys

import pytest

from tfdist.config.knobs import ALLOCATORS
from tfdist.errors import InputError
from tfdist.runtime import loading
from tfdist.runtime import threads as threads_module
from tfdist.runtime.allocator import ALLOCATOR_LIBRARIES, allocator_library
from tfdist.runtime.onednn import onednn_enabled
from tfdist.runtime.threads import SERVER_MIN_INTER_OP_THREADS, server_config

from helpers.project import REPO, tiny_params

SERVER_IMPORT = """
import sys
from tfdist.runtime.loading import tensorflow_without_keras
tf = tensorflow_without_keras()
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("tf_keras", "pandas"))
print("after tensorflow:", loaded)
print("runs:", int(tf.constant(2) * 3))
import tf_keras
print("tf_keras then:", tf_keras.layers.Dense(1).__class__.__name__)
"""


def test_once_tensorflow_is_loaded_either_import_is_it():
    import tensorflow

    assert loading.tensorflow() is tensorflow and loading.tensorflow_without_keras() is tensorflow


def test_a_server_loads_tensorflow_without_tf_keras_which_stays_importable():
    result = subprocess.run([sys.executable, "-c", SERVER_IMPORT], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after tensorflow: []" in result.stdout, "neither tf_keras nor pandas (its data adapter's) is loaded"
    assert "runs: 6" in result.stdout
    assert "tf_keras then: Dense" in result.stdout


ONEDNN = """
import logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from tfdist.config.params import load_config
from tfdist.runtime.threads import configure_runtime
config = load_config(sys.argv[1], [f"runtime.onednn={sys.argv[2]}"])
configure_runtime(config)
from tensorflow.python.util import _pywrap_util_port
print("oneDNN on:", _pywrap_util_port.IsMklEnabled())
configure_runtime(load_config(sys.argv[1], ["runtime.onednn=disabled" if sys.argv[2] == "enabled" else "runtime.onednn=enabled"]))
"""


@pytest.mark.parametrize(("setting", "environment", "on"),
                         [("enabled", "0", True), ("disabled", "1", False), ("tensorflow", "1", True),
                          ("auto", "1", False)])
def test_runtime_onednn_turns_tensorflows_onednn_on_or_off_before_it_loads(tmp_path, setting, environment, on):
    """``tensorflow`` keeps what the environment says; the others override it (``auto``: off for the MLP of the
    tiny params); once loaded, a change only warns."""
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": environment}
    result = subprocess.run([sys.executable, "-c", ONEDNN, str(tiny_params(tmp_path)), setting], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"oneDNN on: {on}" in result.stdout
    if setting != "tensorflow":
        assert "TensorFlow is already loaded with TF_ENABLE_ONEDNN_OPTS=" in result.stderr


def test_auto_onednn_is_off_for_the_mlp_and_on_for_other_models():
    assert onednn_enabled("auto", "mlp") is False
    assert onednn_enabled("auto", "cnn") is True and onednn_enabled("auto", "builder") is True
    assert onednn_enabled("disabled", "cnn") is False and onednn_enabled("enabled", "mlp") is True
    assert onednn_enabled("tensorflow", "cnn") is None


def test_auto_onednn_is_on_for_bfloat16_whatever_the_model():
    # without oneDNN TensorFlow's bfloat16 is emulated: the MLP ran 0.83-0.87x float32 on a CPU with AVX512-BF16
    assert onednn_enabled("auto", "mlp", "mixed_bfloat16") is True
    assert onednn_enabled("auto", "mlp", "mixed_float16") is False
    assert onednn_enabled("disabled", "mlp", "mixed_bfloat16") is False


def test_allocator_auto_takes_jemalloc_then_tcmalloc_then_glibcs_for_the_mlp_glibcs_for_the_convnet(monkeypatch):
    installed: set[str] = set()
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: f"lib{name}.so.4" if name in installed else None)
    assert allocator_library("auto", "mlp") == ("system", None), "nothing installed: glibc's malloc, no error"
    assert allocator_library("system", "mlp") == ("system", None)
    with pytest.raises(InputError, match="runtime.allocator jemalloc: libjemalloc is not installed here; "
                                         "install Debian's libjemalloc2"):
        allocator_library("jemalloc", "mlp")
    installed.add("tcmalloc_minimal")
    assert allocator_library("auto", "mlp") == ("tcmalloc", "libtcmalloc_minimal.so.4")
    installed.add("jemalloc")
    assert allocator_library("auto", "mlp") == ("jemalloc", "libjemalloc.so.4")
    assert allocator_library("system", "mlp") == ("system", None), "system means glibc's even where others are installed"
    assert allocator_library("auto", "cnn") == ("system", None), "auto keeps glibc's for the convnet (slower under jemalloc)"
    assert allocator_library("jemalloc", "cnn") == ("jemalloc", "libjemalloc.so.4"), "named, it is preloaded for any kind"


IN_USE = "from tfdist.runtime.allocator import allocator_in_use; print(allocator_in_use())"


def test_the_allocator_in_use_is_read_from_the_process_itself():
    found = subprocess.run([sys.executable, "-c", IN_USE],
                           capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    assert found.stdout.strip() == "system", found.stderr
    name, library = allocator_library("auto", "mlp")
    if library is None:
        pytest.skip("no jemalloc or tcmalloc installed here (make install installs Debian's libjemalloc2)")
    preloaded = subprocess.run([sys.executable, "-c", IN_USE],
                               capture_output=True, text=True, env={**os.environ, "LD_PRELOAD": library})
    assert preloaded.stdout.strip() == name, preloaded.stderr


@pytest.mark.parametrize(("cpus", "threads"), [([3], SERVER_MIN_INTER_OP_THREADS), (list(range(6)), 6)])
def test_a_server_pinned_to_one_cpu_still_gets_two_inter_op_threads_and_the_runtime_intra_op_ones(monkeypatch, cpus, threads):
    # One thread hung a parameter_server worker pinned to a CPU (tests/cluster/test_multi_process.py runs it pinned).
    monkeypatch.setattr(threads_module, "usable_cpus", lambda: cpus)
    config = server_config(1)
    assert config.inter_op_parallelism_threads == threads
    assert config.intra_op_parallelism_threads == 1, "runtime.intra_op_threads, which a server's pools ignored before"


def test_every_allocator_params_yaml_offers_is_one_runtime_can_preload_and_no_other():
    assert set(ALLOCATORS) - {"auto", "system"} == set(ALLOCATOR_LIBRARIES)
