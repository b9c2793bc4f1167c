"""The conversion command line: every flag `onnx2tf-alt` (and each child of a batch)
parses, and the list of those onnx2tf does not have. `python -m onnx2tf_alt.cli.args`
prints docs/cli_flags.md."""

from __future__ import annotations

import argparse

from calibration.methods import DEFAULT_METHOD, METHODS, NAMES, ONNXRUNTIME, TFLITE_GRAPH
from onnx2tf_alt.cli.compat_flags import FLAGS, add_compat_flags, cli_flags_markdown
from onnx2tf_alt.export.names import TARGETS
from onnx2tf_alt.version import __version__

# onnx2tf 2.x's --tflite_backend values -> our --tflite_writer (cli/main.py applies it)
BACKENDS = {"tf_converter": "tf", "flatbuffer_direct": "auto"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="onnx2tf-alt",
        description="Convert an ONNX model to saved_model, Keras and TFLite with channel-last ops.",
        allow_abbrev=False,  # onnx2tf's flags must never be read as prefixes of ours
        epilog="Every other flag of onnx2tf 1.29 / 2.x is accepted with a note or refused "
        "with its equivalent: see docs/cli_flags.md.",
    )
    _file_flags(p)
    _shape_and_layout_flags(p)
    _log_flags(p)
    _check_flags(p)
    _quant_flags(p)
    _lowering_flags(p)
    p.add_argument("-V", "--version", action="version", version=f"onnx2tf-alt {__version__}")
    add_compat_flags(p)
    return p


def _file_flags(p: argparse.ArgumentParser) -> None:
    """What to convert and which files to write."""
    p.add_argument("-i", "--input_onnx_file_path", help="the .onnx model to convert")
    p.add_argument("-o", "--output_folder_path", default="saved_model", help="output folder")
    p.add_argument(
        "-osd",
        "--output_signaturedefs",
        action="store_true",
        help="accepted for onnx2tf compatibility; signatures are always written",
    )
    p.add_argument("-oh5", "--output_h5", action="store_true", help="also write <stem>.h5")
    p.add_argument(
        "-dms", "--disable_model_save", action="store_true",
        help="write no saved_model (the .tflite and the other requested files still)")
    p.add_argument(
        "--tflite_writer", choices=("auto", "tf", "direct"), default="auto",
        help="what writes the float32 and float16 .tflite (without quantized, int4, micro or "
        "checked files): auto (default) our own writer when it covers every node (with -dms "
        "and no -oh5/-okv3, without TensorFlow; beside a saved_model, up to 256 MB of "
        "weights), else TF's converter; tf always TF's; direct "
        "ours, for -dms runs only, or exit 1 naming the node it does not cover "
        "(docs/direct_writer.md)")
    p.add_argument(
        "-tb", "--tflite_backend", choices=tuple(BACKENDS),
        help="onnx2tf 2.x's name: tf_converter is --tflite_writer tf, flatbuffer_direct is "
        "--tflite_writer auto")
    p.add_argument(
        "-okv3", "--output_keras_v3", action="store_true", help="also write <stem>.keras"
    )
    p.add_argument(
        "-coion",
        "--copy_onnx_input_output_names_to_tflite",
        action="store_true",
        help="name every .tflite's input and output tensors and signature keys exactly as in "
        "the ONNX graph (default: TF-safe names, e.g. serving_default_x:0)",
    )

def _shape_and_layout_flags(p: argparse.ArgumentParser) -> None:
    """Input shapes and layouts, and the part of the graph to convert."""
    p.add_argument("-b", "--batch_size", type=int, help="fix a symbolic batch dimension")
    p.add_argument(
        "-ois",
        "--overwrite_input_shape",
        nargs="+",
        metavar="NAME:D1,D2,...",
        help="fix input shapes, e.g. -ois input:1,3,224,224 mask:1,224",
    )
    p.add_argument(
        "--signature",
        dest="signatures",
        nargs="+",
        action="append",
        metavar="NAME [MODEL.onnx] INPUT:D1,D2,...",
        help="repeatable: one signature of the .tflite files, named by its first word, made "
        "from MODEL.onnx if given (default: -i), with the input shapes that follow (as "
        "-ois; dims of the same symbol, or a sum of symbols, follow), e.g. --signature "
        "prefill input_ids:1,64 --signature decode input_ids:1,1. The signatures share one "
        "copy of the weights, in the .tflite files and the saved_model (docs/generative.md)",
    )
    p.add_argument(
        "--kv_cache_capacity",
        type=int,
        metavar="N",
        help="a decoder's past key/value inputs hold N positions (filled ones marked 1 in "
        "its attention mask, which then spans N + sequence) and its present outputs "
        "return only the step's new entries, to be written into the cache at its "
        "position: the same shapes every step (docs/generative.md)",
    )
    p.add_argument(
        "-k",
        "--keep_ncw_or_nchw_or_ncdhw_input_names",
        nargs="+",
        action="extend",  # shared with -kat
        metavar="NAME",
        help="inputs that stay channel-first (ONNX layout)",
    )
    p.add_argument(
        "-kt",
        "--keep_nwc_or_nhwc_or_ndhwc_input_names",
        nargs="+",
        metavar="NAME",
        help="inputs that become channel-last even if no conv reads them",
    )
    p.add_argument(
        "-kat",
        "--keep_shape_absolutely_input_names",
        nargs="+",
        action="extend",
        dest="keep_ncw_or_nchw_or_ncdhw_input_names",
        metavar="NAME",
        help="onnx2tf's name for -k: these inputs keep their ONNX shape and layout",
    )
    p.add_argument(
        "-inimc",
        "--input_names_to_interrupt_model_conversion",
        nargs="+",
        metavar="NAME",
        help="convert only the part of the graph computed from these tensors (they become "
        "the model's inputs)",
    )
    p.add_argument(
        "-onimc",
        "--output_names_to_interrupt_model_conversion",
        nargs="+",
        metavar="NAME",
        help="convert only the part of the graph that computes these tensors (they become "
        "the model's outputs)",
    )

def _log_flags(p: argparse.ArgumentParser) -> None:
    """How much is printed."""
    p.add_argument(
        "-v",
        "--verbosity",
        choices=["debug", "info", "warn", "error"],
        default="info",
        help="log level (default: info)",
    )
    p.add_argument(
        "-n", "--non_verbose", action="store_true", help="errors only, no progress bar"
    )

def _check_flags(p: argparse.ArgumentParser) -> None:
    """The accuracy check against onnxruntime and its inputs."""
    p.add_argument(
        "-coto",
        "--check_onnx_tf_outputs_elementwise_close",
        action="store_true",
        help="compare the model outputs of the Keras model and float32 TFLite (and, with "
        "-odrqt/-oiqt, of each quantized file, dequantized, passing on cosine >= 0.98) with "
        "onnxruntime; writes <stem>_accuracy_report.json/.html",
    )
    p.add_argument(
        "-cotof",
        "--check_onnx_tf_outputs_elementwise_close_full",
        action="store_true",
        help="the same for every node output, reporting the first diverging node",
    )
    p.add_argument(
        "-cotoa",
        "--check_onnx_tf_outputs_elementwise_close_atol",
        type=float,
        default=1e-4,
        help="absolute tolerance of the check (default: 1e-4)",
    )
    p.add_argument(
        "-cotor",
        "--check_onnx_tf_outputs_elementwise_close_rtol",
        type=float,
        default=0.0,
        help="relative tolerance of the check: |tf - onnx| <= atol + rtol*|onnx| (default: 0)",
    )
    p.add_argument(
        "-cind",
        "--custom_input_op_name_np_data_path",
        nargs="+",
        action="append",
        metavar="NAME FILE.npy [MEAN STD]",
        help="data for input NAME (ONNX layout); repeatable. The check and the failure "
        "reports use it as the input (the first sample); INT8 calibration takes its N "
        "samples along axis 0, normalized as (x - MEAN) / STD when given (a number or a "
        "list per channel, e.g. [0.485,0.456,0.406])",
    )

def _calibration_method_help() -> str:
    """--calibration_method's help, from the table of calibration/methods.py."""

    def listed(measurer: str) -> str:
        return ", ".join(f"{m.name} ({'default: ' if m.name == DEFAULT_METHOD else ''}"
                         f"{m.description})" for m in METHODS if m.measurer == measurer)

    text = (f"activation ranges of the -oiqt INT8 files, measured on the TFLite graph over the "
            f"calibration samples: {listed(TFLITE_GRAPH)}; or by onnxruntime's calibrators on "
            f"the ONNX graph: {listed(ONNXRUNTIME)}. The INT16-activation files always use "
            "min-max")
    return text.replace("%", "%%")


def _quant_flags(p: argparse.ArgumentParser) -> None:
    """The quantized .tflite files."""
    p.add_argument(
        "-odrqt",
        "--output_dynamic_range_quantized_tflite",
        action="store_true",
        help="also write <stem>_dynamic_range_quant.tflite (int8 weights, float activations)",
    )
    p.add_argument(
        "-oiqt",
        "--output_integer_quantized_tflite",
        action="store_true",
        help="also write <stem>_dynamic_range_quant.tflite (as -odrqt), "
        "<stem>_integer_quant.tflite, <stem>_full_integer_quant.tflite and "
        "their _with_int16_act variants, calibrated with the shipped photographs (image "
        "inputs) or -cind data; and <stem>_quant_report.json",
    )
    p.add_argument(
        "-qt",
        "--quant_type",
        choices=["per-channel", "per-tensor"],
        default="per-channel",
        help="weight quantization of the -oiqt files (default: per-channel)",
    )
    p.add_argument(
        "--calibration_method",
        choices=NAMES,
        default=DEFAULT_METHOD,
        help=_calibration_method_help(),
    )
    p.add_argument(
        "--keep_float",
        nargs="+",
        metavar="NODE",
        help="ONNX nodes the -oiqt INT8 files compute in float, with the ops reading their "
        "outputs (mixed precision; the quant report's 'sensitivity' ranks the nodes)",
    )
    p.add_argument(
        "--keep_float_auto",
        type=float,
        metavar="COSINE",
        help="keep the most sensitive nodes of the -oiqt INT8 files in float, one at a "
        "time, until their outputs reach this cosine against the float32 TFLite on the "
        "held-out samples (e.g. 0.99; ranking each node costs one re-quantization)",
    )
    p.add_argument(
        "--no_bias_correction",
        dest="bias_correction",
        action="store_false",
        help="leave the biases of the -oiqt INT8 files as quantized (default: each "
        "convolution without fused activation has the mean error of its 8-bit output on "
        "the calibration samples taken out of its bias)",
    )
    p.add_argument(
        "-oi4",
        "--output_int4_weight_quantized_tflite",
        action="store_true",
        help="also write <stem>_int4_weight_quant.tflite: FULLY_CONNECTED weights in int4 "
        "with a float16 scale per 32 inputs (taken by XNNPACK; ai-edge-litert >= 2.1), "
        "other weights int8 as in the dynamic-range file; activations stay float "
        "(docs/quantization.md)",
    )
    p.add_argument(
        "--int8_warn_below",
        type=float,
        default=0.99,
        metavar="COSINE",
        help="warn at the end of an -oiqt run when an INT8 file's pooled output cosine "
        "against the float32 TFLite on the held-out samples is below this, naming the "
        "quantized file beside it that holds best (default: 0.99; the exit status is "
        "unchanged)",
    )
    p.add_argument(
        "-iqd",
        "--input_quant_dtype",
        choices=["int8", "uint8", "float32"],
        default="int8",
        help="input type of <stem>_full_integer_quant.tflite (default: int8)",
    )
    p.add_argument(
        "-oqd",
        "--output_quant_dtype",
        choices=["int8", "uint8", "float32"],
        default="int8",
        help="output type of <stem>_full_integer_quant.tflite (default: int8)",
    )
    p.add_argument(
        "-qnm",
        "--quant_norm_mean",
        nargs="+",
        action=_Numbers,
        metavar="MEAN",
        help="mean (one, or one per channel) subtracted from the shipped photographs' [0, 1] "
        "pixels for calibration (default: ImageNet's 0.485 0.456 0.406)",
    )
    p.add_argument(
        "-qns",
        "--quant_norm_std",
        nargs="+",
        action=_Numbers,
        metavar="STD",
        help="standard deviation the photographs are divided by after -qnm (default: "
        "ImageNet's 0.229 0.224 0.225)",
    )

def _lowering_flags(p: argparse.ArgumentParser) -> None:
    """Which opsets, TFLite ops and delegate-friendly forms the conversion uses."""
    p.add_argument(
        "--allow_newer_opset",
        action="store_true",
        help="convert a model whose opset is newer than the installed onnx package knows, "
        "with the newest known opset's semantics (refused otherwise)",
    )
    p.add_argument(
        "--builtin_only",
        action="store_true",
        help="fail (exit 1, naming the ONNX nodes responsible) instead of writing .tflite "
        "files that need Select TF ops (the Flex delegate)",
    )
    p.add_argument(
        "--target",
        choices=TARGETS,
        help="check the files on a runtime: micro implies -oiqt and -b 1 (unless -b is given) and checks "
        "<stem>_full_integer_quant.tflite on TensorFlow Lite for Microcontrollers (needs the "
        "tflite-micro package): every op has a TFLite Micro kernel and computes in integers, "
        "shapes are static, and it runs with outputs compared with ai-edge-litert's; else "
        "exit 1 naming the ONNX nodes. Writes <stem>_micro.json (smallest tensor arena, "
        "flash size, largest tensors, ops and their resolver calls); see docs/micro.md",
    )
    p.add_argument(
        "-dgc",
        "--disable_group_convolution",
        action="store_true",
        help="lower a grouped Conv as SPLIT + one CONV_2D per group + CONCATENATION, for "
        "runtimes without grouped convolution (e.g. TF.js); default: one grouped CONV_2D",
    )
    p.add_argument(
        "-rtpo",
        "--replace_to_pseudo_operators",
        nargs="*",
        metavar="OP",
        help="lower these ops to the simplest builtins GPU/NNAPI delegates take, each exact "
        "within 1e-4: GeLU, HardSwish, LeakyReLU, PReLU, Pow (onnx2tf's names, any case); "
        "its other names (Erf, Abs, Neg, GatherND, MatMulInteger, ...) are accepted: "
        "they are lowered to such builtins already",
    )


_LIST_PUNCTUATION = str.maketrans("[],", "   ")


class _Numbers(argparse.Action):
    """Numbers given one by one (-qnm 0.485 0.456 0.406) or as onnx2tf's bracketed list
    (-qnm "[[[[0.485, 0.456, 0.406]]]]")."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            numbers = [float(v) for text in values for v in text.translate(_LIST_PUNCTUATION).split()]
        except ValueError:
            parser.error(f"{option_string} takes numbers or a list of them, got {values}")
        setattr(namespace, self.dest, numbers)


def own_flags() -> list[tuple[str, str]]:
    """(option strings, help) of the flags onnx2tf does not have, for docs/cli_flags.md."""
    known = {name for f in FLAGS for name in (f.short, f.long)} | {"-h", "--help"}
    return [
        (", ".join(a.option_strings), " ".join((a.help or "").split()).replace("%%", "%"))
        for a in parser()._actions
        if not known.intersection(a.option_strings)
    ]


if __name__ == "__main__":
    print(cli_flags_markdown(own_flags()), end="")
