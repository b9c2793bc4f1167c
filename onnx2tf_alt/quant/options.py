"""What the -odrqt / -oiqt family of flags asks for: kept apart from the quantizer
(quant/quantize.py) so that a conversion without quantized files does not import it."""

from __future__ import annotations

from dataclasses import dataclass, field

from calibration.methods import DEFAULT_METHOD


@dataclass
class QuantOptions:
    """What the -odrqt / -oiqt family of flags asked for."""

    dynamic_range: bool = False
    integer: bool = False
    quant_type: str = "per-channel"
    input_quant_dtype: str = "int8"
    output_quant_dtype: str = "int8"
    calibration_method: str = DEFAULT_METHOD
    keep_float: list[str] = field(default_factory=list)  # ONNX nodes the INT8 files keep float
    keep_float_auto: float | None = None  # target output cosine of the INT8 files
    sensitivity: bool = False  # rank the INT8 files' ops (-cotof) even without a target
    bias_correction: bool = True  # the INT8 files' conv biases (quant/bias_correction.py)
    warn_below: float = 0.99  # held-out pooled cosine under which an INT8 file is flagged
    integer_kernels_only: bool = False  # --target micro: no op of the INT8 files stays float

    @property
    def any(self) -> bool:
        return self.dynamic_range or self.integer
