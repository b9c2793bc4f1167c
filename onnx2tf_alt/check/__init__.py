"""The accuracy checker (-coto / -cotof) and the per-node reports of failed conversions.

Kept import-light: the top-level package imports `check` from here, so the name
`onnx2tf_alt.check` stays this function even after the checker's modules load (a lazily
imported subpackage would otherwise replace the function of the same name).
"""

from __future__ import annotations

from onnx2tf_alt.translate.recursion import deep_graphs


@deep_graphs()
def check(
    input_onnx_file_path: str,
    converted_path: str | None = None,
    *,
    full: bool = True,
    tflite: bool = True,
    atol: float = 1e-4,
    rtol: float = 0.0,
    inputs: dict | None = None,
    custom_input_op_name_np_data_path: list | None = None,
    report_folder: str | None = None,
    seed: int = 0,
    keras: bool | None = None,
    **build_kwargs,
):
    """Compare a conversion of `input_onnx_file_path` with onnxruntime; returns an
    `AccuracyReport` (onnx2tf_alt.check.compare).

    The conversion is rebuilt in memory. With `converted_path` (a folder `convert` wrote),
    its `<stem>_io_layout.json` supplies the input layouts and shapes, and the rebuilt
    model must lay out every input and output as recorded there (else InputError); when
    only the model outputs are checked (`full=False`), the folder's float32 .tflite is the
    TFLite that is run.

    full: every node output (the -cotof check), else only the model outputs (-coto).
    tflite: compare the float32 TFLite as well as the Keras model.
    keras: build and compare the Keras model (TensorFlow, the `[tf]` extra: onnx2tf_alt/
        version.py); default: where TensorFlow is installed. False checks the float32
        TFLite of the direct writer alone, as the default CLI run writes it, without
        TensorFlow.
    atol, rtol: a value passes when |converted - onnx| <= atol + rtol * |onnx| everywhere.
    inputs / custom_input_op_name_np_data_path: test inputs by name, as arrays or as
        -cind entries [[name, file.npy(, mean, std)], ...] (ONNX layout; of an array with
        several samples along a leading axis, the first); other inputs are seeded random.
    report_folder: also write `<stem>_accuracy_report.json` and `.html` there.
    build_kwargs: conversion options of `onnx2tf_alt.pipeline.build` (batch_size, ...).
    """
    from onnx2tf_alt import version

    if keras is None:
        keras = version.installed()
    if keras:
        version.require("onnx2tf_alt.check(keras=True)")
    elif not tflite:
        raise ValueError("check(keras=False, tflite=False) compares nothing.")
    from onnx2tf_alt.check.inputs import load_custom_inputs
    from onnx2tf_alt.check.run import check_files

    arrays = load_custom_inputs([e[:2] for e in custom_input_op_name_np_data_path or []])
    arrays.update(inputs or {})
    return check_files(
        input_onnx_file_path, converted_path, full=full, atol=atol, rtol=rtol, inputs=arrays,
        tflite=tflite, report_folder=report_folder, seed=seed, keras=keras, **build_kwargs,
    )


__all__ = ["check"]
