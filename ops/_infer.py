"""Shared output-type inference for ops ONNX shape inference does not know (other domains):
helpers for the `infer` functions of their handlers.

A type is (ONNX elem_type, dims); dims hold int, str or None.
"""

from __future__ import annotations

import onnx
from onnx import helper, shape_inference

_FLOAT = onnx.TensorProto.FLOAT
_SCHEMA_OPSET = 18  # the standard ops' schemas that the proxies are inferred with


def attrs_of(node) -> dict:
    """The node's attributes as a name -> value dict."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def plus(a, b):
    """a + b for dims that may be unknown (None or a symbol)."""
    return a + b if isinstance(a, int) and isinstance(b, int) else None


def dtype_of(i: int):
    """An elem type rule for `infer_as`: input i's."""
    return lambda types: types[i][0]


def infer_as(op_type: str, data_inputs, dtype):
    """`infer` giving the output types the standard `op_type` gives for the shapes of
    `data_inputs` (input indices, absent ones skipped in place; None: all inputs from the
    third on, in threes, as QLinearConcat), with the node's attributes that `op_type` knows
    (FusedConv is a Conv, ...) and elem type `dtype(types)`."""

    def infer(node, types):
        picked = data_inputs if data_inputs is not None else range(2, len(types), 3)
        present = [i < len(types) and types[i] is not None for i in picked]
        names = [f"in{k}" if there else "" for k, there in enumerate(present)]
        schema = onnx.defs.get_schema(op_type, _SCHEMA_OPSET)
        attrs = [a for a in node.attribute if a.name in schema.attributes]
        proxy = helper.make_node(op_type, names, [o or f"unused{j}" for j, o in
                                                  enumerate(node.output)])
        proxy.attribute.extend(attrs)
        feeds = {n: helper.make_tensor_type_proto(_FLOAT, types[i][1])
                 for n, i in zip(names, picked) if n}
        inferred = shape_inference.infer_node_outputs(schema, proxy, feeds)
        elem = dtype(types)
        return [_as_type(inferred.get(o), elem) if o else None for o in node.output]

    return infer


def _as_type(type_proto, elem: int):
    if type_proto is None or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or None
            for d in type_proto.tensor_type.shape.dim]
    return elem, dims


def infer_attention(node, types):
    """Output types of com.microsoft Attention (and of QAttention, whose inputs it reads)."""
    (dtype, x), (_, w) = types[0], types[1]
    heads = attrs_of(node)["num_heads"]
    sizes = attrs_of(node).get("qkv_hidden_sizes") or [w[1] // 3] * 3
    past_len = types[4][1][3] if len(types) > 4 and types[4] else 0
    present = (dtype, [2, x[0], heads, plus(past_len, x[1]), sizes[1] // heads])
    return [(dtype, [x[0], x[1], sizes[2]]), present]
