"""The kernel's value graph: from a Kernel (axes with roles, AST) to the STOREs of every output replica, as a DAG of
index math, LOADs, ALU ops and REDUCE nodes that the emitter (emit.py) orders into a program. In the order it runs:

  1. `axis_indices`: one index per axis: a RANGE loop, a SPECIAL thread id (ids recovered with // and % where dims
     share one), or None for an upcast axis (a constant per replica);
  2. `Addressing`: each memory op's ShapeTracker at given axis indices → (index, valid), memoized per shape of
     non-constant indices (replicas only add a constant); a gather (a LOAD with arg GatherAxis) adds the index value
     it reads, clamped into the table's rows (`ValueBuilder.gather_load`, `gather_address`, `clamp_index`): a
     data-dependent load that can never leave the table;
  3. `ValueBuilder.build`: the AST at axis indices, children first (elementwise ops on an explicit stack); memory
     ops by Addressing, staged loads from their shared tiles (staging.py), reduces as loop reduces (reduces.py: row
     passes, blocking, invariant folding, the GROUP combine) or tensor-core fragments (tensor_cores.py);
  4. `build_stores`: expand the output's upcast axes into replicas (one STORE each; a row kernel also walks its rows in
     the store pass's loops), gated to the combining thread of a GROUP.
On a CPU, subexpressions of a reduce's source that vary only along its axes are built once more at loops of their own
into scratch arrays (scratch.py: the `precompute`) and read back from them in step 3.

The result is a ValueGraph: the stores plus what the emitter needs to place them (loops that only the gated thread
runs, the row store's loops, the staged tiles' next-step copy).
"""
from __future__ import annotations
import itertools
from dataclasses import dataclass
from typing import Iterator, Optional
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops, ALU, GatherAxis, simplify, exec_alu, identity_of_reduce, is_gather_load
from tgrad.codegen.axes import fold_dims
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.opts import reduce_ignores_padding
from tgrad.codegen.staging import StagedTiles
from tgrad.codegen.scratch import ScratchValues, varying_axes
from tgrad.codegen.tensor_cores import TensorCoreFragments
from tgrad.codegen.reduces import (PASS_LOOP_ARG, accumulation_split, block_ranges, chain_op, chain_terms,
                                   factor_integer_terms, factor_shared_out, shared_factors_last,
                                   compensable, fold_invariant_reduce, group_combine, group_axes, group_gate,
                                   group_partial,
                                   is_sum_of_partials, loop_axes, new_reduce, online_result, online_step,
                                   row_pass_loops, row_store_indices, store_pass)
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import offset_by, to_uop
from tgrad.helpers import prod

BUILT_WHOLE = (Ops.LOAD, Ops.CONST, Ops.ARANGE, Ops.REDUCE_AXIS)   # the AST nodes ValueBuilder.build_leaf builds

# ---- 1. an index per axis

def _unfolded_specials(prefix: str, dims: tuple[int, ...], limits: tuple[int, ...]) -> list[UOp]:
  """Thread ids for dims, last dim on id 0 (x: the fastest-varying and the one with the largest limit). Dims that
  share an id (fold_dims: too many dims, or a dim over its id's limit) are recovered with // and %."""
  out: list[UOp] = []
  for id_number, group in reversed(list(enumerate(fold_dims(dims, limits)))):   # outermost group first
    special = UOp(Ops.SPECIAL, dtypes.index, (), (f"{prefix}{id_number}", prod(group)))
    for i, size in enumerate(group):
      out.append(simplify((special // prod(group[i + 1:])) % size) if len(group) > 1 else special)
  return out

def axis_indices(kernel: Kernel) -> list[Optional[UOp]]:
  """One index per axis; upcast axes get None (they are constants per replica)."""
  k, caps = kernel, kernel.renderer
  full = k.full_shape
  idx: list[Optional[UOp]] = [None] * k.shape_len
  def loop(axis: int) -> UOp: return UOp(Ops.RANGE, dtypes.index, (to_uop(0), to_uop(full[axis])), axis)
  if caps.has_local:
    idx[:k.global_dims] = _unfolded_specials("gidx", k.global_axis_sizes, caps.max_grid[:caps.max_global_dims])
    for axis, index in zip(k.thread_axes, _unfolded_specials("lidx", k.local_axis_sizes, caps.max_local_dims)):
      idx[axis] = index
  else:
    for axis in range(k.global_dims):
      idx[axis] = UOp(Ops.SPECIAL, dtypes.index, (), ("core", full[0])) if axis == 0 and k.threads else loop(axis)
  for axis in range(k.first_reduce + k.group_for_reduces, k.first_upcast): idx[axis] = loop(axis)
  return idx

# ---- 2. memory addressing, gathers included

def clamp_index(value: UOp, size: int) -> UOp:
  """An int value read from memory as an index in [0, size): cast to the index dtype, then clamped, so a gather never
  reads outside its table whatever the index buffer holds. min(x, size - 1) is written -max(-x, 1 - size): the range
  analysis then knows exactly [0, size - 1] and nothing more (the value itself is only known at run time)."""
  nonnegative = value.cast(dtypes.index).maximum(to_uop(0))
  return simplify((nonnegative * -1).maximum(to_uop(1 - size)) * -1)

def _load(node: UOp, index: UOp, valid: UOp) -> UOp:
  """A LOAD of node's buffer at index, gated by valid unless it is always true (a never-true valid loads 0)."""
  if valid.op is Ops.CONST and not valid.arg: return UOp.const(node.dtype, 0)
  return UOp(Ops.LOAD, node.dtype, (node.src[0], index) + (() if valid.op is Ops.CONST and valid.arg else (valid,)))

def gather_address(row_start: UOp, row_value: UOp, axis: GatherAxis) -> UOp:
  """A gather's element index: its VIEW's address (row 0 of the gathered axis) plus the index value it read,
  clamped into the table's rows, times the row stride."""
  return simplify(row_start + clamp_index(row_value, axis.size) * axis.stride)

class Addressing:
  """(index, valid) of the kernel's memory ops at axis indices. Replicas differ in constant indices: along an axis
  with a constant stride (which the mask ignores) a constant only moves the index, so each shape of non-constant
  indices is indexed once (ShapeTracker.to_indexed simplifies, which is most of the linearizer's time) and then
  offset."""
  def __init__(self, kernel: Kernel):
    self.view_of: dict[UOp, ShapeTracker] = {u: st for u, st in zip(kernel.memops, kernel.sts)}
    self.strides: dict[UOp, tuple] = {}                # memory op → its ShapeTracker's real strides
    self.indexings: dict[tuple, tuple[UOp, UOp]] = {}  # memo of `indexed`

  def memory_strides(self, memop: UOp) -> tuple:
    if (strides := self.strides.get(memop)) is None: strides = self.strides[memop] = self.view_of[memop].real_strides()
    return strides

  def indexed(self, memop: UOp, idxs: tuple[UOp, ...]) -> tuple[UOp, UOp]:
    st, strides = self.view_of[memop], self.memory_strides(memop)
    base, delta = list(idxs), 0
    for axis, x in enumerate(idxs):
      if x.op is Ops.CONST and x.arg != 0 and isinstance(strides[axis], int):   # not None, nor symbolic (n*n)
        base[axis], delta = to_uop(0), delta + x.arg * strides[axis]
    if (key := (memop, tuple(base))) not in self.indexings: self.indexings[key] = st.to_indexed(base)
    index, valid = self.indexings[key]
    return offset_by(index, delta), valid

  def global_load(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    index, valid = self.indexed(node, idxs)
    return _load(node, index, valid)

# ---- 3. the value of an AST node at axis indices

def fold_constants(u: UOp) -> UOp:
  """An ALU op of constants is the constant exec_alu computes. Kernels never hand such an op to a device compiler:
  NVRTC's C++ front end treats `0.0f / 0.0f` as undefined and folded `(-(0.0f / 0.0f)) != (-(0.0f / 0.0f))` to
  false (an argmin over the NaN mean of an empty axis answered 1, not 0: fuzz_ops seed 0 case 1302)."""
  if u.op not in ALU or not u.src or any(s.op is not Ops.CONST for s in u.src): return u
  try: return UOp.const(u.dtype, exec_alu(u.op, u.dtype, tuple(s.arg for s in u.src)))
  except (TypeError, OverflowError): return u

# ---- a row kernel's value stored in its pass

@dataclass(frozen=True)
class PassStore:
  """A row kernel whose stored value is (a function of reduces of) the source of one of its sums: softmax stores
  exp(x − max) / Σ exp(x − max). The sum's pass stores each value of its source into the output as it adds it, and the
  store pass reads them back instead of computing them again (one exponential per element, not two). `value` is the
  sum's source (an AST node), `store` the kernel's STORE memop."""
  reduce: UOp
  store: UOp

  @property
  def value(self) -> UOp: return self.reduce.src[0]

# What makes a source worth storing: computing it again costs more than the load that replaces it.
COSTLY_OPS = (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TANH, Ops.SQRT, Ops.FDIV, Ops.RECIP)

def _reads_rows_only_through(value: UOp, kept: UOp, kernel: Kernel) -> bool:
  """Whether every LOAD that `value` reads along the row is read through `kept` or a reduce (so the store pass, with
  `kept` loaded from the output, reads no input)."""
  stack, seen = [value], set()
  while stack:
    u = stack.pop()
    if u in seen or u is kept or u.op is Ops.REDUCE_AXIS: continue
    seen.add(u)
    if u.op is Ops.LOAD: return False
    stack.extend(u.src)
  return True

def _varies_along(kernel: Kernel, value: UOp, axes: list[int]) -> bool:
  """Whether `value` reads a LOAD that moves along one of these axes (a sum of it is a loop, never folded)."""
  views = dict(zip(kernel.memops, kernel.sts))
  return any(u.op is Ops.LOAD and u in views and any(views[u].real_strides()[a] != 0 for a in axes)
             for u in value.toposort())

def pass_store(kernel: Kernel) -> Optional[PassStore]:
  """The PassStore of a CPU row kernel (no thread blocks), or None: one STORE, spanning the rows, with no mask along
  them, of a value that reads its inputs only through the source of one float sum (`_reads_rows_only_through`), a
  source of the store's dtype that costs more than a load (COSTLY_OPS) and is no unrolled axis's (each value stored
  where the store pass will read it: an unroll of the reduce axis is the store pass's own, an output replica has
  one store each)."""
  k = kernel
  if not k.row_store or k.renderer.has_local or k.group_for_reduces or k.staged or k.tensor_core: return None
  if not (loops := loop_axes(k)): return None   # every value unrolled: no loop to store in
  stores = [u for u in k.memops if u.op is Ops.STORE]
  if len(stores) != 1 or not stores_rows(k, stores[0]): return None
  store = stores[0]
  st = k.sts[k.memops.index(store)]
  strides = st.real_strides()
  if any(strides[a] in (0, None) for a in range(k.first_reduce, k.shape_len) if k.full_shape[a] != 1): return None
  if any(v.mask is not None for v in st.views): return None
  value = store.src[2]
  for r in k.reduceops:
    source = r.src[0]
    if r.arg[0] is not Ops.ADD or not r.dtype.is_float or source.dtype != value.dtype: continue
    if not any(u.op in COSTLY_OPS for u in source.toposort()) or not _varies_along(k, source, loops): continue
    if source in value.toposort() and _reads_rows_only_through(value, source, k): return PassStore(r, store)
  return None

class ValueBuilder:
  """Builds AST nodes at axis indices, memoized by (node, indices). Input: the kernel, its axis indices, its memory
  addressing, its staged tiles (or None) and its counter of accumulator and array numbers. Collects the GROUP loops
  that only the combining thread runs (`gated_loops`)."""
  def __init__(self, kernel: Kernel, indices: list[Optional[UOp]], addressing: Addressing,
               tiles: Optional[StagedTiles], ids: Iterator[int], scratch: Optional[ScratchValues] = None):
    self.kernel, self.indices, self.addressing, self.tiles, self.ids = kernel, indices, addressing, tiles, ids
    self.scratch = scratch
    # on a CPU a reduce is keyed by the axes it varies along only: one loop for every output replica and output
    # loop position it doesn't vary with (a norm's sum of squares under an upcast matvec's rows)
    self.varies = None if kernel.renderer.has_local else varying_axes(kernel)
    self.levels = kernel.reduce_levels    # each reduce's row pass (see reduces.PASS_LOOP_ARG)
    self.tensor_cores = TensorCoreFragments(kernel, indices, tiles, self.build, ids) if kernel.tensor_core else None
    self.memo: dict[tuple, UOp] = {}
    self.reduces: dict[tuple, UOp] = {}   # (REDUCE_AXIS, indices with the reduce axes at 0) → its value
    self.group_partials: dict[tuple, tuple[UOp, UOp]] = {}   # the same key → (its shared partials, their barrier)
    self.gated_loops: set[UOp] = set()    # the RANGEs over a GROUP's partials that only the storing thread runs
    self.pass_store = pass_store(kernel)
    self.pass_stores: list[UOp] = []      # the PassStore's STOREs, inside its sum's loop

  def build(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """The value of AST node `node` at axis indices `idxs`. Elementwise ops are walked on an explicit stack, children
    first and in order (any depth of chain); memory ops and reduces are built where the walk meets them (a reduce
    builds its own source with a nested call: one level per reduce inside a kernel)."""
    stack: list[tuple[UOp, bool]] = [(node, False)]
    while stack:
      u, sources_built = stack.pop()
      key = (u, idxs)
      if key in self.memo: continue
      if self.scratch is not None and (read := self.scratch.read(u, idxs)) is not None: self.memo[key] = read
      elif u.op in BUILT_WHOLE: self.memo[key] = self.build_leaf(u, idxs)
      elif not sources_built:
        stack.append((u, True))
        stack.extend((s, False) for s in reversed(u.src))
      else: self.memo[key] = fold_constants(UOp(u.op, u.dtype, tuple(self.memo[(s, idxs)] for s in u.src), u.arg))
    return self.memo[(node, idxs)]

  def build_leaf(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """A memory op (load, constant, arange) or a reduce at `idxs`."""
    view_of = self.addressing.view_of
    if node.op is Ops.LOAD and self.tiles is not None and node in self.tiles.stages: return self.tiles.read(node, idxs)
    if is_gather_load(node): return self.gather_load(node, idxs)
    if node.op is Ops.LOAD: return self.addressing.global_load(node, idxs)
    if node.op is Ops.CONST and not node.src: return node
    if node.op is Ops.CONST and isinstance(node.arg, UOp):   # a symbolic constant (e.g. a mean's count): its value
      _, valid = view_of[node].to_indexed(list(idxs))
      return simplify(valid.where(node.arg.cast(node.dtype), UOp.const(node.dtype, 0)))
    if node.op is Ops.CONST:
      _, valid = view_of[node].to_indexed(list(idxs))
      return simplify(valid.where(UOp.const(node.dtype, node.arg), UOp.const(node.dtype, 0)))
    if node.op is Ops.ARANGE:
      index, valid = view_of[node].to_indexed(list(idxs))
      return simplify(valid.where(index, to_uop(0))).cast(node.dtype)
    # a reduce's result doesn't vary along its own axes: one per position of the others, wherever it is read (a row
    # kernel reads it at every position of the row, and inside later reduces' loops); an axis of size 1 (a loop left
    # by a split) has only index 0, whichever pass's loop stands for it
    canonical = tuple(to_uop(0) if self.kernel.is_reduce_axis(a) or self.kernel.full_shape[a] == 1 or
                      (self.varies is not None and a not in self.varies[node]) else x for a, x in enumerate(idxs))
    if (node, canonical) not in self.reduces: self.reduces[(node, canonical)] = self.build_reduce(node, canonical)
    return self.reduces[(node, canonical)]

  def gather_load(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """A data-dependent load (ops.GatherAxis) at idxs: its index value is built at the same idxs (gather_address). A
    masked position loads nothing and reads no index."""
    row_start, valid = self.addressing.indexed(node, idxs)
    if valid.op is Ops.CONST and not valid.arg: return UOp.const(node.dtype, 0)
    return _load(node, gather_address(row_start, self.build(node.src[1], idxs), node.arg), valid)

  def unrolled_value(self, node: UOp, idxs: tuple[UOp, ...], loop_indices: dict[int, UOp]) -> tuple[UOp, int]:
    """The unrolled replicas of a reduce's source combined with its op (a left chain of reduces.chain_op:
    reduces.reduce_terms splits it again), at idxs with the GROUP's thread ids and these loop indices on the reduce
    axes, and the chain's length. A float sum's integer terms that share a factor are summed as integers first
    (reduces.factor_integer_terms), so the chain may be shorter than the replicas."""
    k, op = self.kernel, chain_op(node.arg[0])
    guarded = bool(k.padding_guards) and not reduce_ignores_padding(node)
    identity = UOp.const(node.dtype, identity_of_reduce(op, node.dtype))
    values = []
    for inner in self.replica_indices(idxs, loop_indices):
      value = self.build(node.src[0], inner)
      if guarded: value = simplify(self.not_padding(inner).where(value, identity))
      values.append(value)
    if op is Ops.ADD and node.dtype.is_float:
      values = factor_integer_terms(values)
      # a GPU adds floats as written: the shared factors come out of the sum; LLVM factors the reorderable chain itself
      values = factor_shared_out(values) if k.renderer.has_local else shared_factors_last(values)
    combined = values[0]
    for v in values[1:]: combined = UOp(op, v.dtype, (combined, v))   # the source's dtype (a LOGADDEXP's may differ)
    return combined, len(values)

  def replica_indices(self, idxs: tuple[UOp, ...], loop_indices: dict[int, UOp]) -> Iterator[tuple[UOp, ...]]:
    """The indices of each unrolled replica of a reduce's source: idxs with the GROUP's thread ids, these loop indices
    on the reduce axes, and each combination of constants on the unrolled ones."""
    k = self.kernel
    unroll_axes = [a for a in k.upcast_axes if k.is_reduce_axis(a)]
    inner = list(idxs)
    for a in group_axes(k): inner[a] = self.indices[a]
    for a, index in loop_indices.items(): inner[a] = index
    for combo in itertools.product(*[range(k.full_shape[a]) for a in unroll_axes]):
      for a, v in zip(unroll_axes, combo): inner[a] = to_uop(v)
      yield tuple(inner)

  def store_in_pass(self, node: UOp, idxs: tuple[UOp, ...], loop_indices: dict[int, UOp]) -> None:
    """The PassStore's STOREs: each replica of the sum's source, at the indices its reduce adds it at."""
    assert self.pass_store is not None
    for inner in self.replica_indices(idxs, loop_indices):
      index, _ = self.addressing.indexed(self.pass_store.store, inner)
      value = self.build(node.src[0], inner)
      self.pass_stores.append(UOp(Ops.STORE, dtypes.void, (self.pass_store.store.src[0], index, value)))

  def not_padding(self, idxs: tuple[UOp, ...]) -> UOp:
    """Where no guarded GROUP's padding is (Kernel.padding_guards): a reduce that the padding would change (a max, a
    sum of exponentials) combines its identity there instead of its value."""
    valid = UOp.const(dtypes.bool, True)
    for guard in self.kernel.padding_guards: valid = valid & self.addressing.indexed(guard, idxs)[1]
    return simplify(valid)

  def reduce_partial(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """A REDUCE_AXIS at idxs (its own axes at 0) in one thread: tensor-core fragments, or a loop reduce in its row
    pass, blocked or folded where reduces.py says so (a GROUP's threads then combine their partials)."""
    k = self.kernel
    if self.tensor_cores is not None and node is k.tensor_core.reduce:
      return self.tensor_cores.reduce_element(node, idxs)
    op, level = node.arg[0], self.levels[node]
    loops = row_pass_loops(k, self.indices, level)
    loop_order = loop_axes(k)
    ranges = tuple(loops[a] for a in loop_order)
    combined, chained = self.unrolled_value(node, idxs, loops)
    terms = prod(k.full_shape[a] for a in k.upcast_axes if k.is_reduce_axis(a))
    if not ranges and op is Ops.LOGADDEXP:   # every value unrolled: the state of one step is the whole reduce
      result = online_result(*online_step(chain_terms(combined, chained)), node.dtype)
    elif not ranges:   # a float sum starts from +0.0 as a loop's accumulator does: -0.0 + -0.0 is +0.0, as in numpy
      result = UOp(Ops.ADD, node.dtype, (combined, UOp.const(node.dtype, 0.0))) if compensable(op, node.dtype) \
        else combined
    elif (folded := fold_invariant_reduce(op, node.dtype, combined, ranges)) is not None: result = folded
    elif (split := accumulation_split(k, op, node.dtype, loop_order, terms)) is not None:
      axis, chunk = split
      block, within = block_ranges(axis, k.full_shape[axis], chunk, PASS_LOOP_ARG * level)
      position = loop_order.index(axis)
      inner_ranges = (within,) + ranges[position + 1:]
      blocked_loops = {**loops, axis: within}
      value, chained = self.unrolled_value(node, idxs, blocked_loops)
      block_total = new_reduce(self.ids, op, node.dtype, value, inner_ranges, chained)
      if self.pass_store is not None and node is self.pass_store.reduce: self.store_in_pass(node, idxs, blocked_loops)
      result = new_reduce(self.ids, op, node.dtype, block_total, ranges[:position] + (block,), compensated=True)
    else:
      result = new_reduce(self.ids, op, node.dtype, combined, ranges, chained,
                          compensated=is_sum_of_partials(node) and compensable(op, node.dtype))
      if self.pass_store is not None and node is self.pass_store.reduce: self.store_in_pass(node, idxs, loops)
    return result

  def build_reduce(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """A REDUCE_AXIS at idxs (its own axes at 0): its partial (`reduce_partial`), combined across a GROUP's threads.
    The reduces of one pass share the barrier before their combines (`pass_barrier`)."""
    k = self.kernel
    if not k.group_for_reduces or (self.tensor_cores is not None and node is k.tensor_core.reduce):
      return self.reduce_partial(node, idxs)
    shared, barrier = self.pass_barrier(node, idxs)
    result, gated = group_combine(k, self.indices, self.ids, node.arg[0], node.dtype, shared, barrier,
                                  self.levels[node], of_partials=is_sum_of_partials(node))
    self.gated_loops.update(gated)
    return result

  def pass_barrier(self, node: UOp, idxs: tuple[UOp, ...]) -> tuple[UOp, UOp]:
    """node's shared array of partials and the barrier before its combine. Where each reduce is built at one position
    (no output upcast), every reduce of node's pass gets its partial stored at the first one's turn, behind one
    barrier: a fully unrolled reduce (a packed matvec's) is straight-line code, and a barrier after each one's store
    kept the next one's loads from being issued before it (three of them in a row in gemma's packed gate/up kernel)."""
    if (found := self.group_partials.get((node, idxs))) is not None: return found
    k = self.kernel
    one_position = all(k.full_shape[a] == 1 for a in k.upcast_axes if not k.is_reduce_axis(a))
    level = self.levels[node]
    siblings = [r for r in k.reduceops if self.levels[r] == level and r is not node and
                not (self.tensor_cores is not None and r is k.tensor_core.reduce)] if one_position else []
    stores = {}
    for r in [node] + siblings:
      stores[r] = group_partial(k, self.indices, self.ids, r.arg[0], r.dtype, self.reduce_partial(r, idxs))
    barrier = UOp(Ops.BARRIER, dtypes.void, tuple(store for _, store in stores.values()))
    for r, (shared, _) in stores.items(): self.group_partials[(r, idxs)] = (shared, barrier)
    return self.group_partials[(node, idxs)]

# ---- 4. the stores of every output replica

@dataclass(frozen=True)
class ValueGraph:
  """The value graph's result: the STOREs, the axis indices, the GROUP loops only the combining thread runs and its
  condition, a row kernel's store loops, and the staged tiles' next-step copy (reduce loop ranges, barrier after it)
  with the copies to issue early (asynchronous)."""
  stores: tuple[UOp, ...]
  indices: tuple[Optional[UOp], ...]
  gated_loops: frozenset[UOp]
  gate: Optional[UOp]
  row_loops: tuple[UOp, ...]
  next_copy: Optional[tuple[tuple[UOp, ...], UOp]]
  early_stores: frozenset[UOp]
  accumulators: int   # accumulator and shared-array numbers taken (DEFINE_ACC args, tile/temp names)
  pass_stores: tuple[UOp, ...] = ()   # STOREs inside a row pass's loop (PassStore), emitted with that loop's body
  # CPU scratch values (scratch.py): per loop nest (its RANGEs, the STOREs into scratch), placed before the output loops
  precompute: tuple[tuple[tuple[UOp, ...], tuple[UOp, ...]], ...] = ()

def stores_rows(kernel: Kernel, store: UOp) -> bool:
  """Whether a STORE of a row kernel spans the reduce axes (it stores whole rows); a kernel with several outputs
  (schedule.py rule 2c) may also store reduced values, once per row, beside them."""
  st = kernel.sts[kernel.memops.index(store)]
  return kernel.row_store and any(st.shape[a] != 1 for a in range(kernel.first_reduce, kernel.shape_len)
                                  if kernel.is_reduce_axis(a))

def build_stores(builder: ValueBuilder) -> list[UOp]:
  """The STOREs of every output replica (one per combination of the output's upcast axes). A row kernel stores its
  whole rows: each thread of a GROUP its share, in the store pass's loops, one replica per unrolled position; a
  reduced output beside them is stored as in any reduce kernel (reduce axes at 0, by the GROUP's first thread). A
  replica whose store is masked off everywhere (a copy of one row's run, rule 2c) is no store."""
  k, indices = builder.kernel, builder.indices
  stores = []
  row_indices = row_store_indices(k, indices) if k.row_store else {}
  for store in [u for u in k.memops if u.op is Ops.STORE]:
    rows = stores_rows(k, store)
    out_upcast = [a for a in k.upcast_axes if not k.is_reduce_axis(a) or rows]
    gate = None if rows else group_gate(k, indices)
    for combo in itertools.product(*[range(k.full_shape[a]) for a in out_upcast]):
      idxs = list(indices)
      for a in range(k.first_reduce, k.shape_len): idxs[a] = row_indices.get(a, to_uop(0)) if rows else to_uop(0)
      for a, v in zip(out_upcast, combo): idxs[a] = to_uop(v)
      index, valid = builder.addressing.indexed(store, tuple(idxs))
      if gate is not None: valid = simplify(valid & gate)
      if valid.op is Ops.CONST and not valid.arg: continue
      if builder.pass_store is not None and builder.pass_store.store is store:   # the sum's pass stored it there
        builder.memo[(builder.pass_store.value, tuple(idxs))] = UOp(Ops.LOAD, store.src[2].dtype, (store.src[0], index))
      value = builder.build(store.src[2], tuple(idxs))
      stores.append(UOp(Ops.STORE, dtypes.void, (store.src[0], index, value) +
                        (() if valid.op is Ops.CONST and valid.arg else (valid,))))
  return stores

def build_value_graph(kernel: Kernel) -> ValueGraph:
  """Steps 1-4 for one kernel: indices, addressing, staged tiles, the stores."""
  ids = itertools.count(1)   # accumulator and shared-array numbers, in the order the graph takes them
  indices = axis_indices(kernel)
  addressing = Addressing(kernel)
  tiles = StagedTiles(kernel, indices, addressing, ids) if kernel.staged else None
  scratch = ScratchValues.of(kernel, indices, ids)
  builder = ValueBuilder(kernel, indices, addressing, tiles, ids, scratch)
  precompute = scratch.precompute(builder.build) if scratch is not None else ()
  stores = build_stores(builder)
  assert builder.pass_store is None or builder.pass_stores, "the store pass reads values no pass stored"
  level = store_pass(kernel)
  row_loops = tuple(row_pass_loops(kernel, indices, level).values()) if level is not None else ()
  next_copy = tiles.next_copy if tiles is not None else None
  early_stores = frozenset(tiles.early_stores) if tiles is not None else frozenset()
  return ValueGraph(tuple(stores), tuple(indices), frozenset(builder.gated_loops), group_gate(kernel, indices),
                    row_loops, next_copy, early_stores, accumulators=next(ids) - 1,
                    pass_stores=tuple(builder.pass_stores), precompute=precompute)
