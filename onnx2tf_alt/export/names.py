"""The names of the files a conversion writes, known before it converts (no TensorFlow
import), so that the output folder can be checked first."""

from __future__ import annotations

SAVED_MODEL_ENTRIES = ("saved_model.pb", "fingerprint.pb", "variables/", "assets/")
DYNAMIC_RANGE_SUFFIXES = ("dynamic_range_quant",)
INT4_SUFFIX = "int4_weight_quant"  # -oi4: int4 FULLY_CONNECTED weights, int8 elsewhere
TARGETS = ("micro",)  # --target: runtimes a conversion's files are checked on
INTEGER_SUFFIXES = (
    "integer_quant",
    "full_integer_quant",
    "integer_quant_with_int16_act",
    "full_integer_quant_with_int16_act",
)


def planned_outputs(
    stem: str,
    output_h5: bool = False,
    output_keras_v3: bool = False,
    output_tflite: bool = True,
    dynamic_range: bool = False,
    integer: bool = False,
    check: bool = False,
    micro: bool = False,
    int4: bool = False,
    saved_model: bool = True,
    litertlm: bool = False,
) -> list[str]:
    """Every entry of the output folder the options may write (folders end in '/')."""
    names = [*(SAVED_MODEL_ENTRIES if saved_model else ()), f"{stem}_io_layout.json",
             f"{stem}_manifest.json"]
    if output_tflite:
        names += [f"{stem}_float32.tflite", f"{stem}_float16.tflite", f"{stem}_delegates.json"]
    if output_h5:
        names.append(f"{stem}.h5")
    if output_keras_v3:
        names.append(f"{stem}.keras")
    suffixes = (DYNAMIC_RANGE_SUFFIXES if dynamic_range else ()) + (
        INTEGER_SUFFIXES if integer else ())
    names += [f"{stem}_{s}.tflite" for s in suffixes]
    if suffixes:
        names.append(f"{stem}_quant_report.json")
    if int4:
        names.append(f"{stem}_{INT4_SUFFIX}.tflite")
    if litertlm:
        names += [f"{stem}_{s}.litertlm" for s in ("float32", *(
            DYNAMIC_RANGE_SUFFIXES[:1] if dynamic_range else ()), *(
            (INT4_SUFFIX,) if int4 else ()))]
    if micro:
        names.append(f"{stem}_micro.json")
    if check:
        names += [f"{stem}_accuracy_report.json", f"{stem}_accuracy_report.html"]
    return names

