"""A GROUP's partials combined inside each warp by xor-shuffles first (reduces.warp_combine), then one partial a warp
through shared memory.

The lane plan (`warp_lane_masks`) is checked against a simulation of the hardware over seeded random block layouts:
every lane's value after the shuffle tree, then the combine's reads of one representative a warp, must give each
output the sum of exactly its own group's partials. Whole kernels are checked on CUDA kernels run on the CPU
(test/cuda_on_cpu.py, whose `__shfl_xor_sync` is a real exchange of a value's bytes between the warp's fibers) against
numpy: sums and maxima in float32, float64, int32 and int64 (64-bit and wide integer values exactly), layouts whose
warps hold several outputs, layouts without a shuffle (a block that is not a whole number of warps).
"""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.reduces import warp_combine, warp_lane_masks
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.ops import Ops
from tgrad.runtime.cuda.renderer import CUDA_WARP_LANES, CUDARenderer
from tgrad.schedule import create_schedule
from cuda_on_cpu import cpu_available, run_kernel_emulated

LANES = CUDA_WARP_LANES
AXIS_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 32, 40, 64)

def digits_of(thread: int, sizes: list[int]) -> list[int]:
  """The thread's index along each axis (the last fastest)."""
  out = []
  for size in reversed(sizes):
    out.append(thread % size)
    thread //= size
  return out[::-1]

def simulate(sizes: list[int], grouped: list[bool], masks, spans: list[int], rng) -> None:
  """Each thread holds a random integer partial; run the xor-shuffle tree over every warp, then for each output sum
  the representatives the combine reads (every GROUP axis at multiples of its span); that must equal the sum of the
  output's partials, each counted once."""
  threads = prod(sizes)
  values = rng.integers(-1000, 1000, threads)
  shuffled = values.copy()
  for mask in masks:
    lanes = np.arange(threads)
    partner = (lanes & ~(LANES - 1)) | ((lanes % LANES) ^ mask)
    shuffled = shuffled + shuffled[partner]
  totals, combined = {}, {}
  for t in range(threads):
    digits = digits_of(t, sizes)
    output = tuple(d for d, g in zip(digits, grouped) if not g)
    totals[output] = totals.get(output, 0) + int(values[t])
    if all(d % span == 0 for d, span, g in zip(digits, spans, grouped) if g):
      combined[output] = combined.get(output, 0) + int(shuffled[t])
  assert combined == totals, (sizes, grouped, masks, spans)

def test_lane_plan_sums_each_output_once():
  """200 seeded random layouts (1-4 thread axes, the outer ones GROUP axes, at most 1024 threads)."""
  rng, planned = np.random.default_rng(0), 0
  for _ in range(200):
    count = int(rng.integers(1, 5))
    sizes = [int(rng.choice(AXIS_SIZES)) for _ in range(count)]
    while prod(sizes) > 1024: sizes[int(rng.integers(count))] = 1
    groups = int(rng.integers(1, count + 1))
    grouped = [i < groups for i in range(count)]   # GROUP axes outermost, as Kernel.thread_axes orders them
    if (found := warp_lane_masks(sizes, grouped, LANES)) is None: continue
    masks, spans = found
    assert all(0 < m < LANES and m & (m - 1) == 0 for m in masks) and len(set(masks)) == len(masks)
    simulate(sizes, grouped, masks, spans, rng)
    planned += 1
  assert planned >= 30   # most random layouts shuffle: the check above ran on them

def test_lane_plans_of_decode_blocks():
  """The layouts of gemma's fused decode kernels: rows on the fastest lanes, the row's GROUP threads above them."""
  assert warp_lane_masks([20, 2, 4], [True, True, False], LANES) == ((4, 8, 16), [4, 2, 1])   # gate/up: 4 rows
  assert warp_lane_masks([10, 8, 2], [True, True, False], LANES) == ((2, 4, 8, 16), [2, 8, 1])   # qkv: 2 rows
  assert warp_lane_masks([64], [True], LANES) == ((1, 2, 4, 8, 16), [32])   # a whole row in one GROUP
  assert warp_lane_masks([20, 4], [True, False], LANES) is None    # 80 threads: the last warp is not full
  assert warp_lane_masks([5, 32], [True, False], LANES) is None    # a warp holds one GROUP index: nothing to shuffle
  assert warp_lane_masks([12, 8], [True, False], LANES) == ((8, 16), [4, 1])   # 12 = 4·3: two bits of it, then stop

def kernel_of(out: Tensor, opts: list[Opt]) -> Kernel:
  (item,) = [i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, CUDARenderer())
  for opt in opts: kernel.apply_opt(opt)
  return kernel

def test_warp_combine_only_where_shuffles_are_exact():
  x = Tensor(np.ones((4, 256), np.float32), device="LLVM")
  kernel = kernel_of(x.sum(-1), [Opt(OptOps.GROUP, 0, 64)])
  assert warp_combine(kernel, Ops.ADD, dtypes.float32).masks == (1, 2, 4, 8, 16)
  assert warp_combine(kernel, Ops.MAX, dtypes.int32) is not None
  assert warp_combine(kernel, Ops.ADD, dtypes.float16) is None       # not a 32- or 64-bit register
  assert warp_combine(kernel, Ops.LOGADDEXP, dtypes.float32) is None   # its combine rescales by the max first

needs_gxx = pytest.mark.skipif(not cpu_available(), reason="g++ not found")

@needs_gxx
@pytest.mark.parametrize("seed", range(6))
def test_grouped_reduces_on_emulated_cuda(seed):
  """Seeded random rows × columns, a LOCAL over rows and a GROUP over columns (power-of-two and not), sum or max,
  float32 or int32: the emulated kernel equals numpy, and shuffles appear exactly where the plan has masks."""
  rng = np.random.default_rng(100 + seed)
  local = int(rng.choice([1, 2, 4]))
  group = int(rng.choice([8, 16, 20, 32, 40, 64, 80]))
  rows = local * int(rng.integers(1, 4))
  columns = group * int(rng.integers(1, 5))
  integer = bool(seed % 2)
  values = rng.integers(-50, 50, (rows, columns)).astype(np.int32) if integer else \
    rng.standard_normal((rows, columns)).astype(np.float32)
  x = Tensor(values, device="LLVM").realize()
  opts = ([Opt(OptOps.LOCAL, 0, local)] if local > 1 else []) + [Opt(OptOps.GROUP, 0, group)]
  for name, op in (("sum", Ops.ADD), ("max", Ops.MAX)):
    out = getattr(x, name)(-1)
    got, source = run_kernel_emulated(out, opts)
    plan = warp_combine(kernel_of(out, opts), op, dtypes.int32 if integer else dtypes.float32)
    assert ("__shfl_xor_sync" in source) == (plan is not None), source
    want = getattr(np, name)(values if integer else values.astype(np.float64), axis=-1)
    if integer: np.testing.assert_array_equal(got, want)
    else: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

@needs_gxx
@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_wide_and_integer_registers_shuffle_exactly(dtype):
  """64-bit partials move whole through the shuffles (CUDA's overloads for double and long long): a float64 sum to
  float64's accuracy and its max exactly, integer sums whose values need all their bits exactly."""
  rng = np.random.default_rng(11)
  values = rng.standard_normal((4, 640)) if dtype == np.float64 else \
    rng.integers(-(2 ** 40) if dtype == np.int64 else -(2 ** 20), 2 ** 20 if dtype == np.int32 else 2 ** 40, (4, 640))
  x = Tensor(values.astype(dtype), device="LLVM").realize()
  opts = [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.GROUP, 0, 64)]
  for name in ("sum", "max"):
    got, source = run_kernel_emulated(getattr(x, name)(-1), opts)
    assert "__shfl_xor_sync" in source
    want = getattr(np, name)(values.astype(dtype), axis=-1)
    if dtype == np.float64 and name == "sum": np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-12)
    else: np.testing.assert_array_equal(got, want)

@needs_gxx
@pytest.mark.parametrize("rows_per_block,group", [(4, 40), (2, 80)])   # the packed rule's layout, the dense row rule's
def test_row_kernel_every_thread_combines_after_shuffles(rows_per_block, group):
  """A fused norm (rows·(x / rms(x))): a later pass reads the sum of squares, so every thread combines the warp
  partials itself; the stored rows must match numpy."""
  rng = np.random.default_rng(7)
  x_np = rng.standard_normal((1, 640)).astype(np.float32)
  w_np = rng.standard_normal((8, 640)).astype(np.float32)
  x, w = (Tensor(a, device="LLVM").realize() for a in (x_np, w_np))
  rows = x.expand(w.shape)   # one copy of x a row, as gemma3.py's fused norms read it
  out = (rows * ((rows * rows).mean(-1, keepdim=True) + 1e-6).rsqrt() * w).sum(-1)
  opts = [Opt(OptOps.LOCAL, 0, rows_per_block), Opt(OptOps.GROUP, 0, group), Opt(OptOps.UNROLL, 1, 0)]
  got, source = run_kernel_emulated(out, opts)
  assert "__shfl_xor_sync" in source
  x64 = x_np.astype(np.float64)
  want = w_np.astype(np.float64) @ (x64 / np.sqrt((x64 * x64).mean() + 1e-6))[0]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
