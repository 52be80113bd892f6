"""LeNet-5 (LeCun et al., 1998), for 28x28 digits or any images at least 12x12: an example of a builder (``model.builder: user_models.lenet:build``)."""

import tf_keras as keras


def build(input_shape: tuple[int, ...], classes: int) -> keras.Model:
    """Two convolutions with average pooling, then three dense layers; about 61k parameters."""
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Conv2D(6, 5, padding="same", activation="tanh"),
        keras.layers.AveragePooling2D(2),
        keras.layers.Conv2D(16, 5, activation="tanh"),
        keras.layers.AveragePooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(120, activation="tanh"),
        keras.layers.Dense(84, activation="tanh"),
        keras.layers.Dense(classes, activation="softmax"),
    ], name="lenet5")
