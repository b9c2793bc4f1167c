"""The model's weights as the rest of the converter sees them.

A model's large tensors stay where the exporter put them. The loader (`keep_on_disk`) reads
external tensors of up to INFERENCE_VALUE_LIMIT elements into the model (they may be shape
data) and leaves every larger one on disk, its `location` rewritten relative to the
filesystem root so that the model proto alone says where each tensor lives, whatever copies
of it the passes make. `to_array` memory-maps such a tensor (no copy: pages are read when
touched and belong to the page cache), so no stage holds the model's weights twice and no
proto ever carries them: nothing here is bound by protobuf's 2 GB limit. onnxruntime
resolves the same locations with `ort_options`.

Shape inference and validation run on a weight-free copy of the model: ONNX's inference
serializes the whole model on every call, and a model past 2 GB cannot be serialized at all.
"""

from __future__ import annotations

import atexit
import mmap
import os
import tempfile

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

# Initializers above this many elements are weights, never shape data: shape inference runs
# on a copy of the model that declares them as typed inputs instead of carrying their values
# (ONNX's inference serializes the whole model on every call).
INFERENCE_VALUE_LIMIT = 4096

# External locations are kept relative to this folder (see the module docstring).
FILESYSTEM_ROOT = os.path.abspath(os.sep)

# Inline weights of at least this many bytes in all are moved to a temporary file (`spill`).
SPILL_BYTES = 64 << 20
SPILL_ONE = 16 << 20  # a weight a pass makes goes to a temporary file from this size (add_spilled)
SPILLED: list[str] = []  # the files `spill` wrote, removed by remove_spilled

# Element types whose external bytes are the little-endian array itself (memory-mappable);
# the others (strings, 4-bit and 8-bit floats, bfloat16) are read with onnx's own decoder.
RAW_TYPES = {
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
    onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
    onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL,
    onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128,
}


def is_external(tensor: onnx.TensorProto) -> bool:
    return external_data_helper.uses_external_data(tensor)


def keep_on_disk(model: onnx.ModelProto, folder: str) -> int:
    """Read `model`'s small external tensors into it and point the large ones at their
    files by a location relative to FILESYSTEM_ROOT (`folder`: the model file's folder,
    which the locations are relative to). Returns the bytes left on disk."""
    on_disk = 0
    for tensor in external_data_helper._get_all_tensors(model):
        if not is_external(tensor):
            continue
        elements = int(np.prod(tensor.dims, dtype=np.int64))
        if elements <= INFERENCE_VALUE_LIMIT:
            external_data_helper.load_external_data_for_tensor(tensor, folder)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        path = os.path.normpath(os.path.join(folder, info.location))
        entry = next(e for e in tensor.external_data if e.key == "location")
        entry.value = os.path.relpath(path, FILESYSTEM_ROOT)
        on_disk += info.length or os.path.getsize(path)
    return on_disk


def spill(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """`model` with its large inline initializers (over INFERENCE_VALUE_LIMIT elements) moved
    into a temporary file and read from there like external data, when they come to
    SPILL_BYTES or more; else `model` itself. Returns the model and the bytes moved.

    A model given as a proto (or a file's weights that ir/in_place.py does not leave in the
    file: those under 64 KB each, typed fields) carries its weights in the proto; the
    graph's arrays and the Keras model would each hold another copy (light_vgg19: 548 MB
    three times). Moved,
    they are read through memory maps whose pages the Keras model's copy drops
    (`release`). The proto is parsed anew without them, which frees protobuf's memory of
    the old one. The file is removed at the end of a conversion (conversion.convert) or at exit."""
    large = [t for t in model.graph.initializer
             if not is_external(t) and t.data_type in RAW_TYPES
             and int(np.prod(t.dims, dtype=np.int64)) > INFERENCE_VALUE_LIMIT]
    total = sum(tensor_bytes(t) for t in large)
    if total < SPILL_BYTES:
        return model, 0
    _write_spilled((tensor, numpy_helper.to_array(tensor)) for tensor in large)
    fresh = onnx.ModelProto()
    fresh.ParseFromString(model.SerializeToString())
    return fresh, total


def add_spilled(container, name: str, array: np.ndarray,
                data_type: int | None = None) -> onnx.TensorProto:
    """A new initializer `name` in `container` (a GraphProto's `initializer` field) holding
    `array` (its bytes, of `data_type` when given): kept in a temporary file as `spill`
    keeps weights when it comes to SPILL_ONE bytes, else in the proto. A pass that makes a
    large weight (dense_flatten.py: a VGG's 400 MB permuted FC weight; a folded constant)
    puts it there directly: in the proto it would stay in the model's memory for the whole
    conversion, as protobuf frees a message's memory only with the message, which the
    callers of the passes hold."""
    tensor = container.add()
    if data_type is None and (array.nbytes < SPILL_ONE or array.dtype.kind not in "biufc"):
        tensor.CopyFrom(numpy_helper.from_array(array, name))
        return tensor
    tensor.name = name
    tensor.data_type = (helper.np_dtype_to_tensor_dtype(array.dtype) if data_type is None
                        else data_type)
    tensor.dims.extend(array.shape)
    if array.nbytes >= SPILL_ONE and tensor.data_type in RAW_TYPES:
        _write_spilled([(tensor, array)])
    else:
        tensor.raw_data = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
    return tensor


def _write_spilled(pairs) -> None:
    """Each (tensor, its value) of `pairs` (an iterable, read one at a time) moved into one
    new temporary file and pointed at it as external data."""
    handle, path = tempfile.mkstemp(prefix=".onnx2tf_alt_weights_", suffix=".bin")
    SPILLED.append(path)
    location = os.path.relpath(path, FILESYSTEM_ROOT)
    try:
        with os.fdopen(handle, "wb") as f:
            for tensor, data in pairs:
                offset = -(-f.tell() // 64) * 64
                f.seek(offset)
                f.write(memoryview(np.ascontiguousarray(
                    data, data.dtype.newbyteorder("<"))).cast("B"))
                for field in ("raw_data", "float_data", "int32_data", "int64_data",
                              "double_data", "uint64_data"):
                    tensor.ClearField(field)
                tensor.data_location = onnx.TensorProto.EXTERNAL
                del tensor.external_data[:]
                for key, value in (("location", location), ("offset", str(offset)),
                                   ("length", str(data.nbytes))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
    except OSError:
        remove_spilled_file(path)
        raise


def remove_spilled() -> None:
    """Removes every file `spill` wrote (at exit)."""
    while SPILLED:
        remove_spilled_file(SPILLED[-1])


def remove_spilled_file(path: str) -> None:
    """Removes one file `spill` wrote; memory maps of it stay valid until closed."""
    if path in SPILLED:
        SPILLED.remove(path)
    if os.path.exists(path):
        os.remove(path)


def initializer_bytes(model: onnx.ModelProto) -> int:
    """The bytes of `model`'s initializers, inline or kept on disk."""
    return sum(tensor_bytes(t) for t in model.graph.initializer)


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    size = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * size


def to_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The tensor's value: a read-only memory map for a tensor kept on disk, else decoded
    from the proto (numpy_helper.to_array)."""
    if not is_external(tensor):
        return numpy_helper.to_array(tensor)
    if tensor.data_type not in RAW_TYPES:
        return numpy_helper.to_array(tensor, FILESYSTEM_ROOT)
    info = external_data_helper.ExternalDataInfo(tensor)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    shape = tuple(int(d) for d in tensor.dims)
    if int(np.prod(shape, dtype=np.int64)) == 0:
        return np.zeros(shape, dtype)
    path = os.path.join(FILESYSTEM_ROOT, info.location)
    return np.memmap(path, dtype=dtype, mode="r", offset=info.offset or 0, shape=shape)


def release(array: np.ndarray) -> None:
    """Drop the resident pages of a tensor kept on disk once its value has been copied
    elsewhere (into a TF variable): the file stays mapped, and a later read pages it in
    again. Without this a model's weights would count twice in the converter's memory."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        base.madvise(mmap.MADV_DONTNEED)


def ort_options(options=None):
    """onnxruntime SessionOptions (given or new) that find the tensors kept on disk."""
    import onnxruntime as ort

    options = options or ort.SessionOptions()
    options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", FILESYSTEM_ROOT)
    return options


def with_weights_inline(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` holding every tensor kept on disk in the proto, for a tool that
    reads a model file of its own (onnxruntime's calibrators): saved elsewhere, the kept
    locations would not be found. Costs the weights once in memory."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in external_data_helper._get_all_tensors(copy):
        if is_external(tensor):
            external_data_helper.load_external_data_for_tensor(tensor, FILESYSTEM_ROOT)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    return copy


def weight_free_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its large initializers turned into graph inputs of the same type."""
    light = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, field, getattr(model, field))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph, copy = model.graph, light.graph
    copy.name = graph.name
    copy.node.extend(graph.node)
    copy.input.extend(graph.input)
    copy.output.extend(graph.output)
    copy.value_info.extend(graph.value_info)
    copy.sparse_initializer.extend(graph.sparse_initializer)
    declared = {i.name for i in graph.input}
    for init in graph.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= INFERENCE_VALUE_LIMIT:
            copy.initializer.append(init)
        elif init.name not in declared:
            copy.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                            list(init.dims)))
    return light


atexit.register(remove_spilled)
