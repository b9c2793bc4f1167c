"""Recurrent layers RNN, LSTM and GRU, unrolled over their static number of time steps.

Constant weights are folded in numpy. The input projection of all time steps is one
matmul before the loop; each step adds a matmul with the recurrence weights and elementwise
gates, which TFLite runs as FULLY_CONNECTED, ADD, MUL, LOGISTIC and TANH builtins, with no
control flow and no Flex ops. Each step's FULLY_CONNECTED gets a run-time bias (the step's
projection, or a vector computed at run time) so that all steps share one copy of the
recurrence weights on TFLite's builtin kernel (onnx2tf_alt/tflite/shared_weights.py). Weights,
biases and peepholes computed at run time go through the same code as tensors: the slices
and products that fold in numpy become ops.

sequence_lens: a sequence's state is frozen after its end and its outputs there are zero.
The reverse direction walks the steps from the last one down, so a shorter sequence keeps
its initial state through its padding and then runs its valid prefix backwards, which is
the per-sequence reversal the spec asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnx2tf_alt.ir.graph import is_read
from onnx2tf_alt.layout.policies import Decision, custom_policy, logical
from onnx2tf_alt.tflite.direct_tensors import DirectOps
from onnx2tf_alt.tflite.flatgraph import NotCovered
from onnx2tf_alt.translate.context import reshape
from onnx2tf_alt.translate.lazy import tf
from onnx2tf_alt.translate.registry import direct, handler

from ._shapes import delegated_split

LIMITS = "static sequence length"


@custom_policy
def sequence_as_arrived(node, graph, in_perms) -> Decision:
    """X is taken time-major or batch-major, as it arrives (its projection only needs the
    feature axis last), and Y keeps X's physical order of time and batch, so the Transpose
    nodes of batch-first exports (PyTorch) become perm changes. Everything else is logical.
    """
    decision = logical.decide(node, graph, in_perms)
    if in_perms[0] is not None and tuple(in_perms[0]) == (1, 0, 2):
        decision.inputs[0] = (1, 0, 2)
        if node.outputs[0]:  # Y: [T, D, B, H] kept as [B, T, D, H] (or layout 1 the reverse)
            decision.outputs[0] = (2, 0, 1, 3) if node.attrs.get("layout", 0) == 0 else (
                1, 2, 0, 3)
    return decision


# --- activation functions ------------------------------------------------------------------
@dataclass(frozen=True)
class _Activation:
    """fn(ops, x, alpha, beta), ops the tf namespace (`TFOps`, or the direct writer's);
    alpha / beta: their defaults, None when the function takes none."""

    fn: Callable
    alpha: float | None = None
    beta: float | None = None


def _elu(ops, x, alpha, _):
    y = ops.nn.elu(x)
    return y if alpha == 1.0 else ops.where(x > 0, y, alpha * y)


# Names and alpha / beta defaults as onnxruntime reads them (case-insensitive).
_ACTIVATIONS = {
    "relu": _Activation(lambda ops, x, a, b: ops.nn.relu(x)),
    "tanh": _Activation(lambda ops, x, a, b: ops.tanh(x)),
    "sigmoid": _Activation(lambda ops, x, a, b: ops.sigmoid(x)),
    "affine": _Activation(lambda ops, x, a, b: a * x + b, 0.0, 0.0),
    "leakyrelu": _Activation(lambda ops, x, a, b: ops.nn.leaky_relu(x, alpha=a), 0.01),
    "thresholdedrelu": _Activation(
        lambda ops, x, a, b: ops.where(x > a, x, ops.zeros_like(x)), 0.0),
    "scaledtanh": _Activation(lambda ops, x, a, b: a * ops.tanh(b * x), 0.0, 0.0),
    "hardsigmoid": _Activation(
        lambda ops, x, a, b: ops.minimum(ops.nn.relu(a * x + b), 1.0), 0.2, 0.5),
    "elu": _Activation(_elu, 1.0),
    "softsign": _Activation(lambda ops, x, a, b: ops.nn.softsign(x)),
    "softplus": _Activation(lambda ops, x, a, b: ops.math.softplus(x)),
}


def _activations(ctx, defaults: list[str], num_dirs: int, ops) -> list[list[Callable]]:
    """Activation callables per direction; alphas and betas are consumed in order by the
    functions that take them. A list for one direction serves both."""
    names = ctx.attr("activations", defaults)
    if len(names) not in (len(defaults), len(defaults) * num_dirs):
        raise ValueError(f"{len(names)} activations for {num_dirs} direction(s) of "
                         f"{len(defaults)} functions")
    alphas, betas = list(ctx.attr("activation_alpha", [])), list(ctx.attr("activation_beta", []))
    funcs = []
    for name in names:
        act = _ACTIVATIONS.get(name.lower())
        if act is None:
            raise NotImplementedError(f"activation function {name} is not supported")
        alpha = None if act.alpha is None else alphas.pop(0) if alphas else act.alpha
        beta = None if act.beta is None else betas.pop(0) if betas else act.beta
        funcs.append(lambda x, fn=act.fn, a=alpha, b=beta: fn(ops, x, a, b))
    if len(funcs) == len(defaults):
        return [funcs] * num_dirs
    return [funcs[d * len(defaults):(d + 1) * len(defaults)] for d in range(num_dirs)]


# --- the unrolled recurrence ---------------------------------------------------------------
class TFOps:
    """The tf namespace as the recurrences call it on the TF route, with the node's inputs
    (`node_input`), its constants as tensors (`weight`), and context.reshape and
    _shapes.delegated_split under tf's names."""

    def __init__(self, ctx):
        self.node_input, self.weight = ctx.x, ctx.const_tensor

    reshape = staticmethod(reshape)
    delegated_split = staticmethod(delegated_split)

    def __getattr__(self, name: str):
        return getattr(tf, name)


class Recurrence:
    """What RNN, LSTM and GRU share: attributes, weights, and the loop over time steps.

    A state is a tuple of [batch, hidden] tensors (hidden first, then LSTM's cell); None
    stands for a zero state, so that the first step skips the products with it. `ops` is
    the tf namespace the cells compute with: `TFOps` (the handler), or the direct writer's
    (tflite/direct_tensors.py), which writes the same TFLite ops without TensorFlow.
    """

    def __init__(self, ctx, num_gates: int, default_activations: list[str], ops=None):
        self.ctx = ctx
        self.ops = ops = TFOps(ctx) if ops is None else ops
        op = ctx.node.op_type
        self.layout = ctx.attr("layout", 0)
        self.steps = ctx.shape(0)[0 if self.layout == 0 else 1]
        self.time_axis = ctx.axis(0 if self.layout == 0 else 1, 0)  # physical, in X and Y
        # One sequence: each step's input projection is a vector [width], which the TFLite
        # file adds to the recurrence product as the FULLY_CONNECTED op's run-time bias
        # (onnx2tf_alt/tflite/shared_weights.py: the steps then share one copy of the weights).
        self.vector_steps = ctx.shape(0)[1 if self.layout == 0 else 0] == 1
        if self.steps is None:
            raise NotImplementedError(
                f"{op} needs a static sequence length; fix the input shape with -ois")
        direction = ctx.attr("direction", "forward")
        self.reverse = {"forward": [False], "reverse": [True],
                        "bidirectional": [False, True]}[direction]
        self.dtype = np.dtype(ctx.dtype(0))
        self.w, self.r = self.weight(1), self.weight(2)
        self.hidden = ctx.attr("hidden_size", self.r.shape[-1])
        width = num_gates * self.hidden
        b = self.weight(3) if ctx.has(3) else np.zeros((len(self.reverse), 2 * width), self.dtype)
        self.wb, self.rb = b[:, :width], b[:, width:]
        self.acts = _activations(ctx, default_activations, len(self.reverse), ops)
        clip = ctx.attr("clip")
        self.clip = (lambda x: x) if clip is None else (
            lambda x: ops.clip_by_value(x, -clip, clip))

    def weight(self, i: int):
        """Input i (W, R, B or P, direction first): a numpy array when constant, else a
        tensor. Slicing and `*` work the same on both."""
        value = self.ctx.const(i)
        return self.ops.node_input(i) if value is None else value.astype(self.dtype)

    def tensor(self, weight):
        """A weight (or a slice of one) as a tensor."""
        return self.ops.weight(weight) if isinstance(weight, np.ndarray) else weight

    def linear(self, weight) -> Callable:
        """The function x -> x @ weight^T of an ONNX [out, in] weight. A run-time weight is
        used as it is, [out, in] being what FULLY_CONNECTED takes, with no transpose."""
        if isinstance(weight, np.ndarray):
            matrix = self.ops.weight(np.ascontiguousarray(weight.T))
            return lambda x: self.ops.linalg.matmul(x, matrix)
        return lambda x: self.ops.linalg.matmul(x, weight, transpose_b=True)

    def recurrence(self, weight, bias=None) -> Callable:
        """The function h -> h @ weight^T (+ bias) of the product with the recurrence
        weights that every step computes, as FULLY_CONNECTED ops that all read one weight
        tensor. Each gets a run-time bias, which makes TFLite run them on its builtin kernel
        with one copy of the weights (onnx2tf_alt/tflite/shared_weights.py): with one sequence the
        caller adds the step's input projection (a vector, `vector_steps`), else the bias
        (zero by default) is made a vector computed at run time."""
        product = self.linear(weight)
        units = weight.shape[0]
        if self.vector_steps or units is None:
            return product if bias is None else (lambda h: product(h) + self.tensor(bias))
        vector = self._run_time_vector(np.zeros(units, self.dtype) if bias is None else bias)
        return lambda h: product(h) + vector

    def _run_time_vector(self, value):
        """`value` ([n], an array or a tensor) as a tensor that TFLite computes at run time:
        sliced from its concatenation with (at most) one element of X, which the converter
        cannot fold into a constant; the values are `value`'s whatever X holds."""
        if not isinstance(value, np.ndarray):
            return value
        ops = self.ops
        some_x = ops.reshape(ops.node_input(0), [None])[:1]
        joined = ops.concat([ops.weight(value), some_x], 0)
        return ops.reshape(joined[:value.shape[0]], value.shape)  # a static [n]

    def initial_states(self, inputs: list[int]) -> list[tuple]:
        """Per direction, the states from inputs such as initial_h, initial_c (None: zero)."""
        per_input = []
        for i in inputs:
            array = self.ctx.const(i)
            axis = 0 if self.layout == 0 else 1
            if not self.ctx.has(i) or (array is not None and not array.any()):
                per_input.append([None] * len(self.reverse))
            elif array is not None:
                per_input.append([self.ops.weight(np.take(array, d, axis).astype(
                    self.dtype)) for d in range(len(self.reverse))])
            else:
                # num: a state built at run time (zeros of a dynamic batch) has no static shape
                per_input.append(self.ops.unstack(self.ops.node_input(i),
                                                  num=len(self.reverse), axis=axis))
        return list(zip(*per_input))

    def _masks(self) -> list:
        """Per step, None (every sequence still runs) or ([batch, 1] bool, the same as 0/1)."""
        if not self.ctx.has(4):
            return [None] * self.steps
        lengths, ops = self.ctx.const(4), self.ops
        if lengths is not None:
            running = np.arange(self.steps)[:, None, None] < lengths.reshape(1, -1, 1)
            return [None if m.all() else (ops.constant(m), ops.constant(m.astype(self.dtype)))
                    for m in running]
        lengths = ops.expand_dims(ops.cast(ops.node_input(4), ops.int32), 0)
        steps = ops.constant(np.arange(self.steps, dtype=np.int32)[:, None])
        running = ops.expand_dims(steps < lengths, -1)
        factor = ops.cast(running, ops.as_dtype(self.dtype))
        return list(zip(ops.unstack(running), ops.unstack(factor)))

    def run(self, cells: list[Callable], input_bias: np.ndarray, initial: list[tuple],
            gate_groups: list[int] | None = None,
            regroup: Callable[[int, list], list] | None = None) -> list:
        """The node's outputs (Y, Y_h[, Y_c]; None where omitted) from one step function
        per direction: cell(projected x_t, state) -> new state. x_t is [batch, width], or
        [width] with `vector_steps`. With `gate_groups` (widths of the projection's gate
        groups) x_t arrives as a tuple of those groups, split once for all time steps rather
        than once per step; `regroup(direction, groups)` may replace the groups first (all
        steps at once: [steps, width] with `vector_steps`)."""
        ops = self.ops
        x = ops.node_input(0)
        xw = self.linear(_merge_directions(self.w, ops))(x) + self.tensor(
            _merge_directions(input_bias, ops))
        parts = ops.split(xw, len(cells), axis=-1) if len(cells) > 1 else [xw]
        masks = self._masks()
        time_axis = 0 if self.vector_steps else self.time_axis
        ys, finals = [], []
        for d, (cell, reverse, part, state) in enumerate(
                zip(cells, self.reverse, parts, initial)):
            if self.vector_steps:
                part = ops.reshape(part, [self.steps, part.shape[-1]])
            if gate_groups:
                groups = ops.delegated_split(part, gate_groups, axis=-1)
                groups = regroup(d, groups) if regroup else groups
                inputs = list(zip(*[ops.unstack(g, axis=time_axis) for g in groups]))
            else:
                inputs = ops.unstack(part, axis=time_axis)
            y = [None] * self.steps
            for t in reversed(range(self.steps)) if reverse else range(self.steps):
                new = cell(inputs[t], state)
                if self.vector_steps:  # a first step from a zero state computed vectors
                    new = tuple(ops.reshape(v, [1, v.shape[-1]]) if v.shape.rank == 1 else v
                                for v in new)
                state, y[t] = _masked(new, state, masks[t], ops)
            ys.append(y)
            finals.append(state)
        return self._outputs(ys, finals)

    def _outputs(self, ys: list[list], finals: list[tuple]) -> list:
        wanted = [bool(name) for name in self.ctx.node.outputs]
        dirs, hidden, ops = len(ys), self.hidden, self.ops
        outputs = []
        if wanted[0]:
            if self.time_axis == 0:  # [steps * dirs, batch, hidden] -> [steps, dirs, ...]
                stacked = ops.stack([y[t] for t in range(self.steps) for y in ys], axis=0)
                outputs.append(ops.reshape(stacked, [self.steps, dirs, None, hidden]))
            else:  # [batch, steps * dirs, hidden] -> [batch, steps, dirs, hidden]
                stacked = ops.stack([y[t] for t in range(self.steps) for y in ys], axis=1)
                outputs.append(ops.reshape(stacked, [None, self.steps, dirs, hidden]))
        else:
            outputs.append(None)
        for k, want in enumerate(wanted[1:]):
            states = [state[k] for state in finals]
            outputs.append(ops.stack(states, axis=self.layout) if want else None)
        return outputs


def _merge_directions(weight, ops):
    """[directions, n, ...] -> [directions * n, ...], of an array or a tensor."""
    if isinstance(weight, np.ndarray):
        return weight.reshape(-1, *weight.shape[2:])
    return ops.reshape(weight, [None, *weight.shape[2:]])


def _masked(new: tuple, old: tuple, mask, ops) -> tuple:
    """(state, output) of one step: where a sequence has ended the state stays `old` and
    the output is zero."""
    if mask is None:
        return new, new[0]
    running, factor = mask
    output = new[0] * factor
    kept = tuple((output if k == 0 else n * factor) if o is None else ops.where(running, n, o)
                 for k, (n, o) in enumerate(zip(new, old)))
    return kept, output


# --- the three cells -----------------------------------------------------------------------
@handler("RNN", since=7, layout=sequence_as_arrived, limits=LIMITS)
def rnn(ctx):
    """Ht = f(Xt W^T + Ht-1 R^T + Wb + Rb)."""
    rec = Recurrence(ctx, 1, ["Tanh"])  # first: it raises on what cannot be converted
    layered = _own_layer(ctx)
    return _rnn_steps(rec) if layered is None else layered


@direct("RNN", since=7)
def rnn_direct(ctx):
    """The handler's unrolled steps, written without TensorFlow."""
    ops, rec = _direct_recurrence(ctx, 1, ["Tanh"])
    return ops.outputs(_rnn_steps(rec))


def _own_layer(ctx) -> list | None:
    """The node's outputs from its own Keras layer (translate/node_layer.own_layer), or None
    where the handler writes its ops itself: inside that layer, or on the direct writer's
    Recorder (whose context is `in_layer`: Keras is not imported there)."""
    if ctx.in_layer:
        return None
    from onnx2tf_alt.translate.node_layer import own_layer  # Keras, when used

    return own_layer(ctx)


def _direct_recurrence(ctx, num_gates: int, activations: list[str]) -> tuple:
    """The direct writer's ops and Recurrence, for constant weights, biases and
    peepholes."""
    if any(ctx.has(i) and ctx.const(i) is None for i in (1, 2, 3, 7)):
        raise NotCovered("weights computed at run time")
    ops = DirectOps(ctx)
    return ops, Recurrence(ctx, num_gates, activations, ops)


def _rnn_steps(rec: Recurrence) -> list:
    def cell(d):
        (f,), r = rec.acts[d], rec.recurrence(rec.r[d])

        def step(x, state):
            (h,) = state
            return (f(rec.clip(x if h is None else r(h) + x)),)

        return step

    cells = [cell(d) for d in range(len(rec.reverse))]
    return rec.run(cells, rec.wb + rec.rb, rec.initial_states([5]))


@handler("LSTM", since=7, layout=sequence_as_arrived, limits=LIMITS)
def lstm(ctx, recurrence: type | None = None):
    """Gates i, o, f, c (ONNX order) with optional peepholes P (i, o, f) and input_forget
    (f = 1 - i); clip bounds every gate's pre-activation. `recurrence`: a Recurrence
    subclass, for LSTM variants that read their weights otherwise (DynamicQuantizeLSTM)."""
    rec = (recurrence or Recurrence)(ctx, 4, ["Sigmoid", "Tanh", "Tanh"])
    fused = recurrence is None and _fits_fused_lstm(ctx, rec) and not _unrolls_faster(rec)
    if ctx.recording and fused:
        raise NotCovered("a sequence for TFLite's fused LSTM kernel")  # as lstm_direct
    if ctx.in_layer:  # the unrolled recurrence, in its own layer (chosen below)
        pass
    elif fused:
        return _fused_lstm(ctx, rec)
    else:
        layered = _own_layer(ctx)
        if layered is not None:
            return layered
    return _lstm_steps(rec)


@direct("LSTM", since=7)
def lstm_direct(ctx):
    """The handler's unrolled steps, written without TensorFlow; a sequence the handler
    gives TFLite's fused LSTM kernel goes through TF's converter."""
    ops, rec = _direct_recurrence(ctx, 4, ["Sigmoid", "Tanh", "Tanh"])
    if _fits_fused_lstm(ctx, rec) and not _unrolls_faster(rec):
        raise NotCovered("a sequence for TFLite's fused LSTM kernel")
    return ops.outputs(_lstm_steps(rec))


def _lstm_steps(rec: Recurrence) -> list:
    ctx = rec.ctx
    peepholes = rec.weight(7) if ctx.has(7) else None
    couple = bool(ctx.attr("input_forget", 0))
    clip = rec.clip

    def cell(d):
        (f, g, h_act), r = rec.acts[d], rec.recurrence(rec.r[d])
        p_i = p_o = p_f = None
        p = None if peepholes is None else peepholes[d]
        if p is not None and (not isinstance(p, np.ndarray) or p.any()):
            p_i, p_o, p_f = (rec.tensor(p[k * rec.hidden:(k + 1) * rec.hidden])
                             for k in range(3))

        def step(x, state):
            h, c = state
            gates = x if h is None else r(h) + x
            i, o, forget, candidate = rec.ops.split(gates, 4, axis=-1)
            if p_i is not None and c is not None:
                i, forget = i + c * p_i, forget + c * p_f
            i = f(clip(i))
            candidate = g(clip(candidate))
            if c is None:
                c_new = i * candidate
            else:
                forget = 1 - i if couple else f(clip(forget))
                c_new = forget * c + i * candidate
            if p_o is not None:
                o = o + c_new * p_o
            return f(clip(o)) * h_act(c_new), c_new

        return step

    cells = [cell(d) for d in range(len(rec.reverse))]
    return rec.run(cells, rec.wb + rec.rb, rec.initial_states([5, 6]))


# --- LSTM as TFLite's fused kernel ---------------------------------------------------------
# A tf_keras LSTM layer (default activations, no clip) is what the TFLite converter turns into
# one UNIDIRECTIONAL_SEQUENCE_LSTM op instead of ~12 ops per time step. That kernel returns
# the output sequence only, so a node whose final cell state Y_c is read stays unrolled.
_KERAS_GATES = [0, 2, 3, 1]  # Keras i, f, c, o from ONNX i, o, f, c


# One sequence of at most this many steps x directions runs faster unrolled than in
# TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM, measured interleaved with onnxruntime at 1 thread
# (TFLite / onnxruntime, H=128, T=100): one direction 1.66 against 2.06, a 2-layer
# bidirectional LSTM 2.10 against 2.41 (2 threads: 1.30 / 1.49 and 1.62 / 1.99; on an
# AVX2-only CPU the same way, 7-26 % faster). Unrolling costs conversion time, ~0.05 s a
# step (the 2-layer LSTM: 39 s against 17 s), so longer sequences keep the fused kernel.
UNROLL_STEPS = 256


def _unrolls_faster(rec: Recurrence) -> bool:
    return bool(rec.vector_steps) and rec.steps is not None and (
        rec.steps * len(rec.reverse) <= UNROLL_STEPS)


def _fits_fused_lstm(ctx, rec: Recurrence) -> bool:
    names = [n.lower() for n in ctx.attr("activations", ["Sigmoid", "Tanh", "Tanh"])]
    peepholes = ctx.const(7) if ctx.has(7) else np.zeros(1)
    lengths = ctx.const(4) if ctx.has(4) else np.full(1, rec.steps)
    outputs = ctx.node.outputs
    # A non-zero constant initial state comes out of TFLite's conversion ignored (zero ones
    # are made at run time, _zero_states), and one value cannot feed both state inputs.
    states = [ctx.const(i) for i in (5, 6) if ctx.has(i)]
    distinct_states = not (ctx.has(5) and ctx.has(6) and ctx.node.inputs[5] == ctx.node.inputs[6])
    return (
        all(s is None or not s.any() for s in states) and distinct_states and
        set(names) <= {"sigmoid", "tanh"} and names[:3] == ["sigmoid", "tanh", "tanh"]
        and names[3:] in ([], ["sigmoid", "tanh", "tanh"])
        and ctx.attr("clip") is None and not ctx.attr("input_forget", 0)
        and peepholes is not None and not peepholes.any()
        and lengths is not None and (lengths == rec.steps).all()
        and all(isinstance(w, np.ndarray) for w in (rec.w, rec.r, rec.wb))
        and rec.dtype == np.float32
        # with an unknown batch TF's converter cannot fuse the layer: it writes TensorList
        # ops, which need Flex
        and ctx.shape(0)[1 if rec.layout == 0 else 0] is not None
        and not (len(outputs) > 2 and outputs[2] and is_read(ctx.graph, outputs[2]))
    )


def _keras_weights(w: np.ndarray, r: np.ndarray, bias: np.ndarray, hidden: int) -> list:
    """One direction's ONNX W [4H, I], R [4H, H] and summed bias [4H] as Keras' kernel,
    recurrent kernel and bias (gate order i, f, c, o; [in, out] matrices)."""
    def gates(a):
        return np.concatenate([a[k * hidden:(k + 1) * hidden] for k in _KERAS_GATES], 0)

    return [np.ascontiguousarray(gates(w).T), np.ascontiguousarray(gates(r).T), gates(bias)]


def _zero_states(x, time_axis: int, hidden: int, count: int, unique: int) -> list:
    """`count` [batch, hidden] zero tensors computed from X at run time. A constant initial
    state becomes a TFLite variable tensor that keeps the final state of one invocation for
    the next; and a state input must be a value nothing else reads, hence one split, and a
    factor `unique` to this node, so that the converter cannot merge two nodes' zeros."""
    if not count:
        return []
    first = tf.gather(x, 0, axis=time_axis)[:, :1] * 0.0 * float(unique)
    zeros = first + tf.zeros([1, count * hidden], x.dtype)
    return tf.split(zeros, count, axis=-1) if count > 1 else [zeros]


def _fused_lstm(ctx, rec: Recurrence) -> list:
    import tf_keras

    x, time_axis = ctx.x(0), rec.time_axis
    bias = rec.wb + rec.rb
    initial = rec.initial_states([5, 6])
    missing = sum(s is None for state in initial for s in state)
    unique = 1 + ctx.graph.nodes.index(ctx.node)
    zeros = iter(_zero_states(x, time_axis, rec.hidden, missing, unique))
    ys, finals = [], []
    for d, (reverse, state) in enumerate(zip(rec.reverse, initial)):
        layer = tf_keras.layers.LSTM(rec.hidden, return_sequences=True, go_backwards=reverse,
                                     time_major=time_axis == 0)
        y = layer(x, initial_state=[next(zeros) if s is None else s for s in state])
        layer.set_weights(_keras_weights(rec.w[d], rec.r[d], bias[d], rec.hidden))
        finals.append(tf.gather(y, rec.steps - 1, axis=time_axis))  # the last step run
        ys.append(tf.reverse(y, [time_axis]) if reverse else y)
    outputs = ctx.node.outputs
    y = None
    if outputs[0]:
        y = tf.stack(ys, axis=time_axis + 1)  # [T, D, B, H] or [B, T, D, H]
    y_h = tf.stack(finals, axis=rec.layout) if len(outputs) > 1 and outputs[1] else None
    return [y, y_h, None][:len(outputs)]


@handler("GRU", since=7, layout=sequence_as_arrived, limits=LIMITS)
def gru(ctx):
    """Gates z, r, h (ONNX order); linear_before_reset applies R_h (and its bias) before
    the reset gate instead of after."""
    rec = Recurrence(ctx, 3, ["Sigmoid", "Tanh"])  # first: it raises on what cannot be converted
    layered = _own_layer(ctx)
    return _gru_steps(rec) if layered is None else layered


@direct("GRU", since=7)
def gru_direct(ctx):
    """The handler's unrolled steps, written without TensorFlow."""
    ops, rec = _direct_recurrence(ctx, 3, ["Sigmoid", "Tanh"])
    return ops.outputs(_gru_steps(rec))


def _gru_steps(rec: Recurrence) -> list:
    ctx = rec.ctx
    before_reset = bool(ctx.attr("linear_before_reset", 0))
    hidden, clip = rec.hidden, rec.clip
    # With linear_before_reset R_h's bias is multiplied by the reset gate: it stays in the
    # loop. zr_only keeps a [3 * hidden] bias's z and r parts and zeroes its h part.
    zr_only = (np.arange(3 * hidden) < 2 * hidden).astype(rec.dtype)
    input_bias = rec.wb + (rec.rb * zr_only if before_reset else rec.rb)

    # One sequence: R_h's bias joins each step's projection of z and r, so that the whole
    # bias [x_z, x_r, rb_h] of the recurrence product is one run-time vector (see run).
    joined = before_reset and rec.vector_steps

    def join_rb_h(d: int, groups: list) -> list:
        x_zr, x_h = groups  # [steps, 2 * hidden], [steps, hidden]
        rb_h = rec.rb[d, 2 * hidden:]
        rows = (rec.tensor(np.tile(rb_h, (rec.steps, 1))) if isinstance(rb_h, np.ndarray)
                else rec.ops.tile(rb_h[None], [rec.steps, 1]))
        return [rec.ops.concat([x_zr, rows], axis=-1), x_h]

    def cell(d):
        (f, g), r = rec.acts[d], rec.r[d]
        rb_h_padded = rec.rb[d] * (1 - zr_only) if before_reset and not joined else None
        r_zr = rec.recurrence(r if before_reset else r[:2 * hidden], rb_h_padded)
        r_h = None if before_reset else rec.recurrence(r[2 * hidden:])
        rb_h = rec.tensor(rec.rb[d, 2 * hidden:]) if before_reset else None

        def step(x, state):
            (h,) = state
            x_h = x[-1]
            if not before_reset:  # x: (x_zr, x_h)
                gates = x[0] if h is None else r_zr(h) + x[0]
                z, reset = rec.ops.split(f(clip(gates)), 2, axis=-1)
                candidate = x_h if h is None else r_h(reset * h) + x_h
            else:  # equal thirds of the product: one SPLIT, which XNNPACK takes
                if joined:  # x: ([x_z, x_r, rb_h], x_h), the first the product's whole bias
                    pre_z, pre_r, h_h = rec.ops.split(
                        x[0] if h is None else r_zr(h) + x[0], 3, -1)
                elif h is None:  # x: (x_z, x_r, x_h)
                    pre_z, pre_r, h_h = x[0], x[1], rb_h
                else:
                    pre_z, pre_r, h_h = rec.ops.split(r_zr(h), 3, axis=-1)
                    pre_z, pre_r = pre_z + x[0], pre_r + x[1]
                z, reset = f(clip(pre_z)), f(clip(pre_r))
                candidate = x_h + reset * h_h
            candidate = g(clip(candidate))
            return (candidate - z * candidate if h is None else candidate + z * (h - candidate),)

        return step

    cells = [cell(d) for d in range(len(rec.reverse))]
    groups = [hidden] * 3 if before_reset and not joined else [2 * hidden, hidden]
    return rec.run(cells, input_bias, rec.initial_states([5]), groups,
                   join_rb_h if joined else None)
