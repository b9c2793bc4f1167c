"""The transpose explainer (onnx2tf_alt/layout/explain.py): every relayout the plan asks for
is listed once, and each TRANSPOSE op of a .tflite is attributed to the plan, to a handler
or to TF's converter."""

import logging
from types import SimpleNamespace

import numpy as np
from onnx import helper

from onnx2tf_alt.cli.explain import main as explain_main
from onnx2tf_alt.ir.graph import graph_from_model
from onnx2tf_alt.layout.cost import moving_transposes
from onnx2tf_alt.layout.explain import describe, plan_transposes, tflite_transposes
from onnx2tf_alt.passes.prepare import prepare_model
from onnx2tf_alt.pipeline import build, plan_graph

from harness import make_model


def conv_then_matmul():
    """A Conv (channel-last) whose output a MatMul reads over its last ONNX axis (W): the
    plan must move the Conv's output back to ONNX order."""
    inits = {"w": np.ones((4, 3, 1, 1), np.float32), "m": np.ones((5, 7), np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"]),
             helper.make_node("MatMul", ["a", "m"], ["y"])]
    return make_model(nodes, {"x": np.zeros((2, 3, 6, 5), np.float32)}, ["y"], inits)


def test_every_relayout_is_listed_once_with_its_kind():
    graph = graph_from_model(prepare_model(conv_then_matmul()))
    plan = plan_graph(graph)
    groups = plan_transposes(graph, plan)
    assert sum(g.count for g in groups) == len(plan.transposes(graph)) > 0
    assert sum(g.count for g in groups if g.moving) == len(moving_transposes(graph, plan))
    assert ("Conv", ("MatMul",), 4, True) in {(g.producer, g.consumers, g.rank, g.moving)
                                              for g in groups}
    summary = describe(graph, plan)[-1]
    assert f"plan: {len(moving_transposes(graph, plan))} moving" in summary


def test_tflite_transposes_are_attributed():
    graph = graph_from_model(prepare_model(conv_then_matmul()))
    plan = plan_graph(graph)
    matmul = next(n for n in graph.nodes if n.op_type == "MatMul")
    conv = next(n for n in graph.nodes if n.op_type == "Conv")
    ops = [SimpleNamespace(op="TRANSPOSE", onnx_nodes=[{"name": matmul.name, "op_type": "MatMul"}]),
           SimpleNamespace(op="TRANSPOSE", onnx_nodes=[{"name": conv.name, "op_type": "Conv"}]),
           SimpleNamespace(op="TRANSPOSE", onnx_nodes=[]),
           SimpleNamespace(op="CONV_2D", onnx_nodes=[{"name": conv.name, "op_type": "Conv"}])]
    assert tflite_transposes(ops, graph, plan) == {"plan": 1, "inside Conv": 1, "converter": 1}


def test_the_command_and_debug_log_explain_a_model(tmp_path, capsys, caplog):
    path = str(tmp_path / "m.onnx")
    import onnx

    onnx.save(conv_then_matmul(), path)
    assert explain_main(["--tflite", path]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"== {path}"
    assert any(line.split()[1:4] == ["Conv", "->", "MatMul"] for line in printed)
    assert "TFLite TRANSPOSE: " in printed[-1]
    with caplog.at_level(logging.DEBUG, logger="onnx2tf_alt"):
        build(path)
    assert any(r.getMessage().startswith("layout plan: ") and "moving" in r.getMessage()
               for r in caplog.records)
