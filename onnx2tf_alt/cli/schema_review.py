"""Why an older handler is still right for a newer ONNX schema version of its op.

A handler registered `since=N` serves every opset from N until the next registration of
the op, so each schema version of a supported op that has no handler of its own needs a
reason here: the change between it and the previous schema version (attributes, inputs,
outputs, type constraints and text compared with `onnx.defs`, then read by hand) and why
the older handler already converts it. Changes a handler does not follow are listed too,
as GAP, with what changed. tests/cli/test_opset_coverage.py keeps this in step with the
installed onnx; `python -m onnx2tf_alt.cli.docs` prints it in docs/supported_ops.md.
"""

from __future__ import annotations

from typing import NamedTuple

TYPES = "types"  # only type constraints changed: behaviour for the existing types is the same
WORDING = "wording"  # text, examples or defaults spelled out; same meaning
LEGACY = "legacy"  # a legacy attribute dropped, its default behaviour kept
NEGATIVE_AXES = "negative axes"  # negative axes allowed; handlers normalise them at every opset
HANDLED = "handled"  # a new attribute/input/mode the older handler reads
GAP = "gap"  # changed behaviour the handler does not follow (yet)

KINDS = (TYPES, WORDING, LEGACY, NEGATIVE_AXES, HANDLED, GAP)


class Review(NamedTuple):
    kind: str  # one of KINDS
    note: str  # what changed against the previous schema version, and why the handler is right


# (domain, op, schema version) -> its review.
REVIEWED: dict[tuple[str, str, int], Review] = {
    ("", "Abs", 6): Review(
        LEGACY,
        "consumed_inputs (a legacy in-place memory hint) dropped; integer types added"
    ),
    ("", "Abs", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "Acos", 22): Review(TYPES, "adds bfloat16"),
    ("", "Acosh", 22): Review(TYPES, "adds bfloat16"),
    ("", "Add", 6): Review(LEGACY, "consumed_inputs dropped; int32, int64, uint32, uint64 added"),
    ("", "Add", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "Add", 13): Review(TYPES, "adds bfloat16"),
    ("", "Add", 14): Review(TYPES, "adds int8, int16, uint8, uint16"),
    ("", "And", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "ArgMax", 11): Review(
        NEGATIVE_AXES,
        "axis may be negative; ctx.axis normalises it at every opset"
    ),
    ("", "ArgMax", 12): Review(
        HANDLED,
        "select_last_index added (default 0 keeps the first index); the handler reads it "
        "(reverses the axis)"
    ),
    ("", "ArgMax", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "ArgMin", 11): Review(
        NEGATIVE_AXES,
        "axis may be negative; ctx.axis normalises it at every opset"
    ),
    ("", "ArgMin", 12): Review(
        HANDLED,
        "select_last_index added (default 0 keeps the first index); the handler reads it "
        "(reverses the axis)"
    ),
    ("", "ArgMin", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "Asin", 22): Review(TYPES, "adds bfloat16"),
    ("", "Asinh", 22): Review(TYPES, "adds bfloat16"),
    ("", "Atan", 22): Review(TYPES, "adds bfloat16"),
    ("", "Atanh", 22): Review(TYPES, "adds bfloat16"),
    ("", "Attention", 24): Review(
        HANDLED,
        "nonpad_kv_seqlen input (external KV cache) and a mask shorter than the key "
        "length added; the handler reads input 6 (padding mask and causal offset) and "
        "pads a short mask"
    ),
    ("", "Attention", 25): Review(
        HANDLED,
        "left_window_size/right_window_size added (default -1: no window); the handler "
        "applies them with the causal offset"
    ),
    ("", "AveragePool", 7): Review(
        HANDLED,
        "count_include_pad added (default 0 keeps excluding pads); the handler reads it"
    ),
    ("", "AveragePool", 10): Review(
        HANDLED,
        "ceil_mode added (default 0 keeps floor); the handler reads it"
    ),
    ("", "AveragePool", 11): Review(
        WORDING,
        "output-size formulas rewritten with dilations (still 1) and per ceil_mode; same "
        "results"
    ),
    ("", "AveragePool", 19): Review(HANDLED, "dilations added (default 1); the handler reads it"),
    ("", "AveragePool", 22): Review(
        TYPES,
        "adds bfloat16; the text now says a ceil_mode window starting in the end padding "
        "is dropped, which the handler already does (pool_output_size, as onnxruntime)"
    ),
    ("", "BatchNormalization", 9): Review(
        LEGACY,
        "spatial dropped (spatial=1 behaviour kept); the handler still reads spatial=0 "
        "parameters of shape C x D1 x ... at opsets 7-8"
    ),
    ("", "BatchNormalization", 14): Review(
        HANDLED,
        "training_mode added (default 0: inference as before) and the saved-statistics "
        "outputs dropped; the handler implements training_mode=1"
    ),
    ("", "BatchNormalization", 15): Review(
        TYPES,
        "scale/bias (T1) and mean/var (T2) may differ in type from X; the handler casts "
        "parameters to X's type"
    ),
    ("", "Bernoulli", 22): Review(TYPES, "adds bfloat16"),
    ("", "BitShift", 28): Review(
        TYPES,
        "adds signed integers (right shift is arithmetic) and defines shift amounts "
        "outside [0, bits) as the sign fill; the handler implements both"
    ),
    ("", "Cast", 6): Review(
        HANDLED,
        "to became a TensorProto type number instead of a type name; the handler reads "
        "the number (the name form of opsets 1-5 is a gap, see LEGACY_GAPS)"
    ),
    ("", "Cast", 9): Review(TYPES, "adds string (the handler rejects strings, see its limits)"),
    ("", "Cast", 13): Review(
        TYPES,
        "adds bfloat16; the text spells out conversions between numeric types "
        "(out-of-range float to integer undefined, integers keep the low bits), which "
        "were unspecified before"
    ),
    ("", "Cast", 19): Review(
        TYPES,
        "adds float8 types and saturate (only for float8 targets, which the handler "
        "rejects)"
    ),
    ("", "Cast", 21): Review(TYPES, "adds int4, uint4"),
    ("", "Cast", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Cast", 24): Review(
        TYPES,
        "adds float8e8m0 and round_mode (only for float8e8m0 targets, which the handler "
        "rejects)"
    ),
    ("", "Cast", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Cast", 28): Review(TYPES, "adds float6e2m3, float6e3m2"),
    ("", "CastLike", 19): Review(
        TYPES,
        "adds float8 types and saturate (only for float8 targets, which the handler "
        "rejects)"
    ),
    ("", "CastLike", 21): Review(TYPES, "adds int4, uint4"),
    ("", "CastLike", 23): Review(TYPES, "adds float4e2m1"),
    ("", "CastLike", 24): Review(
        TYPES,
        "adds float8e8m0 and round_mode (only for float8e8m0 targets, which the handler "
        "rejects)"
    ),
    ("", "CastLike", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Ceil", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Ceil", 13): Review(
        TYPES,
        "adds bfloat16; the text adds that integral, signed-zero, NaN and infinite inputs "
        "are returned unchanged (ceil's usual definition)"
    ),
    ("", "Celu", 28): Review(
        TYPES,
        "adds bfloat16, double, float16 (its function body was redefined for them)"
    ),
    ("", "Clip", 6): Review(
        LEGACY,
        "consumed_inputs dropped; missing min/max now default to the lowest/highest "
        "float, which is what 'no bound' already meant (the handler skips the bound)"
    ),
    ("", "Clip", 12): Review(
        TYPES,
        "adds int16, int32, int64, int8, uint16, uint32, uint64, uint8"
    ),
    ("", "Clip", 13): Review(
        TYPES,
        "adds bfloat16; the text defines min > max as max (Min(max, Max(x, min))), which "
        "_clip already computes"
    ),
    ("", "Compress", 11): Review(
        NEGATIVE_AXES,
        "axis may be negative; ctx.axis normalises it at every opset"
    ),
    ("", "Compress", 28): Review(TYPES, "adds bfloat16"),
    ("", "Concat", 4): Review(
        HANDLED,
        "axis became required (opsets 1-3: default 1); the handler defaults to 1"
    ),
    ("", "Concat", 11): Review(
        NEGATIVE_AXES,
        "axis may be negative; ctx.axis normalises it at every opset"
    ),
    ("", "Concat", 13): Review(TYPES, "adds bfloat16"),
    ("", "Constant", 9): Review(
        TYPES,
        "adds bool, complex128, complex64, int16, int32, int64, int8, string, uint16, "
        "uint32, uint64, uint8"
    ),
    ("", "Constant", 11): Review(
        HANDLED,
        "value became optional beside the new sparse_value, which the handler rejects "
        "(see its limits)"
    ),
    ("", "Constant", 12): Review(
        HANDLED,
        "value_float(s), value_int(s), value_string(s) added; the handler reads the "
        "numeric ones (strings: see its limits)"
    ),
    ("", "Constant", 13): Review(TYPES, "adds bfloat16"),
    ("", "Constant", 19): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz"
    ),
    ("", "Constant", 21): Review(TYPES, "adds int4, uint4"),
    ("", "Constant", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Constant", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Constant", 25): Review(TYPES, "adds int2, uint2"),
    ("", "ConstantOfShape", 20): Review(
        TYPES,
        "adds bfloat16, float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz"
    ),
    ("", "ConstantOfShape", 21): Review(TYPES, "adds int4, uint4"),
    ("", "ConstantOfShape", 23): Review(TYPES, "adds float4e2m1"),
    ("", "ConstantOfShape", 24): Review(TYPES, "adds float8e8m0"),
    ("", "ConstantOfShape", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Conv", 11): Review(
        WORDING,
        "auto_pad SAME is now written as output = ceil(input / stride), stride/dilation "
        "defaults spelled out; same meaning"
    ),
    ("", "Conv", 22): Review(TYPES, "adds bfloat16"),
    ("", "ConvTranspose", 11): Review(
        WORDING,
        "the pads formula for SAME_UPPER/SAME_LOWER was corrected to agree with the "
        "auto_pad description (odd pad at the end for SAME_UPPER), which the handler "
        "follows at every opset, as onnxruntime does"
    ),
    ("", "ConvTranspose", 22): Review(TYPES, "adds bfloat16"),
    ("", "Cos", 22): Review(TYPES, "adds bfloat16"),
    ("", "Cosh", 22): Review(TYPES, "adds bfloat16"),
    ("", "CumSum", 14): Review(TYPES, "adds bfloat16, float16"),
    ("", "DeformConv", 22): Review(TYPES, "adds bfloat16"),
    ("", "DepthToSpace", 11): Review(
        HANDLED,
        "mode added (default DCR, the opset-1 order); the handler reads it"
    ),
    ("", "DepthToSpace", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "DepthToSpace", 28): Review(
        WORDING,
        "only a function body was added; attributes, inputs and text unchanged"
    ),
    ("", "DequantizeLinear", 13): Review(
        HANDLED,
        "per-axis scale/zero point and axis added (a scalar keeps per-tensor); the "
        "handler reads axis"
    ),
    ("", "DequantizeLinear", 19): Review(
        TYPES,
        "adds float8 inputs and float16/bfloat16 scales (the output takes the scale's "
        "type, which the builder casts to)"
    ),
    ("", "DequantizeLinear", 21): Review(
        HANDLED,
        "block_size added (default 0: per-tensor/per-axis); the handler implements "
        "blocked scales; int4/uint4 inputs are rejected (see its limits)"
    ),
    ("", "DequantizeLinear", 23): Review(
        HANDLED,
        "output_dtype added (default: the scale's type); the builder casts the float32 "
        "result to the ONNX output type"
    ),
    ("", "DequantizeLinear", 24): Review(TYPES, "adds float8e8m0"),
    ("", "DequantizeLinear", 25): Review(TYPES, "adds int2, uint2"),
    ("", "DequantizeLinear", 28): Review(TYPES, "adds float6e2m3, float6e3m2"),
    ("", "Det", 22): Review(TYPES, "adds bfloat16"),
    ("", "Div", 6): Review(
        LEGACY,
        "consumed_inputs dropped; integer types added (truncating division, as the "
        "handler does)"
    ),
    ("", "Div", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "Div", 13): Review(TYPES, "adds bfloat16"),
    ("", "Div", 14): Review(TYPES, "adds int8, int16, uint8, uint16"),
    ("", "Dropout", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Dropout", 7): Review(
        LEGACY,
        "is_test dropped: test or training mode became the runtime's choice; the handler "
        "converts inference (identity)"
    ),
    ("", "Dropout", 10): Review(
        TYPES,
        "the mask output became bool (was T); the builder casts the handler's mask to the "
        "ONNX type"
    ),
    ("", "Dropout", 13): Review(TYPES, "adds bfloat16"),
    ("", "Dropout", 22): Review(
        TYPES,
        "adds float8 types and bfloat16 masks; the ratio text drops 'not set' (the "
        "default 0.5 applies), inference is still the identity"
    ),
    ("", "Einsum", 28): Review(TYPES, "adds bfloat16"),
    ("", "Elu", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Elu", 22): Review(TYPES, "adds bfloat16"),
    ("", "Equal", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "Equal", 11): Review(
        TYPES,
        "adds double, float, float16, int16, int8, uint16, uint32, uint64, uint8"
    ),
    ("", "Equal", 13): Review(TYPES, "adds bfloat16"),
    ("", "Equal", 19): Review(TYPES, "adds string"),
    ("", "Erf", 13): Review(
        TYPES,
        "adds bfloat16; drops int16, int32, int64, int8, uint16, uint32, uint64, uint8"
    ),
    ("", "Exp", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Exp", 13): Review(TYPES, "adds bfloat16"),
    ("", "Expand", 13): Review(TYPES, "adds bfloat16"),
    ("", "EyeLike", 22): Review(
        TYPES,
        "adds bfloat16; the dtype text drops a clause about a missing input"
    ),
    ("", "Flatten", 9): Review(
        TYPES,
        "adds bool, complex128, complex64, int16, int32, int64, int8, string, uint16, "
        "uint32, uint64, uint8"
    ),
    ("", "Flatten", 11): Review(
        NEGATIVE_AXES,
        "axis may be negative; the handler adds the rank at every opset"
    ),
    ("", "Flatten", 13): Review(TYPES, "adds bfloat16"),
    ("", "Flatten", 21): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz, int4, uint4"
    ),
    ("", "Flatten", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Flatten", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Flatten", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Floor", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Floor", 13): Review(
        TYPES,
        "adds bfloat16; the text adds that integral, signed-zero, NaN and infinite inputs "
        "are returned unchanged"
    ),
    ("", "GRU", 14): Review(
        HANDLED,
        "layout added (default 0: the opset-7 time-major shapes); the handler reads it"
    ),
    ("", "GRU", 22): Review(TYPES, "adds bfloat16"),
    ("", "Gather", 11): Review(
        NEGATIVE_AXES,
        "indices may be negative (in [-s, s-1]; a negative axis was already allowed); the "
        "handler normalises both at every opset"
    ),
    ("", "Gather", 13): Review(TYPES, "adds bfloat16; the text gains worked examples"),
    ("", "GatherElements", 13): Review(TYPES, "adds bfloat16"),
    ("", "GatherND", 12): Review(HANDLED, "batch_dims added (default 0); the handler reads it"),
    ("", "GatherND", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "Gemm", 6): Review(WORDING, "'can be inplace' dropped from C's description"),
    ("", "Gemm", 7): Review(
        LEGACY,
        "broadcast dropped: C is always unidirectionally broadcast, which the handler "
        "does"
    ),
    ("", "Gemm", 9): Review(TYPES, "adds int32, int64, uint32, uint64"),
    ("", "Gemm", 11): Review(
        HANDLED,
        "C became optional (a missing C is 0); the handler skips it when absent"
    ),
    ("", "Gemm", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "GlobalAveragePool", 22): Review(TYPES, "adds bfloat16"),
    ("", "GlobalLpPool", 2): Review(
        WORDING,
        "p became an int (was a float, default 2 either way); the handler reads it as a "
        "float"
    ),
    ("", "GlobalLpPool", 22): Review(TYPES, "adds bfloat16"),
    ("", "GlobalMaxPool", 22): Review(TYPES, "adds bfloat16"),
    ("", "Greater", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "Greater", 9): Review(
        TYPES,
        "adds int16, int32, int64, int8, uint16, uint32, uint64, uint8"
    ),
    ("", "Greater", 13): Review(TYPES, "adds bfloat16"),
    ("", "GreaterOrEqual", 16): Review(TYPES, "adds bfloat16"),
    ("", "GridSample", 22): Review(TYPES, "adds bfloat16"),
    ("", "HardSigmoid", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "HardSigmoid", 22): Review(TYPES, "adds bfloat16"),
    ("", "HardSwish", 22): Review(TYPES, "adds bfloat16"),
    ("", "Hardmax", 11): Review(
        NEGATIVE_AXES,
        "axis may be negative; the handler takes it modulo the rank at every opset"
    ),
    ("", "Identity", 13): Review(TYPES, "adds bfloat16"),
    ("", "Identity", 14): Review(TYPES, "accepts sequences (V)"),
    ("", "Identity", 16): Review(TYPES, "adds sequence/optional types"),
    ("", "Identity", 19): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz"
    ),
    ("", "Identity", 21): Review(TYPES, "adds int4, uint4"),
    ("", "Identity", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Identity", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Identity", 25): Review(TYPES, "adds int2, uint2"),
    ("", "If", 11): Review(
        HANDLED,
        "the branches may produce different shapes; the handler's tf.cond accepts "
        "different dims of one rank (see its limits)"
    ),
    ("", "If", 13): Review(TYPES, "adds sequence/optional types"),
    ("", "If", 16): Review(TYPES, "adds bfloat16, sequence/optional types"),
    ("", "If", 19): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz, sequence/optional "
        "types"
    ),
    ("", "If", 21): Review(TYPES, "adds int4, uint4, sequence/optional types"),
    ("", "If", 23): Review(TYPES, "adds float4e2m1, sequence/optional types"),
    ("", "If", 24): Review(TYPES, "adds float8e8m0, sequence/optional types"),
    ("", "If", 25): Review(TYPES, "adds int2, uint2, sequence/optional types"),
    ("", "InstanceNormalization", 22): Review(TYPES, "adds bfloat16"),
    ("", "IsInf", 20): Review(
        TYPES,
        "adds bfloat16, float16, float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz"
    ),
    ("", "IsNaN", 13): Review(TYPES, "adds bfloat16"),
    ("", "IsNaN", 20): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz"
    ),
    ("", "LRN", 13): Review(TYPES, "adds bfloat16"),
    ("", "LSTM", 14): Review(
        HANDLED,
        "layout added (default 0: the opset-7 time-major shapes); the handler reads it"
    ),
    ("", "LSTM", 22): Review(TYPES, "adds bfloat16 (P's text fixes a typo)"),
    ("", "LeakyRelu", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "LeakyRelu", 16): Review(TYPES, "adds bfloat16 (function body added)"),
    ("", "Less", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "Less", 9): Review(TYPES, "adds int16, int32, int64, int8, uint16, uint32, uint64, uint8"),
    ("", "Less", 13): Review(TYPES, "adds bfloat16"),
    ("", "LessOrEqual", 16): Review(TYPES, "adds bfloat16"),
    ("", "Log", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Log", 13): Review(TYPES, "adds bfloat16"),
    ("", "LogSoftmax", 11): Review(
        NEGATIVE_AXES,
        "axis may be negative; the handler takes it modulo the rank at every opset"
    ),
    ("", "Loop", 11): Review(
        WORDING,
        "the example body is rewritten with _in/_out names; the semantics are unchanged"
    ),
    ("", "Loop", 13): Review(
        TYPES,
        "adds sequence types; the text says subgraph inputs/outputs match by order, as "
        "the handler binds them"
    ),
    ("", "Loop", 16): Review(TYPES, "adds bfloat16, sequence/optional types (text reworded)"),
    ("", "Loop", 19): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz, sequence/optional "
        "types"
    ),
    ("", "Loop", 21): Review(TYPES, "adds int4, uint4, sequence/optional types"),
    ("", "Loop", 23): Review(TYPES, "adds float4e2m1, sequence/optional types"),
    ("", "Loop", 24): Review(TYPES, "adds float8e8m0, sequence/optional types"),
    ("", "Loop", 25): Review(TYPES, "adds int2, uint2, sequence/optional types"),
    ("", "LpNormalization", 22): Review(TYPES, "adds bfloat16"),
    ("", "LpPool", 2): Review(
        WORDING,
        "p became an int (default 2 either way; read as a float) and kernel_shape "
        "required"
    ),
    ("", "LpPool", 11): Review(
        WORDING,
        "auto_pad and stride defaults described more precisely; same meaning"
    ),
    ("", "LpPool", 18): Review(
        HANDLED,
        "ceil_mode and dilations added (defaults 0 and 1); the handler's pooling window "
        "reads both"
    ),
    ("", "LpPool", 22): Review(TYPES, "adds bfloat16"),
    ("", "MatMul", 9): Review(TYPES, "adds int32, int64, uint32, uint64"),
    ("", "MatMul", 13): Review(TYPES, "adds bfloat16"),
    ("", "Max", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Max", 8): Review(
        HANDLED,
        "inputs broadcast NumPy-style (were same-shaped); the handler's fold broadcasts"
    ),
    ("", "Max", 12): Review(TYPES, "adds int16, int32, int64, int8, uint16, uint32, uint64, uint8"),
    ("", "Max", 13): Review(TYPES, "adds bfloat16"),
    ("", "MaxPool", 8): Review(
        HANDLED,
        "storage_order and the Indices output added; the handler implements both"
    ),
    ("", "MaxPool", 10): Review(
        HANDLED,
        "ceil_mode and dilations added (defaults 0 and 1); the handler reads both"
    ),
    ("", "MaxPool", 11): Review(WORDING, "stride and dilation defaults spelled out"),
    ("", "MaxPool", 12): Review(
        TYPES,
        "adds int8, uint8; the output-size text is rewritten (same formulas)"
    ),
    ("", "MaxPool", 22): Review(
        TYPES,
        "adds bfloat16; the text now says a ceil_mode window starting in the end padding "
        "is dropped, which the handler already does"
    ),
    ("", "MaxRoiPool", 22): Review(TYPES, "adds bfloat16"),
    ("", "MaxUnpool", 11): Review(WORDING, "stride default spelled out"),
    ("", "MaxUnpool", 22): Review(TYPES, "adds bfloat16"),
    ("", "Mean", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Mean", 8): Review(
        HANDLED,
        "inputs broadcast NumPy-style (were same-shaped); the handler's fold broadcasts"
    ),
    ("", "Mean", 13): Review(TYPES, "adds bfloat16"),
    ("", "MeanVarianceNormalization", 13): Review(TYPES, "adds bfloat16"),
    ("", "Min", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Min", 8): Review(
        HANDLED,
        "inputs broadcast NumPy-style (were same-shaped); the handler's fold broadcasts"
    ),
    ("", "Min", 12): Review(TYPES, "adds int16, int32, int64, int8, uint16, uint32, uint64, uint8"),
    ("", "Min", 13): Review(TYPES, "adds bfloat16"),
    ("", "Mish", 22): Review(TYPES, "adds bfloat16"),
    ("", "Mod", 13): Review(
        TYPES,
        "adds bfloat16; the text is rewritten (fmod=0 sign of the divisor, fmod=1 C "
        "fmod), same semantics"
    ),
    ("", "Mod", 28): Review(
        HANDLED,
        "fmod=0 is now defined for floats too (A - floor(A / B) * B, with special cases "
        "for zeros and infinities); the handler already uses tf.floormod for every type"
    ),
    ("", "Mul", 6): Review(LEGACY, "consumed_inputs dropped; int32, int64, uint32, uint64 added"),
    ("", "Mul", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "Mul", 13): Review(TYPES, "adds bfloat16"),
    ("", "Mul", 14): Review(TYPES, "adds int8, int16, uint8, uint16"),
    ("", "Neg", 6): Review(LEGACY, "consumed_inputs dropped; signed integer types added"),
    ("", "Neg", 13): Review(TYPES, "adds bfloat16"),
    ("", "NegativeLogLikelihoodLoss", 13): Review(
        WORDING,
        "no attribute, input or type change; the text differs only in formatting"
    ),
    ("", "NegativeLogLikelihoodLoss", 22): Review(TYPES, "adds bfloat16"),
    ("", "NonMaxSuppression", 11): Review(
        WORDING,
        "iou_threshold text says 'strictly greater than' suppresses, the meaning it had"
    ),
    ("", "NonZero", 13): Review(TYPES, "adds bfloat16"),
    ("", "OneHot", 11): Review(
        HANDLED,
        "axis and indices may be negative (indices in [-depth, depth-1]); the handler "
        "normalises both"
    ),
    ("", "OneHot", 28): Review(TYPES, "adds bfloat16"),
    ("", "OptionalGetElement", 18): Review(
        TYPES,
        "accepts a plain tensor or sequence (returned as is), which the handler does"
    ),
    ("", "OptionalGetElement", 28): Review(
        TYPES,
        "adds bfloat16, float4e2m1, float6e2m3, float6e3m2, float8e4m3fn, float8e4m3fnuz, "
        "float8e5m2, float8e5m2fnuz, float8e8m0, int2, int4, uint2, uint4, "
        "sequence/optional types"
    ),
    ("", "OptionalHasElement", 18): Review(
        HANDLED,
        "the input became optional (missing: false); the handler returns whether it is "
        "present"
    ),
    ("", "OptionalHasElement", 28): Review(
        TYPES,
        "adds bfloat16, float4e2m1, float6e2m3, float6e3m2, float8e4m3fn, float8e4m3fnuz, "
        "float8e5m2, float8e5m2fnuz, float8e8m0, int2, int4, uint2, uint4, "
        "sequence/optional types"
    ),
    ("", "Or", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "PRelu", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "PRelu", 7): Review(
        HANDLED,
        "slope broadcasts unidirectionally to X (was size 1 or C); the handler broadcasts"
    ),
    ("", "PRelu", 9): Review(TYPES, "adds int32, int64, uint32, uint64"),
    ("", "PRelu", 16): Review(TYPES, "adds bfloat16 (function body added)"),
    ("", "Pad", 2): Review(HANDLED, "paddings renamed pads; the handler reads both names"),
    ("", "Pad", 13): Review(
        TYPES,
        "adds bfloat16, bool, complex, string; constant_value's default is 0, empty or "
        "False per type"
    ),
    ("", "Pad", 18): Review(
        HANDLED,
        "axes input added (default: every axis); the handler reads it"
    ),
    ("", "Pad", 19): Review(HANDLED, "wrap mode added; the handler implements it"),
    ("", "Pad", 21): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz, int4, uint4"
    ),
    ("", "Pad", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Pad", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Pad", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Pow", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "Pow", 12): Review(
        TYPES,
        "the exponent (T1) may differ in type from the base, integer types added; the "
        "handler casts the exponent to the base's type"
    ),
    ("", "Pow", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "Pow", 15): Review(TYPES, "adds bfloat16"),
    ("", "QLinearMatMul", 21): Review(TYPES, "adds float8 inputs and float16/bfloat16 scales"),
    ("", "QuantizeLinear", 13): Review(
        HANDLED,
        "per-axis scale/zero point and axis added (a scalar keeps per-tensor); the "
        "handler reads axis"
    ),
    ("", "QuantizeLinear", 19): Review(
        TYPES,
        "adds float16/bfloat16 inputs, float8 outputs and saturate (only for float8, "
        "which the handler rejects)"
    ),
    ("", "QuantizeLinear", 21): Review(
        HANDLED,
        "block_size and output_dtype added (defaults keep per-tensor/per-axis and the "
        "zero point's type); the handler implements blocked scales and takes the output "
        "type from ONNX inference"
    ),
    ("", "QuantizeLinear", 23): Review(
        GAP,
        "precision added: the division x / y_scale runs in the precision attribute's "
        "type, by default y_scale's type; the handler always divides in float32, so with "
        "float16/bfloat16 scales (or precision set) a quotient near a .5 rounding "
        "boundary can round differently. Fix: divide in the precision type (or y_scale's) "
        "when it is not float32"
    ),
    ("", "QuantizeLinear", 24): Review(TYPES, "adds float8e8m0 (text reworded)"),
    ("", "QuantizeLinear", 25): Review(TYPES, "adds int2, uint2 (text reworded)"),
    ("", "QuantizeLinear", 28): Review(
        TYPES,
        "adds float6e2m3, float6e3m2 outputs (saturate's text extended to them; the "
        "handler rejects float outputs)"
    ),
    ("", "RNN", 14): Review(
        HANDLED,
        "layout added (default 0: the opset-7 time-major shapes); the handler reads it"
    ),
    ("", "RNN", 22): Review(TYPES, "adds bfloat16"),
    ("", "RandomNormal", 22): Review(TYPES, "adds bfloat16"),
    ("", "RandomNormalLike", 22): Review(TYPES, "adds bfloat16"),
    ("", "RandomUniform", 22): Review(TYPES, "adds bfloat16"),
    ("", "RandomUniformLike", 22): Review(TYPES, "adds bfloat16"),
    ("", "Range", 27): Review(
        GAP,
        "stash_type added (default 1): float16/bfloat16 start, limit and delta are cast "
        "to float32, the range computed there and cast back. The handler ignores "
        "stash_type: with constant inputs it counts the elements in float16 arithmetic "
        "((limit - start) / delta, which can be off by one for long ranges) and computes "
        "the values in float64; at run time tf.range accumulates in float16/bfloat16 (the "
        "error stash_type avoids). Fix: when the inputs are float16/bfloat16 and "
        "stash_type is 1, compute in float32 (numpy and tf.range) and cast the result "
        "back"
    ),
    ("", "Reciprocal", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Reciprocal", 13): Review(TYPES, "adds bfloat16"),
    ("", "ReduceL1", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceL1", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "ReduceL2", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceL2", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "ReduceLogSum", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceLogSum", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "ReduceLogSum", 28): Review(TYPES, "drops int32, int64, uint32, uint64"),
    ("", "ReduceLogSumExp", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceLogSumExp", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "ReduceLogSumExp", 28): Review(TYPES, "drops int32, int64, uint32, uint64"),
    ("", "ReduceMax", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceMax", 12): Review(TYPES, "adds int8, uint8 (text reworded)"),
    ("", "ReduceMax", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "ReduceMax", 20): Review(TYPES, "adds bool (False < True)"),
    ("", "ReduceMean", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceMean", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "ReduceMin", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceMin", 12): Review(TYPES, "adds int8, uint8 (text reworded)"),
    ("", "ReduceMin", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "ReduceMin", 20): Review(TYPES, "adds bool (False < True)"),
    ("", "ReduceProd", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceProd", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "ReduceSum", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceSumSquare", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler takes them modulo the rank at every opset"
    ),
    ("", "ReduceSumSquare", 13): Review(TYPES, "adds bfloat16 (text reworded)"),
    ("", "Relu", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Relu", 13): Review(TYPES, "adds bfloat16"),
    ("", "Relu", 14): Review(TYPES, "adds signed integer types (function body added)"),
    ("", "Reshape", 13): Review(TYPES, "adds bfloat16"),
    ("", "Reshape", 14): Review(
        HANDLED,
        "allowzero added (default 0: a 0 copies the input dim); the handler reads it"
    ),
    ("", "Reshape", 19): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz"
    ),
    ("", "Reshape", 21): Review(TYPES, "adds int4, uint4"),
    ("", "Reshape", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Reshape", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Reshape", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Resize", 11): Review(
        HANDLED,
        "coordinate_transformation_mode, cubic_coeff_a, exclude_outside, "
        "extrapolation_value, nearest_mode, roi and sizes added; the handler reads them "
        "from opset 11 on (opset 10: asymmetric, simple nearest)"
    ),
    ("", "Resize", 13): Review(
        HANDLED,
        "roi and scales became optional, tf_half_pixel_for_nn dropped; the handler treats "
        "a missing input as empty"
    ),
    ("", "Resize", 18): Review(
        HANDLED,
        "antialias, axes and keep_aspect_ratio_policy added (defaults keep the opset-13 "
        "meaning); the handler reads all three from opset 18 on"
    ),
    ("", "Resize", 19): Review(
        HANDLED,
        "half_pixel_symmetric mode added; the handler implements it"
    ),
    ("", "ReverseSequence", 28): Review(TYPES, "adds bfloat16"),
    ("", "RoiAlign", 22): Review(TYPES, "adds bfloat16"),
    ("", "Round", 22): Review(TYPES, "adds bfloat16"),
    ("", "Scan", 11): Review(
        NEGATIVE_AXES,
        "scan_input_axes/scan_output_axes may be negative; the handler takes them modulo "
        "the rank"
    ),
    ("", "Scan", 16): Review(TYPES, "adds bfloat16"),
    ("", "Scan", 19): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz"
    ),
    ("", "Scan", 21): Review(TYPES, "adds int4, uint4"),
    ("", "Scan", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Scan", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Scan", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Scatter", 11): Review(
        WORDING,
        "deprecated in favour of ScatterElements; the text says indices may be negative, "
        "which the handler (ScatterElements' code) normalises"
    ),
    ("", "ScatterElements", 13): Review(TYPES, "adds bfloat16"),
    ("", "ScatterElements", 16): Review(
        HANDLED,
        "reduction added (default none); the handler implements add and mul"
    ),
    ("", "ScatterElements", 18): Review(
        HANDLED,
        "reduction max and min added; the handler implements them"
    ),
    ("", "ScatterND", 13): Review(TYPES, "adds bfloat16"),
    ("", "ScatterND", 16): Review(
        HANDLED,
        "reduction added (default none); the handler implements add and mul"
    ),
    ("", "ScatterND", 18): Review(
        HANDLED,
        "reduction max and min added; the handler implements them"
    ),
    ("", "Selu", 6): Review(
        LEGACY,
        "consumed_inputs dropped; the alpha/gamma defaults gained digits (1.67326319..., "
        "1.05070102...), the values the handler uses (the shorter opset-1 defaults are a "
        "gap, see LEGACY_GAPS)"
    ),
    ("", "Selu", 22): Review(TYPES, "adds bfloat16"),
    ("", "Shape", 13): Review(TYPES, "adds bfloat16"),
    ("", "Shape", 15): Review(
        HANDLED,
        "start and end added (defaults: the whole shape); the handler reads them"
    ),
    ("", "Shape", 19): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz"
    ),
    ("", "Shape", 21): Review(TYPES, "adds int4, uint4"),
    ("", "Shape", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Shape", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Shape", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Sigmoid", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Sigmoid", 13): Review(TYPES, "adds bfloat16"),
    ("", "Sign", 13): Review(TYPES, "adds bfloat16"),
    ("", "Sin", 22): Review(TYPES, "adds bfloat16"),
    ("", "Sinh", 22): Review(TYPES, "adds bfloat16"),
    ("", "Size", 13): Review(TYPES, "adds bfloat16"),
    ("", "Size", 19): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz"
    ),
    ("", "Size", 21): Review(TYPES, "adds int4, uint4"),
    ("", "Size", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Size", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Size", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Slice", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative and the text describes negative steps (already allowed at "
        "10); the handler normalises axes"
    ),
    ("", "Slice", 13): Review(TYPES, "adds bfloat16; the text says a repeated axis is undefined"),
    ("", "Softmax", 11): Review(
        NEGATIVE_AXES,
        "axis may be negative; the handler takes it modulo the rank at every opset"
    ),
    ("", "SoftmaxCrossEntropyLoss", 13): Review(TYPES, "adds bfloat16"),
    ("", "Softplus", 22): Review(TYPES, "adds bfloat16"),
    ("", "Softsign", 22): Review(TYPES, "adds bfloat16"),
    ("", "SpaceToDepth", 13): Review(TYPES, "adds bfloat16"),
    ("", "SpaceToDepth", 28): Review(
        HANDLED,
        "mode added (default DCR, the earlier order); the handler reads it"
    ),
    ("", "Split", 2): Review(
        HANDLED,
        "the optional split input was dropped (the split attribute stays) and axis got "
        "default 0; the handler reads the attribute, else input 1, and defaults axis to 0"
    ),
    ("", "Split", 11): Review(
        NEGATIVE_AXES,
        "axis may be negative; the handler takes it modulo the rank at every opset"
    ),
    ("", "Split", 13): Review(
        HANDLED,
        "split moved from attribute to optional input; the handler reads the attribute, "
        "else input 1"
    ),
    ("", "Split", 18): Review(
        HANDLED,
        "num_outputs added (uneven last chunk); the handler reads it"
    ),
    ("", "Sqrt", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Sqrt", 13): Review(TYPES, "adds bfloat16"),
    ("", "Squeeze", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative; the handler normalises them at every opset"
    ),
    ("", "Squeeze", 13): Review(
        HANDLED,
        "axes moved from attribute to optional input; the handler reads the attribute, "
        "else input 1"
    ),
    ("", "Squeeze", 21): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz, int4, uint4"
    ),
    ("", "Squeeze", 23): Review(TYPES, "adds float4e2m1 (axes' text now says 1-D tensor)"),
    ("", "Squeeze", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Squeeze", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Sub", 6): Review(LEGACY, "consumed_inputs dropped; int32, int64, uint32, uint64 added"),
    ("", "Sub", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
    ("", "Sub", 13): Review(TYPES, "adds bfloat16"),
    ("", "Sub", 14): Review(TYPES, "adds int8, int16, uint8, uint16"),
    ("", "Sum", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Sum", 8): Review(
        HANDLED,
        "inputs broadcast NumPy-style (were same-shaped); the handler's fold broadcasts"
    ),
    ("", "Sum", 13): Review(TYPES, "adds bfloat16"),
    ("", "Tan", 22): Review(TYPES, "adds bfloat16"),
    ("", "Tanh", 6): Review(LEGACY, "consumed_inputs dropped"),
    ("", "Tanh", 13): Review(TYPES, "adds bfloat16"),
    ("", "ThresholdedRelu", 22): Review(TYPES, "adds bfloat16"),
    ("", "Tile", 13): Review(TYPES, "adds bfloat16"),
    ("", "TopK", 11): Review(
        HANDLED,
        "sorted and largest added (defaults 1), axis may be negative, integer types "
        "added; the handler reads largest, normalises axis and always sorts (sorted=0 "
        "leaves the order free)"
    ),
    ("", "TopK", 24): Review(TYPES, "adds bfloat16"),
    ("", "Transpose", 13): Review(TYPES, "adds bfloat16"),
    ("", "Transpose", 21): Review(
        TYPES,
        "adds float8 and 4-bit types (perm's length must equal the rank)"
    ),
    ("", "Transpose", 23): Review(TYPES, "adds float4e2m1"),
    ("", "Transpose", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Transpose", 25): Review(TYPES, "adds int2, uint2 (perm text unchanged in meaning)"),
    ("", "Unique", 28): Review(TYPES, "adds bfloat16"),
    ("", "Unsqueeze", 11): Review(
        NEGATIVE_AXES,
        "axes may be negative (relative to the output rank); the handler normalises them"
    ),
    ("", "Unsqueeze", 13): Review(
        HANDLED,
        "axes moved from attribute to input; the handler reads the attribute, else input "
        "1"
    ),
    ("", "Unsqueeze", 21): Review(
        TYPES,
        "adds float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz, int4, uint4"
    ),
    ("", "Unsqueeze", 23): Review(TYPES, "adds float4e2m1 (axes' text now says 1-D tensor)"),
    ("", "Unsqueeze", 24): Review(TYPES, "adds float8e8m0"),
    ("", "Unsqueeze", 25): Review(TYPES, "adds int2, uint2"),
    ("", "Upsample", 9): Review(
        HANDLED,
        "scales moved from attribute to input; the handler reads the attribute, else "
        "input 1"
    ),
    ("", "Upsample", 10): Review(
        WORDING,
        "deprecated in favour of Resize; schema otherwise identical"
    ),
    ("", "Where", 16): Review(TYPES, "adds bfloat16"),
    ("", "Xor", 7): Review(
        LEGACY,
        "broadcast/axis dropped for NumPy-style broadcasting, which the handler "
        "implements"
    ),
}

# Semantics of schema versions that do have their own handler, which that handler does not
# follow: (domain, op, first opset affected) -> what differs. These are opsets before 7,
# which onnxruntime does not run for these ops either.
LEGACY_GAPS: dict[tuple[str, str, int], str] = {
    **{
        ("", op, 1): (
            "opsets 1-6: with broadcast=1 the legacy `axis` attribute aligns B with A from that "
            "axis; the handler ignores broadcast/axis and broadcasts NumPy-style (the same "
            "result only without axis). Fix: when opset < 7 and axis is set, reshape B to "
            "rank(A) with its dims starting at axis"
        )
        for op in ("Add", "And", "Div", "Equal", "Greater", "Less", "Mul", "Or", "Pow", "Sub",
                   "Xor")
    },
    ("", "Cast", 1): (
        "opsets 1-5: `to` is a type name string (e.g. 'FLOAT'); the handler passes it to "
        "onnx.helper.tensor_dtype_to_np_dtype, which needs the TensorProto number. Fix: map the "
        "name with onnx.TensorProto.DataType.Value when `to` is a string"
    ),
    ("", "Selu", 1): (
        "opsets 1-5: alpha and gamma default to 1.6732 and 1.0507; the handler uses the "
        "opset-6 defaults 1.67326319... and 1.05070102... (relative difference 4e-5). Fix: "
        "take the shorter defaults when ctx.opset < 6"
    ),
}


def review(domain: str, op_type: str, version: int) -> Review | None:
    """The review of schema `version` of an op that an older handler serves, else None."""
    return REVIEWED.get((domain, op_type, version))
