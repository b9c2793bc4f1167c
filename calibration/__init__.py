"""Calibration of the INT8 files: the sample data and the activation-range methods.

Sample data: photos.py, six photographs shipped beside this file (the default for image
inputs), turned into calibration and held-out views; samples.py plans the samples of every
input (-cind data too).

Range methods (--calibration_method): methods.py holds their table, ranges.py measures
ranges on the calibrated TFLite graph, ort.py with onnxruntime's calibrators on the ONNX
graph.

The package itself imports nothing: the CLI reads methods.py's table before it forks its
conversion (cli/supervisor.py), and the process that watches it should not hold numpy.
"""
