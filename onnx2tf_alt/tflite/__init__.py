"""TFLite: the Keras model lowered to a .tflite in memory (lowering.py), the flatbuffer read,
edited and written in one place (flatbuffer.py), edits of it (names.py: -coion,
shared_weights.py), and running a .tflite's signature (run.py)."""
