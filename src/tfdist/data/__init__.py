"""The digits: MNIST sources (sources), the prepared files every stage reads (prepared), the preprocess stage (stage).

No TensorFlow in this room: preprocessing, and reading prepared data, start in a blink.
"""
