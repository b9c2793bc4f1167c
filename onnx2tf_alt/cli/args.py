"""The conversion command line: every flag `onnx2tf-alt` (and each child of a batch)
parses, and the list of those onnx2tf does not have. `python -m onnx2tf_alt.cli.args`
prints docs/cli_flags.md."""

from __future__ import annotations

import argparse

from calibration.methods import DEFAULT_METHOD, METHODS, NAMES, ONNXRUNTIME, TFLITE_GRAPH
from onnx2tf_alt.cli.compat_flags import FLAGS, add_compat_flags, cli_flags_markdown
from onnx2tf_alt.export.names import TARGETS
from onnx2tf_alt.version import described_version

# onnx2tf 2.x's --tflite_backend values -> our --tflite_writer (cli/main.py applies it)
BACKENDS = {"tf_converter": "tf", "flatbuffer_direct": "auto"}


USAGE = "onnx2tf-alt -i MODEL.onnx [-o DIR] [options]"

DESCRIPTION = """\
Convert an ONNX model to TFLite files (-osm: saved_model, -oh5 / -okv3: Keras) with
channel-last ops.

  onnx2tf-alt -i MODEL.onnx [options]     one model (the same: python -m onnx2tf_alt ...)
  onnx2tf-alt batch SOURCE -o OUT_ROOT    many models, each in its own process:
                                          onnx2tf-alt batch -h, docs/batch.md
  onnx2tf_alt.convert(input_onnx_file_path="m.onnx", output_h5=True)
                                          from Python: the long flag names as keywords

A flag is listed by its short name; each also has onnx2tf's long one (-oh5 is --output_h5).
Every flag in detail: docs/cli.md in the source tree (docs/ beside README.md)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """One line per flag, within 100 columns: a flag is listed by its short name when it
    has one (docs/cli.md gives both), with its help's first line (the lines after it are
    detail for docs/cli_flags.md)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=100, max_help_position=30)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        short = [s for s in action.option_strings if not s.startswith("--")]
        name = (short or action.option_strings)[0]
        if action.nargs == 0:
            return name
        default = self._get_default_metavar_for_optional(action)
        metavar = self._metavar_formatter(action, default)(1)[0]
        if action.nargs in ("+", "*") and " " not in metavar:  # a spaced metavar: one use
            metavar = f"{metavar} ..." if action.nargs == "+" else f"[{metavar} ...]"
        return f"{name} {metavar}"

    def _get_help_string(self, action: argparse.Action) -> str:
        return (action.help or "").split("\n", 1)[0]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="onnx2tf-alt",
        usage=USAGE,
        description=DESCRIPTION,
        formatter_class=_HelpFormatter,
        add_help=False,  # -h is listed with -v and -V, below
        allow_abbrev=False,  # onnx2tf's flags must never be read as prefixes of ours
    )
    _file_flags(p.add_argument_group("input and output (docs/outputs.md)"))
    _shape_and_layout_flags(p.add_argument_group("shapes and layout"))
    _check_flags(p.add_argument_group("accuracy check against onnxruntime"))
    _quant_flags(p.add_argument_group("quantization (docs/quantization.md)"))
    _generative_flags(p.add_argument_group("generative models (docs/generative.md)"))
    _target_flags(p.add_argument_group("deployment targets and lowering (docs/consumers.md)"))
    _onnx2tf_flags(p.add_argument_group(
        "onnx2tf compatibility",
        "Every other onnx2tf 1.29 / 2.x flag is accepted with a note, or refused naming\n"
        "its equivalent: docs/cli_flags.md lists them all."))
    _message_flags(p.add_argument_group("messages"))
    add_compat_flags(p)
    return p


_Group = argparse._ArgumentGroup  # what add_argument_group returns


def _file_flags(g: _Group) -> None:
    """What to convert and which files to write."""
    g.add_argument("-i", "--input_onnx_file_path", metavar="MODEL.onnx",
                   help="the .onnx model to convert")
    g.add_argument("-o", "--output_folder_path", default="saved_model", metavar="DIR",
                   help="output folder (default: saved_model)")
    g.add_argument("-oh5", "--output_h5", action="store_true", help="also write <stem>.h5")
    g.add_argument("-okv3", "--output_keras_v3", action="store_true",
                   help="also write <stem>.keras")
    g.add_argument("-osm", "--output_saved_model", action="store_true",
                   help="also write the saved_model (needs TensorFlow: the [tf] extra)")
    g.add_argument("-dms", "--disable_model_save", action="store_true",
                   help="no saved_model: the default (accepted for onnx2tf 1.x's scripts)")
    g.add_argument("-coion", "--copy_onnx_input_output_names_to_tflite", action="store_true",
                   help="ONNX input/output names as .tflite tensor names and signature keys")


def _shape_and_layout_flags(g: _Group) -> None:
    """Input shapes and layouts, and the part of the graph to convert."""
    g.add_argument("-b", "--batch_size", type=int, metavar="N",
                   help="fix a symbolic batch dimension")
    g.add_argument("-ois", "--overwrite_input_shape", nargs="+", metavar="NAME:SHAPE",
                   help="fix input shapes, e.g. -ois input:1,3,224,224 mask:1,224")
    g.add_argument("-k", "--keep_ncw_or_nchw_or_ncdhw_input_names", nargs="+",
                   action="extend",  # shared with -kat
                   metavar="NAME", help="inputs that stay channel-first (ONNX layout)")
    g.add_argument("-kt", "--keep_nwc_or_nhwc_or_ndhwc_input_names", nargs="+", metavar="NAME",
                   help="inputs that become channel-last even if no conv reads them")
    g.add_argument("-inimc", "--input_names_to_interrupt_model_conversion", nargs="+",
                   metavar="NAME",
                   help="convert only the part computed from these tensors (the new inputs)")
    g.add_argument("-onimc", "--output_names_to_interrupt_model_conversion", nargs="+",
                   metavar="NAME",
                   help="convert only the part that computes these tensors (the new outputs)")


def _check_flags(g: _Group) -> None:
    """The accuracy check against onnxruntime and its inputs."""
    g.add_argument("-coto", "--check_onnx_tf_outputs_elementwise_close", action="store_true",
                   help="compare the model outputs; writes <stem>_accuracy_report.json/.html")
    g.add_argument("-cotof", "--check_onnx_tf_outputs_elementwise_close_full",
                   action="store_true",
                   help="the same for every node output, naming the first diverging node")
    g.add_argument("-cotoa", "--check_onnx_tf_outputs_elementwise_close_atol", type=float,
                   default=1e-4, metavar="A", help="absolute tolerance (default: 1e-4)")
    g.add_argument("-cotor", "--check_onnx_tf_outputs_elementwise_close_rtol", type=float,
                   default=0.0, metavar="R",
                   help="relative tolerance: |tf - onnx| <= A + R*|onnx| (default: 0)")
    g.add_argument("-cind", "--custom_input_op_name_np_data_path", nargs="+", action="append",
                   metavar="NAME FILE [MEAN STD]",
                   help="check/calibration data of an input (.npy, ONNX layout); repeatable")


def _calibration_method_help() -> str:
    """--calibration_method's help, from the table of calibration/methods.py: one line for
    -h, then each method for docs/cli_flags.md."""

    def listed(measurer: str) -> str:
        return ", ".join(f"{m.name} ({'default: ' if m.name == DEFAULT_METHOD else ''}"
                         f"{m.description})" for m in METHODS if m.measurer == measurer)

    text = (f"activation ranges of the -oiqt INT8 files (default: {DEFAULT_METHOD})\n— "
            f"measured on the TFLite graph over the calibration samples: {listed(TFLITE_GRAPH)};"
            f" or by onnxruntime's calibrators on the ONNX graph: {listed(ONNXRUNTIME)}. The "
            "INT16-activation files always use min-max")
    return text.replace("%", "%%")


def _quant_flags(g: _Group) -> None:
    """The quantized .tflite files."""
    g.add_argument("-odrqt", "--output_dynamic_range_quantized_tflite", action="store_true",
                   help="also write <stem>_dynamic_range_quant.tflite (int8 weights)")
    g.add_argument("-oiqt", "--output_integer_quantized_tflite", action="store_true",
                   help="also write the INT8 and INT16-activation files, and a quant report")
    g.add_argument("-oi4", "--output_int4_weight_quantized_tflite", action="store_true",
                   help="also write <stem>_int4_weight_quant.tflite (int4 FULLY_CONNECTED)")
    g.add_argument("-qt", "--quant_type", choices=["per-channel", "per-tensor"],
                   default="per-channel", metavar="TYPE",
                   help="-oiqt weights: per-channel (default) or per-tensor")
    g.add_argument("--calibration_method", choices=NAMES, default=DEFAULT_METHOD,
                   metavar="M", help=_calibration_method_help())
    g.add_argument("--keep_float", nargs="+", metavar="NODE",
                   help="ONNX nodes the -oiqt INT8 files compute in float (mixed precision)")
    g.add_argument("--keep_float_auto", type=float, metavar="COS",
                   help="keep sensitive nodes in float until the outputs reach this cosine")
    g.add_argument("--no_bias_correction", dest="bias_correction", action="store_false",
                   help="leave the -oiqt INT8 files' biases as quantized")
    g.add_argument("--int8_warn_below", type=float, default=0.99, metavar="COS",
                   help="warn if an INT8 file's output cosine is below this (default: 0.99)")
    for short, long, which in (("-iqd", "--input_quant_dtype", "input"),
                               ("-oqd", "--output_quant_dtype", "output")):
        g.add_argument(short, long, choices=["int8", "uint8", "float32"], default="int8",
                       metavar="TYPE",
                       help=f"{which} type of the full-integer file: int8 (default), uint8, "
                       "float32")
    g.add_argument("-qnm", "--quant_norm_mean", nargs="+", action=_Numbers, metavar="MEAN",
                   help="mean subtracted from the calibration photos (default: ImageNet's)")
    g.add_argument("-qns", "--quant_norm_std", nargs="+", action=_Numbers, metavar="STD",
                   help="std the calibration photos are divided by (default: ImageNet's)")


def _generative_flags(g: _Group) -> None:
    """Several signatures over one copy of the weights, and a decoder's KV cache."""
    g.add_argument("--signature", dest="signatures", nargs="+", action="append",
                   metavar="NAME",
                   help="a signature, sharing the weights: NAME [MODEL.onnx] INPUT:SHAPE ...")
    g.add_argument("--kv_cache_capacity", type=int, metavar="N",
                   help="a decoder's KV cache of N positions: the same shapes every step")
    g.add_argument("--litertlm", action="store_true",
                   help="also <stem>_<variant>.litertlm for LiteRT-LM (with --tokenizer)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="--litertlm: tokenizer.json, tokenizer.model or the model's folder")
    g.add_argument("--litertlm_prefill", type=int, nargs="+", metavar="T",
                   help="--litertlm: the prefill signatures' lengths (default 32)")


def _target_flags(g: _Group) -> None:
    """Which runtime the files are checked on, what writes them, and delegate-friendly
    forms of some ops."""
    g.add_argument("--target", choices=TARGETS, metavar="micro",
                   help="check the full-integer file on TFLite Micro (implies -oiqt, -b 1)")
    g.add_argument("--builtin_only", action="store_true",
                   help="fail rather than write .tflite files needing Select TF (Flex) ops")
    g.add_argument("--tflite_writer", choices=("auto", "tf", "direct"), default="auto",
                   metavar="W",
                   help="what writes the float .tflite: auto (default), tf, direct")
    g.add_argument("-dgc", "--disable_group_convolution", action="store_true",
                   help="a grouped Conv as SPLIT + one CONV_2D per group (e.g. for TF.js)")
    g.add_argument("-rtpo", "--replace_to_pseudo_operators", nargs="*", metavar="OP",
                   help="GeLU, HardSwish, LeakyReLU, PReLU, Pow as simpler builtins")
    g.add_argument("--allow_newer_opset", action="store_true",
                   help="convert an opset newer than the installed onnx package knows")


def _onnx2tf_flags(g: _Group) -> None:
    """onnx2tf's names for flags listed above."""
    g.add_argument("-osd", "--output_signaturedefs", action="store_true",
                   help="accepted; signatures are always written")
    g.add_argument("-tb", "--tflite_backend", choices=tuple(BACKENDS), metavar="BACKEND",
                   help="tf_converter is --tflite_writer tf, flatbuffer_direct is auto")
    g.add_argument("-fdosm", "--flatbuffer_direct_output_saved_model", action="store_true",
                   dest="output_saved_model", help="onnx2tf 2.x's name for -osm")
    g.add_argument("-kat", "--keep_shape_absolutely_input_names", nargs="+", action="extend",
                   dest="keep_ncw_or_nchw_or_ncdhw_input_names", metavar="NAME",
                   help="onnx2tf's name for -k")


def _message_flags(g: _Group) -> None:
    """How much is printed, the version and this help."""
    g.add_argument("-v", "--verbosity", choices=["debug", "info", "warn", "error"],
                   default="info", metavar="LEVEL",
                   help="log level: debug, info (default), warn, error")
    g.add_argument("-n", "--non_verbose", action="store_true",
                   help="errors only, no progress bar")
    g.add_argument("-V", "--version", action="version", version=described_version(),
                   help="print the version (and whether TensorFlow is installed) and exit")
    g.add_argument("-h", "--help", action="help", help="print this help and exit")


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
