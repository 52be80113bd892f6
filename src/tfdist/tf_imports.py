"""TensorFlow and Keras as tfdist uses them: ``from tfdist.tf_imports import keras, tf``.

tfdist uses tf_keras (the Keras 2 API): with Keras 3, MultiWorkerMirrored +
``fit``, CentralStorage with Dropout and ParameterServer training all fail in
TF 2.21. The package ``__init__`` has already set ``TF_USE_LEGACY_KERAS`` so
that ``tf.keras`` (which MLflow's flavor uses) is tf_keras too.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

__all__ = ["keras", "tf"]
