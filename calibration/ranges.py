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
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from calibration.methods import BY_NAME, MINMAX, MSE, PERCENTILE, TFLITE_GRAPH, RangeMethod
from onnx2tf_alt import progress
from onnx2tf_alt.tflite.flatbuffer import SIGNATURE, pack_model, schema, unpack_model
from onnx2tf_alt.tflite.run import (
    XNNPACK_MAX_BYTES,
    exposed,
    give_back_heap,
    op_resolver,
    segment,
    set_inputs,
    signature_inputs,
)

# Keeping every tensor of a piece (of the whole file where it has control flow) costs their
# sum at once. Above this, TF's records are kept (calibrated_tflite warns).
MAX_KEPT_BYTES = 2 << 30
PIECE_BYTES = 64 << 20  # constants and kept tensors of one piece measured at once
# ... in pieces where that estimate is below this share of the whole file's: the estimates
# leave out the reading's temporaries and the heap's slack (the DB detector, estimated at
# 0.58 of its whole run, measured 0.89 of it: 470 against 526 MB)
PIECES_BELOW = 0.5
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
    range, and their clipped ranges are clamped to their own min-max (never wider).

    Every float tensor an op writes is an output of the file that computes it: XNNPACK
    computes them all and keeps them (keeping every tensor otherwise takes the reference
    kernels, ~8x slower on a 640x640 detector's convolutions). A file of one subgraph is
    measured piece by piece (_pieces: tflite/run.segment, each piece's weights and kept
    tensors about PIECE_BYTES, fed what the pieces before wrote): only one piece's weights,
    XNNPACK's packed copy of them and its tensors are held at once, where an exposed copy
    of the whole file held them all (ViT-B/16: the float file, its copy, the packed weights
    and 400 MB of tensors), where that holds clearly less (_in_pieces). Otherwise, and for a
    file of several subgraphs (control flow), the file runs whole: exposed, or past
    XNNPACK_MAX_BYTES on the builtin kernels keeping every tensor of the file itself (no
    copy of its weights)."""
    unknown = {m for m in methods if m not in BY_NAME or BY_NAME[m].measurer != TFLITE_GRAPH
               or BY_NAME[m].algorithm not in ALGORITHMS}
    if unknown:
        raise ValueError(f"unknown range method(s) {sorted(unknown)}")
    rows = [BY_NAME[m] for m in methods]
    clipping = [m for m in rows if m.algorithm != MINMAX]
    feeds = list(feeds)
    model = unpack_model(content)
    graph = model.subgraphs[0]
    watched = sorted({int(t) for op in graph.operators for t in op.outputs
                      if graph.tensors[int(t)].type == schema.TensorType.FLOAT32}
                     | {int(i) for i in graph.inputs})
    tally = _Tally(split, len(feeds))
    try:
        # past XNNPACK_MAX_BYTES the whole file runs in place: no copy of its weights at all
        if (len(model.subgraphs) == 1 and len(content) <= XNNPACK_MAX_BYTES
                and _in_pieces(model, watched, len(feeds))):
            _measure_in_pieces(model, watched, feeds, tally, bool(clipping))
        else:
            _measure_whole(content, model, watched, feeds, tally, bool(clipping))
    finally:
        tally.pool.shutdown()
        give_back_heap()  # the interpreters' tensors and packed weights
    ranges, head = tally.ranges, tally.head
    measured = {m.name: ranges for m in rows if m.algorithm == MINMAX}
    first = {m.name: head for m in rows if m.algorithm == MINMAX} if split is not None else None
    for method in clipping:
        measured[method.name] = {
            index: _clipped(method, tally.counts[index], low, high) if high > low
            else (low, high) for index, (low, high) in ranges.items()}
        if first is not None:
            first[method.name] = {
                index: _within(_clipped(method, tally.head_counts[index], *ranges[index]), span)
                if ranges[index][1] > ranges[index][0] else span
                for index, span in head.items()}
    return first, measured


class _Tally:
    """The ranges and histograms of the tensors measured so far: `ranges` over every feed,
    `head` over the first `split`; `counts` (BINS over each whole range) over every feed,
    `head_counts` over the first `split`. Tensors are read (as views, before the next run)
    one thread per core: numpy lets go of Python on whole tensors."""

    def __init__(self, split: int | None, feeds: int):
        self.split, self.feeds = split, feeds
        self.ranges: dict[int, tuple] = {}
        self.head: dict[int, tuple] = {}
        self.counts: dict[int, np.ndarray] = {}
        self.head_counts: dict[int, np.ndarray] = {}
        self.unfinite: set[int] = set()  # tensors that held an infinity or a NaN (a -inf mask)
        self.pool = ThreadPoolExecutor(os.cpu_count() or 1)

    def spans(self, k: int, tensors: list[int], read: Callable[[int], np.ndarray]) -> None:
        """The first pass: the min and max of `tensors` on feed `k` (read(tensor))."""
        if k == self.split:
            self.head.update((t, self.ranges[t]) for t in tensors if t in self.ranges)
        for index, found in zip(tensors, self.pool.map(lambda t: self._span(t, read(t)),
                                                       tensors)):
            if found is None:
                continue
            low, high = found
            if index in self.ranges:
                low, high = min(low, self.ranges[index][0]), max(high, self.ranges[index][1])
            self.ranges[index] = low, high
        if k == self.feeds - 1 and self.split is not None and self.split >= self.feeds:
            self.head.update((t, self.ranges[t]) for t in tensors if t in self.ranges)

    def _span(self, index: int, value: np.ndarray) -> tuple[float, float] | None:
        if not value.size:
            return None
        low, high = value.min(), value.max()
        if np.isfinite(low) and np.isfinite(high):
            return float(low), float(high)
        self.unfinite.add(index)
        value = value[np.isfinite(value)]
        return (float(value.min()), float(value.max())) if value.size else None

    def histograms(self, k: int, tensors: list[int], read: Callable[[int], np.ndarray]
                   ) -> None:
        """The second pass (the first one's values again): `tensors`' histograms on feed `k`
        over their whole ranges."""
        if k == 0:
            self.counts.update((t, np.zeros(BINS, np.int64)) for t in tensors
                               if t in self.ranges)
        if k == self.split:
            self.head_counts.update((t, self.counts[t].copy()) for t in tensors
                                    if t in self.counts)
        spread = [t for t in tensors if t in self.ranges and self.ranges[t][1] > self.ranges[t][0]]

        def count(index: int) -> None:
            value = read(index)
            self.counts[index] += _histogram(
                value[np.isfinite(value)] if index in self.unfinite else value,
                *self.ranges[index])

        list(self.pool.map(count, spread))
        if k == self.feeds - 1 and self.split is not None and self.split >= self.feeds:
            self.head_counts.update((t, self.counts[t]) for t in tensors if t in self.counts)


def _measure_in_pieces(model, watched: list[int], feeds: list[dict], tally: _Tally,
                       clipping: bool) -> None:
    """Both passes over a file of one subgraph, piece by piece (_pieces): each piece's
    interpreter runs every feed (fed the tensors the pieces before wrote, kept per feed
    while a later piece reads them), its tensors tallied, then is dropped."""
    from ai_edge_litert.interpreter import Interpreter

    if not feeds:
        return
    graph = model.subgraphs[0]
    inputs = signature_inputs(model)
    states = [{inputs[name]: value for name, value in feed.items()} for feed in feeds]
    watching, seen = set(watched), set()
    pieces = _pieces(model, watched)
    kept_bytes = max(sum(_tensor_bytes(graph.tensors[int(o)]) for k in piece
                         for o in graph.operators[k].outputs if int(o) in watching)
                     for piece in pieces) if pieces else 0
    if kept_bytes > MAX_KEPT_BYTES:
        raise ValueError(f"its tensors need {kept_bytes / 2**30:.1f} GiB at once, more than "
                         f"the {MAX_KEPT_BYTES / 2**30:.0f} GiB allowed")
    last_read = {int(i): p for p, piece in enumerate(pieces) for k in piece
                 for i in graph.operators[k].inputs}
    with progress.counting("measuring ranges", len(pieces)) as counter:
        for p, piece in enumerate(pieces):
            counter.begin()
            written = [int(o) for k in piece for o in graph.operators[k].outputs]
            kept = [t for t in written if last_read.get(t, -1) > p]
            outputs = [*dict.fromkeys([*(t for t in written if t in watching), *kept])]
            content, piece_inputs = segment(model, piece, outputs)
            interpreter = Interpreter(model_content=content, num_threads=os.cpu_count(),
                                      experimental_op_resolver_type=op_resolver(len(content)))
            del content
            interpreter.allocate_tensors()
            fed = interpreter.get_input_details()
            index = {t: d["index"] for t, d in zip(piece_inputs, fed)}
            index.update((t, d["index"]) for t, d in zip(outputs,
                                                          interpreter.get_output_details()))
            tallied = [t for t in piece_inputs if t in watching and t not in seen
                       and t in states[0]]  # the file's inputs, where first read
            tallied += [t for t in written if t in watching]
            seen.update(tallied)

            def read(tensor: int, interpreter=interpreter, index=index) -> np.ndarray:
                return interpreter.tensor(index[tensor])()

            for run in ((tally.spans, tally.histograms) if clipping else (tally.spans,)):
                for k, state in enumerate(states):
                    set_inputs(interpreter, fed, [state[t] for t in piece_inputs])
                    interpreter.invoke()
                    run(k, tallied, read)
                    if run == tally.spans:
                        state.update((t, interpreter.get_tensor(index[t])) for t in kept)
            for state in states:
                for tensor in [t for t in state if last_read.get(t, -1) <= p]:
                    del state[tensor]
            del interpreter, read
            give_back_heap()


def _pieces(model, watched: list[int]) -> list[list[int]]:
    """The ops of `model`'s subgraph in runs of graph order, each holding about
    PIECE_BYTES of constants and kept tensors (an op alone may hold more)."""
    graph = model.subgraphs[0]
    watching = set(watched)
    pieces, current, size, counted = [], [], 0, set()
    for k, op in enumerate(graph.operators):
        cost = 0
        for i in op.inputs:
            if int(i) >= 0 and int(i) not in counted:
                cost += _constant_bytes(model, graph.tensors[int(i)])
                counted.add(int(i))
        cost += sum(_tensor_bytes(graph.tensors[int(o)]) for o in op.outputs
                    if int(o) in watching)
        if current and size + cost > PIECE_BYTES:
            pieces.append(current)
            current, size = [], 0
        current.append(k)
        size += cost
    if current:
        pieces.append(current)
    return pieces


def _in_pieces(model, watched: list[int], feeds: int) -> bool:
    """Whether measuring `model` piece by piece holds clearly less at once than running it
    whole (PIECES_BELOW).
    Whole: its constants twice (the exposed copy, XNNPACK's packed weights) and every kept
    tensor. In pieces: the largest piece's constants twice and kept tensors, and the
    tensors crossing a piece boundary, kept for every feed. A transformer (ViT-B/16, 343 MB
    of weights, 18 feeds: 0.6 MB cross) gains; a detector at 640x640 (4.7 MB of weights,
    16 feeds: a feature pyramid's maps cross) does not."""
    graph = model.subgraphs[0]
    pieces = _pieces(model, watched)
    if len(pieces) < 2:
        return False
    watching = set(watched)
    constants = [sum(_constant_bytes(model, graph.tensors[i])
                     for i in dict.fromkeys(int(i) for k in piece
                                            for i in graph.operators[k].inputs if int(i) >= 0))
                 for piece in pieces]
    kept = [sum(_tensor_bytes(graph.tensors[int(o)]) for k in piece
                for o in graph.operators[k].outputs if int(o) in watching) for piece in pieces]
    last_read = {int(i): p for p, piece in enumerate(pieces) for k in piece
                 for i in graph.operators[k].inputs}
    crossing = [sum(_tensor_bytes(graph.tensors[int(o)]) for q in range(p + 1)
                    for k in pieces[q] for o in graph.operators[k].outputs
                    if last_read.get(int(o), -1) > p) for p in range(len(pieces))]
    whole = 2 * sum(constants) + sum(kept)
    in_pieces = max(2 * c + k for c, k in zip(constants, kept)) + feeds * max(crossing)
    return in_pieces < whole * PIECES_BELOW


def _constant_bytes(model, tensor) -> int:
    data = model.buffers[int(tensor.buffer)].data
    return 0 if data is None else len(data)


def _tensor_bytes(tensor) -> int:
    return 4 * math.prod(int(d) for d in tensor.shape) if tensor.shape is not None else 0


def _measure_whole(content: bytes, model, watched: list[int], feeds: list[dict],
                   tally: _Tally, clipping: bool) -> None:
    """Both passes over a file of several subgraphs in one interpreter: every tensor an
    output (tflite/run.exposed) on XNNPACK, or past XNNPACK_MAX_BYTES the file itself on
    the builtin kernels keeping every tensor (no exposed copy of its weights)."""
    from ai_edge_litert.interpreter import Interpreter

    kept = _activation_bytes(model)
    if kept > MAX_KEPT_BYTES:
        raise ValueError(f"its tensors need {kept / 2**30:.1f} GiB at once, more than the "
                         f"{MAX_KEPT_BYTES / 2**30:.0f} GiB allowed")
    if len(content) > XNNPACK_MAX_BYTES:
        interpreter = Interpreter(model_content=bytes(content),  # no copy of bytes
                                  experimental_preserve_all_tensors=True,
                                  experimental_op_resolver_type=op_resolver(len(content)),
                                  num_threads=os.cpu_count())
    else:
        interpreter = Interpreter(model_content=exposed(model, watched),
                                  num_threads=os.cpu_count())
    runner = interpreter.get_signature_runner(SIGNATURE)

    def read(tensor: int) -> np.ndarray:
        return interpreter.tensor(tensor)()

    for run in ((tally.spans, tally.histograms) if clipping else (tally.spans,)):
        for k, feed in enumerate(progress.each(feeds, "measuring ranges")
                                 if run == tally.spans else feeds):
            runner(**feed)
            run(k, watched, read)


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
