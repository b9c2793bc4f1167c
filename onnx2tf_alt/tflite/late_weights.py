"""A .tflite whose large weights are bound after TF's converter has run.

TF's converter takes every weight into its MLIR module, folds and packs it there and
serializes the flatbuffer with it: on a 2.3 GB decoder that phase took 196 s and 9.9 GB
(4.5x the weights) and its file passed flatbuffers' 2 GB. tflite/lowering.py instead gives
the converter the serving function with each large weight as one more input, a graph of
kilobytes, and this module binds the weights to those inputs in the flatbuffer:

- an op that the converter left on weights and constants alone (the TRANSPOSE of a conv
  kernel or of a MatMul's right side, a RESHAPE, a CAST) is computed here on the array
  and removed;
- the rewrites the converter makes for constant weights are made here
  (tflite/bound_rewrites.py: BATCH_MATMUL as FULLY_CONNECTED, per-channel arithmetic and
  activations fused, reshapes around products merged);
- every other reader reads the weight as a constant buffer.

Anything else on weights alone (an op the converter would have folded but that is not
computed here) raises Unbindable, and the caller converts the usual way. Nothing here holds
the weights: each buffer is computed from its source when the file is written and dropped
after (`Bound.write`), and a file past 2 GB keeps its buffers after the flatbuffer (the
schema's Buffer.offset/size, which ai-edge-litert reads).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from onnx2tf_alt.tflite.bound_rewrites import (
    NUMPY,
    Unbindable,
    constant,
    fused_into_affine,
    fused_into_following,
    reshapes_around_products,
    to_fully_connected,
)
from onnx2tf_alt.tflite.flatbuffer import (  # MAX_INLINE: a flatbuffer's 32-bit offsets
    FILE_IDENTIFIER,
    MAX_INLINE,
    inline_stored_buffers,
    op_name,
    schema,
    unpack_model,
)

__all__ = ["Bound", "LazyBuffer", "Recipe", "Signature", "Unbindable", "bind", "drop_unused",
           "is_constant", "mapped", "row_blocks", "unpacked_file"]

ALIGN = 16  # the alignment TF's converter gives buffer data
PIECE_ELEMENTS = 1 << 22  # a transposed weight is written this many elements at a time


@dataclass(frozen=True)
class Recipe:
    """A weight as a reader wants it: its source's array with `steps` applied in order
    (("transpose", perm), ("reshape", shape), ("cast", dtype name), ("scale" or "divide",
    (axis, per-channel factors)))."""

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
        return np.ascontiguousarray(value)

    def pieces(self, recipe: Recipe) -> Iterator[np.ndarray]:
        """`array(recipe)` in consecutive parts of about PIECE_ELEMENTS elements, for a
        transposed weight (a part at a time: no whole transposed copy); else in one."""
        if len(recipe.steps) != 1 or recipe.steps[0][0] != "transpose":
            yield self.array(recipe)
            return
        yield from row_blocks(np.transpose(self.sources[recipe.source](), recipe.steps[0][1]))

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


@dataclass(frozen=True)
class Signature:
    """The signature TF's saved_model route would write for one converted function, for a
    file converted from the function's frozen graph (which has none): `inputs`, the
    function's argument names (user inputs, then weights); `outputs`, {graph op name of an
    output: its key}; `order`, the keys in the model's output order."""

    key: str
    inputs: tuple[str, ...]
    outputs: dict
    order: tuple[str, ...]
    call: str  # the name TF gives the outputs: StatefulPartitionedCall when it reads variables

    @classmethod
    def of(cls, concrete, key: str, inputs: list[str], order: list[str]) -> Signature:
        outputs = {tensor.name.split(":")[0]: name
                   for name, tensor in concrete.structured_outputs.items()}
        call = "StatefulPartitionedCall" if concrete.variables else "PartitionedCall"
        return cls(key, tuple(inputs), outputs, tuple(order), call)

    def write(self, model) -> None:
        """Names, orders and signs model's main subgraph as TF's saved_model route does:
        inputs `serving_default_<name>:0` in name order, outputs `<call>:<i>` (i: the key's
        place in key order) in the model's output order."""
        if model.signatureDefs:
            raise Unbindable("the frozen-graph file has signatures already")
        subgraph = model.subgraphs[0]  # the main graph; control-flow bodies follow it
        by_name = {subgraph.tensors[i].name.decode(): int(i) for i in subgraph.inputs}
        by_op = {subgraph.tensors[i].name.decode(): int(i) for i in subgraph.outputs}
        if set(by_name) != set(self.inputs) or set(by_op) != set(self.outputs):
            raise Unbindable(f"the frozen-graph file's inputs {sorted(by_name)} and outputs "
                             f"{sorted(by_op)} are not the function's {sorted(self.inputs)} and "
                             f"{sorted(self.outputs)}")
        keys = sorted(self.outputs.values())
        outputs = {key: by_op[op] for op, key in self.outputs.items()}
        for name, index in by_name.items():
            subgraph.tensors[index].name = f"{self.key}_{name}:0".encode()
        for key, index in outputs.items():
            subgraph.tensors[index].name = f"{self.call}:{keys.index(key)}".encode()
        subgraph.inputs = [by_name[name] for name in sorted(by_name)]
        subgraph.outputs = [outputs[key] for key in self.order]
        signature = schema.SignatureDefT()
        signature.signatureKey, signature.subgraphIndex = self.key.encode(), 0
        signature.inputs = [_tensor_map(name, by_name[name]) for name in sorted(by_name)]
        signature.outputs = [_tensor_map(key, outputs[key]) for key in keys]
        model.signatureDefs = [signature]


def _tensor_map(name: str, index: int):
    entry = schema.TensorMapT()
    entry.name, entry.tensorIndex = name.encode(), index
    return entry


def bind(content: bytes, sources: dict[str, tuple[tuple, str, Callable[[], np.ndarray]]],
         frozen: Signature | None = None) -> Bound:
    """The converter's flatbuffer `content`, whose signature inputs named by `sources`
    ({name: (shape, dtype name, maker)}) are weights, with those weights bound (see the
    module docstring); `maker()` returns a weight's array, read-only (best a view of where
    the weight already is). `frozen`: the signature to write first, into a file converted
    from a frozen graph. Raises Unbindable."""
    model = unpack_model(content)
    if frozen is not None:
        frozen.write(model)
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
        if name == "BATCH_MATMUL":
            to_fully_connected(model, subgraph, op, late)
        kept.append(op)
    kept = fused_into_affine(model, subgraph, kept, late)
    kept = fused_into_following(model, subgraph, kept, late, bound.array)
    subgraph.operators = reshapes_around_products(model, subgraph, kept, late)
    for op in subgraph.operators:  # the weights that are read become constants
        for i in op.inputs:
            if i in late:
                tensor = subgraph.tensors[i]
                tensor.buffer = bound.buffer_of(late[i], tensor.shape, NUMPY[tensor.type])
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
        perm = constant(model, subgraph, int(op.inputs[1]))
        return recipe.then("transpose", tuple(int(a) for a in perm))
    if name in ("RESHAPE", "EXPAND_DIMS", "SQUEEZE"):
        return recipe.then("reshape", tuple(int(d) for d in out.shape))
    if name == "CAST":
        return recipe.then("cast", np.dtype(NUMPY[out.type]).name)
    raise Unbindable(f"{name} of a weight")


def _drop_unused_tensors(subgraph, signatures) -> None:
    """Removes the tensors nothing reads or writes any more (the folded weights)."""
    used = {int(i) for op in subgraph.operators for i in [*op.inputs, *op.outputs] if i >= 0}
    used |= {int(i) for i in subgraph.inputs} | {int(i) for i in subgraph.outputs}
    for op in subgraph.operators:
        used |= {int(i) for i in (op.intermediates if op.intermediates is not None else [])}
    used |= {i for t in used for i in _blockwise_reads(subgraph.tensors[t]).values()}
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
    for tensor in subgraph.tensors:
        for field_name, index in _blockwise_reads(tensor).items():
            setattr(tensor.quantization.details, field_name, new[index])
    for signature in signatures:
        for tensor_map in [*signature.inputs, *signature.outputs]:
            tensor_map.tensorIndex = new[tensor_map.tensorIndex]


def _blockwise_reads(tensor) -> dict[str, int]:
    """The tensors a blockwise-quantized weight reads through its quantization details, not
    through an op: its scales and, when set (0 is the schema's "none"), its zero points."""
    quantization = tensor.quantization
    if (quantization is None
            or quantization.detailsType != schema.QuantizationDetails.BlockwiseQuantization):
        return {}
    details = quantization.details
    reads = {"scales": int(details.scales)}
    if details.zeroPoints:
        reads["zeroPoints"] = int(details.zeroPoints)
    return reads


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _aligned_vector(builder, nbytes: int, parts: Iterator[np.ndarray]) -> int:
    """The bytes of consecutive array `parts` (`nbytes` in all) as one [ubyte] vector
    aligned to ALIGN (what TF's converter writes), copied a part at a time."""
    builder.StartVector(1, nbytes, ALIGN)
    builder.head -= nbytes
    at = builder.head
    for part in parts:
        payload = memoryview(np.ascontiguousarray(part).reshape(-1)).cast("B")
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


def row_blocks(array: np.ndarray) -> Iterator[np.ndarray]:
    """`array` (any strides) as contiguous blocks of leading rows of about PIECE_ELEMENTS
    elements, in order: its bytes without a whole contiguous copy."""
    if array.ndim == 0 or array.size == 0:
        yield np.ascontiguousarray(array)
        return
    step = max(1, PIECE_ELEMENTS // max(1, array[0].size))
    for start in range(0, array.shape[0], step):
        yield np.ascontiguousarray(array[start:start + step])


def unpacked_file(path: str):
    """The .tflite at `path` unpacked (schema.ModelT), the buffers of a file past 2 GB
    (stored after its flatbuffer) as views of the mapped file."""
    content = mapped(path)
    model = unpack_model(content)
    inline_stored_buffers(model, content)
    return model
