"""A .tflite whose large weights are bound after TF's converter has run.

TF's converter takes every weight into its MLIR module, folds and packs it there and
serializes the flatbuffer with it: on a 2.3 GB decoder that phase took 196 s and 9.9 GB
(4.5x the weights) and its file passed flatbuffers' 2 GB. tflite/lowering.py instead gives
the converter the serving function with each large weight as one more input, a graph of
kilobytes, and this module binds the weights to those inputs in the flatbuffer:

- an op that the converter left on weights and constants alone (the TRANSPOSE of a conv
  kernel or of a MatMul's right side, a RESHAPE, a CAST) is computed here on the array
  and removed;
- a BATCH_MATMUL whose right side is a rank-2 weight becomes the FULLY_CONNECTED the
  converter writes for a constant right side (weights stored [units, depth]);
- every other reader reads the weight as a constant buffer.

Anything else on weights alone (an op the converter would have folded but that is not
computed here) raises Unbindable, and the caller converts the usual way. Nothing here holds
the weights: each buffer is computed from its source when the file is written and dropped
after (`Bound.write`), and a file past 2 GB keeps its buffers after the flatbuffer (the
schema's Buffer.offset/size, which ai-edge-litert reads).
"""

from __future__ import annotations

import copy
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from onnx2tf_alt.tflite.flatbuffer import (
    FILE_IDENTIFIER,
    op_name,
    opcode_index,
    schema,
    unpack_model,
)

ALIGN = 16  # the alignment TF's converter gives buffer data
PIECE_ELEMENTS = 1 << 22  # a transposed weight is written this many elements at a time
MAX_INLINE = 2**31 - 1 - (64 << 20)  # a flatbuffer's signed 32-bit offsets, with a margin
_NUMPY = {schema.TensorType.FLOAT32: np.float32, schema.TensorType.FLOAT16: np.float16,
          schema.TensorType.INT32: np.int32, schema.TensorType.INT64: np.int64,
          schema.TensorType.INT8: np.int8, schema.TensorType.UINT8: np.uint8,
          schema.TensorType.INT16: np.int16, schema.TensorType.BOOL: np.bool_,
          schema.TensorType.FLOAT64: np.float64}


class Unbindable(ValueError):
    """The converted graph has an op on weights that this module does not compute."""


@dataclass(frozen=True)
class Recipe:
    """A weight as a reader wants it: its source's array with `steps` applied in order
    (("transpose", perm), ("reshape", shape), ("cast", dtype name), ("half", None))."""

    source: str
    steps: tuple = ()

    def then(self, kind: str, arg) -> Recipe:
        """This recipe followed by one more step; two transposes in a row are one, and none
        when they cancel (a tied embedding's table and its transposed product weights are
        then one buffer)."""
        steps = self.steps
        if kind == "transpose" and steps and steps[-1][0] == "transpose":
            arg = tuple(steps[-1][1][a] for a in arg)
            steps = steps[:-1]
            if arg == tuple(range(len(arg))):
                return Recipe(self.source, steps)
        return Recipe(self.source, steps + ((kind, arg),))


@dataclass
class LazyBuffer(schema.BufferT):
    """A buffer whose bytes are made when the model is packed (and dropped after)."""

    make: Callable[[], np.ndarray] = None
    nbytes: int = 0
    pieces: Callable[[], Iterator[np.ndarray]] | None = None  # the bytes in order, in parts

    def __post_init__(self):
        schema.BufferT.__init__(self)

    def chunks(self) -> Iterator[np.ndarray]:
        """The buffer's array in consecutive parts (one part unless `pieces` is given)."""
        if self.pieces is not None:
            yield from self.pieces()
        else:
            yield self.make()

    def Pack(self, builder):  # the schema's object-API name
        if self.offset > 1:  # stored after the flatbuffer
            return schema.BufferT.Pack(self, builder)
        data = _aligned_vector(builder, self.nbytes, self.chunks())
        schema.BufferStart(builder)
        schema.BufferAddData(builder, data)
        return schema.BufferEnd(builder)


def is_constant(buffer) -> bool:
    """Whether a tensor with this buffer is a constant (data inline, stored after the
    flatbuffer, or made when written)."""
    return isinstance(buffer, LazyBuffer) or bool(
        buffer is not None and ((buffer.data is not None and len(buffer.data)) or buffer.size))


@dataclass
class Bound:
    """The bound model: the converter's flatbuffer (object API) with LazyBuffers."""

    model: object  # schema.ModelT
    sources: dict[str, Callable[[], np.ndarray]]
    recipes: dict[Recipe, int] = field(default_factory=dict)  # recipe -> buffer index

    @property
    def weight_bytes(self) -> int:
        return sum(b.nbytes for b in self.model.buffers if isinstance(b, LazyBuffer))

    def array(self, recipe: Recipe) -> np.ndarray:
        value = self.sources[recipe.source]()
        for kind, arg in recipe.steps:
            if kind == "transpose":
                value = np.transpose(value, arg)
            elif kind == "reshape":
                value = value.reshape(arg)
            elif kind == "cast":
                value = value.astype(arg)
            elif kind in ("scale", "divide"):
                axis, vector = arg
                shape = [1] * value.ndim
                shape[axis] = len(vector)
                factor = np.asarray(vector, np.float32).reshape(shape)
                value = value * factor if kind == "scale" else value / factor
            elif kind == "half":
                with np.errstate(over="ignore"):  # beyond float16: +-inf, as TF writes them
                    value = value.astype(np.float16)
        return np.ascontiguousarray(value)

    def pieces(self, recipe: Recipe) -> Iterator[np.ndarray]:
        """`array(recipe)` in consecutive parts of about PIECE_ELEMENTS elements, for a
        transposed weight (a part at a time: no whole transposed copy); else in one."""
        if len(recipe.steps) != 1 or recipe.steps[0][0] != "transpose":
            yield self.array(recipe)
            return
        moved = np.transpose(self.sources[recipe.source](), recipe.steps[0][1])
        if moved.ndim == 0:
            yield np.ascontiguousarray(moved)
            return
        step = max(1, PIECE_ELEMENTS // max(1, moved[0].size))
        for start in range(0, moved.shape[0], step):
            yield np.ascontiguousarray(moved[start:start + step])

    def buffer_of(self, recipe: Recipe, shape, dtype) -> int:
        """The index of the buffer holding `recipe` (one per recipe)."""
        if recipe not in self.recipes:
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            self.model.buffers.append(LazyBuffer(make=lambda: self.array(recipe), nbytes=nbytes,
                                                 pieces=lambda: self.pieces(recipe)))
            self.recipes[recipe] = len(self.model.buffers) - 1
        return self.recipes[recipe]

    def write(self, path: str) -> None:
        """The .tflite file at `path`: one flatbuffer when it fits in 2 GB, else the
        flatbuffer followed by the weights (Buffer.offset/size)."""
        if self.weight_bytes < MAX_INLINE:
            builder = _builder(self.model, self._size_hint())
            with open(path, "wb") as f:
                f.write(memoryview(builder.Bytes)[builder.Head():])
            return
        lazy = [b for b in self.model.buffers if isinstance(b, LazyBuffer)]
        for buffer in lazy:  # placeholders of the final width, so the size is final
            buffer.offset, buffer.size = 2, buffer.nbytes
        end = _aligned(len(_packed(self.model)))
        for buffer in lazy:
            buffer.offset, end = end, _aligned(end + buffer.nbytes)
        head = _packed(self.model)
        with open(path, "wb") as f:
            f.write(head)
            for buffer in lazy:
                f.seek(buffer.offset)
                f.writelines(memoryview(np.ascontiguousarray(part)).cast("B")
                             for part in buffer.chunks())
            f.truncate(end)
        for buffer in lazy:
            buffer.offset = buffer.size = 0

    def to_bytes(self) -> bytes:
        """The file's bytes; one flatbuffer, so its weights must fit in 2 GB."""
        return bytes(self.to_bytearray())

    def to_bytearray(self) -> bytearray:
        """The file's bytes, made without a second copy of them (what can write them;
        TFLite's interpreter wants `bytes`)."""
        if self.weight_bytes >= MAX_INLINE:
            raise ValueError(f"{self.weight_bytes / 2**30:.1f} GiB of weights do not fit in "
                             "one flatbuffer: write the file (Bound.write)")
        builder = _builder(self.model, self._size_hint())
        content = builder.Bytes
        del content[:builder.Head()]  # in place
        return content

    def _size_hint(self) -> int:
        """The packed size, about (so that the builder never grows by copying)."""
        inline = sum(len(b.data) for b in self.model.buffers
                     if not isinstance(b, LazyBuffer) and b.data is not None)
        lazy = sum(b.nbytes + ALIGN for b in self.model.buffers if isinstance(b, LazyBuffer))
        return inline + lazy + (1 << 20)


def bind(content: bytes, sources: dict[str, tuple[tuple, str, Callable[[], np.ndarray]]]
         ) -> Bound:
    """The converter's flatbuffer `content`, whose signature inputs named by `sources`
    ({name: (shape, dtype name, maker)}) are weights, with those weights bound (see the
    module docstring); `maker()` returns a weight's array, read-only (best a view of where
    the weight already is). Raises Unbindable."""
    model = unpack_model(content)
    bound = Bound(model, {name: make for name, (_, _, make) in sources.items()})
    for index, subgraph in enumerate(model.subgraphs):
        signatures = [s for s in model.signatureDefs or [] if s.subgraphIndex == index]
        late: dict[int, Recipe] = {}
        for signature in signatures:
            for tensor_map in signature.inputs:
                name = tensor_map.name.decode()
                if name in sources:
                    late[tensor_map.tensorIndex] = Recipe(name)
            signature.inputs = [m for m in signature.inputs if m.tensorIndex not in late]
        if late:
            subgraph.inputs = [i for i in subgraph.inputs if i not in late]
            _bind_subgraph(bound, subgraph, late, signatures)
    if not bound.recipes:
        raise Unbindable("no weight input was found in the converted model")
    _drop_unread_buffers(model)
    return bound


def drop_unused(model, subgraph, signatures) -> None:
    """Removes the tensors of `subgraph` that no op, input or output uses any more (the
    `signatures` of that subgraph renumbered) and empties the buffers nothing reads."""
    _drop_unused_tensors(subgraph, signatures)
    _drop_unread_buffers(model)


def _drop_unread_buffers(model) -> None:
    """Empties the buffers no tensor or metadata reads any more (the constants computed
    into fused weights and biases, float weights replaced by quantized ones)."""
    read = {int(t.buffer) for g in model.subgraphs for t in g.tensors}
    read |= {int(m.buffer) for m in model.metadata or []}
    for index, buffer in enumerate(model.buffers):
        if index not in read and (isinstance(buffer, LazyBuffer) or buffer.data is not None):
            model.buffers[index] = schema.BufferT()


def _bind_subgraph(bound: Bound, subgraph, late: dict[int, Recipe], signatures) -> None:
    model = bound.model
    kept = []
    for op in subgraph.operators:
        inputs = [int(i) for i in op.inputs if i >= 0]
        if not any(i in late for i in inputs):
            kept.append(op)
            continue
        name = op_name(model, op)
        constant = all(i in late or is_constant(model.buffers[subgraph.tensors[i].buffer])
                       for i in inputs)
        if constant:
            late[int(op.outputs[0])] = _folded(model, subgraph, op, name, late)
            continue
        if name == "BATCH_MATMUL" and _to_fully_connected(model, subgraph, op, late):
            pass
        kept.append(op)
    kept = _fused_into_affine(model, subgraph, kept, late)
    subgraph.operators = _reshapes_around_products(model, subgraph, kept, late)
    for op in subgraph.operators:  # the weights that are read become constants
        for i in op.inputs:
            if i in late:
                tensor = subgraph.tensors[i]
                tensor.buffer = bound.buffer_of(late[i], tensor.shape, _NUMPY[tensor.type])
    for i in subgraph.outputs:
        if i in late:
            raise Unbindable("a model output is a weight")
    _drop_unused_tensors(subgraph, signatures)


def _folded(model, subgraph, op, name: str, late: dict[int, Recipe]) -> Recipe:
    """The recipe of `op`'s output, `op` reading weights and constants only."""
    source = int(op.inputs[0])
    if source not in late or len(op.outputs) != 1 or any(
            int(i) in late for i in op.inputs[1:] if i >= 0):
        raise Unbindable(f"{name} reads weights and constants only")
    recipe, out = late[source], subgraph.tensors[int(op.outputs[0])]
    if name == "TRANSPOSE":
        perm = _constant(model, subgraph, int(op.inputs[1]))
        return recipe.then("transpose", tuple(int(a) for a in perm))
    if name in ("RESHAPE", "EXPAND_DIMS", "SQUEEZE"):
        return recipe.then("reshape", tuple(int(d) for d in out.shape))
    if name == "CAST":
        return recipe.then("cast", np.dtype(_NUMPY[out.type]).name)
    raise Unbindable(f"{name} of a weight")


def _fused_into_affine(model, subgraph, ops: list, late: dict[int, Recipe]) -> list:
    """`ops` with the arithmetic TF's converter computes into the weights of a CONV_2D,
    DEPTHWISE_CONV_2D or FULLY_CONNECTED when they are constants, done here for bound
    weights: a MUL / DIV / ADD / SUB of a constant scalar or per-channel vector reading the
    op's output goes into its weights and bias, its activation onto the op. A convolution
    must be that op's only reader; a FULLY_CONNECTED read by others is cloned for it (as
    the converter does). Then a RELU / RELU6 / RELU_N1_TO_1 alone reading such an op
    becomes its fused activation."""
    readers: dict[int, int] = {}
    for op in ops:
        for i in op.inputs:
            readers[int(i)] = readers.get(int(i), 0) + 1
    outputs = {int(i) for i in subgraph.outputs}
    producers = {int(o): op for op in ops for o in op.outputs}
    kept = []
    for op in ops:
        name = op_name(model, op)
        affine = (_fuse(model, subgraph, op, name, producers, readers, outputs, late)
                  if name in _ARITHMETIC else None)
        if affine is None:
            kept.append(op)
        elif affine is not op:  # a clone takes the op's place
            kept.append(affine)
    bound_affine = [op for op in kept
                    if op_name(model, op) in _CHANNEL_AXIS and int(op.inputs[1]) in late]
    return _fused_activations(model, kept, bound_affine, readers, outputs)


_ARITHMETIC = ("MUL", "DIV", "ADD", "SUB")
_ACTIVATIONS = {"RELU": schema.ActivationFunctionType.RELU,
                "RELU6": schema.ActivationFunctionType.RELU6,
                "RELU_N1_TO_1": schema.ActivationFunctionType.RELU_N1_TO_1}
_CHANNEL_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0}


def _fuse(model, subgraph, op, name, producers, readers, outputs, late):
    """Computes `op` into the affine op that produces its operand: returns that op (`op`
    itself when the affine op was changed in place), or None."""
    if len(op.inputs) != 2:
        return None
    for k in (0, 1):
        source, other = int(op.inputs[k]), int(op.inputs[1 - k])
        affine = producers.get(source)
        if affine is None or (name in ("SUB", "DIV") and k != 0):
            continue
        kind = op_name(model, affine)
        shared = readers.get(source, 0) != 1
        if (kind not in _CHANNEL_AXIS or int(affine.inputs[1]) not in late
                or (shared and kind != "FULLY_CONNECTED") or source in outputs
                or getattr(affine.builtinOptions, "fusedActivationFunction", 0)
                or int(affine.inputs[0]) in late):
            continue
        if other in late or not _is_inline(model, subgraph, other):
            continue
        weight = subgraph.tensors[int(affine.inputs[1])]
        axis = _CHANNEL_AXIS[kind]
        channels = int(weight.shape[axis])
        value = _constant(model, subgraph, other).astype(np.float32)
        shape = list(subgraph.tensors[other].shape)
        if weight.type != schema.TensorType.FLOAT32 or not (
                value.size == 1 or (value.size == channels and shape and shape[-1] == channels)):
            continue
        has_bias = len(affine.inputs) > 2 and int(affine.inputs[2]) >= 0
        bias = (_constant(model, subgraph, int(affine.inputs[2])).astype(np.float32)
                if has_bias else None)
        if has_bias and (int(affine.inputs[2]) in late or bias.size != channels):
            continue
        vector = np.broadcast_to(value.reshape(-1), (channels,)).astype(np.float32)
        recipe = late[int(affine.inputs[1])]
        if name in ("MUL", "DIV"):
            recipe = recipe.then("scale" if name == "MUL" else "divide",
                                 (axis, tuple(vector.tolist())))
            if bias is not None:
                bias = bias * vector if name == "MUL" else bias / vector
        else:
            base = bias if bias is not None else np.zeros(channels, np.float32)
            bias = base + vector if name == "ADD" else base - vector
        target = affine
        if shared:  # the other readers keep the op as it is
            target = copy.copy(affine)
            target.builtinOptions = copy.copy(affine.builtinOptions)
            readers[source] -= 1
        target.inputs = list(target.inputs)
        if bias is not None:
            index = _new_constant(model, subgraph, bias, b"/fused_bias")
            target.inputs = [int(target.inputs[0]), int(target.inputs[1]), index]
        # a tensor of its own for the new weights: others may read the old ones
        fused = schema.TensorT()
        fused.shape, fused.type = weight.shape, weight.type
        fused.name, fused.buffer = (weight.name or b"") + b"/fused", 0
        subgraph.tensors.append(fused)
        late[len(subgraph.tensors) - 1] = recipe
        target.inputs[1] = len(subgraph.tensors) - 1
        target.outputs = list(op.outputs)
        target.builtinOptions.fusedActivationFunction = getattr(
            op.builtinOptions, "fusedActivationFunction", 0)
        for o in op.outputs:
            producers[int(o)] = target
        return target if shared else op
    return None


def _fused_activations(model, ops: list, affine: list, readers, outputs) -> list:
    """`ops` with a RELU, RELU6 or RELU_N1_TO_1 that alone reads the output of an `affine`
    op without activation made that op's fused activation."""
    producers = {int(op.outputs[0]): op for op in affine}
    dropped = set()
    for op in ops:
        kind = _ACTIVATIONS.get(op_name(model, op))
        source = int(op.inputs[0]) if kind is not None else None
        target = producers.get(source)
        if (target is None or readers.get(source) != 1 or source in outputs
                or target.builtinOptions.fusedActivationFunction):
            continue
        target.builtinOptions.fusedActivationFunction = kind
        target.outputs = list(op.outputs)
        dropped.add(id(op))
    return [op for op in ops if id(op) not in dropped]


def _reshapes_around_products(model, subgraph, ops: list, late: dict[int, Recipe]) -> list:
    """RESHAPE -> FULLY_CONNECTED (keep_num_dims, bound weights) -> RESHAPE that keeps the
    last axis: one RESHAPE straight to the final shape, then the product, as TF's converter
    writes it for a constant weight (a product over the last axis commutes with reshaping
    the others)."""
    readers: dict[int, list] = {}
    for op in ops:
        for i in op.inputs:
            readers.setdefault(int(i), []).append(op)
    producers = {int(o): op for op in ops for o in op.outputs}
    outputs = {int(i) for i in subgraph.outputs}
    dropped = set()
    for product in ops:
        if (op_name(model, product) != "FULLY_CONNECTED" or int(product.inputs[1]) not in late
                or not product.builtinOptions.keepNumDims):
            continue
        first = producers.get(int(product.inputs[0]))
        after = readers.get(int(product.outputs[0]), [])
        if (first is None or op_name(model, first) != "RESHAPE" or len(after) != 1
                or op_name(model, after[0]) != "RESHAPE" or int(product.outputs[0]) in outputs
                or len(readers.get(int(first.outputs[0]), [])) != 1
                or int(first.outputs[0]) in outputs):
            continue
        last = after[0]
        source = subgraph.tensors[int(first.inputs[0])]
        final = subgraph.tensors[int(last.outputs[0])]
        shape = [int(d) for d in final.shape]
        signature = [int(d) for d in (final.shapeSignature if final.shapeSignature is not None
                                      else final.shape)]
        depth = int(subgraph.tensors[int(first.outputs[0])].shape[-1])
        if (min(signature + [int(d) for d in (source.shapeSignature if source.shapeSignature
                                              is not None else source.shape)]) < 0
                or not shape or shape[-1] != int(subgraph.tensors[int(product.outputs[0])]
                                                 .shape[-1])):
            continue
        reshaped = subgraph.tensors[int(first.outputs[0])]
        reshaped.shape = np.array(shape[:-1] + [depth], np.int32)
        reshaped.shapeSignature = None
        target = _new_int32(model, subgraph, np.array(shape[:-1] + [depth], np.int32))
        first.inputs = [int(first.inputs[0]), target]
        if getattr(first.builtinOptions, "newShape", None) is not None:
            first.builtinOptions.newShape = list(shape[:-1] + [depth])
        product.outputs = list(last.outputs)
        dropped.add(id(last))
    return [op for op in ops if id(op) not in dropped]


def _new_int32(model, subgraph, value: np.ndarray) -> int:
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(value.astype("<i4").tobytes(), np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape = np.array(value.shape, np.int32)
    tensor.type, tensor.buffer = schema.TensorType.INT32, len(model.buffers) - 1
    tensor.name = b"reshape_shape"
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def _is_inline(model, subgraph, index: int) -> bool:
    data = model.buffers[subgraph.tensors[index].buffer].data
    return data is not None and len(data) > 0


def _new_constant(model, subgraph, value: np.ndarray, suffix: bytes) -> int:
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(np.ascontiguousarray(value).tobytes(), np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape = np.array(value.shape, np.int32)
    tensor.type, tensor.buffer = schema.TensorType.FLOAT32, len(model.buffers) - 1
    tensor.name = b"fused" + suffix
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def _to_fully_connected(model, subgraph, op, late: dict[int, Recipe]) -> bool:
    """BATCH_MATMUL(x, rank-2 weight) as FULLY_CONNECTED(x, weight stored [units, depth]),
    as TF's converter writes a product with a constant right side."""
    x, w = int(op.inputs[0]), int(op.inputs[1])
    options = op.builtinOptions
    weight = subgraph.tensors[w]
    if x in late or w not in late or options.adjX or len(weight.shape) != 2:
        return False
    recipe = late[w] if options.adjY else late[w].then("transpose", (1, 0))
    transposed = schema.TensorT()
    transposed.shape = np.array(weight.shape[::-1] if not options.adjY else weight.shape,
                                np.int32)
    transposed.type, transposed.name = weight.type, (weight.name or b"") + b"/transposed"
    transposed.buffer = 0
    subgraph.tensors.append(transposed)
    late[len(subgraph.tensors) - 1] = recipe
    rank = len(subgraph.tensors[x].shape)
    op.opcodeIndex = opcode_index(model, schema.BuiltinOperator.FULLY_CONNECTED,
                                  5 if rank != 2 else 1)
    op.inputs = [x, len(subgraph.tensors) - 1, -1]
    op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = schema.FullyConnectedOptionsT(keepNumDims=rank != 2)
    return True


def _constant(model, subgraph, index: int) -> np.ndarray:
    tensor = subgraph.tensors[index]
    data = model.buffers[tensor.buffer].data
    if data is None or not len(data):
        raise Unbindable(f"tensor '{tensor.name}' is not a constant")
    return np.frombuffer(np.asarray(data, np.uint8).tobytes(), _NUMPY[tensor.type])


def _drop_unused_tensors(subgraph, signatures) -> None:
    """Removes the tensors nothing reads or writes any more (the folded weights)."""
    used = {int(i) for op in subgraph.operators for i in [*op.inputs, *op.outputs] if i >= 0}
    used |= {int(i) for i in subgraph.inputs} | {int(i) for i in subgraph.outputs}
    for op in subgraph.operators:
        used |= {int(i) for i in (op.intermediates if op.intermediates is not None else [])}
    order = sorted(used)
    if len(order) == len(subgraph.tensors):
        return
    new = {old: k for k, old in enumerate(order)}
    subgraph.tensors = [subgraph.tensors[i] for i in order]
    for op in subgraph.operators:
        op.inputs = [new[int(i)] if i >= 0 else -1 for i in op.inputs]
        op.outputs = [new[int(i)] for i in op.outputs]
        if op.intermediates is not None:
            op.intermediates = [new[int(i)] for i in op.intermediates]
    subgraph.inputs = [new[int(i)] for i in subgraph.inputs]
    subgraph.outputs = [new[int(i)] for i in subgraph.outputs]
    for signature in signatures:
        for tensor_map in [*signature.inputs, *signature.outputs]:
            tensor_map.tensorIndex = new[tensor_map.tensorIndex]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _aligned_vector(builder, nbytes: int, parts: Iterator[np.ndarray]) -> int:
    """The bytes of consecutive array `parts` (`nbytes` in all) as one [ubyte] vector
    aligned to ALIGN (what TF's converter writes), copied a part at a time."""
    builder.StartVector(1, nbytes, ALIGN)
    builder.head -= nbytes
    at = builder.head
    for part in parts:
        payload = memoryview(np.ascontiguousarray(part)).cast("B")
        builder.Bytes[at:at + len(payload)] = payload
        at += len(payload)
    if at != builder.head + nbytes:
        raise ValueError(f"a weight's parts hold {at - builder.head} bytes, not {nbytes}")
    builder.vectorNumElems = nbytes
    return builder.EndVector()


def _builder(model, size_hint: int):
    import flatbuffers

    builder = flatbuffers.Builder(size_hint)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return builder


def _packed(model) -> bytes:
    return bytes(_builder(model, 1 << 20).Output())


def mapped(path: str):
    """A read-only memory map of the file at `path` (reads of it page in on demand)."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(path) \
            else b""
