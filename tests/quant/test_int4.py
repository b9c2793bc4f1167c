"""Int4 blockwise FULLY_CONNECTED weights (onnx2tf_alt/quant/int4.py): the file holds INT4
codes with float16 block scales, XNNPACK takes the product, and both TFLite kernels compute
exactly the product with the weights as this test decodes them from the file; the weights
cost about half the int8 file's; a fused activation survives the builtin kernel; weights
that do not qualify stay float for dynamic_range_model.

Both kernels quantize the activations to int8 per row at run time. Inputs on that int8 grid
(integers times a step, each row spanning -128..127) are quantized exactly, so the output must
equal the product with the decoded weights up to float rounding; on normal inputs the
activation rounding costs ~0.7% of the largest output (measured 0.63% and 0.74% here), and
the 4-bit weights ~10% relative RMS against the float model (cosine ~0.995).
"""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter, OpResolverType
from onnx import helper

from onnx2tf_alt.quant.int4 import int4_blockwise_model
from onnx2tf_alt.quant.weight_only import dynamic_range_model
from onnx2tf_alt.tflite.flatbuffer import op_name, schema, unpack_model
from onnx2tf_alt.tflite.lowering import late_bound
from onnx2tf_alt.tflite.run import run_signature

from harness import Rng, convert, make_model, ort_run, to_logical, to_physical

rng = Rng(7)
ACTIVATION_TOL = 0.02  # of max|output|: run-time int8 activations (measured <= 0.0074)
BUILTIN = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES


def _matmul(x_shape, w_shape, relu: bool = False, second=None):
    """x @ w (then Relu; then @ `second` if given), with weights scaled to unit outputs."""
    x = rng.randn(*x_shape)
    initializers = {"w": (rng.randn(*w_shape) / np.sqrt(w_shape[0])).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m" if relu or second else "y"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["m"], ["r" if second else "y"]))
    if second is not None:
        initializers["w2"] = (rng.randn(*second) / np.sqrt(second[0])).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["r" if relu else "m", "w2"], ["y"]))
    model = make_model(nodes, {"x": x}, ["y"], initializers)
    return model, x


def _bound(model):
    bound = late_bound(convert(model).tflite_result())
    assert bound is not None
    return bound


def _run(converted, content: bytes, x: np.ndarray, builtin: bool = False):
    """The output, and the interpreter (its ops) after the run."""
    kwargs = {"experimental_op_resolver_type": BUILTIN} if builtin else {}
    interpreter = Interpreter(model_content=content, num_threads=1, **kwargs)
    outputs = run_signature(interpreter, to_physical(converted, {"x": x}))
    return to_logical(converted, outputs)[0], interpreter


def _decoded_weights(content: bytes) -> dict[bytes, np.ndarray]:
    """Each INT4 weight of the file as float32, decoded here from its bytes."""
    model = unpack_model(content)
    subgraph = model.subgraphs[0]
    weights = {}
    for tensor in subgraph.tensors:
        if tensor.type != schema.TensorType.INT4:
            continue
        details = tensor.quantization.details
        scale_tensor = subgraph.tensors[details.scales]
        assert scale_tensor.type == schema.TensorType.FLOAT16
        scales = np.frombuffer(bytes(model.buffers[scale_tensor.buffer].data), "<f2")
        scales = scales.astype(np.float32).reshape(tuple(scale_tensor.shape))
        assert np.all(scales > 0)  # XNNPACK refuses a negative scale
        packed = np.asarray(model.buffers[tensor.buffer].data, np.uint8)
        nibbles = np.stack([packed & 0x0F, packed >> 4], axis=-1).astype(np.int8)
        codes = np.where(nibbles > 7, nibbles - 16, nibbles).reshape(tuple(tensor.shape))
        rows, width = codes.shape
        blocks = codes.reshape(rows, width // details.blockSize, details.blockSize)
        weights[tensor.name] = (blocks * scales[..., None]).reshape(rows, width)
    return weights


def _on_int8_grid(shape) -> np.ndarray:
    """Inputs that run-time int8 quantization per row reproduces exactly."""
    grid = rng.integers(-128, 128, shape).astype(np.float32)
    grid[..., 0], grid[..., 1] = -128, 127
    return grid * np.float32(0.01)


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("x_shape,w_shape", [((3, 5, 256), (256, 96)), ((2, 384), (384, 160))],
                         ids=["3x5x256@256x96", "2x384@384x160"])
def test_int4_product(x_shape, w_shape):
    model, x = _matmul(x_shape, w_shape)
    converted = convert(model)
    bound = late_bound(converted.tflite_result())
    assert int4_blockwise_model(bound.model) == 1
    content = bound.to_bytes()
    (weight,) = _decoded_weights(content).values()
    assert weight.shape == (w_shape[1], w_shape[0])
    grid = _on_int8_grid(x_shape)
    for builtin in (False, True):
        actual, interpreter = _run(converted, content, grid, builtin)
        expected = grid @ weight.T
        assert np.abs(actual - expected).max() <= 1e-5 * np.abs(expected).max()
        actual, _ = _run(converted, content, x, builtin)
        expected = x @ weight.T
        assert np.abs(actual - expected).max() <= ACTIVATION_TOL * np.abs(expected).max()
        if not builtin:  # XNNPACK took the product: its node reads the int4 weight
            ops = interpreter._get_ops_details()
            product = next(op for op in ops if op["op_name"] == "FULLY_CONNECTED")
            delegated = [op for op in ops if op["op_name"] == "DELEGATE"]
            assert any(product["inputs"][1] in op["inputs"] for op in delegated)
    (reference,) = ort_run(model, {"x": x})
    assert _cosine(actual, reference) > 0.99


def test_weights_are_about_half_the_int8_files():
    model, _ = _matmul((2, 1024), (1024, 512))
    float_file = _bound(model).to_bytes()
    int8 = _bound(model)
    assert dynamic_range_model(int8.model) == 1
    int4 = _bound(model)
    assert int4_blockwise_model(int4.model) == 1
    int8_file, int4_file = int8.to_bytes(), int4.to_bytes()
    overhead = len(float_file) - 4 * 1024 * 512
    weight_ratio = (len(int4_file) - overhead) / (len(int8_file) - overhead)
    assert 0.5 < weight_ratio < 0.6  # codes 1/2, float16 scales 1/16 of the int8 bytes


def test_fused_activation_becomes_an_op():
    """TF's converter fuses the Relu into the product; the builtin blockwise kernel would
    drop it, so it is its own op after the int4 product."""
    model, _ = _matmul((2, 4, 256), (256, 128), relu=True)
    converted = convert(model)
    bound = late_bound(converted.tflite_result())
    (product,) = bound.model.subgraphs[0].operators
    assert product.builtinOptions.fusedActivationFunction == schema.ActivationFunctionType.RELU
    assert int4_blockwise_model(bound.model) == 1
    content = bound.to_bytes()
    names = [op_name(bound.model, op) for op in bound.model.subgraphs[0].operators]
    assert names == ["FULLY_CONNECTED", "RELU"]
    (weight,) = _decoded_weights(content).values()
    grid = _on_int8_grid((2, 4, 256))
    for builtin in (False, True):
        actual, _ = _run(converted, content, grid, builtin)
        expected = np.maximum(grid @ weight.T, 0)
        assert np.abs(actual - expected).max() <= 1e-5 * np.abs(expected).max()


def test_other_weights_stay_float_for_dynamic_range():
    """K = 200 is no multiple of the block: that weight stays float, and dynamic_range_model
    run afterwards makes it int8 (the int4 weight's scales survive its renumbering)."""
    model, x = _matmul((2, 256), (256, 200), second=(200, 96))
    converted = convert(model)
    bound = late_bound(converted.tflite_result())
    assert int4_blockwise_model(bound.model) == 1
    assert dynamic_range_model(bound.model) == 1
    content = bound.to_bytes()
    types = {tensor.type for tensor in unpack_model(content).subgraphs[0].tensors}
    assert {schema.TensorType.INT4, schema.TensorType.INT8} <= types
    (reference,) = ort_run(model, {"x": x})
    for builtin in (False, True):
        actual, _ = _run(converted, content, x, builtin)
        assert _cosine(actual, reference) > 0.99


def test_block_size_must_suit_xnnpack():
    model, _ = _matmul((2, 256), (256, 96))
    with pytest.raises(ValueError, match="multiple of 32"):
        int4_blockwise_model(_bound(model).model, block_size=16)


def test_cli_flag_writes_the_int4_file_beside_the_others(tmp_path):
    """-oi4 (convert's output_int4_weight_quantized_tflite): `<stem>_int4_weight_quant.tflite`
    with INT4 weights, listed in the manifest, close to onnxruntime."""
    import json

    import onnx

    from onnx2tf_alt import convert

    model, x = _matmul((2, 3, 256), (256, 96))
    feeds = {"x": x}
    source = str(tmp_path / "mm.onnx")
    onnx.save(model, source)
    convert(source, output_folder_path=str(tmp_path / "out"),
            output_int4_weight_quantized_tflite=True, disable_model_save=True, non_verbose=True)
    path = tmp_path / "out" / "mm_int4_weight_quant.tflite"
    flat = unpack_model(path.read_bytes())
    types = {t.type for g in flat.subgraphs for t in g.tensors}
    assert schema.TensorType.INT4 in types
    (want,) = ort_run(model, feeds)
    runner = Interpreter(model_path=str(path)).get_signature_runner()
    (got,) = runner(**feeds).values()
    cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cosine > 0.99
    manifest = json.loads((tmp_path / "out" / "mm_manifest.json").read_text())
    assert "mm_int4_weight_quant.tflite" in json.dumps(manifest)


def test_weights_already_4_bit_keep_their_codes():
    """Weights dequantized from onnxruntime's symmetric 4-bit blocks ((code - 8) x scale, the
    largest magnitude at code 0): a positive scale's block comes back exactly; a negative
    scale's (positive scales only here) exactly but for its +8 extreme, clipped to 7."""
    k, n, block = 256, 96, 32
    codes = rng.integers(1, 16, (n, k // block, block))
    codes[..., 0] = 0  # the block's extreme: -8 x scale
    signs = np.where(np.arange(n * k // block).reshape(n, -1) % 3 == 0, -1.0, 1.0)
    scales = signs * 2.0 ** -6 * (1 + rng.integers(0, 8, signs.shape) / 8)  # bfloat16-exact
    weight = ((codes - 8) * scales[..., None]).reshape(n, k).astype(np.float32)
    x = rng.randn(2, 3, k)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x}, ["y"],
                       {"w": np.ascontiguousarray(weight.T)})
    bound = _bound(model)
    assert int4_blockwise_model(bound.model) == 1
    (decoded,) = _decoded_weights(bound.to_bytes()).values()
    expected = weight.reshape(n, k // block, block).copy()
    expected[..., 0] = np.where(signs < 0, 7 * -scales, expected[..., 0])
    np.testing.assert_array_equal(decoded.reshape(expected.shape), expected)
