"""Convert many models: `onnx2tf-alt batch SOURCE -o OUT_ROOT` and `onnx2tf_alt.batch(...)`.

(Named `batching`, not `batch`: a subpackage `onnx2tf_alt.batch` would replace the
function `onnx2tf_alt.batch` as soon as it is imported.)
"""

from onnx2tf_alt.batching.baseline import Thresholds
from onnx2tf_alt.batching.runner import BatchReport, batch

__all__ = ["BatchReport", "Thresholds", "batch"]
