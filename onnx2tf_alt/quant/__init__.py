"""Quantized .tflite files: calibration ranges, the TFLite quantizer, float fallbacks
(sensitivity.py) and the accuracy check of the quantized files (check.py)."""
