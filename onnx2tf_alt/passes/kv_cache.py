"""A decoder's growing KV cache as a cache of fixed capacity (issue 30).

An exported decoder (transformers / Optimum, torch.onnx) takes `past` keys and values and
returns `present = Concat(past, new, axis=sequence)`: one more position each step, so new
shapes and a re-allocation per token. `fixed_capacity` rewrites it so that every step has
the same shapes:

- each past input holds `capacity` positions (dim fixed), of which the caller marks the
  filled ones with 1 in the attention mask and the empty ones with 0;
- each present output returns only the `new` entries of this step; the caller writes them
  into its cache at the step's position (in place: a slice assignment into the interpreter's
  input tensor, no copy of the cache per step);
- inside the graph attention still reads Concat(past, new): the empty slots are masked out
  like padding, and the new positions keep their causal mask, so the outputs are those of
  the original graph for the same tokens (the order of the keys differs, so sums may differ
  in the last bits).

The attention mask then spans `capacity + sequence` positions, and position ids are the
caller's (the step's absolute positions). Pure ONNX: the rewritten model runs in
onnxruntime as well.

onnxruntime's model builder writes the cache differently: a com.microsoft
GroupQueryAttention takes the past and returns the present, and reads each row's filled
length from `seqlens_k` (the attention mask's sum - 1). Its present outputs are found
there; the node's rotary embedding moves out into RotaryEmbedding nodes at the rows'
positions (filled past + i), so that the rotated new keys are a tensor the present output
can return, and the attention itself is unchanged: it reads the capacity-long past, of
which the mask's filled prefix counts.

The capacity is checked first (check_capacity): no more than the positions the model can
place, and a cache that TFLite and this machine can hold.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnx2tf_alt.errors import InputError, UnsupportedFormError
from onnx2tf_alt.passes.graph_walk import (
    TABLE_CARRIERS,
    concat_of,
    constant_dims,
    slice_constants,
    small_constant,
    source_of,
    traced,
)
from onnx2tf_alt.passes.kv_check import check_rewrite
from onnx2tf_alt.passes.kv_mask import fit_mask_and_positions
from onnx2tf_alt.passes.prepare import symbol_value

ALL_SUFFIX = "/onnx2tf_alt_all_positions"
# TFLite's kernels count a tensor's elements and compute offsets in `int`
# (RuntimeShape::FlatSize and Offset, tensorflow/lite/kernels/internal/runtime_shape.h), so a
# tensor of 2^31 elements or more overflows them (XNNPACK counts in size_t; the int is the
# bound). A past input is one tensor: its capacity x per-position elements must stay below.
TFLITE_MAX_ELEMENTS = 2**31 - 1
# Context-length names (transformers' configs; onnxruntime-genai's context_length) that an
# exporter may copy into the model's metadata_props
POSITION_METADATA = ("max_position_embeddings", "n_positions", "n_ctx", "context_length",
                     "max_sequence_length", "max_seq_len", "seq_length")
# Ops that carry position ids unchanged in value (only shape or dtype changes), from a
# `position_ids` input or a Range to the Gather of a position table
_POSITION_CARRIERS = ("Identity", "Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten",
                      "Expand")


@dataclass(frozen=True)
class CacheEntry:
    """One past input and the present output that now returns only the new entries."""

    past: str
    present: str
    axis: int  # the sequence axis
    symbol: str  # the past input's symbolic length on that axis before the rewrite ("" if none)


def cache_entries(model: onnx.ModelProto) -> list[CacheEntry]:
    """The past/present pairs of `model`: a graph output made (through copies: Identity, a
    one-input Concat, a Cast to the type it has) by a two-input Concat whose first input is
    (through copies) a graph input, or a GroupQueryAttention's present key / value whose
    past is a graph input."""
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    producer = {out: node for node in graph.node for out in node.output}
    found = []
    types = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    for output in graph.output:
        source = source_of(producer, output.name)
        node = producer.get(source)
        if node is None:
            continue
        concat = concat_of(producer, output.name, types)
        if concat is not None:
            node = concat
        if _is_gqa(node) and source in node.output[1:3]:
            k = list(node.output).index(source)
            past = inputs.get(node.input[k + 2]) if len(node.input) > k + 2 else None
            if past is not None:
                dims = past.type.tensor_type.shape.dim
                found.append(CacheEntry(past.name, output.name, 2, dims[2].dim_param))
            continue
        if node.op_type != "Concat" or len(node.input) != 2:
            continue
        past = inputs.get(source_of(producer, node.input[0]))
        if past is None:
            continue
        dims = past.type.tensor_type.shape.dim
        axis = next(a.i for a in node.attribute if a.name == "axis")
        axis = axis + len(dims) if axis < 0 else axis
        found.append(CacheEntry(past.name, output.name, axis, dims[axis].dim_param))
    return found


def windowed_caches(model: onnx.ModelProto, capacity: int) -> int:
    """A sliding-window layer's cache as transformers 5's DynamicCache keeps it
    (DynamicSlidingWindowLayer, in a TorchScript export of a wrapper that rebuilds the
    cache): its present output is the last W - 1 positions of Concat(the past's last W - 1,
    new), each cut by a Slice from -(W - 1) to the end. With `capacity` <= W - 1 both Slices
    take everything (the past holds `capacity` positions, the present is made of the new
    entries only), so they become Identity and the cache is the one cache_entries reads;
    attention then sees the filled slots, which the window's mask of positions limits
    (kv_mask). A larger capacity would need the cache to slide: UnsupportedFormError.
    Modifies `model`; returns the number of caches so read."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    inputs = {i.name: i for i in graph.input}

    def window_cut(name: str) -> tuple[onnx.NodeProto, int, int] | None:
        """(the Slice, W - 1, axis) of a Slice of `name`'s producer from -(W - 1) to the end
        along one axis, step 1; else None."""
        node = producer.get(source_of(producer, name))
        if node is None or node.op_type != "Slice":
            return None
        starts, ends, axes, steps = slice_constants(graph, node)
        if (None in (starts, ends, axes) or steps != [1] or len(starts) != 1
                or starts[0] >= 0 or ends[0] < 2**31 - 1):
            return None
        return node, -int(starts[0]), int(axes[0])

    found = []
    for output in graph.output:
        outer = window_cut(output.name)
        concat = producer.get(outer[0].input[0]) if outer else None
        if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
            continue
        inner = window_cut(concat.input[0])
        axis = next((a.i for a in concat.attribute if a.name == "axis"), None)
        past = source_of(producer, inner[0].input[0]) if inner else None
        if inner is None or inner[1] != outer[1] or past not in inputs or axis is None:
            continue
        rank = len(inputs[past].type.tensor_type.shape.dim)
        if len({a % rank for a in (axis, inner[2], outer[2])}) != 1:
            continue
        found.append((output.name, outer, inner))
    for name, (outer, keep, _), (inner, _, _) in found:
        if capacity > keep:
            raise UnsupportedFormError(
                f"--kv_cache_capacity {capacity}: present output '{name}' keeps only the "
                f"last {keep} positions of its cache (a sliding-window layer's cache, as "
                f"transformers 5 keeps it: Slice '{outer.name or outer.output[0]}'), and a "
                f"cache of {capacity} fixed slots would have to slide. Use "
                f"--kv_cache_capacity {keep} or less, or export the decoder with a cache that "
                "keeps every position (transformers' DynamicCache() without config=, or "
                "Optimum's export).")
    for _, (outer, _, _), (inner, _, _) in found:
        for node in (outer, inner):
            del node.input[1:]
            node.op_type = "Identity"
    return len(found)


def take_cache_branch(model: onnx.ModelProto) -> str | None:
    """A merged decoder (Optimum's `decoder_model_merged.onnx`: an If on a boolean input,
    `use_cache_branch`, between the decoder with past and the one without) as its branch
    with past, which alone has a cache to fix (with an empty cache it computes the first
    step too): the input becomes a constant and the If is inlined (passes/control_flow.py).
    Modifies `model`; returns the input's name, or None when it has no such input. The
    branch with past is the one that reads more of the graph's inputs (the other reads no
    past)."""
    from onnx import numpy_helper

    from onnx2tf_alt.passes.control_flow import free_names, inline_control_flow

    graph = model.graph
    inputs = {i.name for i in graph.input}
    for value in graph.input:
        tensor = value.type.tensor_type
        ifs = [n for n in graph.node if n.op_type == "If" and n.input[0] == value.name]
        if tensor.elem_type != onnx.TensorProto.BOOL or not ifs or any(
                d.dim_value != 1 for d in tensor.shape.dim):
            continue
        branches = {a.name: a.g for a in ifs[0].attribute if a.name.endswith("_branch")}
        reads = {name: len(inputs & set(free_names(g))) for name, g in branches.items()}
        take = reads.get("then_branch", 0) >= reads.get("else_branch", 0)
        graph.input.remove(value)
        graph.initializer.append(numpy_helper.from_array(
            np.full([1] * len(tensor.shape.dim), take), value.name))
        inline_control_flow(model)
        _drop_placeholders(graph)
        return value.name
    return None


def _drop_placeholders(graph: onnx.GraphProto) -> None:
    """The outputs that the branch with past returns as an empty constant dropped: Optimum's
    merged encoder-decoders (T5, BART, Whisper) give each cross-attention cache, which the
    step does not change, as a [0, heads, 1, head size] placeholder there; the caller keeps
    the one the first step returned."""
    producer = {out: node for node in graph.node for out in node.output}
    empty = {t.name for t in graph.initializer if 0 in t.dims}
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None and 0 in value.dims:
            empty.add(node.output[0])
    for output in [o for o in graph.output if source_of(producer, o.name) in empty]:
        graph.output.remove(output)


def _is_gqa(node: onnx.NodeProto) -> bool:
    return node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft"




def check_total(model: onnx.ModelProto, entries: list[CacheEntry]) -> None:
    """UnsupportedFormError when a cache of `model` is left out of `entries`: a past input
    the rewrite would give the capacity without its present output, or a present output it
    would leave returning past and new positions. Every decode step after the first would
    then compute wrong tokens. A cache input is one named as a paired one with key and value
    swapped, or of its type and shape with the same symbol on the sequence axis; a cache
    output one named so, or of a paired output's type and shape, computed (not a copy of
    an input, as an encoder's cross-attention cache passed through)."""
    graph = model.graph
    declared = {v.name: v for v in [*graph.input, *graph.output]}
    initializers = {i.name for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    pasts, presents = {e.past for e in entries}, {e.present for e in entries}
    problems: dict[str, str] = {}  # by the cache's input or output
    for value in graph.output:
        source = source_of(producer, value.name)
        if value.name in presents or source not in producer:
            continue
        like = _like(entries, value, lambda e: e.present, declared)
        if like is not None:
            problems[value.name] = (
                f"present output '{value.name}' = {_describe(producer, value.name, declared)}, "
                f"not Concat(past input, new entries) on axis {like.axis} as '{like.present}'")
    for value in graph.input:
        if value.name in pasts or value.name in initializers:
            continue
        like = _like(entries, value, lambda e: e.past, declared, same_symbol=True)
        if like is not None and not any(f"'{value.name}'" in p for p in problems.values()):
            problems[value.name] = (f"past input '{value.name}' (as '{like.past}') reaches no "
                                    "present output as Concat(past, new entries)")
    if problems:
        raise UnsupportedFormError(
            f"--kv_cache_capacity: the rewrite does not recognise how this decoder computes "
            f"{len(problems)} of its caches, so it cannot give them a fixed capacity "
            "(converted anyway, every token after the first would be wrong):\n"
            + "".join(f"  - {p}\n" for p in problems.values())
            + "Export the decoder with each past concatenated to its new entries (as "
            "transformers / Optimum do), or drop --kv_cache_capacity (each step then takes "
            "and returns the whole cache).")


def _like(entries: list[CacheEntry], value: onnx.ValueInfoProto, tensor, declared: dict,
          same_symbol: bool = False) -> CacheEntry | None:
    """The entry whose `tensor(entry)` `value` is a cache like: named as it with key and value
    swapped, else of its type and shape (with `same_symbol`, the same symbol on the sequence
    axis too)."""
    for entry in entries:
        if _sibling(value.name, tensor(entry)):
            return entry
    for entry in entries:
        if _alike(value, declared[tensor(entry)], entry.axis) and (
                not same_symbol or _dim_at(value, entry.axis) == entry.symbol != ""):
            return entry
    return None





def _sibling(name: str, paired: str) -> bool:
    """Whether `name` is `paired` with its last "key" and "value" swapped."""
    for a, b in (("key", "value"), ("value", "key")):
        k = paired.rfind(a)
        if k >= 0 and name == paired[:k] + b + paired[k + len(a):]:
            return True
    return False


def _dim_at(value: onnx.ValueInfoProto, axis: int) -> str:
    dims = value.type.tensor_type.shape.dim
    return dims[axis].dim_param if axis < len(dims) else ""


def _alike(value: onnx.ValueInfoProto, paired: onnx.ValueInfoProto, axis: int) -> bool:
    """Whether `value` has the element type and rank of the cache tensor `paired`, its fixed
    dims off `axis` and none on it."""
    a, b = value.type.tensor_type, paired.type.tensor_type
    if a.elem_type != b.elem_type or len(a.shape.dim) != len(b.shape.dim) or not a.HasField(
            "shape"):
        return False
    for k, (x, y) in enumerate(zip(a.shape.dim, b.shape.dim)):
        if k == axis:
            if x.HasField("dim_value"):
                return False
        elif x.HasField("dim_value") != y.HasField("dim_value") or (
                x.HasField("dim_value") and x.dim_value != y.dim_value):
            return False
    return True


def _describe(producer: dict[str, onnx.NodeProto], name: str, graph_values,
              depth: int = 3) -> str:
    """How `name` is computed, a few ops deep: `Concat(Mul(past.0.key, …), …)`."""
    node = producer.get(name)
    if node is None or (name in graph_values and depth < 3):
        return f"'{name}'"
    if depth == 0:
        return f"{node.op_type}(…)"
    inner = [_describe(producer, i, graph_values, depth - 1) for i in node.input[:2] if i]
    more = ", …" if len([i for i in node.input if i]) > 2 else ""
    return f"{node.op_type}({', '.join(inner)}{more})"


def fixed_capacity(model: onnx.ModelProto, capacity: int) -> tuple[onnx.ModelProto,
                                                                    list[CacheEntry]]:
    """`model` (modified) with a cache of `capacity` positions (see the module docstring),
    and its past/present pairs. InputError when it has none, or when `capacity` is more
    than the model or the target can hold (check_capacity: before anything is built)."""
    if capacity < 1:
        raise InputError(f"--kv_cache_capacity must be at least 1 (got {capacity}).")
    take_cache_branch(model)
    original = onnx.ModelProto()  # for check_rewrite (weights on disk stay there); its
    original.CopyFrom(model)  # sliding layers' cuts kept (windowed_caches): as exported
    windowed_caches(model, capacity)
    entries = cache_entries(model)
    if not entries:
        raise InputError(
            "--kv_cache_capacity: the model has no KV cache to fix: no output is a Concat of a "
            "past input and new entries, nor a GroupQueryAttention's present (inputs: "
            f"{[i.name for i in model.graph.input]}). Export the decoder with past key/values "
            "(e.g. transformers / Optimum with use_cache), or drop the flag.")
    check_total(model, entries)
    check_capacity(model, entries, capacity)
    fit_mask_and_positions(model, entries, capacity)
    graph = model.graph
    totals = _total_symbols(graph, entries)
    producer = {out: node for node in graph.node for out in node.output}
    new_entries = {}
    attentions = {source_of(producer, e.present) for e in entries}
    for node in [n for n in graph.node if _is_gqa(n) and attentions & set(n.output)]:
        new_entries.update(_rotary_outside(graph, node))
    types = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    for entry in entries:
        source = source_of(producer, entry.present)
        node = producer[source]
        new = new_entries[source] if _is_gqa(node) else concat_of(
            producer, entry.present, types).input[1]
        rename_value(graph, entry.present, entry.present + ALL_SUFFIX)
        graph.node.append(helper.make_node("Identity", [new], [entry.present],
                                           name=f"{entry.present}/new_entries"))
        dims = next(i for i in graph.input if i.name == entry.past).type.tensor_type.shape.dim
        dims[entry.axis].Clear()
        dims[entry.axis].dim_value = capacity
        out = next(o for o in graph.output if o.name == entry.present)
        out.type.tensor_type.shape.dim[entry.axis].Clear()  # the step's length
    _substitute(graph, {e.symbol for e in entries if e.symbol}, capacity)
    for total, sequence in totals.items():
        _substitute_total(graph, total, f"{capacity} + {sequence}")
    _mask_over_the_cache(graph, capacity)
    check_rewrite(original, model, entries, capacity)
    return model, entries


@dataclass(frozen=True)
class PositionLimit:
    """The most positions a model can place, and where that was read."""

    positions: int
    source: str


def max_positions(model: onnx.ModelProto) -> PositionLimit | None:
    """The fewest positions any of these allows, or None when none is found: a context
    length in metadata_props (POSITION_METADATA); the rows of a rotary cos cache read by
    position (GroupQueryAttention with do_rotary, RotaryEmbedding); the rows of a constant
    table (a learned position embedding like GPT-2's `wpe`, or a precomputed cos / sin
    cache like older Llama exports) gathered at the position ids: a `position_ids` input,
    or a Range, through ops that only reshape or cast them."""
    found = []
    for prop in model.metadata_props:
        if prop.key in POSITION_METADATA and prop.value.strip().isdigit():
            found.append(PositionLimit(int(prop.value), f"metadata_props {prop.key} = "
                                                        f"{prop.value.strip()}"))
    graph = model.graph
    tables = constant_dims(graph)
    producer = {out: node for node in graph.node for out in node.output}
    inputs = {i.name for i in graph.input}
    for node in graph.node:
        where = f"{node.op_type} '{node.name or node.output[0]}'"
        cos = None
        if _is_gqa(node) and any(a.name == "do_rotary" and a.i for a in node.attribute):
            cos = node.input[7] if len(node.input) > 7 else ""
        elif node.op_type == "RotaryEmbedding" and node.domain == "com.microsoft":
            cos = node.input[2] if len(node.input) > 2 else ""
        elif node.op_type == "RotaryEmbedding" and len(node.input) > 3 and node.input[3]:
            cos = node.input[1]  # ai.onnx: [max positions, dim / 2] with position_ids
        if cos and len(tables.get(cos, [])) == 2:
            found.append(PositionLimit(tables[cos][0], f"the rows of the cos cache '{cos}' "
                                                       f"of {where}"))
        elif node.op_type == "Gather" and not any(a.name == "axis" and a.i
                                                  for a in node.attribute):
            table = traced(producer, node.input[0], TABLE_CARRIERS)
            dims = tables.get(table, [])
            while len(dims) > 2 and dims[0] == 1:  # [1, 1, positions, dim], squeezed
                dims = dims[1:]
            if len(dims) == 2 and _are_positions(producer, inputs, node.input[1]):
                found.append(PositionLimit(dims[0], f"the rows of the position table "
                                                    f"'{table}' that {where} reads"))
    return min(found, key=lambda limit: limit.positions, default=None)




def _are_positions(producer: dict[str, onnx.NodeProto], inputs: set[str], name: str) -> bool:
    source = traced(producer, name, _POSITION_CARRIERS)
    if source in inputs:
        return "position" in source.lower()
    return source in producer and producer[source].op_type == "Range"


def check_capacity(model: onnx.ModelProto, entries: list[CacheEntry], capacity: int) -> None:
    """InputError when a cache of `capacity` positions cannot work: more positions than the
    model places (max_positions), a past input over TFLite's TFLITE_MAX_ELEMENTS, or a cache
    larger than this machine's memory. A symbolic dim (the batch) counts as 1."""
    limit = max_positions(model)
    if limit is not None and capacity > limit.positions:
        raise InputError(
            f"--kv_cache_capacity {capacity} is more than the {limit.positions} positions the "
            f"model places ({limit.source}): it has nothing for a token at position "
            f"{limit.positions} or later. Pass --kv_cache_capacity {limit.positions} or less.")
    inputs = {i.name: i.type.tensor_type for i in model.graph.input}
    per_position = {}  # past input -> (elements, bytes) of one position
    for entry in entries:
        tensor = inputs[entry.past]
        dims = [d.dim_value or 1 for k, d in enumerate(tensor.shape.dim) if k != entry.axis]
        elements = int(np.prod(dims, dtype=np.int64))
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
        per_position[entry] = elements, elements * itemsize
    widest = max(entries, key=lambda e: per_position[e][0])
    elements, tensor_bytes = per_position[widest]
    total = sum(b for _, b in per_position.values())
    memory = physical_memory()
    fits = min(TFLITE_MAX_ELEMENTS // elements,
               memory // total if memory is not None else TFLITE_MAX_ELEMENTS)
    if capacity <= fits:
        return
    tensor = inputs[widest.past]
    shape = [d.dim_value or d.dim_param or "?" for d in tensor.shape.dim]
    shape[widest.axis] = capacity
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    over = []
    if capacity * elements > TFLITE_MAX_ELEMENTS:
        over.append(f"the 2^31 - 1 elements TFLite's kernels index in one tensor "
                    f"('{widest.past}' {shape} {dtype} would have {capacity * elements})")
    if memory is not None and capacity * total > memory:
        over.append(f"this machine's {_gb(memory)} of memory")
    symbolic = any(isinstance(d, str) for d in shape)
    known = (f"the model places {limit.positions} ({limit.source})" if limit is not None
             else "the model's max positions are unknown (its config's "
                  "max_position_embeddings says them)")
    raise InputError(
        f"--kv_cache_capacity {capacity} needs {_gb(capacity * tensor_bytes)} per past input "
        f"and {_gb(capacity * total)} for all {len(entries)}"
        f"{' (symbolic dims such as the batch counted as 1)' if symbolic else ''}: more than "
        f"{' and '.join(over)}.\n"
        f"Pass a smaller --kv_cache_capacity: at most {fits} positions fit; {known}.")


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f} GB"


def _total_symbols(graph: onnx.GraphProto, entries: list[CacheEntry]) -> dict[str, str]:
    """A present length named by its own symbol (the model builder's `total_sequence_length`,
    which the attention mask shares) -> the step's sequence symbol: the one symbol that the
    integer [batch, sequence] inputs (token and position ids) have on axis 1. Empty when
    that is not clear; the caller then gives the mask's shape."""
    outputs = {o.name: o for o in graph.output}
    pasts = {e.symbol for e in entries}
    totals = set()
    for entry in entries:
        dim = outputs[entry.present].type.tensor_type.shape.dim
        name = dim[entry.axis].dim_param if len(dim) > entry.axis else ""
        if name.isidentifier() and name not in pasts:
            totals.add(name)
    sequences = set()
    for info in graph.input:
        dims = info.type.tensor_type.shape.dim
        if (len(dims) == 2 and info.type.tensor_type.elem_type in _INTEGERS
                and dims[1].dim_param and dims[1].dim_param not in totals):
            sequences.add(dims[1].dim_param)
    return {t: next(iter(sequences)) for t in totals} if len(sequences) == 1 else {}


_INTEGERS = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)


def _mask_over_the_cache(graph: onnx.GraphProto, capacity: int) -> None:
    """An attention mask declared as long as the step (`[batch, sequence_length]`, as
    Optimum's merged decoders declare it for both branches) spans the cache and the step in
    the branch with past: its length becomes `capacity + sequence`, else a signature's
    shapes would give it the step's length and no cache slot could be masked. So does a
    mask whose length is a symbol of its own (torch.export names it `s41`: it has no Dim for
    past + sequence), which nothing else could give."""
    inputs = {i.name: i.type.tensor_type.shape.dim for i in graph.input}
    ids = inputs.get("input_ids")
    mask = inputs.get("attention_mask")
    if ids is None or mask is None or len(ids) != 2 or len(mask) != 2:
        return
    sequence, length = ids[1].dim_param, mask[1].dim_param
    elsewhere = {d.dim_param for v in [*graph.input, *graph.output] if v.name != "attention_mask"
                 for d in v.type.tensor_type.shape.dim}
    if sequence and (length == sequence or length.isidentifier() and length not in elsewhere):
        mask[1].dim_param = f"{capacity} + {sequence}"


def _substitute_total(graph: onnx.GraphProto, total: str, expression: str) -> None:
    for info in graph.input:
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param == total:
                dim.dim_param = expression


def _rotary_outside(graph: onnx.GraphProto, node: onnx.NodeProto) -> dict[str, str]:
    """GroupQueryAttention `node` rewritten to take its query, key and value separate and
    already rotated (RotaryEmbedding nodes at each row's positions: seqlens_k + 1 - S + i,
    or the node's position_ids), with do_rotary off; returns {its present key / value
    output: the new entries [B, Nkv, S, D] of this step}."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
    inputs = list(node.input) + [""] * (12 - len(node.input))
    base = node.name or node.output[0]
    added = []

    def add(op, ins, attributes=None, domain="", outs=1):
        names = [f"{base}/kv_cache/{op}_{len(added)}_{k}" for k in range(outs)]
        added.append(helper.make_node(op, ins, names, name=names[0], domain=domain,
                                      **(attributes or {})))
        return names[0] if outs == 1 else names

    def const(value, name):
        full = f"{base}/kv_cache/{name}"
        added.append(helper.make_node("Constant", [], [full], name=full,
                                      value=onnx.numpy_helper.from_array(value)))
        return full

    head = _head_size(graph, node, heads, kv_heads)
    q, k, v = inputs[0], inputs[1], inputs[2]
    zero, one = (const(np.array([i], np.int64), f"i{i}") for i in (0, 1))
    if not k:  # packed [B, S, (N + 2 Nkv) D]
        sizes = const(np.array([heads * head, kv_heads * head, kv_heads * head], np.int64),
                      "sizes")
        q, k, v = add("Split", [inputs[0], sizes], {"axis": -1}, outs=3)
    if attrs.get("do_rotary", 0):
        cos, sin = inputs[7], inputs[8]
        positions = inputs[9]
        if not positions:  # each row's filled past + 0 .. S - 1
            seq = add("Gather", [add("Shape", [inputs[0]]), one], {"axis": 0})
            filled = add("Sub", [add("Add", [add("Cast", [inputs[5]], {"to": 7}), one]), seq])
            steps = add("Range", [const(np.array(0, np.int64), "start"),
                                  add("Squeeze", [seq, zero]),
                                  const(np.array(1, np.int64), "step")])
            positions = add("Add", [add("Unsqueeze", [filled, one]),
                                    add("Unsqueeze", [steps, zero])])
        rotary = {"interleaved": attrs.get("rotary_interleaved", 0)}
        half = _dims(graph, cos)
        if half:
            rotary["rotary_embedding_dim"] = 2 * half[-1]
        q = add("RotaryEmbedding", [q, positions, cos, sin], {**rotary, "num_heads": heads},
                "com.microsoft")
        k = add("RotaryEmbedding", [k, positions, cos, sin], {**rotary, "num_heads": kv_heads},
                "com.microsoft")
    new_entries = {}
    split = const(np.array([0, 0, kv_heads, head], np.int64), "split")
    for x, present in ((k, node.output[1] if len(node.output) > 1 else ""),
                       (v, node.output[2] if len(node.output) > 2 else "")):
        if present:
            new_entries[present] = add("Transpose", [add("Reshape", [x, split])],
                                       {"perm": [0, 2, 1, 3]})
    inputs[:3] = [q, k, v]
    inputs[7:10] = ["", "", ""]
    while inputs and not inputs[-1]:
        inputs.pop()
    del node.input[:]
    node.input.extend(inputs)
    for a in node.attribute:
        if a.name == "do_rotary":
            a.i = 0
    position = list(graph.node).index(node)
    for offset, extra in enumerate(added):
        graph.node.insert(position + offset, extra)
    return new_entries


def _head_size(graph: onnx.GraphProto, node: onnx.NodeProto, heads: int, kv_heads: int) -> int:
    """The attention's head size: the past's last dim when static (else fixed to it in the
    inputs and outputs), or the width of the projection that makes the query (a MatMul or
    Gemm of a stored weight, or a MatMulNBits, through Add / Identity / Cast) over the
    heads it holds. InputError when neither tells."""
    past = next((i for i in graph.input if i.name == node.input[3]), None)
    dims = past.type.tensor_type.shape.dim if past is not None else []
    if len(dims) == 4 and dims[3].HasField("dim_value"):
        return dims[3].dim_value
    packed = len(node.input) < 2 or not node.input[1]
    parts = heads + 2 * kv_heads if packed else heads
    producer = {out: n for n in graph.node for out in n.output}
    width, name = None, node.input[0]
    while width is None and name in producer:
        made = producer[name]
        if made.op_type == "MatMulNBits":
            width = next(a.i for a in made.attribute if a.name == "N")
        elif made.op_type in ("MatMul", "Gemm"):
            weight = _dims(graph, made.input[1])
            transposed = any(a.name == "transB" and a.i for a in made.attribute)
            width = weight[0 if transposed else -1] if weight else None
            break
        elif made.op_type in ("Reshape", "Split"):  # [.., width] or one part of a split
            sizes = small_constant(graph, made.input[1]) if len(made.input) > 1 else None
            if made.op_type == "Split" and sizes is None:
                sizes = next((list(a.ints) for a in made.attribute if a.name == "split"), None)
            at = -1 if made.op_type == "Reshape" else list(made.output).index(name)
            if sizes is not None and -len(sizes) <= at < len(sizes) and sizes[at] > 0:
                width = int(sizes[at])
            break
        elif made.op_type in ("Add", "Identity", "Cast", "SimplifiedLayerNormalization",
                              "LayerNormalization"):
            name = made.input[0]
        else:
            break
    if width is None or width % parts:
        raise InputError(
            f"--kv_cache_capacity: the head size of GroupQueryAttention '{node.name}' is not "
            f"known: its past input '{node.input[3]}' has a symbolic last dim and its query "
            "does not come from a stored projection. Give the past's shape with -ois / "
            "--signature (batch, kv heads, capacity, head size).")
    head = width // parts
    for info in (*graph.input, *graph.output):
        shape = info.type.tensor_type.shape.dim
        mine = info.name in node.input[3:5] or info.name in node.output[1:3]
        if mine and len(shape) == 4 and not shape[3].HasField("dim_value"):
            shape[3].Clear()
            shape[3].dim_value = head
    return head


def _dims(graph: onnx.GraphProto, name: str) -> list[int]:
    """An initializer's dims (its data need not be loaded), else []."""
    for init in graph.initializer:
        if init.name == name:
            return list(init.dims)
    return []


def _substitute(graph: onnx.GraphProto, symbols: set[str], capacity: int) -> None:
    """The past length's symbols replaced by `capacity` in every input's dims: the attention
    mask's `past_sequence + sequence` becomes `256 + sequence`, which -ois / --signature
    shapes then resolve (passes/prepare.set_input_shapes)."""
    for info in graph.input:
        for dim in info.type.tensor_type.shape.dim:
            if not dim.HasField("dim_param"):
                continue
            try:
                tree = ast.parse(dim.dim_param, mode="eval")
            except SyntaxError:
                continue
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            if not names & symbols:
                continue
            value = symbol_value(dim.dim_param, dict.fromkeys(symbols, capacity))
            if value is not None:
                dim.Clear()
                dim.dim_value = value
                continue
            for node in ast.walk(tree):
                for field, child in ast.iter_fields(node):
                    if isinstance(child, ast.Name) and child.id in symbols:
                        setattr(node, field, ast.Constant(capacity))
            dim.dim_param = ast.unparse(tree)


def rename_value(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every node's reference to tensor `old` (as output or input) now names `new`; the graph
    output named `old` is left for its new producer."""
    for node in graph.node:
        for names in (node.input, node.output):
            for k, name in enumerate(names):
                if name == old:
                    names[k] = new
    for info in graph.value_info:
        if info.name == old:
            info.name = new
