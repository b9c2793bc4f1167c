"""Generative models (issue 30): one .tflite with several signatures sharing one copy of the
weights (signatures.py), over a decoder whose KV cache has a fixed capacity
(passes/kv_cache.py)."""
