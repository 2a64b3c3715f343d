"""Hopper warpgroup MMA in the opt space (OptOps.WGMMA): a whole half/bfloat16 (or TF32) matmul kernel computed by the
wgmma kernel that runtime/cuda/wgmma.py writes (128-byte-swizzled shared tiles, a cp.async pipeline of `stages` buffers,
`wgmma.mma_async` from shared-memory descriptors), on targets whose renderer has `warpgroup_mma` (CUDA sm_90a).
Everything about it is here, in the order it is used:

  1. which kernels qualify (`matmul_of`): the AST is exactly out = Σ_K a·b (the product of two loads of one 16-bit
     float dtype, summed in float32) stored as float32 or rounded once to a 16-bit float (`tensor_core_operands` says
     which sums of products qualify), or of two float32 loads the graph rounds to TF32 (the matmul lowering "tf32":
     `tf32_rounded_load`) stored as float32, which the kernel multiplies as TF32 (dtype float32: it loads the raw
     floats and rounds them in shared memory as the graph does; b must then be N×K, both operands K-major, and 16-byte
     rows are 4 elements), or of two plain float32 loads stored as float32 (`split_tf32`: 3xTF32, the kernel of
     runtime/cuda/wgmma_split.py, float32-class: each operand split into big and small TF32 parts; b N×K or K×N);
     one reduce over one K axis, two output axes (M, N), N and K known, M known or symbolic (a prompt's rows: an
     expression of variables, the grid's rows from their values at launch, rows past M read as zeros and not stored);
     b's view plain (no mask, offset 0) with strides (0, K, 1) (N×K, a linear layer's
     weight) or (0, 1, N) (K×N, a plain a·b; N a multiple of 8); a's memory index row·S_row + kk (rows contiguous,
     S_row = K or another multiple of 8) or, with K cut into segments of whole K tiles (64), row·S_row + (kk / seg)·
     S_seg + kk % seg (`a_layout`: attention's heads [H, T, D] read as T×(H·D), S_seg = T·D symbolic); the
     output's (N, 1, 0); K a multiple of 8 (16-byte rows). No other epilogue: any other op between the reduce and
     the store (a bias, an activation), a third buffer, or a batch axis refuses it, and such kernels keep the mma.sync
     tensor cores (OptOps.TC).
  2. the opt's choices: WGMMA_TILES, (warpgroups, block_n, stages, tma) each; Opt(OptOps.WGMMA, 0, i) takes tile i and
     must be the kernel's first and only opt (the kernel is the template: no other opt applies to it). A `tma` tile
     loads A and B by the tensor-memory accelerator with a producer warpgroup beside the `warpgroups` consumers
     (runtime/cuda/wgmma_tma.py): its tensor maps are made per launch from the buffer pointers alone, so it takes a
     known M and a row-major A only (`loads_by_tma`); the others load by cp.async from every thread. BEAM tries every
     tile (search.py's ACTIONS; a TMA tile is refused where it can't load); the heuristics take `default_tile`, from
     the TMA tiles under WGMMA_TMA=1 where they can load, and for a symbolic M from its maximum up to TYPICAL_ROWS.
     A 3xTF32 matmul takes Opt(OptOps.TF32X3, 0, i) instead: tile i of SPLIT_TILES (warpgroups, block_n, stages,
     A in registers), cp.async loads; BEAM tries every one; the heuristics take `default_split_tile` under
     F32_MATMUL=3xtf32 (the default). WGMMA refuses such a matmul (a single TF32
     pass is not float32) and TF32X3 every other.
  3. rendering: compile.render_source hands AxisState.warpgroup_matmul to renderer.render_warpgroup_matmul.
"""
from __future__ import annotations
import dataclasses
from typing import Optional, Union
from tgrad.codegen.axes import AxisState, KernelOptError, Opt, WarpgroupMatmul
from tgrad.codegen.tensor_cores import operand_load, tensor_core_operands, tf32_rounded_load
from tgrad.dtype import dtypes
from tgrad.ops import Ops, UOp, split_terms
from tgrad.shape.shapetracker import ShapeTracker
from tgrad.shape.sint import canonical, divides, sint, variables_of, vmax_of

WGMMA_DTYPES = (dtypes.float16, dtypes.bfloat16)
TF32 = dtypes.float32   # a WarpgroupMatmul of float32 multiplies loads the graph rounds to TF32 (tf32_rounded_load)
ROW_BYTES = 16        # cp.async copies 16-byte chunks: a row's contiguous size must be a multiple of 8 elements
BLOCK_K = 64          # K per pipeline stage (runtime/cuda/wgmma.py): a K segment of A holds whole tiles (TF32's: 32)
# (warpgroups, block_n, stages, tma): every entry fits an H100's 227 KiB of shared memory and both B layouts (block_n a
# multiple of 64 whose 16-byte chunks divide the block's threads). Largest tiles first, the cp.async tiles, then the
# TMA tiles (appended: an index keeps its meaning for the winners cached before them). TMA needs no stage for copies
# still in flight while another is released, so the same shared memory holds a stage more.
WGMMA_TILES: tuple[tuple[int, int, int, bool], ...] = (
  (2, 256, 4, False), (2, 256, 3, False), (2, 128, 5, False), (2, 128, 4, False), (2, 128, 6, False),
  (1, 256, 3, False), (1, 128, 4, False), (1, 128, 6, False), (2, 64, 6, False), (1, 64, 4, False), (1, 64, 8, False),
  (2, 256, 4, True), (2, 256, 3, True), (2, 128, 6, True), (2, 128, 4, True), (1, 256, 5, True), (1, 256, 3, True),
  (1, 128, 8, True), (1, 128, 5, True), (2, 64, 8, True), (1, 64, 8, True))
# The heuristics' tile: the largest (first of DEFAULT_TILES) that still gives a wave of blocks to an H100's 132 SMs
# (WAVE_FRACTION of them: a few idle SMs cost less than a smaller tile's lower arithmetic intensity), else the one
# with the most blocks. A one-warpgroup tile takes more stages: with one block per SM the copies in flight (stages - 2
# tiles) are all that hides the latency of global memory.
DEFAULT_TILES = ((2, 256, 4, False), (2, 128, 5, False), (1, 128, 6, False), (1, 64, 8, False))
# The same choice among the TMA tiles (WGMMA_TMA=1): the largest, then the deepest pipelines of smaller tiles.
DEFAULT_TMA_TILES = ((2, 256, 4, True), (2, 128, 6, True), (1, 128, 8, True), (1, 64, 8, True))
# 3xTF32 (OptOps.TF32X3, runtime/cuda/wgmma_split.py): (warpgroups, block_n, stages, a_registers) of a plain float32
# matmul, cp.async loads. Shared memory holds `stages` TF32 stages (128·(BM + BN) bytes each: the big parts) and 3 more
# buffers for the small parts (a stage's size, or B's tile only when A is split in registers: `a_registers`, the
# wgmmas reading A from each thread's registers), so a 128×256 tile doesn't fit; every entry fits 227 KiB and both B
# layouts (a K×N B's rows of BN/4 chunks divide the threads): the most stages each tile fits, then fewer. Appended
# only: an index keeps its meaning for the BEAM winners cached before a new tile.
SPLIT_TILES: tuple[tuple[int, int, int, bool], ...] = (
  (2, 128, 4, False), (1, 128, 6, False), (2, 64, 6, False), (1, 64, 8, False), (2, 128, 3, False),
  (1, 128, 4, False), (1, 64, 11, False), (1, 64, 5, False),
  (2, 128, 5, True), (2, 128, 4, True), (1, 128, 6, True), (2, 64, 6, True), (1, 64, 8, True))
# The heuristics' 3xTF32 tile, chosen as DEFAULT_TILES (a wave of blocks, else the most blocks).
DEFAULT_SPLIT_TILES = ((2, 128, 5, True), (2, 64, 6, True), (1, 64, 8, True))
# ... with SPLIT_WAVE_FRACTION of the SMs for a wave: on an H100 (bench/sgemm.py) 512×1536×640 ran 1.12× cuBLAS float32
# on 96 blocks of 128×64 and 0.76× on 192 of 64×64; below such a wave the smallest tile's blocks are the fastest.
SPLIT_WAVE_FRACTION = 0.7
GPU_SMS = 132
WAVE_FRACTION = 0.9
# Below this many multiply-adds (M·N·K) the mma.sync tensor-core kernels are left the work: the heuristics' WGMMA
# threshold (BEAM may still pick WGMMA for any qualifying kernel). 2^26: a 512×512×256 product.
MIN_MULTIPLY_ADDS = 1 << 26
# The rows a symbolic M's tile is chosen for, when its maximum is larger: a prompt of typical length (the tile stays
# right for short prompts; a long one gets more blocks of the same tile, which costs little).
TYPICAL_ROWS = 512
SIZE_OPS = (Ops.DEFINE_VAR, Ops.CONST, Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD)   # what a symbolic M's C form may use

def _plain(state: AxisState, index: int) -> Optional[tuple[int, ...]]:
  """The strides of memop `index`'s tracker when it is one view without mask or offset, else None."""
  views = state.sts[index].views
  if len(views) != 1 or views[0].mask is not None or views[0].offset != 0: return None
  return tuple(views[0].strides)

def _strides_of(tracker: ShapeTracker) -> Optional[tuple[sint, ...]]:
  """Per axis the stride of a tracker whose memory index is Σ stride·index with no offset and no mask (a stride may be
  an expression of the variables: heads laid out [H, T, D] step T·D), else None."""
  idxs, index, valid = tracker._loop_indexed
  if valid.op is not Ops.CONST or valid.arg is not True: return None
  terms, constant = split_terms(index)
  if constant != 0: return None
  strides: dict[UOp, sint] = {}
  for term, coefficient in terms.items():
    if term in idxs: strides[term] = strides.get(term, 0) + coefficient
    elif term.op is Ops.MUL and (axis := next((x for x in term.src if x in idxs), None)) is not None:
      (other,) = [x for x in term.src if x is not axis] or [axis]
      if any(u.op is Ops.RANGE for u in other.toposort()) or axis in strides: return None
      strides[axis] = canonical(other * coefficient)
    else: return None
  return tuple(strides.get(idx, 0) for idx in idxs)

def a_layout(tracker: ShapeTracker, m: sint, n: int, k: int) -> Optional[tuple[sint, int, sint]]:
  """(row stride, K segment, segment stride) of an M×N×K tracker reading A (module doc, 1.): one segment when a row
  is contiguous (segment 0), else the longest segments of whole K tiles whose elements are contiguous, each
  `segment stride` on; None when A is neither (at once when it varies along N: b)."""
  if tracker.real_strides(ignore_valid=True)[1] != 0: return None
  for segment in [k] + [s for s in range(k - BLOCK_K, 0, -BLOCK_K) if k % s == 0]:
    split = tracker.reshape((m, n, k // segment, segment)) if segment != k else tracker
    strides = _strides_of(split)
    if strides is None or strides[1] != 0 or strides[-1] != 1 or not isinstance(strides[0], int): continue
    row_stride, segment_stride = strides[0], (strides[2] if segment != k else 0)
    if segment == k: return (0 if row_stride == k else row_stride), 0, 0
    return row_stride, segment, segment_stride
  return None

def matmul_of(state: AxisState) -> Union[WarpgroupMatmul, str]:
  """The kernel as a warpgroup matmul (default tile), or why it is not one (see the module doc, 1.)."""
  if not state.renderer.warpgroup_mma: return f"{type(state.renderer).__name__} has no warpgroup MMA"
  m, n, k = (state.full_shape + (1, 1, 1))[:3]
  if len(state.reduceops) != 1 or state.shape_len != 3 or state.first_reduce != 2 or not isinstance(n, int) or \
     not isinstance(k, int):
    return f"a warpgroup matmul has two output axes (N known) and one reduce axis of known size, not {state.full_shape}"
  stores = [u for u in state.ast.src if u.op is Ops.STORE]
  buffers_read = [u for u in state.memops if u.op is Ops.LOAD]   # (TF32 rounding's constants are memops too)
  if len(state.ast.src) != 1 or len(stores) != 1 or len(buffers_read) != 2:
    return "a warpgroup matmul reads two buffers and stores one"
  store, reduce = stores[0], state.reduceops[0]
  value = store.src[2]
  products = tensor_core_operands(reduce)
  if products is None: return "the reduce is not a sum of products of two loads"
  tf32 = all(tf32_rounded_load(x) is not None for x in products)
  if not tf32 and any(x.op is not Ops.LOAD for x in products): return "the reduce is not a sum of products of two loads"
  operands = tuple(operand_load(x) for x in products)   # the loads (the kernel rounds TF32 operands itself)
  dtype = operands[0].dtype
  rounded = value.op is Ops.CAST and value.src[0] is reduce and value.dtype in WGMMA_DTYPES and not tf32
  if (dtype not in WGMMA_DTYPES + (dtypes.float32,)) or operands[1].dtype != dtype or \
     reduce.dtype != dtypes.float32 or not (rounded or value is reduce):
    return f"a warpgroup matmul stores the float32 sum of {[str(d) for d in WGMMA_DTYPES]} products (or of float32 " \
           "loads, plain or rounded to TF32), or it rounded to a 16-bit float, with nothing in between (no epilogue)"
  if isinstance(m, UOp) and any(not ok for ok in (u.op in SIZE_OPS for u in m.toposort())):
    return f"a symbolic M is an expression of variables with {[o.name for o in SIZE_OPS]}, not {m}"
  strides = {u: _plain(state, i) for i, u in enumerate(state.memops)}
  if strides[store] != (n, 1, 0): return "the output must be a contiguous M×N matrix"
  layouts = {x: a_layout(state.sts[state.memops.index(x)], m, n, k) for x in operands}
  a = next((x for x in operands if layouts[x] is not None and strides[x] != (0, k, 1)), None) or \
      next((x for x in operands if layouts[x] is not None), None)
  b = next((x for x in operands if x is not a), None)
  b_n_major = b is not None and strides[b] == (0, 1, n)
  if a is None or b is None or not (b_n_major or strides[b] == (0, k, 1)):
    return "a must be an M×K matrix (rows, or K segments of whole tiles, contiguous) and b a contiguous N×K or K×N one"
  globals_ = {store.src[0]: "out", a.src[0]: "a", b.src[0]: "b"}
  if len(globals_) != 3: return "a warpgroup matmul reads two buffers other than its output"
  if tf32 and b_n_major:
    return "TF32 operands must both be K-major in shared memory (no transpose): b stored N×K (a·wᵀ), not K×N"
  split = dtype == dtypes.float32 and not tf32   # plain float32 loads: 3xTF32 (OptOps.TF32X3)
  if split and value is not reduce: return "a 3xTF32 matmul stores its float32 sums as they are (no epilogue)"
  chunk = ROW_BYTES // dtype.itemsize
  if k % chunk or (b_n_major and n % chunk):
    return f"K (and N for a K×N b) must be multiples of {chunk}: 16-byte rows, not {m}×{n}×{k}"
  row_stride, segment, segment_stride = layouts[a]
  if row_stride % chunk or not divides(chunk, segment_stride):
    return f"A's rows and K segments must start on 16-byte boundaries: strides {row_stride}, {segment_stride}"
  arguments = tuple(role for _, role in sorted(((g.arg, role) for g, role in globals_.items())))
  variables = tuple(sorted({v.arg[0] for x in (m, segment_stride) for v in variables_of(x)}))
  use = WarpgroupMatmul(m, n, k, dtype, b_n_major, arguments, a_row_stride=row_stride, a_segment=segment,
                        a_segment_stride=segment_stride, out_dtype=None if value.dtype == dtype else value.dtype,
                        variables=variables, split_tf32=split)
  return dataclasses.replace(use, **_tile_fields(SPLIT_TILES[0])) if split else use

def loads_by_tma(use: WarpgroupMatmul) -> bool:
  """Whether a TMA tile can load this matmul: the tensor maps are made from the buffer pointers alone (a known M, a
  row-major A), and 16-bit inputs (TF32 operands are rounded in shared memory by the cp.async kernel's threads)."""
  return isinstance(use.m, int) and use.a_segment == 0 and use.a_row_stride == 0 and use.dtype in WGMMA_DTYPES

def _tile_fields(tile: tuple[int, int, int, bool]) -> dict:
  """A 3xTF32 tile (SPLIT_TILES) as WarpgroupMatmul's fields."""
  warpgroups, block_n, stages, a_registers = tile
  return {"warpgroups": warpgroups, "block_n": block_n, "stages": stages, "tma": False, "a_registers": a_registers}

def _qualifying(state: AxisState, opt: Opt, tiles: int) -> WarpgroupMatmul:
  """The kernel as a warpgroup matmul for `opt` (its first and only opt, tile index below `tiles`), or
  KernelOptError."""
  if state.applied_opts: raise KernelOptError(f"{opt}: {opt.op.name} must be the kernel's first and only opt")
  if opt.axis not in (None, 0) or not (isinstance(opt.amount, int) and 0 <= opt.amount < tiles):
    raise KernelOptError(f"{opt}: {opt.op.name} takes axis 0 and a tile index 0..{tiles - 1}")
  use = matmul_of(state)
  if isinstance(use, str): raise KernelOptError(f"{opt}: {use}")
  return use

def split_tf32_matmul(state: AxisState, opt: Opt) -> AxisState:
  """TF32X3: the whole kernel is one 3xTF32 warpgroup matmul of plain float32 loads with tile SPLIT_TILES[opt.amount]
  (see the module doc)."""
  use = _qualifying(state, opt, len(SPLIT_TILES))
  if not use.split_tf32: raise KernelOptError(f"{opt}: 3xTF32 multiplies plain float32 loads, not {use.dtype} ones")
  return state.replace(warpgroup_matmul=dataclasses.replace(use, **_tile_fields(SPLIT_TILES[opt.amount])))

def warpgroup_mma(state: AxisState, opt: Opt) -> AxisState:
  """WGMMA: the whole kernel is one warpgroup matmul with tile WGMMA_TILES[opt.amount] (see the module doc)."""
  use = _qualifying(state, opt, len(WGMMA_TILES))
  if use.split_tf32: raise KernelOptError(f"{opt}: a matmul of plain float32 loads is 3xTF32's (OptOps.TF32X3)")
  warpgroups, block_n, stages, tma = WGMMA_TILES[opt.amount]
  if tma and not loads_by_tma(use):
    raise KernelOptError(f"{opt}: a TMA tile needs a known M, a row-major A (the maps are made per buffer) and "
                         "16-bit inputs (TF32 operands are rounded by the cp.async kernel)")
  return state.replace(warpgroup_matmul=dataclasses.replace(use, warpgroups=warpgroups, block_n=block_n,
                                                            stages=stages, tma=tma))

def default_tile(m: sint, n: int, tma: bool = False) -> int:
  """The heuristics' tile for an M×N output (an index into WGMMA_TILES; see DEFAULT_TILES, DEFAULT_TMA_TILES); a
  symbolic M counts as its maximum up to TYPICAL_ROWS."""
  m = m if isinstance(m, int) else min(vmax_of(m), TYPICAL_ROWS)
  def blocks(tile) -> int: return -(-m // (64 * tile[0])) * -(-n // tile[1])
  candidates = DEFAULT_TMA_TILES if tma else DEFAULT_TILES
  tile = next((t for t in candidates if blocks(t) >= WAVE_FRACTION * GPU_SMS), candidates[-1])
  return WGMMA_TILES.index(tile)

def _split_blocks(m: sint, n: int, tile: tuple[int, int, int, bool]) -> int:
  """Blocks of a 3xTF32 tile over an M×N output, a symbolic M at its maximum up to TYPICAL_ROWS."""
  m = m if isinstance(m, int) else min(vmax_of(m), TYPICAL_ROWS)
  return -(-m // (64 * tile[0])) * -(-n // tile[1])

def default_split_tile(m: sint, n: int) -> int:
  """The heuristics' 3xTF32 tile for an M×N output (an index into SPLIT_TILES; see DEFAULT_SPLIT_TILES); a symbolic M
  counts as its maximum up to TYPICAL_ROWS."""
  tile = next((t for t in DEFAULT_SPLIT_TILES if _split_blocks(m, n, t) >= SPLIT_WAVE_FRACTION * GPU_SMS),
              DEFAULT_SPLIT_TILES[-1])
  return SPLIT_TILES.index(tile)

def worth_it(use: WarpgroupMatmul) -> bool:
  """Whether the heuristics give this matmul to the warpgroup kernel (big enough: MIN_MULTIPLY_ADDS; a symbolic M at
  its maximum)."""
  m = vmax_of(use.m)
  return m * use.n * use.k >= MIN_MULTIPLY_ADDS and min(m, use.n) >= 64
