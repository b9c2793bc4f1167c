"""The command line: `onnx2tf-alt` (entry.py starts it, main.py runs it), its flags
(args.py), every onnx2tf flag and what we do with it (compat_flags.py), and the generated
documentation (docs.py, with schema_review.py's notes on each handler's ONNX schema
versions)."""
