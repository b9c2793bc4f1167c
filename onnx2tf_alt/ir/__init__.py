"""The ONNX model as the converter holds it: loading (loader.py), the light graph view every
later stage reads (graph.py), the index the rewrite passes share (index.py: producers,
consumers, declared shapes, constants), the weights (weights.py), validation of a prepared
model (validate.py) and the part of a model between named tensors (subgraph.py). Imports
nothing else of the package but errors.py, and never TensorFlow."""
