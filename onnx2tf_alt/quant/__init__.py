"""Quantized .tflite files: the TFLite quantizer driven by the activation ranges calibration/
measures (quantize.py), the ONNX model prepared for it (prepare.py, weight_rounding.py), bias
correction (bias_correction.py), float fallbacks (sensitivity.py) and the accuracy check of
the quantized files (check.py)."""
