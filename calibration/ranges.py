"""Activation ranges of a calibrated flatbuffer, measured again without in-place ops.

TF's calibrator (the converter's calibrate-only step) runs the float model in an
interpreter that lets an elementwise op write its output over an input nobody else reads,
and it records each tensor's min and max after the op that reads it has run. An input
overwritten that way gets the reader's range. Every hard-swish written as x * relu6(x + 3)
shows it: the relu6 output, truly in [0, 6], is recorded with the product's range (up to
[-2, 650] on a PP-OCR detector), so its INT8 grid keeps a handful of the 256 levels. Here
each recorded tensor's range is measured again on the same samples in an interpreter that
writes every tensor out (each is an output of the subgraph: tflite/run.exposed; none shares
a buffer), on XNNPACK, and written back into the flatbuffer the quantizer reads (the
direct writer's file records none: there every range is written this way).

The measurement can also clip each range (`--calibration_method`, the TFLITE_GRAPH rows of
methods.py): a second pass over the samples fills a histogram of every tensor over its
min-max range, and the range becomes, by the row's algorithm,
- PERCENTILE: the values between the row's `tail`-th quantile and its mirror (at most that
  share of the values is clipped at each end; a range never moves past 0);
- MSE: the range whose 8-bit grid has the least expected squared error over the
  histogram, counting the rounding inside (step^2 / 12 a value) and the clipping outside.
A range is never widened. A handful of outliers (a heavy-tailed channel, one bright pixel)
then no longer sets an 8-bit step that rounds the bulk of the values to a few levels.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from calibration.methods import BY_NAME, MINMAX, MSE, PERCENTILE, TFLITE_GRAPH, RangeMethod
from onnx2tf_alt import progress
from onnx2tf_alt.tflite.flatbuffer import SIGNATURE, pack_model, schema, unpack_model
from onnx2tf_alt.tflite.run import XNNPACK_MAX_BYTES, exposed, give_back_heap, op_resolver

# Keeping every tensor costs their sum at once: about 420 MiB for a 640x640 PP-OCR detector
# (1.3 GB resident). Above this, TF's records are kept (calibrated_tflite warns).
MAX_KEPT_BYTES = 2 << 30
ALGORITHMS = (MINMAX, PERCENTILE, MSE)
PERCENTILE_TAIL = BY_NAME[PERCENTILE].tail  # percentile_range's default
BINS = 2048  # histogram bins over a tensor's min-max range
MSE_CANDIDATES = 128  # `mse`: candidate ends on each side of 0


def _recorded(tensor) -> bool:
    q = tensor.quantization
    return q is not None and q.min is not None and len(q.min) == 1 and q.max is not None


def _gridded(tensor) -> bool:
    """Whether a tensor has a grid of its own (quant/grids.given_grid: a scale)."""
    q = tensor.quantization
    return q is not None and q.scale is not None and len(q.scale) > 0


def measured_ranges(content: bytes, feeds: Iterable[dict[str, np.ndarray]],
                    methods: Sequence[str] = (MINMAX,)) -> dict[str, dict[int, tuple]]:
    """{method: {tensor index: (low, high)}} for each of `methods` (names of TFLITE_GRAPH
    rows of methods.METHODS, not auto) over `feeds` (signature inputs, physical layout): the
    min and max of the finite values of every float tensor of the main subgraph that an op
    writes or the subgraph takes as input, clipped by the method."""
    return measured_ranges_split(content, feeds, None, methods)[1]


def measured_ranges_split(content: bytes, feeds: Iterable[dict[str, np.ndarray]],
                          split: int | None, methods: Sequence[str] = (MINMAX,)
                          ) -> tuple[dict[str, dict[int, tuple]] | None,
                                     dict[str, dict[int, tuple]]]:
    """(measured_ranges over the first `split` feeds (None without a split), over all of
    them), from one pair of passes: the first feeds' histograms share the bins of the whole
    range, and their clipped ranges are clamped to their own min-max (never wider)."""
    unknown = {m for m in methods if m not in BY_NAME or BY_NAME[m].measurer != TFLITE_GRAPH
               or BY_NAME[m].algorithm not in ALGORITHMS}
    if unknown:
        raise ValueError(f"unknown range method(s) {sorted(unknown)}")
    rows = [BY_NAME[m] for m in methods]
    feeds = list(feeds)
    from ai_edge_litert.interpreter import Interpreter

    # Every float tensor an op writes is an output of the subgraph: XNNPACK computes them
    # all and keeps them (keeping every tensor otherwise takes the reference kernels, ~8x
    # slower on a 640x640 detector's convolutions). A file past XNNPACK_MAX_BYTES runs
    # without XNNPACK anyway (it would pack a second copy of the weights): there the
    # interpreter keeps every tensor of `content` itself, and no exposed copy of the file
    # is made (a 2.3 GB file: 7.1 -> 2.5 GB at this step).
    model = unpack_model(content)
    kept = _activation_bytes(model)
    if kept > MAX_KEPT_BYTES:
        raise ValueError(f"its tensors need {kept / 2**30:.1f} GiB at once, more than the "
                         f"{MAX_KEPT_BYTES / 2**30:.0f} GiB allowed")
    graph = model.subgraphs[0]
    watched = sorted({int(t) for op in graph.operators for t in op.outputs
                      if graph.tensors[int(t)].type == schema.TensorType.FLOAT32}
                     | {int(i) for i in graph.inputs})
    if len(content) > XNNPACK_MAX_BYTES:
        interpreter = Interpreter(model_content=bytes(content),  # no copy of bytes
                                  experimental_preserve_all_tensors=True,
                                  experimental_op_resolver_type=op_resolver(len(content)),
                                  num_threads=os.cpu_count())
    else:
        interpreter = Interpreter(model_content=exposed(model, watched),
                                  num_threads=os.cpu_count())
    del model, graph
    runner = interpreter.get_signature_runner(SIGNATURE)
    # numpy releases the GIL on whole tensors: one thread per core reads them
    pool = ThreadPoolExecutor(os.cpu_count() or 1)

    unfinite: set[int] = set()  # tensors that held an infinity or a NaN (a -inf mask)

    def span(index: int) -> tuple[float, float] | None:
        value = interpreter.tensor(index)()  # a view, read before the next run
        if not value.size:
            return None
        low, high = value.min(), value.max()
        if np.isfinite(low) and np.isfinite(high):
            return float(low), float(high)
        unfinite.add(index)
        value = value[np.isfinite(value)]
        return (float(value.min()), float(value.max())) if value.size else None

    ranges: dict[int, tuple] = {}
    head: dict[int, tuple] = {}  # over the first `split` feeds
    for k, feed in enumerate(progress.each(feeds, "measuring ranges")):
        if k == split:
            head = dict(ranges)
        runner(**feed)
        for index, found in zip(watched, pool.map(span, watched)):
            if found is None:
                continue
            low, high = found
            if index in ranges:
                low, high = min(low, ranges[index][0]), max(high, ranges[index][1])
            ranges[index] = low, high
    if split is not None and split >= len(feeds):
        head = dict(ranges)
    measured = {m.name: ranges for m in rows if m.algorithm == MINMAX}
    first = {m.name: head for m in rows if m.algorithm == MINMAX} if split is not None else None
    clipping = [m for m in rows if m.algorithm != MINMAX]
    if not clipping:
        pool.shutdown()
        runner = interpreter = None  # its tensors and packed weights
        give_back_heap()
        return first, measured
    counts = {index: np.zeros(BINS, np.int64) for index in ranges}
    head_counts = {}

    def count(index: int) -> None:
        low, high = ranges[index]
        value = interpreter.tensor(index)()  # the first pass's values again
        counts[index] += _histogram(value[np.isfinite(value)] if index in unfinite else value,
                                    low, high)

    spread = [index for index, (low, high) in ranges.items() if high > low]
    for k, feed in enumerate(feeds):  # a second pass: histograms over each whole range
        if k == split:
            head_counts = {index: c.copy() for index, c in counts.items()}
        runner(**feed)
        list(pool.map(count, spread))
    pool.shutdown()
    runner = interpreter = None  # its tensors and packed weights
    give_back_heap()
    if split is not None and split >= len(feeds):
        head_counts = counts
    for method in clipping:
        measured[method.name] = {
            index: _clipped(method, counts[index], low, high) if high > low else (low, high)
            for index, (low, high) in ranges.items()}
        if first is not None:
            first[method.name] = {
                index: _within(_clipped(method, head_counts[index], *ranges[index]), span)
                if ranges[index][1] > ranges[index][0] else span
                for index, span in head.items()}
    return first, measured


def _within(clipped: tuple[float, float], span: tuple[float, float]) -> tuple[float, float]:
    """`clipped` (a range clipped on bins of a wider one) no wider than `span`."""
    return max(clipped[0], span[0]), min(clipped[1], span[1])


def _histogram(value: np.ndarray, low: float, high: float) -> np.ndarray:
    """The counts of `value` (within [low, high]) in BINS equal bins: np.histogram's, in a
    third of its time (one scaled truncation and a bincount, no edge checks)."""
    scaled = np.subtract(value, np.float32(low), dtype=np.float32)
    np.multiply(scaled, np.float32(BINS / (high - low)), out=scaled)
    bins = scaled.astype(np.intp).ravel()  # bincount's own index type: no second copy
    del scaled
    np.clip(bins, 0, BINS - 1, out=bins)
    return np.bincount(bins, minlength=BINS)


def _clipped(method: RangeMethod, counts: np.ndarray, low: float, high: float
             ) -> tuple[float, float]:
    if method.algorithm == PERCENTILE:
        return percentile_range(counts, low, high, method.tail)
    return mse_range(counts, low, high)


def percentile_range(counts: np.ndarray, low: float, high: float,
                     tail: float = PERCENTILE_TAIL) -> tuple[float, float]:
    """[low, high] without at most `tail` of the histogram's values at each end; 0 stays
    inside."""
    edges = np.linspace(low, high, len(counts) + 1)
    share = np.cumsum(counts) / max(counts.sum(), 1)
    first = int(np.searchsorted(share, tail, side="right"))  # the bin the low quantile is in
    last = int(np.searchsorted(share, 1 - tail, side="left"))  # the high one's
    return (min(float(edges[first]), 0.0) if low < 0 else low,
            max(float(edges[min(last + 1, len(counts))]), 0.0) if high > 0 else high)


def mse_range(counts: np.ndarray, low: float, high: float,
              candidates: int = MSE_CANDIDATES) -> tuple[float, float]:
    """The [a, b] within [low, high] (0 inside, ends on bin edges) whose 8-bit grid has the
    least expected squared error over the histogram `counts` of [low, high]."""
    bins = len(counts)
    width = (high - low) / bins
    centers = low + (np.arange(bins) + 0.5) * width
    edges = low + np.arange(bins + 1) * width
    # prefix sums of n, n*c, n*c^2: the clipping error of every end in O(1)
    n = np.concatenate([[0], np.cumsum(counts)])
    nc = np.concatenate([[0], np.cumsum(counts * centers)])
    ncc = np.concatenate([[0], np.cumsum(counts * centers**2)])
    def choices(start: int, stop: int) -> np.ndarray:
        return np.unique(np.linspace(start, stop, candidates).round().astype(int))

    # a low end at an edge <= 0, a high end at an edge >= 0
    lows = choices(0, int(np.searchsorted(edges, 0.0, side="right")) - 1) if low < 0 else (
        np.array([0]))
    highs = choices(int(np.searchsorted(edges, 0.0, side="left")), bins) if high > 0 else (
        np.array([bins]))
    a, b = np.meshgrid(lows, highs, indexing="ij")
    lo, hi = low + a * width, low + b * width
    below = ncc[a] - 2 * lo * nc[a] + lo**2 * n[a]  # sum n (c - lo)^2 over the bins below a
    above = (ncc[-1] - ncc[b]) - 2 * hi * (nc[-1] - nc[b]) + hi**2 * (n[-1] - n[b])
    step = (hi - lo) / 255
    error = below + above + (n[b] - n[a]) * step**2 / 12
    error[hi <= lo] = np.inf
    i, j = np.unravel_index(int(np.argmin(error)), error.shape)
    return (float(lo[i, j]) if low < 0 else low, float(hi[i, j]) if high > 0 else high)


def remeasured(content: bytes, feeds: Iterable[dict[str, np.ndarray]],
               methods: Sequence[str] = (MINMAX,)) -> dict[str, tuple[bytes, int]]:
    """{method: (`content` with the recorded range of each tensor of its main subgraph
    replaced by the one measured on `feeds` by that method (measured_ranges), how many
    ranges changed by more than 1%)}. Tensors the interpreter cannot show (an op's
    intermediates, other subgraphs) keep their range. ValueError when keeping every tensor
    at once would take more than MAX_KEPT_BYTES."""
    return {method: with_ranges(content, ranges)
            for method, ranges in measured_ranges(content, feeds, methods).items()}


@dataclass(frozen=True)
class Calibrated:
    """A float file and the activation ranges the quantizer takes for it: the file as it is
    and the ranges measured on it ({tensor index: (low, high)}, recorded as the quantizer
    unpacks the file: record_ranges), or None where the file's own records stand (TF's
    calibrator's). No copy of the file with the ranges written in is made (a 2.3 GB
    model's was 2.3 GB more at every INT8 and INT16 file); `written` makes one for TF's
    quantizer and for tests."""
    content: bytes
    ranges: dict[int, tuple] | None = None

    def written(self) -> bytes:
        """The file with the ranges recorded (with_ranges)."""
        return self.content if self.ranges is None else with_ranges(self.content,
                                                                    self.ranges)[0]


def with_ranges(content: bytes, ranges: dict[int, tuple]) -> tuple[bytes, int]:
    """(`content` with `ranges` recorded (record_ranges), how many changed by more than
    1%)."""
    model = unpack_model(content)
    changed = record_ranges(model, ranges)
    return pack_model(model, len(content) + 4096), changed


def record_ranges(model, ranges: dict[int, tuple]) -> int:
    """Record the range of each float tensor of `ranges` in `model` (schema.ModelT); how
    many changed by more than 1%. A calibrated file's recorded ranges are replaced and no
    others added (TF's calibrator leaves some tensors unrecorded on purpose: the quantizer
    derives them from their neighbours); a file without any (the direct writer's) gets
    every one. A tensor with a grid of its own (a QDQ pair's or onnxruntime's
    calibrator's, quant/qdq_grids.py) keeps it."""
    tensors = model.subgraphs[0].tensors
    fresh = not any(_recorded(t) and not _gridded(t) for t in tensors)
    changed = 0
    for index, tensor in enumerate(tensors):
        if index not in ranges or tensor.type != schema.TensorType.FLOAT32 or not (
                fresh or _recorded(tensor)) or _gridded(tensor):
            continue
        low, high = (float(np.float32(v)) for v in ranges[index])  # as the file stores them
        if not _recorded(tensor):
            tensor.quantization = tensor.quantization or schema.QuantizationParametersT()
            tensor.quantization.min, tensor.quantization.max = [0.0], [0.0]
        q = tensor.quantization
        old = float(q.max[0]) - float(q.min[0])
        changed += abs((high - low) - old) > 0.01 * max(old, 1e-12)
        q.min, q.max = [low], [high]
    return changed


def _activation_bytes(model) -> int:
    """Bytes of the main subgraph's non-constant tensors, dynamic dims counted as 1."""
    constant = {i for i, b in enumerate(model.buffers) if b.data is not None and len(b.data)}
    return sum(4 * math.prod(int(d) for d in t.shape)
               for t in model.subgraphs[0].tensors
               if t.buffer not in constant and t.shape is not None)
