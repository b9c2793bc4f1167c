"""Exact ONNX rewrites before planning. prepare.py is the pass order (shape inference,
constant folding, control-flow inlining, then each rewrite in turn); every other module is
one pass with its own tests. Passes read and write ONNX protos only: they import the ir
layer, never the layout plan, the builder or TensorFlow."""
