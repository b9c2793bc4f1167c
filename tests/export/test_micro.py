"""--target micro (onnx2tf_alt/export/micro.py): the full-integer file runs on TFLite Micro's
interpreter with the outputs of ai-edge-litert, its smallest tensor arena is measured, and a
model TFLite Micro cannot run is refused with exit 1 naming the ONNX node.

Quantized conversions take seconds, so each model is converted once per module.
"""

from __future__ import annotations

import json
import logging
import os
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("tflite_micro.python.tflite_micro.runtime",
                    reason="the tflite-micro package (TFLite Micro's interpreter) is not "
                           "installed: pip install -e .[test]")

from ai_edge_litert import schema_py_generated as schema

from onnx2tf_alt.api import convert
from onnx2tf_alt.cli.main import main
from onnx2tf_alt.errors import ConversionError, InputError
from onnx2tf_alt.export.micro import (
    MICRO_RESOLVER,
    MicroInterpreter,
    arena_warning,
    check_micro_shapes,
    smallest_arena,
)
from onnx2tf_alt.tflite.flatbuffer import OP_NAMES, pack_model

rng = np.random.default_rng(31)


@pytest.fixture(autouse=True)
def _weights_of_this_test(request):
    """Each test draws its model's weights from its own seed, whatever ran before it in
    this worker: with weights drawn from one module-wide generator, the models changed
    with the order -n 2 ran the tests in, and XNNPACK's rounding, 1 LSB from TFLite
    Micro's on most draws, compounded to 2 LSB at the softmax output on some."""
    global rng
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def weights(*shape: int, fan_in: int) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def bias(n: int) -> np.ndarray:
    return (rng.standard_normal(n) * 0.1).astype(np.float32)


def save_model(folder, name: str, nodes, inputs, output: tuple, initializers: dict,
               opset: int = 17) -> str:
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(output[0], TensorProto.FLOAT, output[1])],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = str(folder / f"{name}.onnx")
    onnx.save(model, path)
    return path


def conv_pool_cnn(folder) -> str:
    """Strided conv, depthwise conv, max pool, 1x1 conv, global pool, dense, softmax."""
    init = {"w1": weights(8, 3, 3, 3, fan_in=27), "b1": bias(8),
            "w2": weights(8, 1, 3, 3, fan_in=9), "b2": bias(8),
            "w3": weights(16, 8, 1, 1, fan_in=8), "b3": bias(16),
            "fc": weights(16, 10, fan_in=16), "fcb": bias(10)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2],
                         name="stem"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=8,
                         name="depthwise"),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w3", "b3"], ["c3"], name="pointwise"),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], name="classifier"),
        helper.make_node("Softmax", ["logits"], ["probs"]),
    ]
    return save_model(folder, "conv_pool", nodes, {"x": [1, 3, 32, 32]}, ("probs", [1, 10]),
                      init)


def dense_cnn(folder) -> str:
    """A LeNet-like grayscale classifier: conv, average pool, two dense layers, softmax."""
    init = {"w": weights(4, 1, 5, 5, fan_in=25), "b": bias(4),
            "fc1": weights(576, 32, fan_in=576), "fb1": bias(32),
            "fc2": weights(32, 10, fan_in=32), "fb2": bias(10)}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc1", "fb1"], ["h"], name="dense1"),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("Gemm", ["hr", "fc2", "fb2"], ["logits"], name="dense2"),
        helper.make_node("Softmax", ["logits"], ["probs"]),
    ]
    return save_model(folder, "dense", nodes, {"x": [1, 1, 28, 28]}, ("probs", [1, 10]), init)


def keyword_spotter(folder, time_steps: int | str = 49) -> str:
    """A keyword-spotting 1-D conv net on 10 MFCC coefficients x 49 frames: conv,
    depthwise conv, pointwise conv, global pool, 4 keywords."""
    init = {"w1": weights(16, 10, 3, fan_in=30), "b1": bias(16),
            "w2": weights(16, 1, 3, fan_in=3), "b2": bias(16),
            "w3": weights(16, 16, 1, fan_in=16), "b3": bias(16),
            "fc": weights(16, 4, fan_in=16), "fcb": bias(4)}
    nodes = [
        helper.make_node("Conv", ["mfcc", "w1", "b1"], ["c1"], pads=[1, 1], name="conv1d"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1], group=16,
                         name="depthwise1d"),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="pointwise1d"),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], name="keywords"),
        helper.make_node("Softmax", ["logits"], ["probs"]),
    ]
    return save_model(folder, "kws", nodes, {"mfcc": [1, 10, time_steps]}, ("probs", [1, 4]),
                      init)


def micro_report(out: str, stem: str) -> dict:
    with open(os.path.join(out, f"{stem}_micro.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """converted(stem): the output folder of that model converted with --target micro, once
    per module. The dense one also writes the accuracy report (its HTML page), the keyword
    spotter gets -coion."""
    folder = tmp_path_factory.mktemp("micro")
    outputs = {}

    def output(stem: str) -> str:
        global rng
        if stem in outputs:
            return outputs[stem]
        rng = np.random.default_rng(zlib.crc32(stem.encode()))  # whichever test asks first
        flags = {}
        if stem == "conv_pool":
            path = conv_pool_cnn(folder)
        elif stem == "dense":
            path = dense_cnn(folder)
            flags["check_onnx_tf_outputs_elementwise_close"] = True
        else:
            path = keyword_spotter(folder)
            mfcc = folder / "mfcc.npy"
            np.save(mfcc, np.random.default_rng(0).standard_normal((10, 10, 49)).astype(
                np.float32))
            flags.update(custom_input_op_name_np_data_path=[["mfcc", str(mfcc)]],
                         copy_onnx_input_output_names_to_tflite=True)
        outputs[stem] = str(folder / f"out_{stem}")
        convert(input_onnx_file_path=path, output_folder_path=outputs[stem], non_verbose=True,
                target="micro", **flags)
        return outputs[stem]

    return output


@pytest.mark.parametrize("stem", ["conv_pool", "dense", "kws"])
def test_micro_outputs_equal_litert(converted, stem):
    report = micro_report(converted(stem), stem)
    print(report["summary"])
    assert report["samples"] >= 2 and report["sample_source"] == "held-out calibration samples"
    # TFLite Micro's kernels are TFLite's reference kernels, but its FULLY_CONNECTED rounds
    # some values 1 LSB away; ai-edge-litert's default kernels (XNNPACK) round others 1 LSB
    # away too, which compounds: conv_pool's softmax output is 2 LSB from XNNPACK's and
    # bit-exact with the reference kernels (docs/micro.md)
    for compared, bound in ((report["outputs"], 2), (report["outputs_reference_kernels"], 1)):
        for found in compared.values():
            assert found["unit"] == "LSB" and found["max_abs_diff"] <= bound, compared
    assert all(o["resolver_call"] and o["onnx_nodes"] for o in report["ops"]), report["ops"]
    assert report["resolver"][0].startswith("tflite::MicroMutableOpResolver<")


def test_ops_and_resolver_calls_of_the_conv_net(converted):
    report = micro_report(converted("conv_pool"), "conv_pool")
    ops = {o["op"]: o for o in report["ops"]}
    assert {"CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "FULLY_CONNECTED", "SOFTMAX"} <= set(
        ops), list(ops)
    assert ops["DEPTHWISE_CONV_2D"]["resolver_call"] == "AddDepthwiseConv2D"
    assert ops["DEPTHWISE_CONV_2D"]["onnx_nodes"][0]["name"] == "depthwise"
    assert "resolver.AddSoftmax();" in report["resolver"]
    largest = report["largest_tensors"]
    assert all(t["onnx_nodes"] for t in largest if t["op"]), largest
    assert [1, 16, 16, 8] in [t["shape"] for t in largest], largest  # the stem's output
    assert [t["bytes"] for t in largest] == sorted((t["bytes"] for t in largest), reverse=True)


def test_arena_is_the_smallest_that_works(converted):
    out = converted("conv_pool")
    report = micro_report(out, "conv_pool")
    with open(os.path.join(out, "conv_pool_full_integer_quant.tflite"), "rb") as f:
        content = f.read()
    arena = report["arena_bytes"]
    assert arena > 0 and report["recorded_arena"]["total"] <= arena
    assert report["flatbuffer_bytes"] == len(content)
    with MicroInterpreter() as interpreter:
        assert interpreter.attempt(content, arena)[0]
        for smaller in (arena - 1, arena - 1024):
            ok, printed = interpreter.attempt(content, smaller)
            assert not ok and "Failed to" in printed, printed
        assert smallest_arena(interpreter, content, start=1 << 12)[0] == arena
    assert report["warnings"] == []  # a few kB: any microcontroller holds it


def test_an_arena_past_a_microcontrollers_sram_is_a_warning_naming_the_tensors():
    largest = ["input 'x' [1, 2048, 2048, 3] int8 12582912 bytes",
               "PAD #0 from node 'stem' (Conv) [1, 2050, 2050, 3] int8 12607500 bytes"]
    warning = arena_warning("big_full_integer_quant.tflite", 25193168, largest,
                            "Give the model smaller inputs with -ois (now x:1,3,2048,2048)")
    assert warning.splitlines()[0] == (
        "big_full_integer_quant.tflite needs a tensor arena of 25193168 bytes (24.0 MiB), more "
        "than the 2 MiB of SRAM of a microcontroller; its largest tensors: input 'x' "
        "[1, 2048, 2048, 3] int8 12582912 bytes; PAD #0 from node 'stem' (Conv) "
        "[1, 2050, 2050, 3] int8 12607500 bytes. Give the model smaller inputs with -ois (now "
        "x:1,3,2048,2048).")
    assert arena_warning("small.tflite", 2 << 20, largest, "") is None


def shapes_only(shapes: dict, outputs: list[str]):
    """What check_micro_shapes reads of a pipeline graph: inputs, outputs, shapes."""
    from types import SimpleNamespace

    return SimpleNamespace(inputs=[n for n in shapes if n not in outputs], outputs=outputs,
                           shapes=shapes)


def test_an_input_past_the_sram_is_a_warning_before_quantizing(caplog, monkeypatch):
    graph = shapes_only({"x": (2, 3, 2048, 2048), "probs": (2, 10)}, ["probs"])
    logger = logging.getLogger("onnx2tf_alt")
    # as a conversion configures it (logs.configure_logging), whichever test ran first in
    # this worker: caplog's handler on the root logger would see each record twice
    monkeypatch.setattr(logger, "propagate", False)
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="onnx2tf_alt"):  # -n set it to errors
            check_micro_shapes(graph, "big_full_integer_quant.tflite")
            warned = list(caplog.messages)
            check_micro_shapes(shapes_only({"x": (1, 3, 224, 224), "probs": (1, 10)},
                                              ["probs"]), "small_full_integer_quant.tflite")
    finally:
        logger.removeHandler(caplog.handler)
    assert warned == [(
        "micro: big_full_integer_quant.tflite: the model input 'x' [2, 3, 2048, 2048] alone "
        "needs 25165824 bytes of tensor arena in int8, more than the 2 MiB of SRAM of a "
        "microcontroller: expect an arena that needs external RAM, and a slow quantization. "
        "Give the model smaller inputs with -ois (now x:2,3,2048,2048), or a batch of 1 with "
        "-b 1.")]
    assert caplog.messages == warned  # none for the small one


def test_an_input_no_board_holds_is_refused_before_quantizing(tmp_path):
    path = conv_pool_cnn(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(InputError) as error:
        convert(input_onnx_file_path=path, output_folder_path=str(out), non_verbose=True,
                target="micro", overwrite_input_shape=["x:1,3,5000,5000"])
    assert str(error.value).splitlines()[0] == (
        "--target micro: conv_pool_full_integer_quant.tflite: the model input 'x' "
        "[1, 3, 5000, 5000] alone needs 75000000 bytes of tensor arena in int8, more than a "
        "microcontroller board holds (external RAM included, 64 MiB at most). Give the model "
        "smaller inputs with -ois (now x:1,3,5000,5000).")
    assert error.value.exit_code == 2 and not out.exists()


def test_report_is_owned_and_shown(converted):
    out = converted("dense")
    with open(os.path.join(out, "dense_manifest.json")) as f:
        assert "dense_micro.json" in json.load(f)["files"]
    with open(os.path.join(out, "dense_accuracy_report.html")) as f:
        page = f.read()
    report = micro_report(out, "dense")
    assert "TensorFlow Lite for Microcontrollers" in page
    assert f"Tensor arena: {report['arena_bytes']} bytes" in page


def test_onnx_names_file_is_the_one_measured(converted):
    out = converted("kws")
    report = micro_report(out, "kws")
    assert report["flatbuffer_bytes"] == os.path.getsize(
        os.path.join(out, "kws_full_integer_quant.tflite"))
    assert [i["name"] for i in report["inputs"]] == ["mfcc"]
    assert list(report["outputs"]) == ["probs"]
    assert report["inputs"][0]["shape"] == [1, 49, 10]  # channel-last, as TFLite Micro runs it


# --- refusals -----------------------------------------------------------------------------------


def test_run_time_shape_is_refused_before_quantizing(tmp_path):
    path = keyword_spotter(tmp_path, time_steps="frames")
    out = tmp_path / "out"
    with pytest.raises(ConversionError) as error:
        convert(input_onnx_file_path=path, output_folder_path=str(out), non_verbose=True,
                target="micro")
    message = str(error.value)
    assert "input 'mfcc'" in message and "-ois mfcc:1,10,1" in message, message
    assert error.value.exit_code == 1 and not out.exists()


def test_float_node_is_refused_with_exit_1_naming_it(tmp_path, capfd):
    path = dense_cnn(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("not the converter's")
    code = main(["-i", path, "-o", str(out), "--target", "micro", "--keep_float", "dense2",
                 "-n"])
    message = capfd.readouterr().err
    assert code == 1, message
    assert "from node 'dense2' (Gemm) computes in float32" in message, message
    assert "--keep_float" in message
    assert sorted(os.listdir(out)) == ["mine.txt"]  # nothing published


def test_resolver_table_is_what_tflite_micro_registers(tmp_path):
    """Every builtin code in a one-op model: TFLite Micro says "Didn't find op" exactly for
    those MICRO_RESOLVER lacks (a registered op then fails or crashes in its Prepare on the
    made-up tensors, which is beside the point)."""
    registered = set()
    with MicroInterpreter() as interpreter:
        for code, name in OP_NAMES.items():
            if name == "CUSTOM":
                continue
            ok, printed = interpreter.attempt(one_op_model(code), 1 << 16)
            if ok or "Didn't find op for builtin opcode" not in printed:
                registered.add(name)
    assert registered == set(MICRO_RESOLVER), (
        sorted(registered - set(MICRO_RESOLVER)), sorted(set(MICRO_RESOLVER) - registered))


def one_op_model(code: int) -> bytes:
    """A model of one op with builtin `code` from an int8 [1, 4] tensor to another."""
    model = schema.ModelT()
    model.version = 3
    opcode = schema.OperatorCodeT()
    opcode.builtinCode, opcode.deprecatedBuiltinCode, opcode.version = code, min(code, 127), 1
    model.operatorCodes = [opcode]
    model.buffers = [schema.BufferT()]
    subgraph = schema.SubGraphT()
    subgraph.tensors = []
    for name in (b"in", b"out"):
        tensor = schema.TensorT()
        tensor.shape, tensor.type, tensor.buffer, tensor.name = [1, 4], schema.TensorType.INT8, \
            0, name
        subgraph.tensors.append(tensor)
    subgraph.inputs, subgraph.outputs = [0], [1]
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0], [1]
    subgraph.operators = [op]
    model.subgraphs = [subgraph]
    return pack_model(model, 1024)


def test_gelu_and_pow_take_the_forms_tflite_micro_runs(tmp_path):
    """GELU and POW have no TFLite Micro kernel; --target micro lowers Gelu and an integer
    Pow to MUL/ADD forms (MICRO_FORMS) and the file runs there."""
    init = {"w": weights(16, 8, fan_in=16), "b": bias(8), "two": np.array(2.0, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Gelu", ["hb"], ["g"]),
             helper.make_node("Pow", ["g", "two"], ["y"], name="square")]
    path = save_model(tmp_path, "gelu_pow", nodes, {"x": [1, 16]}, ("y", [1, 8]), init,
                      opset=20)
    samples = tmp_path / "x.npy"
    np.save(samples, np.random.default_rng(1).standard_normal((12, 16)).astype(np.float32))
    out = tmp_path / "out"
    convert(input_onnx_file_path=path, output_folder_path=str(out), non_verbose=True,
            target="micro", custom_input_op_name_np_data_path=[["x", str(samples)]])
    with open(out / "gelu_pow_micro.json") as f:
        report = json.load(f)
    names = {op["op"] for op in report["ops"]}
    assert not names & {"GELU", "POW"}, names
    assert report["arena_bytes"] > 0 and report["samples"] > 0


def test_dms_micro_files_need_no_tensorflow(tmp_path):
    """-dms --target micro: the full-integer file is calibrated on the direct writer's file,
    quantized by the own quantizer and checked on TFLite Micro in a process that never
    loads TF; its outputs there are those of ai-edge-litert's reference kernels within 1 LSB
    (XNNPACK's within 2), every op
    names its ONNX nodes."""
    import subprocess
    import sys

    from cli_runner import cli_env

    path = conv_pool_cnn(tmp_path)
    out = tmp_path / "out"
    script = (
        "import sys\n"
        "from onnx2tf_alt.cli.main import main\n"
        f"code = main(['-i', {str(path)!r}, '-o', {str(out)!r}, '-dms', '--target', 'micro', "
        "'-n'])\n"
        "assert 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=cli_env(), timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = micro_report(str(out), "conv_pool")
    for compared, bound in ((report["outputs"], 2), (report["outputs_reference_kernels"], 1)):
        for found in compared.values():  # bounds as in test_micro_outputs_equal_litert
            assert found["unit"] == "LSB" and found["max_abs_diff"] <= bound, compared
    assert all(o["resolver_call"] and o["onnx_nodes"] for o in report["ops"]), report["ops"]


def test_a_computed_divisor_is_kept_off_zero_and_runs_on_a_quiet_input(tmp_path):
    """Features divided by their peak plus an epsilon: on a quiet input the peak is 0, the
    8-bit divisor lands on its zero point, and TFLite's int8 DIV stops the invocation. The
    micro file reads the divisor through a MAXIMUM one step above 0: it runs on such an
    input, in TFLite Micro as in ai-edge-litert, with the same codes."""
    init = {"axes": np.array([-1], np.int64), "eps": np.array(1e-4, np.float32),
            "fc": weights(16, 4, fan_in=16), "fb": bias(4)}
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("ReduceMax", ["r", "axes"], ["peak"]),
        helper.make_node("Add", ["peak", "eps"], ["d"]),
        helper.make_node("Div", ["x", "d"], ["n"], name="norm"),
        helper.make_node("Gemm", ["n", "fc", "fb"], ["y"], name="head"),
    ]
    path = save_model(tmp_path, "norm", nodes, {"x": [1, 16]}, ("y", [1, 4]), init, opset=18)
    np.save(tmp_path / "cal.npy", np.random.default_rng(5).standard_normal((12, 1, 16)).astype(
        np.float32))
    out = tmp_path / "out"
    convert(input_onnx_file_path=path, output_folder_path=str(out), non_verbose=True,
            target="micro", custom_input_op_name_np_data_path=[["x", str(tmp_path / "cal.npy")]])
    report = micro_report(str(out), "norm")
    assert {"DIV", "MAXIMUM"} <= {o["op"] for o in report["ops"]}, report["ops"]
    content = (out / "norm_full_integer_quant.tflite").read_bytes()
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_content=content,
                              experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    runner = interpreter.get_signature_runner()
    (name, detail), = runner.get_input_details().items()
    scale, zero = detail["quantization"]
    quiet = np.full(detail["shape"], np.clip(np.round(-0.3 / scale) + zero, -128, 127), np.int8)
    (litert,) = runner(**{name: quiet}).values()  # relu(x) = 0 everywhere: peak 0
    with MicroInterpreter() as micro:
        found, printed = micro.run(content, report["arena_bytes"], [[quiet]], 1)
    assert found is not None, printed
    np.testing.assert_array_equal(found[0][0], litert)
