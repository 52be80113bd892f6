"""TensorFlow's runtime as a process sets it up: a server loads TensorFlow without tf_keras, and tf_keras still loads."""

import subprocess
import sys

from helpers.project import REPO

SERVER_IMPORT = """
import sys
from tfdist.runtime import tensorflow_without_keras
tf = tensorflow_without_keras()
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("tf_keras", "pandas"))
print("after tensorflow:", loaded)
print("runs:", int(tf.constant(2) * 3))
import tf_keras
print("tf_keras then:", tf_keras.layers.Dense(1).__class__.__name__)
"""


def test_a_server_loads_tensorflow_without_tf_keras_which_stays_importable():
    result = subprocess.run([sys.executable, "-c", SERVER_IMPORT], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after tensorflow: []" in result.stdout, "neither tf_keras nor pandas (its data adapter's) is loaded"
    assert "runs: 6" in result.stdout
    assert "tf_keras then: Dense" in result.stdout
