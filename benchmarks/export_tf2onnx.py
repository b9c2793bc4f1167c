"""Export Keras applications and layers with random weights (no download) to ONNX with
tf2onnx, the form TensorFlow users' models reach ONNX in: channel-last inputs, with the
Transposes tf2onnx writes around each channel-first op (in its own venv:
`pip install tensorflow tf_keras tf2onnx`). Usage:

    python benchmarks/export_tf2onnx.py OUT_DIR [mobilenet_v2 resnet50 ...]
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf2onnx reads tf_keras models

import numpy as np
import tensorflow as tf
import tf2onnx
import tf_keras as keras


def _lstm_tagger():
    inputs = keras.Input((50, 40), batch_size=1)
    x = keras.layers.Conv1D(64, 5, padding="same", activation="relu")(inputs)
    x = keras.layers.LSTM(64, return_sequences=True)(x)
    return keras.Model(inputs, keras.layers.Dense(12)(x))


def _unet_small():
    inputs = keras.Input((128, 128, 3), batch_size=1)
    a = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    b = keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(a)
    c = keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(b)
    u = keras.layers.UpSampling2D()(c)
    u = keras.layers.Concatenate()([u, b])
    u = keras.layers.Conv2DTranspose(16, 3, strides=2, padding="same", activation="relu")(u)
    u = keras.layers.Concatenate()([u, a])
    return keras.Model(inputs, keras.layers.Conv2D(2, 1, activation="softmax")(u))


ZOO = {
    "tf_mobilenet_v2": lambda: keras.applications.MobileNetV2(weights=None),
    "tf_mobilenet_v3_small": lambda: keras.applications.MobileNetV3Small(weights=None),
    "tf_resnet50": lambda: keras.applications.ResNet50(weights=None),
    "tf_efficientnet_b0": lambda: keras.applications.EfficientNetB0(weights=None),
    "tf_densenet121": lambda: keras.applications.DenseNet121(weights=None),
    "tf_unet_small": _unet_small,
    "tf_lstm_tagger": _lstm_tagger,
}


def export(name: str, out_dir: str) -> str:
    keras.utils.set_random_seed(0)
    model = ZOO[name]()
    for layer in model.layers:  # non-trivial BatchNorm statistics
        if isinstance(layer, keras.layers.BatchNormalization):
            mean, var = layer.moving_mean, layer.moving_variance
            mean.assign(np.random.uniform(-0.1, 0.1, mean.shape).astype(np.float32))
            var.assign(np.random.uniform(0.5, 1.5, var.shape).astype(np.float32))
    shape = [1, *model.inputs[0].shape[1:]]
    spec = (tf.TensorSpec(shape, tf.float32, name="input"),)
    path = os.path.join(out_dir, f"{name}.onnx")
    tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=path)
    return path


if __name__ == "__main__":
    from export_main import run

    run(__doc__, export, ZOO, keep_going=True)
