"""What a path runs on: a lazy graph's canonical key, its description, and its float64 reference copy.

`graph_key(outs)` hashes the structure of the unrealized graph above `outs` — ops, dtypes, args, shapes, views,
devices and edges, with realized inputs named by their order of first appearance (their values and Buffers are
not part of it) and host data by shape and dtype only. It is stable across processes (sha256 of canonical text), so
the benchmark database can find a graph that a later run builds again. Composite regions are keyed by their name
and parameters, and the key is taken with every region at its default lowering, so it names the graph as the user
wrote it, whatever lowering is applied at the moment.

`reference_graph(outs)` rebuilds that graph on the LLVM device with every float dtype widened to float64: the
exact value against which a path's error is measured (the caller applies the most exact lowerings first).
"""
from __future__ import annotations
import hashlib, json
from enum import Enum
from typing import Any, Optional
import numpy as np
from tgrad.backend import HOST_DEVICE
from tgrad.dtype import DType, bfloat16_to_float32, dtypes
from tgrad.device import Buffer
from tgrad.helpers import prod
from tgrad.lazy import LazyBuffer, walk
from tgrad.ops import Ops, UOp
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import unbind

TRANSCENDENTAL_FLAVOURED = (Ops.EXP2, Ops.LOG2, Ops.TANH)   # ALU ops whose arg picks how a kernel computes them
REFERENCE_DEVICE = HOST_DEVICE
REFERENCE_DTYPE = dtypes.float64
GRAPH_KEY_VERSION = 1   # bump when what the key covers changes: records under old keys are then not found

def arg_text(arg: Any) -> Any:
  """A JSON-able, process-independent form of a lazy op's arg (symbolic sizes by their variables: one key serves
  every value, as one compiled kernel does)."""
  if arg is None or isinstance(arg, (bool, int, str)): return arg
  if isinstance(arg, float): return repr(arg)   # keeps nan/inf/-0.0 apart
  if isinstance(arg, np.ndarray): return ["host", list(arg.shape), str(arg.dtype)]
  if isinstance(arg, UOp): return ["uop", unbind(arg)[0].key]   # a symbolic value: its variables, not their values
  if isinstance(arg, ShapeTracker): return ["view", view_text(arg)]   # an ASSIGN's region: unbound, as views are
  if hasattr(arg, "stable_repr"): return arg.stable_repr()   # a CUSTOM op's kernel (tgrad/custom.py)
  if isinstance(arg, Enum): return arg.name
  if isinstance(arg, DType): return str(arg)
  if isinstance(arg, (tuple, list)): return [arg_text(a) for a in arg]
  return repr(arg)

def view_text(st: ShapeTracker) -> Any:
  def size(s): return unbind(s)[0].key if isinstance(s, UOp) else s
  return [[[size(s) for s in v.shape], [size(s) for s in v.strides], size(v.offset),
           None if v.mask is None else [[size(a), size(b)] for a, b in v.mask]] for v in st.views]

def graph_nodes(outs: list[LazyBuffer], as_built: bool = True) -> list[LazyBuffer]:
  """Every node of the unrealized graph above outs (views included), depth-first pre-order from the roots; as built
  (regions at their default lowerings: LazyBuffer.as_built) or as lowered now."""
  return list(walk(outs, as_built=as_built))

def graph_entries(outs: list[LazyBuffer]) -> list[Any]:
  """The canonical structure of the graph above outs, one entry per node (see the module doc)."""
  nodes = graph_nodes(outs)
  number = {id(lb): i for i, lb in enumerate(nodes)}
  leaves: dict[int, int] = {}
  entries: list[Any] = []
  for lb in nodes:
    if not lb.is_base:
      entries.append(["view", view_text(lb.st), number[id(lb.base)]])
    elif lb.buffer is not None:
      leaf = leaves.setdefault(id(lb.buffer), len(leaves))
      entries.append(["input", lb.device, str(lb.dtype), arg_text(lb.shape), leaf])
    else:
      op, srcs, arg = lb.as_built
      entry = [op.name, lb.device, str(lb.dtype), arg_text(lb.shape), arg_text(arg), [number[id(s)] for s in srcs]]
      region = lb.region
      if region is not None and region.root is lb: entry.append(["composite", region.name, arg_text(region.params)])
      entries.append(entry)
  return entries

def graph_key(outs: list[LazyBuffer]) -> str:
  text = json.dumps([GRAPH_KEY_VERSION, [number_of_out(outs, o) for o in outs], graph_entries(outs)],
                    separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()

def number_of_out(outs: list[LazyBuffer], out: LazyBuffer) -> int:
  return next(i for i, o in enumerate(outs) if o is out)

def graph_description(outs: list[LazyBuffer]) -> dict:
  """What `show` prints about a graph: its outputs, its inputs and how many of each composite and op it holds."""
  nodes = graph_nodes(outs)
  composites: dict[str, int] = {}
  ops: dict[str, int] = {}
  inputs = []
  seen_buffers: set[int] = set()
  for lb in nodes:
    if not lb.is_base: continue
    if lb.buffer is not None:
      if id(lb.buffer) not in seen_buffers:
        seen_buffers.add(id(lb.buffer))
        inputs.append([arg_text(lb.shape), str(lb.dtype)])
      continue
    op_name = lb.as_built[0].name
    ops[op_name] = ops.get(op_name, 0) + 1
    region = lb.region
    if region is not None and region.root is lb: composites[region.name] = composites.get(region.name, 0) + 1
  return {"outputs": [[arg_text(o.shape), str(o.dtype)] for o in outs], "device": outs[0].device if outs else "",
          "inputs": inputs[:16], "input_count": len(inputs), "composites": composites, "ops": ops,
          "nodes": len(nodes)}

def placeholders(device: str, shapes: list[tuple[int, ...]], dtypes_: list[DType]) -> list[LazyBuffer]:
  """Realized-looking inputs of these shapes (their Buffers are never allocated: nothing runs): the inputs of a graph
  built only to be matched or keyed."""
  return [LazyBuffer.from_buffer(Buffer(device, max(prod(s), 1), d), tuple(s)) for s, d in zip(shapes, dtypes_)]

# ---- the float64 reference

class ReferenceUnavailable(ValueError):
  """The graph holds something that has no float64 meaning (a bitcast of floats, uninitialized memory)."""

def _widen(dtype: DType) -> DType: return REFERENCE_DTYPE if dtype.is_float else dtype

def _host_values(buffer) -> np.ndarray:
  data = buffer.copyout()
  return bfloat16_to_float32(data) if buffer.dtype == dtypes.bfloat16 else data

def reference_graph(outs: list[LazyBuffer], host: Optional[dict[int, np.ndarray]] = None) -> list[LazyBuffer]:
  """The graph above outs rebuilt on REFERENCE_DEVICE with float dtypes widened to float64 (realized inputs are
  copied through the host; `host` caches their values by Buffer id across calls). Raises ReferenceUnavailable."""
  host = {} if host is None else host
  made: dict[int, LazyBuffer] = {}
  for lb in walk(outs, "post"):
    value = _rebuilt(lb, made, host)
    made[id(lb)] = value if not lb.is_base else _as_base(value)   # a base stays a base (a widened cast is no op)
  return [made[id(o)] for o in outs]

def _rebuilt(lb: LazyBuffer, made: dict[int, LazyBuffer], host: dict[int, np.ndarray]) -> LazyBuffer:
  device, dtype = REFERENCE_DEVICE, _widen(lb.dtype)
  if not lb.is_base: return LazyBuffer(device, lb.st, dtype, base=_as_base(made[id(lb.base)]))
  if lb.buffer is not None:
    if id(lb.buffer) not in host: host[id(lb.buffer)] = _host_values(lb.buffer)
    values = host[id(lb.buffer)][:lb.buffer.size]
    values = values.astype(dtype.np) if dtype.is_float else values
    if not isinstance(lb.size, int):
      raise ReferenceUnavailable(f"a realized input of symbolic shape {lb.shape} (bind the value and copy it first)")
    return LazyBuffer.from_host(np.ascontiguousarray(values[:lb.size].reshape(lb.shape)), device, dtype)
  srcs = tuple(made[id(s)] for s in lb.srcs)
  op, arg = lb.op, lb.arg
  if op is Ops.CONST: return LazyBuffer.const_of(arg, dtype, device)
  if op is Ops.COPY:
    if not srcs:
      values = np.asarray(arg)
      if lb.dtype == dtypes.bfloat16: values = bfloat16_to_float32(values)
      return LazyBuffer.from_host(np.ascontiguousarray(values.astype(dtype.np)), device, dtype)
    return _as_base(srcs[0])   # a device copy: the reference is all on one device
  if op is Ops.EMPTY: raise ReferenceUnavailable("the graph reads an unrealized empty tensor (uninitialized memory)")
  if op is Ops.CUSTOM: raise ReferenceUnavailable(f"custom kernel {getattr(arg, 'name', arg)!r} has no float64 form")
  if op is Ops.BITCAST and lb.srcs[0].dtype.is_float:
    raise ReferenceUnavailable(f"a bitcast {lb.srcs[0].dtype} → {lb.dtype} has no float64 meaning")
  if op is Ops.CAST: return srcs[0].cast(dtype)
  # bits read as a float (a packed weight's float16 scales): the float the bits say, then widened exactly
  if op is Ops.BITCAST: return srcs[0].cast(lb.dtype, bitcast=True).cast(dtype)
  if op is Ops.CONTIGUOUS: return srcs[0].contiguous()
  if op is Ops.ASSIGN:   # a whole-buffer write is its value; a write into a region stays a write, into the copy
    if arg is None: return _as_base(srcs[1])
    return LazyBuffer.loadop(op, lb.shape, dtype, device, arg=arg, srcs=(_as_base(srcs[0]), srcs[1]))
  if op is Ops.REDUCE_AXIS: return LazyBuffer.loadop(op, lb.shape, dtype, device, arg=arg, srcs=srcs)
  if op is Ops.GATHER: return LazyBuffer.loadop(op, lb.shape, dtype, device, arg=arg, srcs=srcs)
  if op is Ops.ARANGE: return LazyBuffer.loadop(op, lb.shape, dtype, device, arg=arg)
  # elementwise: the exact form of every op (a lowering flavour on EXP2/LOG2 is dropped)
  return LazyBuffer(device, ShapeTracker.from_shape(lb.shape), dtype, op, srcs, _exact_arg(op, arg))

def _as_base(lb: LazyBuffer) -> LazyBuffer:
  """A base with lb's value (views of the rebuilt graph are made over bases, as in the original)."""
  return lb if lb.is_base else lb.contiguous()

def _exact_arg(op: Ops, arg: Any) -> Any:
  """A transcendental's lowering flavour (fast, polynomial, ...) is dropped: float64 takes the math library's."""
  return None if op in TRANSCENDENTAL_FLAVOURED else arg
