"""ONNX nodes to TensorFlow ops: the handler registry (registry.py), what a handler sees
(context.py), the builder that walks the planned graph and emits a tf_keras Model
(builder.py), the conversion options handlers read (options.py), and the model's I/O layout
record (io_layout.py)."""
