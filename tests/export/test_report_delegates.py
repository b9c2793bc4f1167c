"""The HTML accuracy report (-cotof) carries the delegate report's section: the summary,
ops per type, and the ops off XNNPACK or the GPU delegate with their ONNX nodes."""

from __future__ import annotations

import json

import numpy as np
from onnx import helper

from onnx2tf_alt.api import convert

from harness import make_model


def test_html_report_has_delegate_section(tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 5, 7)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_node"),
             helper.make_node("ArgMax", ["r"], ["y"], axis=1, name="argmax_node")]
    model = make_model(nodes, {"x": x}, ["y"], opset=17)
    out = tmp_path / "out"
    convert(onnx_graph=model, output_folder_path=str(out), non_verbose=True,
            check_onnx_tf_outputs_elementwise_close_full=True)
    delegates = json.loads((out / "model_delegates.json").read_text())
    (argmax,) = [o for o in delegates["ops"] if o["op"] == "ARG_MAX"]
    assert argmax["gpu_issue"], argmax  # ARG_MAX is no GPU delegate op
    page = (out / "model_accuracy_report.html").read_text()
    section = page[page.index("<h2>Delegates (float32 .tflite)</h2>"):]
    assert delegates["summary"].replace("'", "&#x27;") in section
    assert "<td>ARG_MAX</td><td class='num'>1</td>" in section
    assert f"<td>{argmax['gpu_issue']}</td><td>argmax_node (ArgMax)</td>" in section
