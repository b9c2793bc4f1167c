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


def _skip_model():
    """(a direct-written float file of three convs with a skip Add, its input in the
    file's layout)."""
    from onnx2tf_alt.ir.loader import load_model
    from onnx2tf_alt.pipeline import plan_loaded
    from onnx2tf_alt.tflite.direct import write_direct

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
    return content, x.transpose(0, 2, 3, 1)


def test_a_file_run_in_segments_computes_what_the_whole_file_computes():
    """tflite/run.segment, as bias correction runs a file piece by piece between its waves:
    each piece takes the tensors it reads from outside as inputs (the skip Add's first
    ReLU output, written by the first piece), and fed what the pieces before it wrote, computes
    every tensor the whole file computes there, exactly (the builtin kernels, op for op)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from onnx2tf_alt.tflite.flatbuffer import unpack_model
    from onnx2tf_alt.tflite.run import run_signature, segment

    content, x = _skip_model()
    builtin = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    full = Interpreter(model_content=content, experimental_preserve_all_tensors=True,
                       experimental_op_resolver_type=builtin)
    run_signature(full, {"x": x})
    model = unpack_model(content)
    graph = model.subgraphs[0]
    ops = len(graph.operators)
    assert ops >= 4
    state = {int(graph.inputs[0]): x}
    pieces = [list(range(2)), list(range(2, ops - 1)), [ops - 1]]
    read_from_before = set()
    for k, piece in enumerate(pieces):
        later = {int(i) for j in range(piece[-1] + 1, ops) for i in graph.operators[j].inputs}
        outputs = [int(o) for j in piece for o in graph.operators[j].outputs
                   if int(o) in later or int(o) in graph.outputs]
        cut, inputs = segment(model, piece, outputs)
        assert len(unpack_model(cut).subgraphs[0].operators) == len(piece)
        if k:
            read_from_before |= set(inputs)
        interpreter = Interpreter(model_content=cut, experimental_op_resolver_type=builtin)
        interpreter.allocate_tensors()
        for tensor, details in zip(inputs, interpreter.get_input_details()):
            interpreter.set_tensor(details["index"], state[tensor])
        interpreter.invoke()
        for tensor, details in zip(outputs, interpreter.get_output_details()):
            state[tensor] = interpreter.get_tensor(details["index"])
            expected = full.get_tensor(tensor)
            assert np.array_equal(state[tensor], expected), graph.tensors[tensor].name
    assert int(graph.outputs[0]) in state
    # the Add reads the ReLU's output, written by the first piece, from the second
    relu = next(int(op.outputs[0]) for op in graph.operators[:2]
                if any(int(op.outputs[0]) in map(int, o.inputs) for o in graph.operators[2:]))
    assert relu in read_from_before


def test_a_pruned_cut_computes_its_tensor_with_only_what_it_reads():
    """tflite/run.exposed(prune=True), as bias correction cuts a file after each conv: the
    cut keeps the ops, tensors and buffers its tensor depends on (renumbered), computes
    what the whole file computes there (XNNPACK against the reference kernels' preserved
    tensor), and leaves the model it was cut from as it was."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from onnx2tf_alt.tflite.flatbuffer import pack_model, unpack_model
    from onnx2tf_alt.tflite.run import exposed, run_signature

    content, x = _skip_model()
    full = Interpreter(model_content=content, experimental_preserve_all_tensors=True,
                       experimental_op_resolver_type=(
                           OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    feeds = {"x": x}
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
