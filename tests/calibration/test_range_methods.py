"""The table of activation-range methods (calibration/methods.py) is the one list of
--calibration_method: the command line's choices and help, docs/cli_flags.md, both
measurers (ranges.py, ort.py) and the quantizer take their methods from it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import helper

from calibration import ranges
from calibration.methods import (
    AUTO_CANDIDATES,
    AUTO_METHOD,
    BY_NAME,
    DEFAULT_METHOD,
    METHODS,
    NAMES,
    ONNXRUNTIME,
    TFLITE_GRAPH,
)
from calibration.ort import onnx_ranges
from onnx2tf_alt.cli.args import parser
from onnx2tf_alt.errors import InputError
from onnx2tf_alt.pipeline import build
from onnx2tf_alt.quant.quantize import QuantOptions, calibrated_tflite, plan_quantization

from harness import make_model

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cli_flags.md")
SHAPE = (1, 3, 6, 6)


def _action():
    [action] = [a for a in parser()._actions if "--calibration_method" in a.option_strings]
    return action


def test_the_table_is_well_formed():
    assert len(NAMES) == len(METHODS), "method names are unique"
    assert DEFAULT_METHOD in NAMES and AUTO_METHOD in NAMES
    assert all(BY_NAME[m].measurer == TFLITE_GRAPH and BY_NAME[m].algorithm in ranges.ALGORITHMS
               for m in AUTO_CANDIDATES)
    from onnxruntime.quantization.calibrate import CalibrationMethod

    for method in METHODS:
        assert method.description and "\n" not in method.description, method
        if method.measurer == ONNXRUNTIME:
            assert method.algorithm in CalibrationMethod.__members__, method
        else:
            assert method.measurer == TFLITE_GRAPH, method
            assert method.algorithm in (*ranges.ALGORITHMS, AUTO_METHOD), method


def test_cli_choices_default_and_help_come_from_the_table():
    action = _action()
    assert tuple(action.choices) == NAMES
    assert action.default == DEFAULT_METHOD
    help_text = action.help.replace("%%", "%")
    for method in METHODS:
        assert f"{method.name} (" in help_text and method.description in help_text, method


def test_cli_refuses_a_method_not_in_the_table(capsys):
    assert parser().parse_args(["--calibration_method", NAMES[-1]]).calibration_method == (
        NAMES[-1])
    with pytest.raises(SystemExit):
        parser().parse_args(["--calibration_method", "magic"])
    assert "invalid choice: 'magic'" in capsys.readouterr().err


def test_the_docs_list_every_method():
    with open(DOC) as f:
        [row] = [line for line in f if line.startswith("| `--calibration_method` |")]
    for method in METHODS:
        assert f"{method.name} (" in row and method.description in row, method


@pytest.fixture(scope="module")
def converted():
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, {"x": np.zeros(SHAPE, np.float32)}, ["y"], weights)
    return build(input_onnx_file_path=None, onnx_graph=model)


def test_the_quantizer_takes_exactly_the_tables_methods(converted):
    for name in NAMES:
        plan = plan_quantization(converted, QuantOptions(dynamic_range=True,
                                                         calibration_method=name))
        assert plan.options.calibration_method == name
    with pytest.raises(InputError, match="calibration_method") as refused:
        plan_quantization(converted, QuantOptions(dynamic_range=True, calibration_method="magic"))
    assert str(list(NAMES)) in str(refused.value)


def test_each_measurer_takes_only_its_rows(converted):
    tflite_graph = [m.name for m in METHODS
                    if m.measurer == TFLITE_GRAPH and m.algorithm != AUTO_METHOD]
    samples = [{"x": np.random.default_rng(i).uniform(-1, 1, SHAPE).astype(np.float32)}
               for i in range(3)]
    calibrated, flex = calibrated_tflite(
        converted, QuantOptions(integer=True, calibration_method="minmax"), samples)
    assert not flex
    content = calibrated.written()
    feeds = [converted.result.to_physical(s) for s in samples]
    measured = ranges.measured_ranges(content, feeds, tflite_graph)
    assert sorted(measured) == sorted(tflite_graph)
    for name in tflite_graph:  # rows of one algorithm measure the same ranges
        same = [m for m in tflite_graph if BY_NAME[m].algorithm == BY_NAME[name].algorithm]
        assert all(measured[m] == measured[name] for m in same), name
    for name in NAMES:
        if name not in tflite_graph:
            with pytest.raises(ValueError, match="unknown range method"):
                ranges.measured_ranges(content, feeds, (name,))
        if BY_NAME[name].measurer != ONNXRUNTIME:
            with pytest.raises(ValueError, match="onnxruntime"):
                onnx_ranges(converted.model, samples, name)


def test_the_ranges_do_not_depend_on_how_the_file_is_run(monkeypatch):
    """A file of one subgraph is measured piece by piece (PIECE_BYTES; here one piece, then
    one op a piece): the same ranges to the bit as the whole file with every tensor an
    output (the path of files with control flow), and, past XNNPACK_MAX_BYTES (1 GiB;
    lowered here), as the whole file on the builtin kernels keeping every tensor, without
    an exposed copy (to the kernels' rounding)."""
    from onnx2tf_alt.tflite.flatbuffer import pack_model, unpack_model

    rng = np.random.default_rng(1)
    weights = {f"w{k}": rng.standard_normal((3, 3, 3, 3)).astype(np.float32) for k in range(2)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "x"], ["y"])]  # the input, read two ops later
    model = make_model(nodes, {"x": np.zeros(SHAPE, np.float32)}, ["y"], weights)
    converted = build(input_onnx_file_path=None, onnx_graph=model)
    samples = [{"x": np.random.default_rng(i).uniform(-1, 1, SHAPE).astype(np.float32)}
               for i in range(3)]
    content = calibrated_tflite(
        converted, QuantOptions(integer=True, calibration_method="minmax"), samples)[0].written()
    feeds = [converted.result.to_physical(s) for s in samples]
    methods = ("minmax", "percentile")
    pieces = []
    unpacked = unpack_model(content)
    ops = len(unpacked.subgraphs[0].operators)
    written = [int(o) for op in unpacked.subgraphs[0].operators for o in op.outputs]
    monkeypatch.setattr(ranges, "_in_pieces", lambda *args: True)  # however small
    for size, count in ((ranges.PIECE_BYTES, 1), (1, ops)):
        monkeypatch.setattr(ranges, "PIECE_BYTES", size)
        assert len(ranges._pieces(unpacked, written)) == count
        pieces.append(ranges.measured_ranges_split(content, feeds, 2, methods))
    assert ops >= 3
    assert pieces[0] == pieces[1] and pieces[0][1]["minmax"]

    def whole(model, watched, feeds, tally, clipping):
        ranges._measure_whole(pack_model(model), model, watched, feeds, tally, clipping)

    monkeypatch.setattr(ranges, "_measure_in_pieces", whole)
    assert ranges.measured_ranges_split(content, feeds, 2, methods) == pieces[0]
    monkeypatch.setattr(ranges, "exposed", None)  # in place: no exposed copy is made
    monkeypatch.setattr(ranges, "XNNPACK_MAX_BYTES", 0)
    in_place = ranges.measured_ranges(content, feeds, methods)
    for method in methods:
        assert in_place[method].keys() == pieces[0][1][method].keys()
        for index, (low, high) in pieces[0][1][method].items():
            np.testing.assert_allclose(in_place[method][index], (low, high), rtol=1e-5,
                                       atol=1e-6, err_msg=f"{method} {index}")


def test_infinities_have_no_range_and_no_bins(monkeypatch):
    """A tensor with infinities where a mask says so (an attention mask's sum) on one
    sample and none on another gets the range of its finite values, and only they are
    counted in its histogram (clipped ranges)."""
    from onnx2tf_alt.ir.loader import load_model
    from onnx2tf_alt.pipeline import plan_loaded
    from onnx2tf_alt.tflite.direct import write_direct
    from onnx2tf_alt.tflite.flatbuffer import unpack_model

    mask = np.zeros(SHAPE, np.float32)
    mask[0, 1] = np.inf  # a third of the first sample's values
    nodes = [helper.make_node("Mul", ["x", "gate"], ["masked"]),
             helper.make_node("Add", ["masked", "bias"], ["y"])]
    model = make_model(nodes, {"x": np.zeros(SHAPE, np.float32),
                               "gate": np.zeros(SHAPE, np.float32)}, ["y"],
                       {"bias": np.float32(0.5).reshape(1)})
    planned = plan_loaded(load_model(None, model))
    content = write_direct(planned.graph, planned.plan, planned.options).content
    plain = build(input_onnx_file_path=None, onnx_graph=model)  # its layout
    rng = np.random.default_rng(4)
    samples = [{"x": rng.uniform(-1, 3, SHAPE).astype(np.float32),
                "gate": np.where(k == 0, mask + 1, 1).astype(np.float32)} for k in range(2)]
    expected = [s["x"] * s["gate"] + np.float32(0.5) for s in samples]
    assert np.isinf(expected[0]).any() and np.isfinite(expected[1]).all()
    finite = np.concatenate([e[np.isfinite(e)] for e in expected])
    feeds = [plain.result.to_physical(s) for s in samples]
    counted = []
    histogram = ranges._histogram

    def recorded(value, low, high):
        counted.append(np.asarray(value).copy())
        return histogram(value, low, high)

    monkeypatch.setattr(ranges, "_histogram", recorded)
    measured = ranges.measured_ranges(content, feeds, ("minmax", "percentile"))
    [y] = [int(o) for o in unpack_model(content).subgraphs[0].outputs]
    assert measured["minmax"][y] == (float(finite.min()), float(finite.max()))
    assert counted and all(np.isfinite(value).all() for value in counted)


def test_a_file_is_measured_in_pieces_where_its_weights_dominate(monkeypatch):
    """_in_pieces: four linear layers whose weights outweigh their tensors run in pieces
    (one piece's weights and packed copy at once, not all of them twice); convolutions
    whose tensors outweigh their weights, whose maps would cross the pieces for every
    feed, run whole."""
    from onnx2tf_alt.ir.loader import load_model
    from onnx2tf_alt.pipeline import plan_loaded
    from onnx2tf_alt.tflite.direct import write_direct
    from onnx2tf_alt.tflite.flatbuffer import unpack_model

    def decided(nodes, inputs, weights) -> bool:
        model = make_model(nodes, inputs, [nodes[-1].output[0]], weights)
        planned = plan_loaded(load_model(None, model))
        unpacked = unpack_model(write_direct(planned.graph, planned.plan,
                                             planned.options).content)
        graph = unpacked.subgraphs[0]
        written = [int(o) for op in graph.operators for o in op.outputs]
        assert len(ranges._pieces(unpacked, written)) > 1
        return ranges._in_pieces(unpacked, written, 16)

    monkeypatch.setattr(ranges, "PIECE_BYTES", 1 << 20)
    rng = np.random.default_rng(2)
    linear = {f"w{k}": rng.standard_normal((512, 512)).astype(np.float32) for k in range(4)}
    chain = [helper.make_node("MatMul", ["x" if k == 0 else f"h{k - 1}", f"w{k}"], [f"h{k}"])
             for k in range(4)]
    assert decided(chain, {"x": np.zeros((1, 512), np.float32)}, linear)
    convs = {f"c{k}": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) for k in range(4)}
    maps = [helper.make_node("Conv", ["x" if k == 0 else f"m{k - 1}", f"c{k}"], [f"m{k}"],
                             pads=[1, 1, 1, 1]) for k in range(4)]
    assert not decided(maps, {"x": np.zeros((1, 16, 64, 64), np.float32)}, convs)
