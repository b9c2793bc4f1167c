"""TF's saved_model converter without its Python loads of the saved_model.

`tf.lite.TFLiteConverter.from_saved_model` loads the saved_model into Python objects to
list its signatures, and its `convert` imports the meta graph into a Python graph and loads
the saved_model once more for its debug info; then the MLIR converter reads the folder
itself, which is the only reading the conversion uses. The graph it wants for its
statistics and its quantization checks is the meta graph's `graph_def`, and the debug info
is the folder's own: both are read here from the protos, nothing is loaded. An unrolled
2-layer LSTM's float32 phase (4,400 ops): 3.78 s with the loads, 2.74 s without.

Only for folders whose debug info has no traces by name, where what TF's loader keeps of it
(its file list) is what is read; any other folder, or a TF whose converter lacks what this
reads, gets TF's own `from_saved_model`.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from contextlib import contextmanager

import tensorflow as tf

try:  # private to TF's converter: what its from_saved_model and convert use
    from tensorflow.core.framework.graph_debug_info_pb2 import GraphDebugInfo
    from tensorflow.lite.python import conversion_metadata_schema_py_generated as _metadata
    from tensorflow.lite.python import lite as _lite
    from tensorflow.lite.python.util import convert_debug_info_func, get_debug_info
    from tensorflow.python.saved_model.loader_impl import parse_saved_model_with_debug_info
except ImportError:  # pragma: no cover - another TF: its own route
    _lite = None

SERVE_TAGS = frozenset({"serve"})


def saved_model_converter(folder: str, signature_keys: list[str], functions: bool = False):
    """A TFLite converter for the saved_model in `folder` (the `serve` tag set) and its
    `signature_keys`: this module's when the folder and TF allow it, else TF's. `functions`:
    the folder holds concrete functions saved by `saved_functions`, which the file's
    conversion metadata records as TF's converter of concrete functions does."""
    converter_class = _reader_class()
    if converter_class is not None:
        proto, debug_info = parse_saved_model_with_debug_info(folder)
        graphs = [m.graph_def for m in proto.meta_graphs
                  if set(m.meta_info_def.tags) == SERVE_TAGS]
        if graphs and not debug_info.traces:
            types = _metadata.ModelType
            _lite.TFLiteConverterBase._set_original_model_type(
                types.TF_CONCRETE_FUNCTIONS if functions else types.TF_SAVED_MODEL)
            converter = converter_class(folder, set(SERVE_TAGS), list(signature_keys))
            if converter.saved_model_dir:  # else TF would convert the loaded functions
                # what TF's loader makes of it (load.py: adjust_debug_info_func_names)
                converter.read = (graphs[0], GraphDebugInfo(files=debug_info.files))
                return converter
    return tf.lite.TFLiteConverter.from_saved_model(folder, signature_keys)


@contextmanager
def saved_functions(functions: list, holder):
    """The concrete `functions` of `holder` saved into a temporary folder as TF's
    converter saves them before converting them (`serving_default` for one function, else
    each function's name), without their debug info: (folder, signature keys)."""
    if len(functions) == 1:
        signatures = {"serving_default": functions[0]}
    else:
        signatures = {function.graph.name: function for function in functions}
    folder = tempfile.mkdtemp(prefix=".onnx2tf_alt_functions_")
    try:
        tf.saved_model.save(holder, folder, signatures=signatures)
        yield folder, list(signatures)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def _reader_class():
    """TFLiteSavedModelConverterV2 with a `convert` that reads instead of loading, or None
    where this TF's converter does not have the parts it calls."""
    base = getattr(_lite, "TFLiteSavedModelConverterV2", None) if _lite else None
    needed = ("_convert_from_saved_model", "_parse_saved_model_args",
              "_convert_and_export_metrics", "_set_original_model_type")
    if base is None or not all(hasattr(base, name) for name in needed):
        return None

    class SavedModelReader(base):
        """TF's converter of a saved_model folder whose `convert` takes the meta graph and
        the debug info read from the folder (`read`, set by saved_model_converter) instead
        of loading the saved_model twice."""

        read: tuple = ()

        def convert(self):
            return self._convert_and_export_metrics(SavedModelReader._convert)

        def _convert(self):
            graph_def, debug_info = self.read
            self._debug_info = get_debug_info(convert_debug_info_func(debug_info), graph_def)
            return self._convert_from_saved_model(graph_def)

    return SavedModelReader
