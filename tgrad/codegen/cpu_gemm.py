"""A CPU matmul's shape: its register tile, and the packed panels of its reused operand.

A CPU matmul C[m, n] = Σ_k A[m, k]·B[k, n] runs as register tiles of `rows` × `columns` outputs (columns: two SIMD
registers along n, the output's contiguous axis), each looping over all of K with the tile's accumulators in
registers. Every row tile reads the same column panel of B (K rows × `columns` values). Read in place, a panel row is
one cache line with rows N·itemsize bytes apart: at a power-of-two N they fall into the same few cache sets, the panel
never stays in L1 or L2, and every row tile streams it from memory again (2048² float32 on 2 Zen 3 cores: 6-10
GFLOP/s). Copied first into panels of consecutive memory (`PackPlan`: B laid out as [..., N/columns, K, columns]), a
panel stays in L2 while all the row tiles walk it (68 GFLOP/s), and the copy costs one pass over B.

The same plan serves a prefill: a symbolic row count (a prompt's tokens) is padded to whole register tiles (A is
copied with its rows padded, so the tile's loads carry no mask; only the stores do), and a product summed over several
reduce axes (a packed weight's blocks and block axes, nn/quant.py) gets panels of B's values dequantized by the copy
kernel and one merged reduce axis: a prompt times a packed weight is one dequantizing copy and the blocked matmul, and
the copy is kept while the weight is unchanged (kept_copies.py).

`gemm_tile(vector_bytes, vector_registers, dtype)` sizes the tile; `gemm_axes(state)` finds the rows and columns axes
of a kernel (the heuristics' register tile); `pack_plan(ast, renderer)` says whether a kernel AST's B is worth
packing and returns the two ASTs that do it: the copy into the packed buffer, and the matmul reading it.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Optional
from tgrad.codegen.axes import AxisState
from tgrad.dtype import DType, dtypes
from tgrad.helpers import prod
from tgrad.ops import Ops, UOp
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import canonical, ceil_div, is_symbolic, vmax_of

# Column registers of a tile: two SIMD registers of B per K step (AVX2: 16 float32), as the BLAS micro-kernels of
# x86 (OpenBLAS Haswell 4×24/6×16, SkylakeX 16×... ) load; one register leaves too few columns to reuse each broadcast.
TILE_COLUMN_REGISTERS = 2
# Registers kept free of accumulators: the B vectors of one K step and the broadcast A value (+1 for LLVM's unroll).
TILE_FREE_REGISTERS = 4
# Rows of a tile: the largest power of two whose accumulators fit beside the free registers, at most TILE_MAX_ROWS:
# 4 with AVX2's 16 registers, 8 with AVX-512's 32. A power of two divides the usual sizes; the 6 rows that AVX2's
# registers would hold need 2^n rows padded, and the masked loads of the padding cost more than the tile gains.
# Measured (1024² float32, packed B, 2 shared Zen 3 cores, best of 9): 4×16 32 GFLOP/s, 6×16 padded 6, 8×16 14
# (its 16 accumulators spill).
TILE_MAX_ROWS = 8
# A B worth packing is reused by at least this many rows of output (its panel is read once per row tile: with fewer
# rows, the copy costs about as much as the product reads), and holds at least PACK_MIN_ELEMENTS values (a smaller B
# stays in L2 whatever its layout).
PACK_MIN_ROWS = 64
PACK_MIN_ELEMENTS = 1 << 16
# A symbolic axis B is reused along (a prompt's tokens) counts as this many rows, or its bound if smaller: a prompt
# this long is what a prefill's matmul is tuned for (as the heuristics' thread split judges symbolic sizes).
PACK_SYMBOLIC_ROWS = 64
PACKED_DTYPES = (dtypes.float32, dtypes.float64)

@dataclass(frozen=True)
class GemmTile:
  rows: int      # outputs along m held in registers (one broadcast of A each per K step)
  columns: int   # outputs along n (TILE_COLUMN_REGISTERS SIMD registers)

def gemm_tile(vector_bytes: int, vector_registers: int, dtype: DType) -> GemmTile:
  """The register tile for outputs of `dtype` on a CPU with `vector_registers` SIMD registers of `vector_bytes`
  (a renderer's facts)."""
  lanes = max(1, vector_bytes // dtype.itemsize)
  fit = min(TILE_MAX_ROWS, (vector_registers - TILE_FREE_REGISTERS) // TILE_COLUMN_REGISTERS)
  rows = 1 << (fit.bit_length() - 1)
  return GemmTile(rows, lanes * TILE_COLUMN_REGISTERS)

# ---- the axes of a matmul-like kernel

def _strides(st: ShapeTracker) -> tuple:
  return st.real_strides()

@dataclass(frozen=True)
class GemmAxes:
  rows: int                   # m: an output axis along which B is reused (stride 0) and A is not
  columns: int                # n: the output's contiguous axis, along which A is reused and B is not
  reduce: tuple[int, ...]     # k: the reduce axes (one for a plain matmul; a packed weight's blocks and block axes)
  b_loads: tuple[UOp, ...]    # the LOADs of B: those that vary along the columns

def _gemm_axes(shape: tuple, out_st: ShapeTracker, loads: list[tuple[UOp, ShapeTracker]], reduce_axes: tuple[int, ...],
               symbolic_reduce: bool = False) -> Optional[GemmAxes]:
  """The axes of Σ_k A·B over consecutive reduce axes (of known sizes unless `symbolic_reduce`), from the output's
  tracker and the trackers of the reduce's loads (shapes all `shape`); None unless some loads (B's) vary along the
  output's contiguous axis and are all reused along another output axis that another load varies along."""
  if not reduce_axes or reduce_axes != tuple(range(reduce_axes[0], reduce_axes[-1] + 1)) or \
     not (symbolic_reduce or all(isinstance(shape[a], int) for a in reduce_axes)): return None
  out_strides = _strides(out_st)
  columns = next((a for a, s in enumerate(out_strides) if s == 1 and isinstance(shape[a], int) and shape[a] > 1), None)
  if columns is None: return None
  strides = [(u, _strides(st)) for u, st in loads]
  b_loads = tuple(u for u, s in strides if s[columns] != 0)
  if not b_loads: return None
  others = [s for u, s in strides if u not in b_loads]
  rows = next((a for a in range(len(shape)) if a not in reduce_axes and a != columns and vmax_of(shape[a]) > 1 and
               all(s[a] == 0 for u, s in strides if u in b_loads) and any(s[a] != 0 for s in others)), None)
  if rows is None: return None
  return GemmAxes(rows, columns, reduce_axes, b_loads)

def _reduce_loads(reduce: UOp) -> list[UOp]:
  return [u for u in reduce.src[0].toposort() if u.op is Ops.LOAD]

def gemm_axes(state: AxisState) -> Optional[GemmAxes]:
  """The rows and columns axes of a kernel that is a matmul (one ADD reduce over one reduce axis of the kernel, B one
  load), else None. The reduce axis may be symbolic (attention's probabilities times values, summed over a prompt's
  keys): the register tile loops over it whatever its length."""
  if len(state.reduceops) != 1 or state.reduceops[0].arg[0] is not Ops.ADD or state.applied_opts: return None
  tracker = dict(zip(state.memops, state.sts))
  loads = [(u, tracker[u]) for u in _reduce_loads(state.reduceops[0]) if u in tracker]
  reduce_axes = tuple(a for a in range(state.shape_len) if state.is_reduce_axis(a))
  if len(reduce_axes) != 1: return None
  axes = _gemm_axes(state.full_shape, state.sts[0], loads, reduce_axes, symbolic_reduce=True)
  return axes if axes is not None and len(axes.b_loads) == 1 else None

# ---- packing B (and materializing a computed A)

@dataclass(frozen=True)
class PackPlan:
  """Kernels that replace one matmul kernel: `steps` run in order, each (AST, buffers), where buffer reference i >= 0
  is the item's bufs[i] and -1 - j is scratch buffer j, of scratch[j] = (elements, dtype). The first steps write the
  scratch buffers (their output first); the last is the matmul, with the item's outputs."""
  steps: tuple[tuple[UOp, tuple[int, ...]], ...]
  scratch: tuple[tuple[int, DType], ...]

def pack_plan(ast: UOp, renderer) -> Optional[PackPlan]:
  """The packing of a kernel AST's B on a CPU (see the module doc), or None when the AST is no matmul, its column
  count doesn't divide into panels or it is too small to pay. A's side of the product, when it computes (a relu of
  the previous layer fused into the load), is computed once into a scratch buffer too: recomputed in the register
  tile, every broadcast of A waits for its ops (a relu'd A made the 256×4096·4096×1024 product 3× slower)."""
  return _pack_plan(ast, renderer.vector_bytes, renderer.vector_registers)

def _views_mapped(x: UOp, change) -> UOp:
  """`x` with every VIEW below it replaced by change(its ShapeTracker)."""
  return x.substitute({u: UOp(Ops.VIEW, dtypes.void, (), change(u.arg)) for u in x.toposort() if u.op is Ops.VIEW})

def _store(index: int, st: ShapeTracker, value: UOp) -> UOp:
  return UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (
    UOp(Ops.DEFINE_GLOBAL, value.dtype, (), index), UOp(Ops.VIEW, dtypes.void, (), st), value)),))

def _dense_buffers(ast: UOp) -> tuple[UOp, tuple[int, ...]]:
  """The AST with its DEFINE_GLOBALs numbered 0, 1, ... (the stored one first), and the old number of each."""
  stored = ast.src[0].src[0]
  others = sorted({u for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL and u is not stored}, key=lambda u: u.arg)
  order = [stored] + others
  renumbered = ast.substitute({u: UOp(Ops.DEFINE_GLOBAL, u.dtype, (), i) for i, u in enumerate(order)})
  return renumbered, tuple(u.arg for u in order)

def _rows_counted(size) -> int:
  """A size along which B is reused, as pack_plan counts it: a symbolic one as PACK_SYMBOLIC_ROWS at most."""
  return size if isinstance(size, int) else min(vmax_of(size), PACK_SYMBOLIC_ROWS)

def _panel_layout(shape: tuple, n: int, ks: tuple[int, ...], reused: list[int], columns: int) -> tuple:
  """B's values of a kernel of `shape` in the packed order: the axes it is reused along shrunk to one position, n
  split into (panels, columns), then [other kept axes..., panels, k axes..., columns, reused axes (size 1)...].
  Returns (the shrink to one row, the split shape, the order of its axes, the packed buffer's shape)."""
  one_row = tuple((0, 1) if a in reused else (0, s) for a, s in enumerate(shape))
  one_shape = tuple(e for _, e in one_row)
  split_shape = tuple(d for a, s in enumerate(one_shape) for d in ((s // columns, columns) if a == n else (s,)))
  position = {a: a + (a > n) for a in range(len(shape))}   # each axis' place in split_shape (n's panels at n)
  batch = [position[a] for a in range(len(shape)) if a not in reused and a != n and a not in ks]
  order = batch + [position[n], *(position[k] for k in ks), position[n] + 1] + [position[a] for a in reused]
  return one_row, split_shape, order, tuple(split_shape[d] for d in order[:len(order) - len(reused)])

def _load(index: int, dtype: DType, st: ShapeTracker) -> UOp:
  return UOp(Ops.LOAD, dtype, (UOp(Ops.DEFINE_GLOBAL, dtype, (), index), UOp(Ops.VIEW, dtypes.void, (), st)))

@functools.lru_cache(maxsize=4096)
def _pack_plan(ast: UOp, vector_bytes: int, vector_registers: int) -> Optional[PackPlan]:
  if ast.op is not Ops.SINK or len(ast.src) != 1 or ast.src[0].op is not Ops.STORE: return None
  reduces = [u for u in ast.toposort() if u.op is Ops.REDUCE_AXIS]
  if len(reduces) != 1 or reduces[0].arg[0] is not Ops.ADD or reduces[0].src[0].op is not Ops.MUL: return None
  store, reduce, product = ast.src[0], reduces[0], reduces[0].src[0]
  loads = [(u, u.src[-1].arg) for u in _reduce_loads(reduce)]
  if not loads or any(u.src[-1].op is not Ops.VIEW for u, _ in loads): return None
  shape = loads[0][1].shape
  if any(st.shape != shape for _, st in loads): return None
  axes = _gemm_axes(shape, store.src[1].arg, loads, tuple(reduce.arg[1]))
  if axes is None: return None
  b_side, a_side = product.src if axes.b_loads[0] in product.src[0].toposort() else product.src[::-1]
  a_nodes = set(a_side.toposort())
  if b_side.dtype not in PACKED_DTYPES or any(u in a_nodes for u in axes.b_loads): return None
  b_strides = [_strides(u.src[-1].arg) for u in b_side.toposort() if u.op is Ops.LOAD]
  reused = [a for a in range(len(shape)) if all(s[a] == 0 for s in b_strides)]   # m and any axis B is broadcast along
  m, n, ks = axes.rows, axes.columns, axes.reduce
  if m not in reused or any(k in reused for k in ks): return None
  if prod(_rows_counted(shape[a]) for a in reused) < PACK_MIN_ROWS: return None
  tile = gemm_tile(vector_bytes, vector_registers, b_side.dtype)
  columns = tile.columns
  if shape[n] % columns or shape[n] == columns: return None
  kept = [a for a in range(len(shape)) if a not in reused]
  if prod(shape[a] for a in kept) < PACK_MIN_ELEMENTS: return None
  # a symbolic row count m (a prompt's tokens; the only symbolic size taken) is padded to whole register tiles: the
  # matmul runs over ceil(m / tile rows) tiles, reading A from a copy with that many rows (the padding rows hold
  # whatever the buffer held: their outputs are not stored), so no load of the product is masked
  symbolic = is_symbolic(shape)
  if symbolic and is_symbolic(tuple(s for a, s in enumerate(shape) if a != m)): return None
  rows = canonical(ceil_div(shape[m], tile.rows) * tile.rows) if symbolic else shape[m]
  padded_shape = tuple(rows if a == m else s for a, s in enumerate(shape))
  # the matmul sums over one axis: several reduce axes (a packed weight's blocks and block axes) are merged into one
  # of their product's size, in place of the first (both copies lay their values out row-major along them)
  merged_away = ks[1:]
  def merged(sizes: tuple) -> tuple:
    return tuple(prod(sizes[k] for k in ks) if a == ks[0] else s for a, s in enumerate(sizes) if a not in merged_away)
  where = {a: i for i, a in enumerate(a for a in range(len(shape)) if a not in merged_away)}
  gemm_shape = merged(padded_shape)
  # the copy of B into panels, over the kernel's own axes
  one_row, split_shape, order, packed_shape = _panel_layout(shape, n, ks, reused, columns)
  def packed_order(st: ShapeTracker) -> ShapeTracker:
    return st.shrink(one_row).reshape(split_shape).permute(order).reshape(packed_shape)
  steps = [_dense_buffers(_store(-1, ShapeTracker.from_shape(packed_shape), _views_mapped(b_side, packed_order)))]
  scratch = [(prod(packed_shape), b_side.dtype)]
  # the matmul reads the same panels over its merged axes
  g_row, g_split, g_order, g_packed = _panel_layout(gemm_shape, where[n], (where[ks[0]],), [where[a] for a in reused],
                                                    columns)
  inverse = sorted(range(len(g_order)), key=lambda d: g_order[d])
  b_read = ShapeTracker.from_shape(g_packed).reshape(tuple(g_split[d] for d in g_order)).permute(inverse) \
    .reshape(tuple(e for _, e in g_row)).expand(gemm_shape)
  replace = {b_side: _load(-1, b_side.dtype, b_read)}
  a_read = None
  if symbolic or merged_away or a_side.op is not Ops.LOAD and any(u.op is Ops.LOAD for u in a_nodes):
    one_column = tuple((0, 1) if a == n else (0, s) for a, s in enumerate(shape))
    a_shape = tuple(e for _, e in one_column)
    a_padded = tuple(rows if a == m else s for a, s in enumerate(a_shape))
    written = ShapeTracker.from_shape(a_padded)
    if symbolic: written = written.shrink(tuple((0, s) for s in a_shape))
    steps.append(_dense_buffers(_store(-2, written, _views_mapped(a_side, lambda st: st.shrink(one_column)))))
    scratch.append((vmax_of(prod(a_padded)), a_side.dtype))
    a_read = ShapeTracker.from_shape(merged(a_padded)).expand(gemm_shape)
    replace[a_side] = _load(-2, a_side.dtype, a_read)
  gemm = ast.substitute(replace)
  if merged_away or symbolic:
    (summed,) = [u for u in gemm.toposort() if u.op is Ops.REDUCE_AXIS]
    gemm = gemm.substitute({summed: UOp(Ops.REDUCE_AXIS, summed.dtype, summed.src,
                                        (summed.arg[0], (where[ks[0]],), *summed.arg[2:]))})
    def to_gemm(st: ShapeTracker) -> ShapeTracker:   # the store's and the epilogue's views (size 1 along k)
      if st == b_read or st == a_read: return st
      if merged_away: st = st.reshape(merged(st.shape))
      return st.pad_end_to(where[m], rows) if symbolic else st
    gemm = _views_mapped(gemm, to_gemm)
  steps.append(_dense_buffers(gemm))
  return PackPlan(tuple(steps), tuple(scratch))
