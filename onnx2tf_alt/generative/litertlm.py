"""`--litertlm`: a decoder as a `.litertlm` bundle that LiteRT-LM's engine runs.

LiteRT-LM (the runtime for LLMs on device; `litert_lm.Engine` in Python) reads one file
holding the model, its tokenizer and LlmMetadata (start and stop tokens, the largest number
of tokens, the chat template). Its CPU executor drives a `.tflite` with these conventions
(LiteRT-LM's runtime/executor/llm_litert_compiled_model_executor.cc and
runtime/executor/litert/state.cc; checked by running the engine on our files):

- signatures `prefill_<T>` (the prompt in chunks of T tokens; the largest chunk that fits
  first) and `decode` (one token);
- inputs `tokens` int32 [1, T] and `input_pos` int32 [T]; unused prefill rows are padded
  with token 0 at position 0, after the real ones;
- per layer `kv_cache_k_<i>` and `kv_cache_v_<i>` float32, returned whole as outputs of
  the same names, updated in the graph (the engine binds one buffer as input and output);
  without a `mask` input the engine reads the capacity from dim 2 of `kv_cache_k_0`;
- output `logits` float32 [1, T, vocab].

`litert_lm_model` wraps the decoder `fixed_capacity` made (passes/kv_cache.py: past inputs
of the capacity, presents of the step's new entries, a mask over capacity + step) in ONNX to
those conventions: the tokens and positions cast to the model's types, the mask made from
the step's first position (the cache filled below it, the step's rows after), each cache
moved to [1, ., capacity, .] (the sequence on axis 2) and its new entries written into it
with DynamicUpdateSlice (ops/cache.py) at that position. The signatures are then built as
`--signature` builds them (one copy of the weights), their keys renamed, and the file
bundled with the tokenizer by litert-lm-builder.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx2tf_alt.errors import InputError, UnsupportedFormError
from onnx2tf_alt.passes.kv_cache import rename_value

DOMAIN = "onnx2tf_alt"  # ops/cache.py's DynamicUpdateSlice
TOKENS, POSITIONS = "tokens", "input_pos"
OUT_SUFFIX = "__updated"  # an ONNX output cannot share its input's name: renamed in the file
TOKEN_INPUTS = ("input_ids",)
MASK_INPUTS = ("attention_mask",)
POSITION_INPUTS = ("position_ids",)
DEFAULT_PREFILL = 32


@dataclass
class Tokenizer:
    """What the bundle takes from a model folder: the tokenizer file and its kind, the
    start and stop tokens, the chat template, and the files they were read from."""

    path: str
    kind: str  # "hf" (tokenizer.json) or "sp" (SentencePiece tokenizer.model)
    start: int | None = None
    stops: list[int] = field(default_factory=list)
    chat_template: str | None = None
    read: list[str] = field(default_factory=list)


def find_tokenizer(path: str) -> Tokenizer:
    """The tokenizer at `path`: a tokenizer.json, a SentencePiece .model, or a folder holding
    one; the start / stop tokens and chat template from the folder's generation_config.json,
    config.json, genai_config.json (onnxruntime-genai) and tokenizer_config.json, first found
    first. InputError naming what is missing."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        found = [os.path.join(path, n) for n in ("tokenizer.json", "tokenizer.model")
                 if os.path.isfile(os.path.join(path, n))]
        if not found:
            raise InputError(f"--tokenizer '{path}': the folder holds neither tokenizer.json "
                             "nor tokenizer.model. Give the tokenizer file or the model's "
                             "folder as saved by transformers (save_pretrained).")
        path = found[0]
    elif not os.path.isfile(path):
        raise InputError(f"--tokenizer '{path}' is not a file or a folder.")
    kind = "hf" if path.endswith(".json") else "sp"
    if kind == "hf":
        try:
            with open(path) as f:
                json.load(f)
        except (OSError, ValueError) as exc:
            raise InputError(f"--tokenizer '{path}' is not a tokenizer.json ({exc}).") from exc
    tokenizer = Tokenizer(os.path.abspath(path), kind)
    known = _token_ids(path) if kind == "hf" else {}
    for name, keys in (("generation_config.json", ()), ("config.json", ()),
                       ("genai_config.json", ("model",)), ("tokenizer_config.json", ()),
                       ("special_tokens_map.json", ())):
        config = _read_json(os.path.join(folder, name))
        for key in keys:
            config = config.get(key, {}) if isinstance(config, dict) else {}
        if not isinstance(config, dict) or not config:
            continue
        start = _ids(config.get("bos_token_id"), known) or _ids(config.get("bos_token"), known)
        stops = _ids(config.get("eos_token_id"), known) or _ids(config.get("eos_token"), known)
        used = False
        if tokenizer.start is None and start:
            tokenizer.start, used = start[0], True
        if not tokenizer.stops and stops:
            tokenizer.stops, used = stops, True
        if tokenizer.chat_template is None and isinstance(config.get("chat_template"), str):
            tokenizer.chat_template, used = config["chat_template"], True
        if used:
            tokenizer.read.append(name)
    if not tokenizer.stops:
        raise InputError(
            f"--tokenizer '{path}': no stop token found (eos_token_id in "
            f"generation_config.json, config.json or genai_config.json beside it, in "
            f"'{folder}'): LiteRT-LM would generate until the cache is full. Save the "
            "model's config beside the tokenizer (transformers: save_pretrained).")
    return tokenizer


def _token_ids(path: str) -> dict[str, int]:
    """{token: id} of a tokenizer.json: its model's vocabulary (when a dict) and added tokens."""
    data = _read_json(path)
    vocab = data.get("model", {}).get("vocab") if isinstance(data, dict) else None
    found = dict(vocab) if isinstance(vocab, dict) else {}
    found.update({t["content"]: t["id"] for t in data.get("added_tokens") or []
                  if isinstance(t, dict) and "content" in t and "id" in t})
    return found


def _ids(value, known: dict[str, int]) -> list[int]:
    """Token ids from a config's value: ids (one or a list) the tokenizer has, or a token
    (a string, or {"content": ...}) it has. An id past its vocabulary (a config's default,
    such as GPT-2's 50256 in a smaller model) counts as none."""
    values = value if isinstance(value, list) else [value]
    ids = []
    for item in values:
        if isinstance(item, dict):
            item = item.get("content")
        if isinstance(item, str) and item in known:
            ids.append(known[item])
        elif isinstance(item, int) and not isinstance(item, bool) and (
                not known or item in known.values()):
            ids.append(item)
    return ids


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def prefill_lengths(lengths: list[int] | None, capacity: int) -> list[int]:
    """The prefill chunk lengths (default DEFAULT_PREFILL), each at most the capacity."""
    lengths = sorted(set(lengths or [min(DEFAULT_PREFILL, capacity)]))
    bad = [n for n in lengths if not 0 < n <= capacity]
    if bad:
        raise InputError(f"--litertlm_prefill {bad}: each prefill length must be between 1 "
                         f"and the --kv_cache_capacity {capacity}.")
    return lengths


def signature_specs(lengths: list[int]) -> dict:
    """--signature specs of the LiteRT-LM model: `prefill_<T>` per length, and `decode`."""
    from onnx2tf_alt.generative.signatures import SignatureSpec

    specs = {f"prefill_{n}": SignatureSpec((f"{TOKENS}:1,{n}", f"{POSITIONS}:{n}"))
             for n in lengths}
    specs["decode"] = SignatureSpec((f"{TOKENS}:1,1", f"{POSITIONS}:1"))
    return specs


def litert_lm_model(model: onnx.ModelProto, entries: list, capacity: int) -> onnx.ModelProto:
    """The decoder `fixed_capacity` returned (with its cache `entries`), wrapped to LiteRT-LM's
    conventions (see the module docstring); modifies `model`. UnsupportedFormError for an
    input LiteRT-LM does not give (naming it) or a cache that is not of rank 4."""
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in initializers}
    pasts = {e.past: e for e in entries}
    tokens = next((n for n in TOKEN_INPUTS if n in inputs), None)
    mask = next((n for n in MASK_INPUTS if n in inputs), None)
    positions = next((n for n in POSITION_INPUTS if n in inputs), None)
    other = sorted(set(inputs) - set(pasts) - {tokens, mask, positions})
    lacking = [name for name, found in (("input_ids", tokens), ("attention_mask", mask))
               if found is None]
    if lacking or other:
        need = f"needs {other}" if other else f"lacks {lacking}"
        raise UnsupportedFormError(
            "--litertlm: LiteRT-LM gives a decoder token ids, their positions and its KV "
            f"caches only; this one {need} (inputs: {sorted(inputs)}). Export the decoder "
            "with input_ids, attention_mask, position_ids and its past key/values only.")
    reserved = {TOKENS, POSITIONS, *(f"kv_cache_{k}_{i}{suffix}" for k in "kv"
                                     for i in range(len(entries)) for suffix in ("", OUT_SUFFIX))}
    for name in reserved & {o for n in graph.node for o in n.output}:
        rename_value(graph, name, f"{name}/decoder")  # the decoder's own value of that name
    head, tail, new_inputs, new_outputs = [], [], [], []  # nodes before and after the decoder's

    def node(op: str, ins: list[str], out: str, domain: str = "", after: bool = False,
             **attrs) -> str:
        (tail if after else head).append(helper.make_node(op, ins, [out], domain=domain, **attrs,
                                      name=out if out.startswith("litert_lm/")
                                      else f"litert_lm/{out}"))
        return out

    def const(name: str, value) -> str:
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    new_inputs.append(helper.make_tensor_value_info(TOKENS, TensorProto.INT32, [1, "sequence"]))
    new_inputs.append(helper.make_tensor_value_info(POSITIONS, TensorProto.INT32, ["sequence"]))
    node("Cast", [TOKENS], tokens, to=inputs[tokens].type.tensor_type.elem_type)
    ids64 = node("Cast", [POSITIONS], "litert_lm/positions", to=TensorProto.INT64)
    if positions is not None:
        row = node("Unsqueeze", [ids64, const("litert_lm/axis0", np.array([0], np.int64))],
                   "litert_lm/position_row")
        node("Cast", [row], positions, to=inputs[positions].type.tensor_type.elem_type)
    first = node("Slice", [ids64, const("litert_lm/zero1", np.array([0], np.int64)),
                           const("litert_lm/one1", np.array([1], np.int64))],
                 "litert_lm/first_position")
    # the mask over capacity + step: cache slots below the first position, then every row
    slots = const("litert_lm/slots", np.arange(capacity, dtype=np.int64)[None])
    filled = node("Less", [slots, first], "litert_lm/filled")
    rows = node("Shape", [TOKENS], "litert_lm/rows")
    step = node("Expand", [const("litert_lm/true", np.array(True)), rows], "litert_lm/step")
    both = node("Concat", [filled, step], "litert_lm/attended", axis=1)
    node("Cast", [both], mask, to=inputs[mask].type.tensor_type.elem_type)
    zero = const("litert_lm/zero", np.array([0], np.int64))
    start = node("Concat", [zero, zero, first, zero], "litert_lm/start", axis=0)  # on axis 2
    kinds = {"k": 0, "v": 0}
    producer = {o: n for n in graph.node for o in n.output}
    for entry in entries:
        dims = inputs[entry.past].type.tensor_type.shape.dim
        if len(dims) != 4:
            raise UnsupportedFormError(
                f"--litertlm: the cache '{entry.past}' has rank {len(dims)}; LiteRT-LM's "
                "caches are [1, heads, positions, head_dim].")
        kind = _kind(entry.past)
        name = f"kv_cache_{kind}_{kinds[kind]}"
        kinds[kind] += 1
        order = [0, 1, 2, 3]  # the engine's layout: the sequence on axis 2
        order.remove(entry.axis)
        order.insert(2, entry.axis)
        shape = [1] + [dims[a].dim_value for a in order[1:]]
        if any(d < 1 for d in shape):
            raise UnsupportedFormError(f"--litertlm: the cache '{entry.past}' has open dims "
                                       f"{[d.dim_value or d.dim_param for d in dims]} besides "
                                       "the batch.")
        new_inputs.append(helper.make_tensor_value_info(
            name, inputs[entry.past].type.tensor_type.elem_type, shape))
        node("Transpose", [name], entry.past, perm=[order.index(a) for a in range(4)])
        update = node("Transpose", [_new_entries(producer, entry.present)], f"{name}/new",
                      after=True, perm=order)
        node("DynamicUpdateSlice", [name, update, start], name + OUT_SUFFIX, domain=DOMAIN,
             after=True)
        new_outputs.append(helper.make_tensor_value_info(
            name + OUT_SUFFIX, inputs[entry.past].type.tensor_type.elem_type, shape))
    logits = next((o for o in graph.output if o.name == "logits"), None)
    if logits is None:
        raise UnsupportedFormError("--litertlm: the decoder has no 'logits' output "
                                   f"(outputs: {[o.name for o in graph.output]}).")
    for value in [*graph.input]:
        if value.name in inputs:
            graph.input.remove(value)
    graph.input.extend(new_inputs)
    del graph.output[:]
    graph.output.extend([logits, *new_outputs])
    decoder = list(graph.node)
    del graph.node[:]
    graph.node.extend([*head, *decoder, *tail])
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return model


def _kind(past: str) -> str:
    """"k" or "v": whether the past input `past` holds keys or values, by the last part of
    its name that says (`past_key_values.0.key`, `past.1.v`, `cache_k_3`)."""
    for part in reversed(re.split(r"[^a-z]+", past.lower())):
        if part in ("key", "keys", "k"):
            return "k"
        if part in ("value", "values", "v"):
            return "v"
    raise UnsupportedFormError(f"--litertlm: the name of the cache '{past}' does not say "
                               "whether it holds keys or values (LiteRT-LM's kv_cache_k_<i> "
                               "or kv_cache_v_<i>).")


def _new_entries(producer: dict, present: str) -> str:
    """The tensor fixed_capacity's Identity `present/new_entries` returns."""
    made = producer.get(present)
    return made.input[0] if made is not None and made.op_type == "Identity" else present


def litert_lm_names(path: str) -> None:
    """The .tflite at `path` with LiteRT-LM's signature keys: each input and output key is
    its ONNX name (TF's keys are made TF-safe), the updated caches named as their inputs."""
    from onnx2tf_alt.tflite.flatbuffer import pack_model, unpack_model

    with open(path, "rb") as f:
        model = unpack_model(f.read())
    for signature in model.signatureDefs:
        subgraph = model.subgraphs[signature.subgraphIndex]
        for tensor_map in [*signature.inputs, *signature.outputs]:
            name = tensor_map.name.decode().removesuffix(OUT_SUFFIX)
            tensor_map.name = name.encode()
            subgraph.tensors[tensor_map.tensorIndex].name = name.encode()
    with open(path, "wb") as f:
        f.write(pack_model(model))


def write_bundles(folder: str, stem: str, written: list[str], tokenizer: Tokenizer,
                  capacity: int) -> list[str]:
    """Every .tflite of `written` (in `folder`) with LiteRT-LM's signature keys and the
    io_layout.json saying so; `<stem>_<variant>.litertlm` for the float32, dynamic-range and
    int4 files among them. Returns the bundles' names."""
    from onnx2tf_alt.export.names import DYNAMIC_RANGE_SUFFIXES, INT4_SUFFIX

    for name in written:
        if name.endswith(".tflite"):
            litert_lm_names(os.path.join(folder, name))
    layout_path = os.path.join(folder, f"{stem}_io_layout.json")
    with open(layout_path) as f:
        layout = json.load(f)
    for signature in layout["signatures"].values():
        for entry in [*signature["inputs"], *signature["outputs"]]:
            entry["tflite_name"] = entry["tflite_name"].removesuffix(OUT_SUFFIX)
    with open(layout_path, "w") as f:
        json.dump(layout, f, indent=2)
    bundles = []
    for variant in ("float32", *DYNAMIC_RANGE_SUFFIXES, INT4_SUFFIX):
        if f"{stem}_{variant}.tflite" in written:
            bundles.append(f"{stem}_{variant}.litertlm")
            write_bundle(os.path.join(folder, f"{stem}_{variant}.tflite"), tokenizer,
                         capacity, os.path.join(folder, bundles[-1]))
    return bundles


def write_bundle(tflite_path: str, tokenizer: Tokenizer, capacity: int, out_path: str) -> None:
    """`out_path`: the .litertlm of the model at `tflite_path` (LiteRT-LM's signatures),
    `tokenizer` and LlmMetadata (start and stop tokens, `capacity` tokens at most, the
    chat template as a jinja template when the folder has one)."""
    try:
        from litert_lm_builder import litertlm_builder as builder
        from litert_lm_builder import litertlm_core
    except ImportError as exc:
        raise InputError("--litertlm needs litert-lm-builder: pip install "
                         "'onnx2tf_alt[litertlm]' (or litert-lm-builder==0.18.1).") from exc
    folder = os.path.dirname(out_path)
    metadata = os.path.join(folder, ".llm_metadata.textproto")
    template = os.path.join(folder, ".chat_template.jinja")
    lines = []
    if tokenizer.start is not None:
        lines.append(f"start_token {{ token_ids {{ ids: {tokenizer.start} }} }}")
    lines += [f"stop_tokens {{ token_ids {{ ids: {s} }} }}" for s in tokenizer.stops]
    lines += [f"max_num_tokens: {capacity}", "llm_model_type { generic_model {} }"]
    try:
        with open(metadata, "w") as f:
            f.write("\n".join(lines) + "\n")
        files = builder.LitertLmFileBuilder()
        if tokenizer.chat_template is not None:
            with open(template, "w") as f:
                f.write(tokenizer.chat_template)
            files.add_llm_metadata(metadata, jinja_prompt_template_path=template)
        else:
            files.add_llm_metadata(metadata)
        if tokenizer.kind == "hf":
            files.add_hf_tokenizer(tokenizer.path)
        else:
            files.add_sentencepiece_tokenizer(tokenizer.path)
        files.add_tflite_model(tflite_path, builder.TfLiteModelType.PREFILL_DECODE)
        with litertlm_core.open_file(out_path, "wb") as f:
            files.build(f)
    finally:
        for path in (metadata, template):
            if os.path.exists(path):
                os.remove(path)
