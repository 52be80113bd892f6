"""Your own models, for ``model.kind: builder`` (``model.builder: user_models.MODULE:FUNCTION``).

dvc.yaml's train stages depend on this folder, so editing a builder here
reruns training. A builder takes the images' shape, ``(height, width,
channels)`` ((28, 28, 1) for MNIST), and the number of classes (10 for MNIST),
as the prepared data records them, and returns an uncompiled tf_keras model (``import tf_keras as
keras``: TensorFlow's own ``tf.keras`` is Keras 3 since TensorFlow 2.16) whose
output is the class probabilities. A Sequential is split at its layers by
model and pipeline parallelism; any other model trains under every
data-parallel strategy.
"""
