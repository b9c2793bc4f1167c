"""ONNX backend node tests through the converter: the TF model, the float32 TFLite and the
direct writer's float32 TFLite (tflite/direct.py, where it covers the case) are each
compared with the suite's expected outputs (its own rtol/atol).

Outcomes per backend are 'pass', 'xfail' (listed in expectations.txt with a reason),
'excluded' (a category the suite rules exclude, see `exclusion`) or 'fail'. A listed test
that passes fails the run, so the list can only shrink. Counts per op type are printed at
the end of the run (see conftest.py).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from conformance.node_cases import NodeCase, load_cases

HERE = os.path.dirname(__file__)
BACKENDS = ("tf", "tflite", "direct")
BOTH = ("tf", "tflite")  # what `both` names in expectations.txt
TRAINING_OPS = {"Gradient", "Adagrad", "Adam", "Momentum"}
RANDOM_OPS = {
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli",
    "Multinomial",
}
STRING_OPS = {
    "ImageDecoder", "StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch",
}
NO_TFLITE_TYPE = {
    onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
    onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ, onnx.TensorProto.INT4,
    onnx.TensorProto.UINT4,
}
for _name in ("FLOAT4E2M1", "FLOAT8E8M0", "INT2", "UINT2"):
    if hasattr(onnx.TensorProto, _name):
        NO_TFLITE_TYPE.add(getattr(onnx.TensorProto, _name))


def read_expectations() -> dict[tuple[str, str], str]:
    """{(test name, backend): reason} from expectations.txt (`name tf|tflite|both reason`)."""
    expected = {}
    with open(os.path.join(HERE, "expectations.txt")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, scope, reason = line.split(maxsplit=2)
            for backend in BOTH if scope == "both" else (scope,):
                expected[(name, backend)] = reason
    return expected


def _elem_types(model: onnx.ModelProto) -> set[int]:
    graph = model.graph
    types = {v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]}
    types |= {t.data_type for t in graph.initializer}
    for node in graph.node:
        for attr in node.attribute:
            if attr.name in ("to", "output_dtype", "dtype") and attr.type == attr.INT:
                types.add(attr.i)
            if attr.type == attr.TENSOR:
                types.add(attr.t.data_type)
    return types


def _is_plain_array(value) -> bool:
    """A numeric tensor (numpy scalars count: the suite stores 0-d values that way)."""
    if not isinstance(value, (np.ndarray, np.generic)):
        return False
    return value.dtype != object and value.dtype.kind not in "US"


def exclusion(case: NodeCase, model: onnx.ModelProto, backend: str) -> str | None:
    """Why this case does not count for this backend (the suite's exclusion rules), or None."""
    ops = {n.op_type for n in model.graph.node}
    domains = {n.domain for n in model.graph.node}
    typed = [*model.graph.input, *model.graph.output]
    if any(v.type.WhichOneof("value") in ("optional_type", "sequence_type", "map_type")
           for v in typed):
        return "sequence, optional or map inputs/outputs"
    if not all(_is_plain_array(v) for v in case.inputs + case.outputs):
        if any(isinstance(v, (list, dict)) or v is None for v in case.inputs + case.outputs):
            return "sequence, optional or map inputs/outputs"
        return "string tensors"
    if "ai.onnx.ml" in domains:
        return "ai.onnx.ml domain"
    if ops & TRAINING_OPS or "ai.onnx.preview.training" in domains:
        return "training-only op"
    if ops & STRING_OPS:
        return "string op"
    if backend != "tf" and _elem_types(model) & NO_TFLITE_TYPE:
        return "dtype with no TFLite tensor type"
    return None


def op_type_of(case: NodeCase, model: onnx.ModelProto, by_name: dict[str, str]) -> str:
    base = case.name.split("_expanded")[0]
    if base in by_name:
        return by_name[base]
    ops = [n.op_type for n in model.graph.node]
    return ops[0] if len(ops) == 1 else "(function)"


CASES = load_cases()
EXPECTED = read_expectations()
SINGLE_OP = {}
for _case in CASES:
    _nodes = _case.model.graph.node
    if len(_nodes) == 1:
        SINGLE_OP[_case.name] = _nodes[0].op_type


def compare(case: NodeCase, model: onnx.ModelProto, actual: list, random_values: bool) -> None:
    assert len(actual) == len(case.outputs), f"{len(actual)} outputs, expected {len(case.outputs)}"
    for i, (got, want) in enumerate(zip(actual, case.outputs)):
        got, want = np.asarray(got), np.asarray(want)
        assert got.shape == want.shape, f"output {i}: shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"output {i}: dtype {got.dtype} != {want.dtype}"
        if random_values:
            continue  # random ops: shape and dtype only
        if want.dtype.kind in "fc":
            np.testing.assert_allclose(
                got.astype(np.float64), want.astype(np.float64), rtol=case.rtol, atol=case.atol,
                err_msg=f"output {i}",
            )
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"output {i}")


def draws_random_values(case: NodeCase, model: onnx.ModelProto) -> bool:
    """Random ops, and Dropout in training mode with a non-zero ratio, cannot match values."""
    if {n.op_type for n in model.graph.node} & RANDOM_OPS:
        return True
    fed = dict(zip([i.name for i in model.graph.input], case.inputs))
    for node in model.graph.node:
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            training = fed.get(node.input[2])
            ratio = fed.get(node.input[1], 0.5) if node.input[1] else 0.5
            if training is not None and bool(training) and float(np.asarray(ratio)) != 0:
                return True
    return False


class NotDirect(Exception):
    """The direct writer does not cover the case (it goes through TF's converter)."""


def run_backend(converted, case: NodeCase, model: onnx.ModelProto, backend: str) -> None:
    from harness import tf_run, tflite_run

    feeds = {name: np.asarray(value) for name, value in zip(converted.graph.inputs, case.inputs)}
    if backend == "direct":
        actual = direct_run(converted, feeds)
    else:
        actual = tf_run(converted, feeds) if backend == "tf" else tflite_run(converted, feeds)
    compare(case, model, actual, draws_random_values(case, model))


def direct_run(converted, feeds: dict) -> list:
    """The direct writer's file of the case's plan, run like the TF route's file."""
    from dataclasses import replace

    from onnx2tf_alt.pipeline import Planned, float32_planned
    from onnx2tf_alt.tflite.direct import DirectResult, write_direct

    from harness import tflite_run

    planned = float32_planned(Planned(converted.graph, converted.plan, converted.model,
                                      converted.options))
    result = write_direct(planned.graph, planned.plan, planned.options)
    if not isinstance(result, DirectResult):
        raise NotDirect(str(result))
    direct = replace(converted, result=result, _tflite_result=result)
    return tflite_run(direct, feeds, result.content)


def short_reason(exc: Exception) -> str:
    """One line for expectations.txt: the failing op and the first line of the error."""
    failures = getattr(exc, "failures", None)
    if failures:
        first = failures[0]
        text = f"{first.op_type}: {first.reason}"
    else:
        text = f"{type(exc).__name__}: {str(exc).strip()}"
    line = " ".join(text.split())
    return line[:160]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node(case: NodeCase, record_property):
    from onnx2tf_alt.pipeline import build

    model = case.model
    record_property("op_type", op_type_of(case, model, SINGLE_OP))
    outcomes, problems = {}, []
    converted, conversion_error = None, None
    for backend in BACKENDS:
        reason = exclusion(case, model, backend)
        if reason:
            outcomes[backend] = "excluded"
            record_property(f"{backend}_excluded", reason)
            continue
        try:
            if converted is None and conversion_error is None:
                try:
                    converted = build(onnx_graph=model)
                except Exception as exc:  # noqa: BLE001 - a failing case, reported below
                    conversion_error = exc
            if conversion_error is not None:
                if backend == "direct":  # its plan is the build's: counted under TF's lines
                    raise NotDirect("the conversion failed")
                raise conversion_error
            run_backend(converted, case, model, backend)
            ok, message = True, ""
        except NotDirect as why:
            outcomes[backend] = "excluded"
            record_property(f"{backend}_excluded", f"not covered: {why}"[:160])
            continue
        except Exception as exc:  # noqa: BLE001 - outcome decided against expectations
            ok, message = False, f"{type(exc).__name__}: {str(exc)[:400]}"
            record_property(f"{backend}_reason", short_reason(exc))
        listed = EXPECTED.get((case.name, backend))
        if ok and listed:
            outcomes[backend] = "fail"
            record_property(f"{backend}_now_passes", True)
            problems.append(f"{backend}: passes but is listed as failing ({listed}); remove it")
        elif ok:
            outcomes[backend] = "pass"
        elif listed:
            outcomes[backend] = "xfail"
        else:
            outcomes[backend] = "fail"
            problems.append(f"{backend}: {message}")
    for backend, outcome in outcomes.items():
        record_property(backend, outcome)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    if {outcomes.get(b) for b in BOTH} <= {"excluded", None}:
        pytest.skip(f"excluded: {exclusion(case, model, 'tf')}")
    if "xfail" in outcomes.values():
        pytest.xfail("; ".join(f"{b}: {EXPECTED[(case.name, b)]}" for b in outcomes
                               if outcomes[b] == "xfail"))
