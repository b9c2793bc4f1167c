"""A model past protobuf's and flatbuffers' 2 GB (issue 29): 2.25 GiB of external-data
weights, generated on the fly, convert without the weights ever being in a proto; the float32
.tflite keeps its weights after the flatbuffer (Buffer.offset/size) and matches onnxruntime;
its float16 file (1.1 GiB, one flatbuffer) too. Each file is deleted once checked, so the
test needs about 4.5 GB of disk at most."""

from __future__ import annotations

import os

import numpy as np
import onnx
from ai_edge_litert.interpreter import Interpreter, OpResolverType
from onnx import helper

from harness import assert_close

VOCAB, WIDTH, WIDE, NARROW = 262144, 1024, 262144, 65536  # 1 + 1 + 0.25 GiB of float32
CHUNK = 1 << 24  # elements written at a time


def _external(folder: str, name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    """A float32 initializer stored in `<name>.bin`: small integers / 64, written in chunks."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    with open(os.path.join(folder, f"{name}.bin"), "wb") as f:
        for start in range(0, size, CHUNK):
            chunk = rng.integers(-64, 65, min(CHUNK, size - start), dtype=np.int8)
            f.write((chunk.astype(np.float32) / 64).tobytes())
    tensor = onnx.TensorProto()
    tensor.name, tensor.data_type = name, onnx.TensorProto.FLOAT
    tensor.dims.extend(shape)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", f"{name}.bin"), ("offset", "0"), ("length", str(size * 4))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _model(folder: str) -> str:
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["x"]),
        helper.make_node("MatMul", ["x", "wide"], ["logits"]),
        helper.make_node("MatMul", ["x", "narrow"], ["features"]),
    ]
    graph = helper.make_graph(
        nodes, "large",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [2, 5, WIDE]),
         helper.make_tensor_value_info("features", onnx.TensorProto.FLOAT, [2, 5, NARROW])],
        [_external(folder, "table", (VOCAB, WIDTH), 1), _external(folder, "wide", (WIDTH, WIDE), 2),
         _external(folder, "narrow", (WIDTH, NARROW), 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = os.path.join(folder, "large.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def _run(path: str, ids: np.ndarray) -> dict[str, np.ndarray]:
    # reference kernels: XNNPACK would pack a second copy of the weights
    interpreter = Interpreter(
        model_path=path,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    return interpreter.get_signature_runner()(ids=ids)


def test_weights_past_2_gb_convert_and_match_onnxruntime(tmp_path):
    import onnxruntime as ort

    from onnx2tf_alt.export.float16 import float16_model
    from onnx2tf_alt.pipeline import build
    from onnx2tf_alt.tflite.flatbuffer import read_model
    from onnx2tf_alt.tflite.lowering import late_bound

    source = _model(str(tmp_path))
    ids = np.array([[0, 5, VOCAB - 1, 77, 1000], [3, 3, 123456, 9, 200000]], np.int64)
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    logits, features = session.run(None, {"ids": ids})
    del session

    converted = build(source)
    bound = late_bound(converted.tflite_result())
    assert bound is not None and bound.weight_bytes > 2**31
    path = str(tmp_path / "large_float32.tflite")
    bound.write(path)
    with open(path, "rb") as f:
        head = f.read(64 << 20)
    flat = read_model(head)
    offsets = [flat.Buffers(i).Offset() for i in range(flat.BuffersLength())]
    assert sum(o > 1 for o in offsets) == 3 and os.path.getsize(path) > 2**31
    outputs = _run(path, ids.astype(np.int32) if _int32_ids(path) else ids)
    got = {k: outputs[k] for k in outputs}
    assert_close(got[_key(got, WIDE)], logits, 1e-5, "float32 logits")
    assert_close(got[_key(got, NARROW)], features, 1e-5, "float32 features")
    os.remove(path)

    assert float16_model(bound.model)
    half = str(tmp_path / "large_float16.tflite")
    bound.write(half)
    assert os.path.getsize(half) < 2**31
    outputs = _run(half, ids.astype(np.int32) if _int32_ids(half) else ids)
    assert_close(outputs[_key(outputs, WIDE)], logits, 1e-2, "float16 logits")
    os.remove(half)


def _int32_ids(path: str) -> bool:
    interpreter = Interpreter(
        model_path=path,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    (detail,) = interpreter.get_signature_runner().get_input_details().values()
    return detail["dtype"] == np.int32


def _key(outputs: dict, width: int) -> str:
    return next(k for k, v in outputs.items() if v.shape[-1] == width)
