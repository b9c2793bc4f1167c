"""The one custom Keras layer of converted models: constants kept as layer weights.

Large ONNX initializers (conv kernels, embedding tables, ...) become the weights of a
`ConstantWeights` layer instead of literals inside op configs, so .h5 and .keras files
store them as binary weights and their JSON configs stay small. The class is registered
as serializable: importing onnx2tf_alt is all `tf_keras.models.load_model` needs.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf
import tf_keras

from onnx2tf_alt.ir.weights import release

# {id(layer): a graph tensor} while tracing a function that takes some layers' values as
# inputs (tflite/late_weights.py); empty otherwise.
LATE_VALUES: dict[int, object] = {}


@tf_keras.saving.register_keras_serializable(package="onnx2tf_alt")
class ConstantWeights(tf_keras.layers.Layer):
    """Holds one constant tensor as a non-trainable weight and returns it when called.

    It is called on a model input only to anchor it in the functional graph; the input's
    value is ignored.
    """

    def __init__(self, value_shape, value_dtype, initial: np.ndarray | None = None, **kwargs):
        super().__init__(**kwargs)
        self.value_shape = tuple(int(d) for d in value_shape)
        self.value_dtype = str(value_dtype)
        # made from `initial` directly: zeros then an assignment held both for a while
        # (reloading a saved model passes no `initial`: its weights are loaded after)
        self.value = self.add_weight(
            name="value",
            shape=self.value_shape,
            dtype=self.value_dtype,
            trainable=False,
            initializer="zeros" if initial is None else (lambda shape, dtype=None: initial),
        )

    def call(self, anchor):
        late = LATE_VALUES.get(id(self))
        return tf.identity(self.value if late is None else late)

    def get_config(self):
        config = super().get_config()
        config.update(value_shape=list(self.value_shape), value_dtype=self.value_dtype)
        return config


def constant_weights(array: np.ndarray, anchor, name: str | None = None):
    """A KerasTensor whose value is `array`, stored as a layer weight (inside
    `shared_constant_weights`, the layer of an equal array made before, if any)."""
    key = None
    if _SHARED is not None:
        sample = array.reshape(-1)[:: max(1, array.size // 4096)]
        key = (array.shape, array.dtype.str, sample.tobytes())
        for layer in _SHARED.get(key, []):
            if np.array_equal(weight_view(layer.value), array):
                release(array)
                return layer(anchor)
    layer = ConstantWeights(array.shape, array.dtype.name, initial=array, name=name)
    release(array)  # the layer holds its own copy now
    if key is not None:
        _SHARED.setdefault(key, []).append(layer)
    return layer(anchor)


_SHARED: dict | None = None  # content key -> ConstantWeights, inside shared_constant_weights


@contextlib.contextmanager
def shared_constant_weights():
    """Within it, models built one after another share one ConstantWeights layer (one
    variable) for equal constants: the models of a file's several signatures
    (generative/signatures.py) then hold the weights once, not once per signature."""
    global _SHARED
    _SHARED = {}
    try:
        yield
    finally:
        _SHARED = None


def weight_view(variable) -> np.ndarray:
    """A read-only view of a variable's memory: `numpy()` would copy it (a Keras variable
    read by a tf.function is copy-on-read)."""
    value = variable.value()
    view = value._numpy() if hasattr(value, "_numpy") else value.numpy()
    view = view.view()
    view.flags.writeable = False
    return view
