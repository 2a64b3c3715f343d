"""Tensor cores (OptOps.TC): one warp computes M×N tiles of a matmul-like reduce with a target's matrix instruction.
Everything about it is here, in the order it is used:

  1. which reduces qualify: `tensor_core_operands` (a sum of exact products of two loads of the core's input dtype,
     or, for a TF32 core, of two float32 loads rounded to TF32 in the graph: `tf32_rounded_load`);
  2. the opt's choices: `tensor_core_choices` lists the (rows, columns, K) axes a core can take; OptOps.TC (opts.py)
     picks one and lays a warp's lanes and fragment axes over them (AxisState.tensor_core, a TensorCoreUse);
  3. the lowering (linearizer): `TensorCoreFragments` builds, per output tile, each lane's A and B fragments
     (VECTORIZE of loads at the core's fragment layouts, or MatrixLoads of staged tiles), one WMMA per K step into a
     fragment accumulator (a REDUCE), and each output replica as one element (GEP) of its tile's fragment.

The target describes its cores (renderer.TensorCore: dims, dtypes, FragmentLayouts); renderers only render WMMA,
VECTORIZE, GEP and MatrixLoad. The opts (opts.py) import this module for the opt's choices; the value graph
(value_graph.py) hands TensorCoreFragments its builder. Neither is imported here: they are passed in.
"""
from __future__ import annotations
import itertools
from typing import TYPE_CHECKING, Callable, Iterator, Optional
from tgrad.dtype import TF32_KEEP_MASK, TF32_ROUNDING_BIAS, dtypes
from tgrad.ops import UOp, Ops, simplify, is_gather_load
from tgrad.codegen.axes import AxisState
from tgrad.codegen.renderer import FragmentLayout, MatrixLoad, TensorCore
from tgrad.shape.sint import sint, to_uop
if TYPE_CHECKING:
  from tgrad.codegen.staging import StagedTiles

MATRIX_ROW_ELEMENTS = 8   # a MatrixLoad's 8×8 matrix rows: 8 16-bit elements, 16 contiguous aligned bytes

# ---- 1. which reduces qualify

def _widened(x: UOp) -> UOp:
  """x without the float casts to wider floats above it (those are exact)."""
  while x.op is Ops.CAST and x.dtype.is_float and x.src[0].dtype.is_float and \
        x.dtype.itemsize > x.src[0].dtype.itemsize:
    x = x.src[0]
  return x

def _const_arg(u: Optional[UOp]):
  """The value of an AST constant (a CONST over its view), else None (also for no node, and for a scalar parameter)."""
  return u.arg if u is not None and u.op is Ops.CONST and not isinstance(u.arg, UOp) else None

def tf32_rounded_load(x: UOp) -> Optional[UOp]:
  """The float32 load that x rounds to TF32 when x is exactly the graph composite.round_to_tf32 builds over a load:
  WHERE(load != load, load, BITCAST(AND(ADD(BITCAST(load, uint32), TF32_ROUNDING_BIAS), TF32_KEEP_MASK), float32)).
  Else None: a plain float32 load never qualifies for the TF32 core (its low 13 bits would be dropped unrounded)."""
  if x.op is not Ops.WHERE or x.dtype != dtypes.float32: return None
  is_nan, load, rounded = x.src
  if load.op is not Ops.LOAD or is_gather_load(load) or is_nan.op is not Ops.CMPNE or is_nan.src != (load, load) or \
     rounded.op is not Ops.BITCAST or rounded.src[0].op is not Ops.AND: return None
  masked, mask = _split_constant(rounded.src[0])
  if _const_arg(mask) != TF32_KEEP_MASK or masked is None or masked.op is not Ops.ADD: return None
  bits, bias = _split_constant(masked)
  if _const_arg(bias) != TF32_ROUNDING_BIAS or bits is None or bits.op is not Ops.BITCAST or \
     bits.dtype != dtypes.uint32 or bits.src[0] is not load: return None
  return load

def _split_constant(u: UOp) -> tuple[Optional[UOp], Optional[UOp]]:
  """A binary op's (other operand, constant operand), in either order; (None, None) without one constant."""
  a, b = u.src
  if _const_arg(b) is not None: return a, b
  return (b, a) if _const_arg(a) is not None else (None, None)

def operand_load(x: UOp) -> Optional[UOp]:
  """The load a tensor-core operand reads: x itself (a plain load), or the load x rounds to TF32; None otherwise."""
  if x.op is Ops.LOAD: return None if is_gather_load(x) else x
  return tf32_rounded_load(x)

def tensor_core_operands(reduce: UOp) -> Optional[tuple[UOp, UOp]]:
  """The two operands (x, y) of a reduce that sums their products, in the forms where every product is exact: an ADD
  over CAST(MUL(x, y)) to a wider float (Tensor.dot on half inputs: tensor cores skip that product's rounding), or an
  ADD over MUL(x', y') where x', y' are x, y widened, where x and y are loads or float32 loads rounded to TF32 (the
  product of two TF32 values is exact in float32). None for anything else."""
  if reduce.arg[0] is not Ops.ADD: return None
  product = _widened(reduce.src[0])
  if product.op is not Ops.MUL: return None
  x, y = (_widened(s) for s in product.src)
  return (x, y) if all(operand_load(u) is not None for u in (x, y)) else None

def operand_format(x: UOp) -> str:
  return f"{x.dtype.name} rounded to TF32" if x.op is not Ops.LOAD else x.dtype.name

# ---- 2. the opt's choices

def tensor_core_choices(kernel: AxisState, core: TensorCore, operands: tuple[UOp, UOp]
                        ) -> list[tuple[int, int, int, UOp, UOp]]:
  """(rows axis, columns axis, K axis, a, b) for every pair of global axes where one load (a) is constant along the
  columns and varies along the rows, the other (b) the reverse, and the sizes divide the tile (a symbolic size always
  qualifies: OptOps.TC pads it); K is the innermost reduce axis that divides. Innermost columns axis first
  (the output's contiguous axis, for coalesced stores)."""
  k = kernel
  full = k.full_shape
  loads = {x: operand_load(x) for x in operands}
  strides = {x: st.real_strides() for x in operands for u, st in zip(k.memops, k.sts) if u is loads[x]}
  reduce_axes = [ax for ax in range(k.first_reduce, k.first_upcast) if k.is_reduce_axis(ax)]
  k_axis = next((ax for ax in reversed(reduce_axes) if full[ax] % core.dims[2] == 0), None)
  if k_axis is None: return []
  def fits(size: sint, tile: int) -> bool: return isinstance(size, UOp) or size % tile == 0
  choices = []
  for columns in reversed(range(k.global_dims)):
    for rows in reversed(range(k.global_dims)):
      if rows == columns or not fits(full[rows], core.dims[0]) or not fits(full[columns], core.dims[1]): continue
      for a, b in (operands, operands[::-1]):
        if strides[a][columns] == 0 and strides[b][rows] == 0 and strides[a][rows] != 0 and strides[b][columns] != 0:
          choices.append((rows, columns, k_axis, a, b))
          break
  return choices

# ---- 3. the lowering

def k_order(core: TensorCore, offset: int, tig: UOp) -> UOp:
  """Where the kernel reads the k = tig·stride + offset of a tensor-core step (A's column, B's row). Any order of the
  step's K positions sums the same, as long as A and B agree: lane tig's k (2·tig + 0, 1, 8, 9 for m16n8k16) are
  read at 4·tig + 0, 1, 2, 3, so a K-contiguous operand is one aligned 8-byte load per row."""
  offsets = sorted(set(core.a.cols))
  assert core.a.col_lane == core.b.row_lane and offsets == sorted(set(core.b.rows)), "A and B must share the K layout"
  return simplify(tig * len(offsets) + offsets.index(offset))

# an m16n8k16 A fragment is four 8×8 matrices (rows 0-7 and 8-15 at K 0-7, then at K 8-15); B's is two, K 0-7 and
# 8-15 of a row-major K×N tile, loaded transposed (see MMA_M16N8K16 in runtime/cuda/renderer.py)
MATRIX_LOADS = {False: MatrixLoad(4, False), True: MatrixLoad(2, True)}

def fragments_are_matrix_loadable(kernel: AxisState, tiles: Optional[StagedTiles]) -> bool:
  """Whether both operands of an m16n8k16 core with 16-bit inputs are staged so that every 8×8 matrix row is 16
  contiguous, 16-byte aligned bytes of the tile: A's K axis and B's (tig, column upcast) pair must be contiguous,
  every other axis and the buffer size multiples of 8 elements."""
  use = kernel.tensor_core
  if use is None or tiles is None or not kernel.renderer.matrix_loads or use.core.dims != (16, 8, 16) or \
     use.a not in tiles.stages or use.b not in tiles.stages or use.core.dtype_in.itemsize != 2: return False
  rows_up, columns_up, k_up = kernel.tc_upcast_axes
  _, tig_axis = kernel.tc_lane_axes
  for operand, contiguous in ((use.a, {k_up: 1}), (use.b, {columns_up: 1, tig_axis: 2})):
    plan = tiles.stages[operand][0]
    if plan.buffer_elements % MATRIX_ROW_ELEMENTS: return False
    strides = dict(zip(plan.axes, plan.strides))
    if any(strides.get(axis) != stride for axis, stride in contiguous.items()): return False
    if any(stride % MATRIX_ROW_ELEMENTS for axis, stride in strides.items() if axis not in contiguous): return False
  return True

class TensorCoreFragments:
  """The tensor core's reduce (AxisState.tensor_core) as fragments and WMMAs. Input: the kernel, its axis indices, its
  staged tiles (or None), `build(node, idxs)` (the value graph's builder, for fragment elements) and the kernel's
  counter of accumulator numbers. `reduce_element(node, idxs)` is one output replica's value."""
  def __init__(self, kernel: AxisState, indices: list[Optional[UOp]], tiles: Optional[StagedTiles],
               build: Callable[[UOp, tuple[UOp, ...]], UOp], ids: Iterator[int]):
    assert kernel.tensor_core is not None
    self.kernel, self.indices, self.tiles, self.build, self.ids = kernel, indices, tiles, build, ids
    self.use, self.core = kernel.tensor_core, kernel.tensor_core.core
    # tensor-core fragments come from staged tiles as MatrixLoads (K read in its order)
    self.matrix_loads = fragments_are_matrix_loadable(kernel, tiles)
    self.tile_fragments: dict[tuple, UOp] = {}   # a tile's accumulated fragment, by (reduce, indices)
    self.lane_coords: dict[bool, dict[int, UOp]] = {}   # per operand (B: True): a lane's row coordinates

  def reduce_element(self, node: UOp, idxs: tuple[UOp, ...]) -> UOp:
    """This output replica's element of its tile's accumulator: replicas that differ only in the tensor core's own
    row and column upcasts are the elements of one C fragment (OptOps.TC lays them out so, opts.py)."""
    core = self.core
    rows_up, columns_up, _ = self.kernel.tc_upcast_axes
    row_offset = idxs[rows_up].arg * (core.lanes // core.lanes_per_group)   # row = 8·upcast + group
    column_offset = idxs[columns_up].arg                                      # column = 2·tig + upcast
    tile = list(idxs)
    tile[rows_up] = tile[columns_up] = to_uop(0)
    key = (node, tuple(tile))
    if key not in self.tile_fragments: self.tile_fragments[key] = self.accumulate(tuple(tile))
    element = list(zip(core.c.rows, core.c.cols)).index((row_offset, column_offset))
    return UOp(Ops.GEP, core.dtype_acc, (self.tile_fragments[key],), element)

  def accumulate(self, tile: tuple[UOp, ...]) -> UOp:
    """One tile's C fragment: a WMMA per K step of 16 (per unrolled replica), inside the reduce loops a REDUCE whose
    value is that chain of WMMAs on the accumulator fragment."""
    k, use, core = self.kernel, self.use, self.core
    _, _, k_up = k.tc_upcast_axes
    loop_axes = range(k.first_reduce, k.first_upcast)
    unroll_axes = [a for a in k.upcast_axes if k.is_reduce_axis(a) and a != k_up]
    inner = list(tile)
    for a in loop_axes: inner[a] = self.indices[a]
    ranges = tuple(self.indices[a] for a in loop_axes)
    zeros = UOp(Ops.VECTORIZE, core.dtype_acc, tuple(UOp.const(core.dtype_acc, 0.0) for _ in core.c.rows))
    fragment = UOp(Ops.DEFINE_ACC, core.dtype_acc, (zeros,), next(self.ids) - 1) if ranges else zeros
    accumulator = fragment
    for combo in itertools.product(*[range(k.full_shape[a]) for a in unroll_axes]):
      for a, v in zip(unroll_axes, combo): inner[a] = to_uop(v)
      a_fragment = self.operand(use.a, core.a, tuple(inner), rows_are_k=False)
      b_fragment = self.operand(use.b, core.b, tuple(inner), rows_are_k=True)
      fragment = UOp(Ops.WMMA, core.dtype_acc, (a_fragment, b_fragment, fragment), core)
    return UOp(Ops.REDUCE, core.dtype_acc, (fragment, *ranges), (Ops.WMMA, accumulator.arg)) if ranges else fragment

  def matrix_load(self, operand: UOp, inner: tuple[UOp, ...], rows_are_k: bool) -> UOp:
    """This lane's row address for the MatrixLoad of A (rows_are_k False) or B at the tile position `inner`."""
    k, core = self.kernel, self.core
    rows_up, columns_up, k_up = k.tc_upcast_axes
    group_axis, tig_axis = k.tc_lane_axes
    lane = self.indices[group_axis] * core.lanes_per_group + self.indices[tig_axis]
    groups = core.lanes // core.lanes_per_group
    tile_k = core.dims[2]
    idxs = list(inner)
    idxs[group_axis] = idxs[rows_up] = idxs[tig_axis] = idxs[columns_up] = to_uop(0)
    if (lane_coords := self.lane_coords.get(rows_are_k)) is None:
      if rows_are_k: lane_coords = {k_up: lane % tile_k}                 # B: rows K 0-15, the tile's first column
      else:
        row = lane % tile_k                                              # A: rows 0-15 at K 0, then again at K 8
        lane_coords = {group_axis: row % groups, rows_up: row // groups, k_up: (lane // tile_k) * MATRIX_ROW_ELEMENTS}
      lane_coords = self.lane_coords[rows_are_k] = {a: simplify(x) for a, x in lane_coords.items()}
    for a, x in lane_coords.items(): idxs[a] = x
    assert self.tiles is not None
    plan, tile, offset = self.tiles.stages[operand]
    address = self.tiles.tile_index(plan, offset, [idxs[a] for a in plan.axes])
    return UOp(Ops.LOAD, operand.dtype, (tile, address, self.tiles.first_barrier), MATRIX_LOADS[rows_are_k])

  def operand(self, operand: UOp, layout: FragmentLayout, inner: tuple[UOp, ...], rows_are_k: bool) -> UOp:
    """This lane's fragment of A (rows: the tile's rows, columns: K) or B (rows: K, columns: the tile's columns): each
    element is the operand built at its (row, column) of the tile, put on the kernel's axes. The operand is constant
    along the other output axis (tensor_core_choices checked), which is indexed 0. K is read in `k_order`."""
    k, core = self.kernel, self.core
    rows_up, columns_up, k_up = k.tc_upcast_axes
    group_axis, tig_axis = k.tc_lane_axes
    group, tig = self.indices[group_axis], self.indices[tig_axis]
    groups, column_upcast = core.lanes // core.lanes_per_group, core.dims[1] // core.lanes_per_group
    if self.matrix_loads: return self.matrix_load(operand, inner, rows_are_k)
    elements = []
    for element in range(len(layout.rows)):
      row, column = (simplify(x) for x in layout.position(element, group, tig))
      idxs = list(inner)
      idxs[group_axis] = idxs[rows_up] = idxs[tig_axis] = idxs[columns_up] = to_uop(0)
      idxs[k_up] = k_order(core, layout.rows[element] if rows_are_k else layout.cols[element], tig)
      if rows_are_k: idxs[tig_axis], idxs[columns_up] = column // column_upcast, column % column_upcast   # 2·tig + up
      else: idxs[group_axis], idxs[rows_up] = row % groups, row // groups                                 # 8·up + group
      elements.append(self.build(operand, tuple(simplify(x) for x in idxs)))
    return UOp(Ops.VECTORIZE, operand.dtype, tuple(elements))
