"""Keras .h5 and .keras (keras_v3) files; weights stay layer weights, configs stay small."""

from __future__ import annotations

import datetime
import json
import os
import warnings
import zipfile

from onnx2tf_alt.translate.builder import BuildResult

ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry


def save_h5(result: BuildResult, path: str) -> None:
    with warnings.catch_warnings():  # "legacy format": the user asked for it with -oh5
        warnings.simplefilter("ignore", UserWarning)
        result.model.save(path, save_format="h5")


def save_keras_v3(result: BuildResult, path: str) -> None:
    result.model.save(path, save_format="keras_v3")
    _make_reproducible(path)


def _make_reproducible(path: str) -> None:
    """Give every zip entry one fixed time, so that two conversions of one model write the
    same bytes. The save time in metadata.json stays, unless SOURCE_DATE_EPOCH (the
    reproducible-builds convention) sets it."""
    with zipfile.ZipFile(path) as source:
        entries = [(info, source.read(info)) for info in source.infolist()]
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    with zipfile.ZipFile(path + ".tmp", "w") as target:
        for info, data in entries:
            if info.filename == "metadata.json" and epoch and epoch.isdigit():
                metadata = json.loads(data)
                stamp = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
                metadata["date_saved"] = stamp.strftime("%Y-%m-%d@%H:%M:%S")
                data = json.dumps(metadata).encode()
            fixed = zipfile.ZipInfo(info.filename, date_time=ZIP_EPOCH)
            fixed.compress_type, fixed.external_attr = info.compress_type, info.external_attr
            target.writestr(fixed, data)
    os.replace(path + ".tmp", path)
