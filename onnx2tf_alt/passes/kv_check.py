"""The KV-cache rewrite checked by running it (passes/kv_cache.py): a decoder form the rewrite
recognises only in part must not convert with exit 0 and wrong tokens.

The decoder as exported (its past growing by concatenation) and as rewritten (a cache of
fixed capacity, the new entries written into it at their positions, the empty slots masked)
decode the same prompt of PROMPT tokens and then one more token in onnxruntime; their logits
must agree at both steps, else UnsupportedFormError names the step and the difference. The
inputs are made from their names and declared shapes: token ids at random below the logits'
width, masks of ones, positions counted, encoder states and cross-attention caches drawn
once, every symbolic dim but the batch and the sequences 5. A model whose inputs cannot be
made so, or that onnxruntime cannot run, is not checked (said at -v info).

Its memory: onnxruntime runs unoptimised and without packed weights, so it reads the weights
kept on disk (ir/weights.py) through memory maps: page cache, not the process's own memory
(a 2.6 GB Llama: +0.8 GB peak RSS, all file pages, none anonymous; packed, the same check
held 2.3 GB of anonymous copies). Each step reads every weight, so a model whose weights
and caches do not fit in the memory available (MemAvailable) is not checked (said at -v
info): it would be read from disk four times.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx

from onnx2tf_alt.errors import UnsupportedFormError
from onnx2tf_alt.ir.weights import initializer_bytes
from onnx2tf_alt.logs import phase

log = logging.getLogger("onnx2tf_alt")

PROMPT = 3  # the first step's tokens; the second step takes one more
CACHE_COPIES = 4  # the caches fed, updated and returned, in both sessions: anonymous memory
TOLERANCE = 1e-3  # of the logits' largest magnitude: the rewrite only reorders sums
_OTHER_DIM = 5  # every other symbolic dim (an encoder's length)


class _Unfeedable(Exception):
    """An input the check cannot make."""


def check_rewrite(original: onnx.ModelProto, rewritten: onnx.ModelProto, entries: list,
                  capacity: int) -> None:
    """UnsupportedFormError when `rewritten` (kv_cache.fixed_capacity of `original`) decodes
    otherwise than `original` (see the module docstring)."""
    if capacity < PROMPT + 1:
        return
    weights, caches = initializer_bytes(original), _cache_bytes(rewritten, entries)
    available = _available_bytes()
    if available is not None and weights + CACHE_COPIES * caches > available:
        log.info("--kv_cache_capacity: the rewritten decoder is not run against the original "
                 "(%.1f GB of weights and %.1f GB of caches; %.1f GB of memory available)",
                 weights / 1e9, CACHE_COPIES * caches / 1e9, available / 1e9)
        return
    known = _rewritten_dims(original, rewritten, entries)
    try:
        with phase("kv cache check"):
            want = _decode(original, entries, None, known)
            got = _decode(rewritten, entries, capacity, known)
    except Exception as exc:  # noqa: BLE001 - inputs it cannot make, onnxruntime's failures
        log.info("--kv_cache_capacity: the rewritten decoder is not run against the original "
                 "(%s)", str(exc).splitlines()[0][:200])
        return
    differences = []
    for step, (a, b) in enumerate(zip(want, got)):
        scale = max(1.0, float(np.abs(a).max()))
        worst = float(np.abs(a - b).max()) / scale
        differences.append(worst)
        if not worst <= TOLERANCE:  # NaN too
            raise UnsupportedFormError(
                "--kv_cache_capacity: the rewritten decoder does not compute the original's "
                f"logits: run in onnxruntime on the same {PROMPT}-token prompt, the "
                f"{'first' if step == 0 else 'next'} step's logits differ by {worst:.3g} of "
                "their largest value (the rewrite recognises this decoder's caches but not "
                "every way it reads their positions or length; converted anyway, its tokens "
                "would be wrong). Export the decoder with attention_mask and position_ids "
                "inputs (transformers / Optimum do), or convert without --kv_cache_capacity "
                f"(caches: {', '.join(e.past for e in entries[:2])}, ...).")
    log.info("--kv_cache_capacity: the rewritten decoder computes the original's logits in "
             "onnxruntime (two steps, %s of their largest value apart at most)",
             f"{max(differences):.1g}")


def _available_bytes() -> int | None:
    """The memory the system can give without swapping (Linux's MemAvailable), or None where
    it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cache_bytes(model: onnx.ModelProto, entries: list) -> int:
    """The bytes of the caches `model` takes, symbolic dims counted as 1."""
    pasts = {e.past for e in entries}
    total = 0
    for value in model.graph.input:
        if value.name in pasts:
            tensor = value.type.tensor_type
            count = int(np.prod([d.dim_value or 1 for d in tensor.shape.dim]))
            total += count * onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
    return total


def _rewritten_dims(original: onnx.ModelProto, rewritten: onnx.ModelProto,
                    entries: list) -> dict[str, int]:
    """{symbol: size} for the original's symbolic dims the rewrite fixed, past lengths aside
    (a GroupQueryAttention decoder's head size, `kv_cache_dim`)."""
    pasts = {e.symbol for e in entries}
    after = {v.name: v.type.tensor_type.shape.dim for v in rewritten.graph.input}
    known = {}
    for value in original.graph.input:
        for dim, fixed in zip(value.type.tensor_type.shape.dim, after.get(value.name, [])):
            if dim.dim_param and dim.dim_param not in pasts and fixed.dim_value:
                known[dim.dim_param] = fixed.dim_value
    return known


def _decode(model: onnx.ModelProto, entries: list, capacity: int | None,
            known: dict[str, int]) -> list[np.ndarray]:
    """The logits of two steps of `model`: the prompt, then one token. `capacity` None: the
    past grows (the original); else the rewritten cache of that many slots. `known`: sizes
    of symbolic dims."""
    import onnxruntime as ort

    from onnx2tf_alt.ir.weights import ort_options

    options = ort_options()
    options.log_severity_level = 3
    # Packed MatMul weights would be an anonymous copy of them all; unpacked, onnxruntime
    # reads the weights kept on disk through memory maps (page cache, not the process's own)
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    presents = {e.present: e for e in entries}
    logits = "logits" if "logits" in names else next(n for n in names if n not in presents)
    width = _width(model, logits)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, width, PROMPT)
    drawn: dict[str, np.ndarray] = {}  # encoder states, cross caches: the same at each step
    caches = {e.past: None for e in entries}
    found, length = [], 0
    for tokens in (prompt, rng.integers(0, width, 1)):  # the prompt, then one token
        feeds = _feeds(model, entries, capacity, caches, tokens, length, drawn, known)
        out = dict(zip(names, session.run(None, feeds)))
        found.append(out[logits].reshape(-1, out[logits].shape[-1])[-1])
        for entry in entries:
            new = out[entry.present]
            if capacity is None:
                caches[entry.past] = new
            else:
                cache = feeds[entry.past].copy()
                where = [slice(None)] * cache.ndim
                where[entry.axis] = slice(length, length + new.shape[entry.axis])
                cache[tuple(where)] = new
                caches[entry.past] = cache
        length += len(tokens)
    return found


def _width(model: onnx.ModelProto, logits: str) -> int:
    """The logits' last dim (the vocabulary), where the model declares it."""
    value = next((o for o in model.graph.output if o.name == logits), None)
    dims = value.type.tensor_type.shape.dim if value is not None else []
    if not dims or not dims[-1].dim_value:
        raise _Unfeedable(f"the width of '{logits}' is not declared")
    return dims[-1].dim_value


def _feeds(model: onnx.ModelProto, entries: list, capacity: int | None, caches: dict,
           tokens: np.ndarray, length: int, drawn: dict, known: dict[str, int]
           ) -> dict[str, np.ndarray]:
    """One step's inputs (see the module docstring)."""
    from onnx2tf_alt.passes.kv_mask import own_mask

    axes = {e.past: e.axis for e in entries}
    mask = own_mask(model.graph, entries)
    step = len(tokens)
    bound = {**known, **{e.symbol: length for e in entries if e.symbol}}
    ids = next((v for v in model.graph.input if v.name == "input_ids"), None)
    for k, dim in enumerate(ids.type.tensor_type.shape.dim if ids is not None else []):
        if dim.dim_param:
            bound[dim.dim_param] = 1 if k == 0 else step
    feeds = {}
    for value in model.graph.input:
        name, tensor = value.name, value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        dims = list(tensor.shape.dim)
        if name in axes:
            shape = _shape(dims, name, bound)
            shape[axes[name]] = length if capacity is None else capacity
            cache = caches[name]
            feeds[name] = cache if cache is not None else np.zeros(shape, dtype)
        elif name == mask:
            if capacity is None:
                feeds[name] = np.ones((1, length + step), dtype)
            else:
                filled = np.zeros((1, capacity + step), dtype)
                filled[0, :length] = filled[0, capacity:] = 1
                feeds[name] = filled
        elif name == "position_ids":
            feeds[name] = np.arange(length, length + step, dtype=dtype)[None]
        elif "ids" in name.lower() and np.issubdtype(dtype, np.integer):
            feeds[name] = tokens.astype(dtype)[None]
        else:
            if name not in drawn:
                shape = _shape(dims, name, bound)
                rng = np.random.default_rng(len(drawn) + 1)
                drawn[name] = (rng.normal(0, 0.5, shape).astype(dtype)
                               if np.issubdtype(dtype, np.floating) else np.ones(shape, dtype))
            feeds[name] = drawn[name]
    return feeds


def _shape(dims, name: str, bound: dict[str, int]) -> list[int]:
    """Declared dims: the token ids' symbols (batch, sequence) and the past's as `bound`,
    any other batch 1 and any other symbolic dim _OTHER_DIM."""
    shape = []
    for k, dim in enumerate(dims):
        if dim.dim_value:
            shape.append(dim.dim_value)
        elif dim.dim_param in bound:
            shape.append(bound[dim.dim_param])
        elif k == 0:
            shape.append(1)
        elif dim.dim_param and "+" not in dim.dim_param:
            shape.append(_OTHER_DIM)
        else:
            raise _Unfeedable(f"input '{name}' has dim {dim.dim_param or '?'}")
    return shape
