"""Shared erf from TFLite builtins (TFLite has no ERF): Erf and the exact Gelu."""

from __future__ import annotations

from onnx2tf_alt.translate.lazy import tf

# erf(x) ~ x P(x^2) / Q(x^2) on [-4, 4] (|erf| rounds to 1 in float32 beyond): a rational
# least-squares/minimax fit made for this converter; max |error| 3.7e-7 evaluated in float32.
_ERF_P = (1.128378924, 0.1977264447, 0.05366001823, 0.004066301948, 0.0002893437433,
          1.962111229e-06)
_ERF_Q = (1.0, 0.5085611919, 0.1170847968, 0.01556976856, 0.001231361772, 3.741702153e-05)


def _horner(t, coefficients):
    result = t * coefficients[-1] + coefficients[-2]
    for c in reversed(coefficients[:-2]):
        result = result * t + c
    return result


def erf(x):
    """erf from builtins (TFLite has no ERF)."""
    x = tf.clip_by_value(x, -4.0, 4.0)
    t = x * x
    return x * _horner(t, _ERF_P) / _horner(t, _ERF_Q)
