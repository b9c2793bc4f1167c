"""Every command-line flag of onnx2tf 1.29 and 2.x, and what `onnx2tf-alt` does with it.

Scripts written for onnx2tf keep working or fail with a reason: each flag is

- IMPLEMENTED: same name, same meaning (defined in cli.py);
- EXPLAINED: accepted, with a one-line note saying why it changes nothing here (the files
  written are correct and complete without it: a performance hint, a switch of onnx2tf's
  internals, an option of a backend we do not have);
- REFUSED: the user asks for a file or a check we do not produce under that name; the run
  stops with exit code 2 before converting, and the message names what to use instead.

The table is the single source of docs/cli_flags.md (`python -m onnx2tf_alt.cli.args >
docs/cli_flags.md`) and of the parser entries of the EXPLAINED and REFUSED flags.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

IMPLEMENTED, EXPLAINED, REFUSED = "implemented", "explained", "refused"
V1, V2 = "1.29", "2.x"
BOTH = (V1, V2)

# What an onnx2tf flag takes on its command line, so that an accepted or refused flag
# consumes exactly its own values: nothing, one value, one or more, zero or more.
NONE, ONE, SOME, ANY = "none", "one", "some", "any"
_NARGS = {NONE: 0, ONE: None, SOME: "+", ANY: "*"}


@dataclass(frozen=True)
class CompatFlag:
    """One onnx2tf flag: its names, the onnx2tf versions that have it, and our answer."""

    short: str
    long: str
    versions: tuple[str, ...]
    status: str
    behaviour: str  # what onnx2tf-alt does, one line
    takes: str = NONE  # the flag's values in onnx2tf (EXPLAINED / REFUSED flags only)


def _row(short, long, status, behaviour, takes=NONE, versions=BOTH) -> CompatFlag:
    return CompatFlag(short, long, versions, status, behaviour, takes)


_CHECK = "use -coto / -cotof (with -cotoa / -cotor), which compare with onnxruntime"
_SPLIT = ("use -inimc / -onimc to convert a large model in parts (one file per subgraph); "
          "no automatic splitting")
_CIND = "use -cind NAME FILE.npy: the check runs on that array's shape and values"
_TORCH = "not written: this converter writes TensorFlow, Keras and TFLite files only"
_ARGMAX = "ArgMax is always TFLite's builtin ARG_MAX; no ReduceMax-based replacement"
_FLEX = ("transposes and strided slices of any rank are TFLite builtins here, so there is "
         "no Flex op to suppress (--builtin_only guarantees it)")

FLAGS: tuple[CompatFlag, ...] = (
    _row("-i", "--input_onnx_file_path", IMPLEMENTED, "the .onnx model to convert"),
    _row("-it", "--input_tflite_file_path", REFUSED,
         "reads ONNX only: convert the model the .tflite came from with -i", ONE, (V2,)),
    _row("-V", "--version", IMPLEMENTED, "prints the version"),
    _row("-o", "--output_folder_path", IMPLEMENTED, "output folder"),
    _row("-osd", "--output_signaturedefs", IMPLEMENTED,
         "signatures are always written (also onnx2tf's default)"),
    _row("-oh5", "--output_h5", IMPLEMENTED, "also writes <stem>.h5"),
    _row("-okv3", "--output_keras_v3", IMPLEMENTED, "also writes <stem>.keras"),
    _row("-otfv1pb", "--output_tfv1_pb", REFUSED,
         "no frozen TF1 .pb: use the saved_model, which tf.compat.v1 loaders read"),
    _row("-ow", "--output_weights", REFUSED,
         "no separate weights file: use -oh5 or -okv3 (weights are layer weights there)"),
    _row("-coion", "--copy_onnx_input_output_names_to_tflite", IMPLEMENTED,
         "every .tflite's input/output tensor names and signature keys become the ONNX names"),
    _row("-odrqt", "--output_dynamic_range_quantized_tflite", IMPLEMENTED,
         "also writes <stem>_dynamic_range_quant.tflite"),
    _row("-oiqt", "--output_integer_quantized_tflite", IMPLEMENTED,
         "also writes the dynamic range, INT8 and INT16-activation .tflite files"),
    _row("-tb", "--tflite_backend", IMPLEMENTED,
         "tf_converter is --tflite_writer tf with the saved_model (unless -dms), as onnx2tf "
         "writes it; flatbuffer_direct is --tflite_writer auto: our own writer where it "
         "covers the model, TF's converter elsewhere", ONE, (V2,)),
    _row("-ewo", "--eval_with_onnx", REFUSED, _CHECK, NONE, (V2,)),
    _row("-ens", "--eval_num_samples", REFUSED, _CHECK + " on the first -cind sample",
         ONE, (V2,)),
    _row("-ert", "--eval_rtol", REFUSED, "use -cotor with -coto / -cotof", ONE, (V2,)),
    _row("-eat", "--eval_atol", REFUSED, "use -cotoa with -coto / -cotof", ONE, (V2,)),
    _row("-efot", "--eval_fail_on_threshold", REFUSED,
         _CHECK + "; the report's JSON says which outputs fail", NONE, (V2,)),
    _row("-ett", "--eval_target_tflite", REFUSED,
         "use -coto with -odrqt / -oiqt: every quantized file is compared, dequantized",
         ONE, (V2,)),
    _row("-ecm", "--eval_compare_mode", REFUSED,
         "use -coto: quantized files are always compared dequantized", ONE, (V2,)),
    _row("-esm", "--eval_split_models", REFUSED, _CHECK, ONE, (V2,)),
    _row("-esfot", "--eval_split_fail_on_threshold", REFUSED, _CHECK, NONE, (V2,)),
    _row("-roc", "--report_op_coverage", REFUSED,
         "see docs/supported_ops.md; a failed conversion lists every unsupported node in "
         "reports/<stem>/conversion_errors.json", NONE, (V2,)),
    _row("-fdosm", "--flatbuffer_direct_output_saved_model", IMPLEMENTED,
         "also writes the saved_model (our -osm)", NONE, (V2,)),
    _row("-fdopt", "--flatbuffer_direct_output_pytorch", REFUSED, _TORCH, NONE, (V2,)),
    _row("-fdots", "--flatbuffer_direct_output_torchscript", REFUSED, _TORCH, NONE, (V2,)),
    _row("-fdodo", "--flatbuffer_direct_output_dynamo_onnx", REFUSED, _TORCH, NONE, (V2,)),
    _row("-fdoep", "--flatbuffer_direct_output_exported_program", REFUSED, _TORCH, NONE,
         (V2,)),
    _row("-npgts", "--native_pytorch_generation_timeout_sec", EXPLAINED,
         "no PyTorch code is generated, so there is nothing to time out", ONE, (V2,)),
    _row("-fdaco", "--flatbuffer_direct_allow_custom_ops", EXPLAINED,
         "custom ops are never emitted; ops TFLite lacks become Select TF ops (see "
         "--builtin_only)", NONE, (V2,)),
    _row("-fdcoa", "--flatbuffer_direct_custom_op_allowlist", EXPLAINED,
         "custom ops are never emitted, so there is nothing to allow", ONE, (V2,)),
    _row("-tsmb", "--tflite_split_max_bytes", REFUSED, _SPLIT, ONE, (V2,)),
    _row("-tstb", "--tflite_split_target_bytes", REFUSED, _SPLIT, ONE, (V2,)),
    _row("-qt", "--quant_type", IMPLEMENTED, "per-channel or per-tensor INT8 weights"),
    _row("-qnm", "--quant_norm_mean", IMPLEMENTED,
         "calibration mean: numbers, or onnx2tf's '[[[[0.485,0.456,0.406]]]]' string"),
    _row("-qns", "--quant_norm_std", IMPLEMENTED,
         "calibration std: numbers, or onnx2tf's '[[[[0.229,0.224,0.225]]]]' string"),
    _row("-cind", "--custom_input_op_name_np_data_path", IMPLEMENTED,
         "test and calibration data per input (ONNX layout)"),
    _row("-iqd", "--input_quant_dtype", IMPLEMENTED, "input type of the full-integer file"),
    _row("-oqd", "--output_quant_dtype", IMPLEMENTED, "output type of the full-integer file"),
    _row("-nuo", "--not_use_onnxsim", EXPLAINED,
         "onnx-simplifier is never run: prepare.py folds constants and shape subgraphs itself"),
    _row("-nuonag", "--not_use_opname_auto_generate", EXPLAINED,
         "names given to unnamed nodes only label messages and reports; outputs do not "
         "depend on them"),
    _row("-b", "--batch_size", IMPLEMENTED, "fixes a symbolic batch dimension"),
    _row("-ois", "--overwrite_input_shape", IMPLEMENTED, "fixes input shapes"),
    _row("-sh", "--shape_hints", REFUSED, _CIND, SOME),
    _row("-vh", "--value_hints", REFUSED, _CIND, SOME),
    _row("-nlt", "--no_large_tensor", EXPLAINED,
         "onnx-simplifier is never run, so Tile constants are never expanded by it"),
    _row("-onwdt", "--output_nms_with_dynamic_tensor", EXPLAINED,
         "NonMaxSuppression returns exactly the selected [batch, class, box] rows, as ONNX "
         "defines"),
    _row("-onwa", "--output_nms_with_argmax", EXPLAINED,
         "NonMaxSuppression follows the ONNX definition; no argmax variant", NONE, (V2,)),
    _row("-snms", "--switch_nms_version", EXPLAINED,
         "NonMaxSuppression always lowers to NON_MAX_SUPPRESSION_V4, exact for ONNX", ONE),
    _row("-k", "--keep_ncw_or_nchw_or_ncdhw_input_names", IMPLEMENTED,
         "these inputs stay channel-first"),
    _row("-kt", "--keep_nwc_or_nhwc_or_ndhwc_input_names", IMPLEMENTED,
         "these inputs become channel-last"),
    _row("-kat", "--keep_shape_absolutely_input_names", IMPLEMENTED,
         "these inputs keep their ONNX shape and layout (the same as -k here)"),
    _row("-inimc", "--input_names_to_interrupt_model_conversion", IMPLEMENTED,
         "converts only the part of the graph after these tensors (they become inputs)"),
    _row("-onimc", "--output_names_to_interrupt_model_conversion", IMPLEMENTED,
         "converts only the part of the graph up to these tensors (they become outputs)"),
    _row("-easm", "--enable_auto_split_model", REFUSED, _SPLIT),
    _row("-asms", "--auto_split_max_size", REFUSED, _SPLIT, ONE, (V2,)),
    _row("-asmsm", "--auto_split_max_size_mb", REFUSED, _SPLIT, ONE, (V1,)),
    _row("-asmmb", "--auto_split_max_size_mb", REFUSED, _SPLIT, ONE, (V2,)),
    _row("-dgc", "--disable_group_convolution", IMPLEMENTED,
         "a grouped Conv becomes SPLIT + one CONV_2D per group + CONCATENATION (for TF.js); "
         "default: one grouped CONV_2D"),
    _row("-eatfp16", "--enable_accumulation_type_float16", EXPLAINED,
         "the float16 file keeps float32 accumulation (no XNNPACK fp16-accumulation hint)"),
    _row("-ebu", "--enable_batchmatmul_unfold", EXPLAINED,
         "a batched MatMul stays one BATCH_MATMUL; no per-batch unfolding"),
    _row("-eru", "--enable_rnn_unroll", EXPLAINED,
         "RNN and GRU are always unrolled over their static time steps; an LSTM too, "
         "except one TFLite's fused kernel can run (default activations, no peepholes or "
         "clip, static batch) over more than one sequence or more than 256 steps x "
         "directions (unrolled is faster, fused converts faster)"),
    _row("-dsft", "--disable_suppression_flextranspose", EXPLAINED, _FLEX),
    _row("-nodaftc", "--number_of_dimensions_after_flextranspose_compression", EXPLAINED,
         _FLEX, ONE),
    _row("-dsfs", "--disable_suppression_flexstridedslice", EXPLAINED, _FLEX),
    _row("-dsm", "--disable_strict_mode", EXPLAINED,
         "there is no non-strict mode: axes are planned exactly, never guessed and repaired"),
    _row("-doem", "--disable_onnxruntime_output_memmap", EXPLAINED,
         "the checker keeps onnxruntime's outputs in memory; no memory-mapped files"),
    _row("-oemd", "--onnxruntime_output_memmap_dir", EXPLAINED,
         "the checker keeps onnxruntime's outputs in memory; no memory-mapped files", ONE),
    _row("-nodafsc", "--number_of_dimensions_after_flexstridedslice_compression", EXPLAINED,
         _FLEX, ONE),
    _row("-ofgd", "--optimization_for_gpu_delegate", EXPLAINED,
         "handlers always emit the builtins delegates take where an exact one exists; no "
         "separate GPU mode"),
    _row("-rari64", "--replace_argmax_to_reducemax_and_indices_is_int64", EXPLAINED, _ARGMAX),
    _row("-rarf32", "--replace_argmax_to_reducemax_and_indices_is_float32", EXPLAINED,
         _ARGMAX),
    _row("-rafi64", "--replace_argmax_to_fused_argmax_and_indices_is_int64", EXPLAINED,
         _ARGMAX),
    _row("-raff32", "--replace_argmax_to_fused_argmax_and_indices_is_float32", EXPLAINED,
         _ARGMAX),
    _row("-fasr", "--fused_argmax_scale_ratio", EXPLAINED, _ARGMAX, ONE),
    _row("-rtpo", "--replace_to_pseudo_operators", IMPLEMENTED,
         "GeLU, HardSwish, LeakyReLU, PReLU, Pow lowered to the simplest delegate builtins "
         "(exact within 1e-4); Erf, Abs, Neg, GatherND, MatMulInteger, Asin, Acos, Atan "
         "already are"),
    _row("-me", "--mvn_epsilon", EXPLAINED,
         "MeanVarianceNormalization adds 1e-9 to the deviation, as onnxruntime does", ONE),
    _row("-prf", "--param_replacement_file", EXPLAINED,
         "layouts are planned, not guessed, so there are no parameters to replace", ONE),
    _row("-cgdc", "--check_gpu_delegate_compatibility", REFUSED,
         "run tf.lite.experimental.Analyzer.analyze(model_path=FILE, gpu_compatibility=True) "
         "on the .tflite"),
    _row("-coto", "--check_onnx_tf_outputs_elementwise_close", IMPLEMENTED,
         "compares the model outputs with onnxruntime"),
    _row("-cotof", "--check_onnx_tf_outputs_elementwise_close_full", IMPLEMENTED,
         "compares every node output with onnxruntime"),
    _row("-coton", "--check_onnx_tf_outputs_sample_data_normalization", EXPLAINED,
         "the check feeds seeded random inputs or -cind arrays, never sample images", ONE),
    _row("-cotor", "--check_onnx_tf_outputs_elementwise_close_rtol", IMPLEMENTED,
         "relative tolerance of the check"),
    _row("-cotoa", "--check_onnx_tf_outputs_elementwise_close_atol", IMPLEMENTED,
         "absolute tolerance of the check"),
    _row("-tdnp", "--test_data_nhwc_path", REFUSED,
         "use -cind NAME FILE.npy (ONNX layout; the converter transposes it)", ONE, (V2,)),
    _row("-agj", "--auto_generate_json", EXPLAINED,
         "layouts are planned, so there is no parameter replacement JSON to generate; -cotof "
         "names the first diverging node"),
    _row("-agje", "--auto_generate_json_on_error", EXPLAINED,
         "no parameter replacement JSON exists here; a failed conversion writes reports/<stem>/ "
         "with a one-node repro per failing node"),
    _row("-dms", "--disable_model_save", IMPLEMENTED,
         "no saved_model: the default here, as in onnx2tf 2.x (-osm writes one)"),
    _row("-n", "--non_verbose", IMPLEMENTED, "errors only"),
    _row("-v", "--verbosity", IMPLEMENTED, "log level (default info; onnx2tf's is debug)"),
)


def flags_of(version: str) -> list[CompatFlag]:
    """The table's rows for one onnx2tf version (V1 or V2)."""
    return [f for f in FLAGS if version in f.versions]


NOTES_DEST = "compat_notes"  # where the notes of EXPLAINED flags collect while parsing
HEADER = """# onnx2tf command-line flags in onnx2tf-alt

Generated from `onnx2tf_alt/cli/compat_flags.py` by
`python -m onnx2tf_alt.cli.args > docs/cli_flags.md`; do not edit.

- **implemented**: same name and meaning;
- **explained**: accepted; a one-line note says why it changes nothing here;
- **refused**: the run stops with exit code 2 before converting and names what to use instead.

Flags are matched exactly (no abbreviations), so e.g. `-ofgd` is never read as `-o fgd`.
"""


def note(flag: CompatFlag, used: str) -> str:
    """The line printed when an EXPLAINED flag is given."""
    return f"note: {used} ({flag.long}) is accepted for onnx2tf compatibility: {flag.behaviour}."


def refusal(flag: CompatFlag, used: str) -> str:
    """The error (exit code 2) for a REFUSED flag."""
    return f"{used} ({flag.long}) of onnx2tf is not supported: {flag.behaviour}."


class _Answer(argparse.Action):
    """Consumes an EXPLAINED or REFUSED flag's values, then notes or refuses it."""

    def __init__(self, option_strings, dest, rows: dict[str, CompatFlag], **kwargs):
        self.rows = rows
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        flag = self.rows[option_string]
        if flag.status == REFUSED:
            parser.error(refusal(flag, option_string))
        notes = getattr(namespace, NOTES_DEST, None) or []
        setattr(namespace, NOTES_DEST, [*notes, note(flag, option_string)])


def add_compat_flags(parser: argparse.ArgumentParser) -> None:
    """Parser entries for every EXPLAINED and REFUSED flag (IMPLEMENTED ones are cli.py's).
    Their notes collect in `args.compat_notes`, which the caller removes before converting."""
    parser.set_defaults(**{NOTES_DEST: []})
    by_long: dict[str, list[CompatFlag]] = {}
    for flag in FLAGS:
        if flag.status != IMPLEMENTED:
            by_long.setdefault(flag.long, []).append(flag)
    for long, rows in by_long.items():
        names = [*dict.fromkeys(r.short for r in rows), long]
        answers = {name: rows[0] for name in names}
        answers.update({r.short: r for r in rows})
        parser.add_argument(
            *names, action=_Answer, rows=answers, nargs=_NARGS[rows[0].takes],
            dest="compat_" + long.lstrip("-"), default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,  # listed in docs/cli_flags.md, not in --help
        )


def cli_flags_markdown(own_flags: list[tuple[str, str]] | None = None) -> str:
    """docs/cli_flags.md: the table, with counts per onnx2tf version; `own_flags` (option
    strings, help) are the flags onnx2tf does not have."""
    lines = [*HEADER.splitlines(), "", "| onnx2tf | flags | implemented | explained | refused |",
             "|---|---|---|---|---|"]
    for version in (V1, V2):
        rows = flags_of(version)
        counts = [sum(r.status == s for r in rows) for s in (IMPLEMENTED, EXPLAINED, REFUSED)]
        lines.append(f"| {version} | {len(rows)} | " + " | ".join(map(str, counts)) + " |")
    lines += ["", "| flag | long flag | onnx2tf | status | onnx2tf-alt |", "|---|---|---|---|---|"]
    for f in FLAGS:
        behaviour = f.behaviour.replace("|", "\\|")
        lines.append(
            f"| `{f.short}` | `{f.long}` | {', '.join(f.versions)} | {f.status} | {behaviour} |")
    if own_flags:
        lines += ["", "## Flags of onnx2tf-alt only", "", "| flag | meaning |", "|---|---|"]
        lines += [f"| `{names}` | {text} |" for names, text in own_flags]
    return "\n".join(lines) + "\n"
