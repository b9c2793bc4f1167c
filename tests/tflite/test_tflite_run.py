"""onnx2tf_alt/tflite/run.py: a .tflite's signature run with empty outputs (a detector that
finds nothing), which the interpreter's Python runner refuses to read."""

import numpy as np
from onnx import helper

from harness import assert_close, convert, make_model, ort_run


def _nonzero_model():
    nodes = [helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("NonZero", ["positive"], ["where"]),
             helper.make_node("Transpose", ["where"], ["y"], perm=[1, 0])]
    return make_model(nodes, {"x": np.ones((5,), np.float32)}, ["y"],
                      {"zero": np.array(0.0, np.float32)}, opset=13)


def test_empty_and_non_empty_outputs():
    from ai_edge_litert.interpreter import Interpreter

    from onnx2tf_alt.tflite.lowering import tflite_bytes
    from onnx2tf_alt.tflite.run import run_signature, signature_call

    model = _nonzero_model()
    converted = convert(model)
    content = tflite_bytes(converted.tflite_result())
    for x in (np.array([1, -1, 2, 0, 3], np.float32), np.zeros(5, np.float32)):
        expected = ort_run(model, {"x": x})[0]
        physical = converted.result.to_physical({"x": x})
        key = converted.result.output_names["y"]
        for run in (lambda i, p=physical: run_signature(i, p),
                    lambda i, p=physical: signature_call(i, p)()):
            got = run(Interpreter(model_content=content))[key]
            assert got.shape == expected.shape and np.array_equal(got, expected), (got, expected)


def test_a_pruned_cut_computes_its_tensor_with_only_what_it_reads():
    """tflite/run.exposed(prune=True), as bias correction cuts a file after each conv: the
    cut keeps the ops, tensors and buffers its tensor depends on (renumbered), computes
    what the whole file computes there (XNNPACK against the reference kernels' preserved
    tensor), and leaves the model it was cut from as it was."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from onnx2tf_alt.ir.loader import load_model
    from onnx2tf_alt.pipeline import plan_loaded
    from onnx2tf_alt.tflite.direct import write_direct
    from onnx2tf_alt.tflite.flatbuffer import pack_model, unpack_model
    from onnx2tf_alt.tflite.run import exposed, run_signature

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 9, 7)).astype(np.float32)
    weights = {f"w{k}": rng.standard_normal((4, 3 if k == 0 else 4, 3, 3)).astype(np.float32)
               for k in range(3)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "r0"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, {"x": x}, ["y"], initializers=weights)
    planned = plan_loaded(load_model(None, model))
    content = write_direct(planned.graph, planned.plan, planned.options).content
    full = Interpreter(model_content=content, experimental_preserve_all_tensors=True,
                       experimental_op_resolver_type=(
                           OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    feeds = {"x": x.transpose(0, 2, 3, 1)}
    run_signature(full, feeds)
    unpacked = unpack_model(content)
    graph = unpacked.subgraphs[0]
    before = pack_model(unpacked)
    cuts = 0
    for op in graph.operators:
        target = int(op.outputs[0])
        name = graph.tensors[target].name.decode()
        cut = exposed(unpacked, [target], prune=True)
        cut_graph = unpack_model(cut).subgraphs[0]
        assert len(cut_graph.tensors) <= len(graph.tensors)
        interpreter = Interpreter(model_content=cut)
        run_signature(interpreter, feeds)
        got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        expected = full.get_tensor(next(d["index"] for d in full.get_tensor_details()
                                        if d["name"] == name))
        assert_close(got, expected, 1e-5, name)  # XNNPACK's sums against the reference's
        cuts += len(cut_graph.tensors) < len(graph.tensors)
    assert cuts >= 2  # the first convs' cuts leave the later weights out
    assert pack_model(unpacked) == before
