"""A later pass's loads of read-only inputs move before a block's first barrier (codegen/early_loads.py): checked on
hand-built programs (what moves and what stays), and on fused norm + matvec kernels rendered for CUDA and run on the
CPU (test/cuda_on_cpu.py) with seeded random sizes: the moved program's output is bit-identical to the unmoved one's
and matches numpy.
"""
import re
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen import linearizer
from tgrad.codegen.early_loads import EARLY_LOAD_MAX_BYTES, hoist_early_loads
from tgrad.codegen.kernel import Opt, OptOps
from tgrad.dtype import dtypes
from tgrad.ops import UOp, Ops
from cuda_on_cpu import cpu_available, run_kernel_emulated

THREADS = 64

def buffer(number: int, dtype=dtypes.float32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dtype, (), number)

def const(value: int) -> UOp: return UOp(Ops.CONST, dtypes.index, (), value)

def load(buf: UOp, index: UOp, *valid: UOp) -> UOp: return UOp(Ops.LOAD, buf.dtype, (buf, index, *valid))

class Program:
  """A hand-built linear program: thread id `lidx0` of THREADS, a shared array, a barrier, and what a test adds."""
  def __init__(self):
    self.out, self.small, self.stream = buffer(0), buffer(1), buffer(2)
    self.shared = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), ("temp0", THREADS))
    self.thread = UOp(Ops.SPECIAL, dtypes.index, (), ("lidx0", THREADS))
    self.barrier = UOp(Ops.BARRIER, dtypes.void, ())
    self.uops = [self.out, self.small, self.stream, self.shared, self.thread]
  def add(self, *uops: UOp) -> UOp:
    self.uops.extend(uops)
    return uops[-1]
  def stream_load(self) -> UOp:
    """A load of the largest read-only buffer (the kernel's stream), before the barrier."""
    index = self.add(self.thread * const(1024) + const(7))
    return self.add(load(self.stream, index))
  def store_partial(self, value: UOp) -> None:
    self.add(UOp(Ops.STORE, dtypes.void, (self.shared, self.thread, value)), self.barrier)

def before_barrier(program: list[UOp]) -> list[UOp]:
  return program[:next(i for i, u in enumerate(program) if u.op is Ops.BARRIER)]

def test_a_later_passs_load_and_its_index_move_before_the_barrier():
  p = Program()
  p.store_partial(p.stream_load())
  index = p.add(p.thread * const(2) + const(1))
  small = p.add(load(p.small, index))
  p.add(UOp(Ops.STORE, dtypes.void, (p.out, p.thread, small)))
  moved = hoist_early_loads(p.uops)
  assert small in before_barrier(moved) and index in before_barrier(moved)
  assert sorted(map(id, moved)) == sorted(map(id, p.uops))   # a reordering: nothing lost, nothing added
  assert moved.index(index) < moved.index(small)

@pytest.mark.parametrize("case", ["stored", "streamed", "in_branch", "reads_shared", "no_barrier"])
def test_loads_that_must_stay(case):
  p = Program()
  if case != "no_barrier": p.store_partial(p.stream_load())
  index = p.add(p.thread + const(3))
  if case == "stored": target = p.out
  elif case == "streamed": target = p.stream
  else: target = p.small
  if case == "reads_shared":   # an index read from shared memory: it needs the barrier
    index = p.add(load(p.shared, p.thread).cast(dtypes.index))
  if case == "in_branch":
    branch = p.add(UOp(Ops.IF, dtypes.void, (p.thread.lt(const(4)),)))
  value = p.add(load(target, index))
  if case == "in_branch": p.add(UOp(Ops.ENDIF, dtypes.void, (branch,)))
  p.add(UOp(Ops.STORE, dtypes.void, (p.out, p.thread, value)))
  assert hoist_early_loads(p.uops) == p.uops

def test_a_masked_load_moves_with_its_valid():
  p = Program()
  p.store_partial(p.stream_load())
  valid = p.add(p.thread.lt(const(40)))
  small = p.add(load(p.small, p.thread, valid, UOp(Ops.CONST, dtypes.float32, (), 0.0)))
  p.add(UOp(Ops.STORE, dtypes.void, (p.out, p.thread, small)))
  moved = hoist_early_loads(p.uops)
  assert moved.index(valid) < moved.index(small) < moved.index(p.barrier)

def test_at_most_the_byte_budget_moves_in_program_order():
  p = Program()
  p.store_partial(p.stream_load())
  count = EARLY_LOAD_MAX_BYTES // 4 + 5
  loads = [p.add(load(p.small, p.add(p.thread + const(k)))) for k in range(count)]
  total = loads[0]
  for value in loads[1:]: total = p.add(total + value)
  p.add(UOp(Ops.STORE, dtypes.void, (p.out, p.thread, total)))
  early = before_barrier(hoist_early_loads(p.uops))
  assert [u in early for u in loads] == [k < EARLY_LOAD_MAX_BYTES // 4 for k in range(count)]

# ---- rendered kernels, run on the CPU
def norm_matvec(x: Tensor, residual: Tensor, gain: Tensor, w: Tensor) -> Tensor:
  """W · (r + x/rms(x) · (1 + g)): the squares' sum is the first pass; the second reads the residual, the gain and the
  weight, each value after the first pass's result (gemma3.py's post-norm and residual before a projection, x read as
  one copy a row)."""
  rows = x.expand(w.shape)
  scale = ((rows * rows).sum(-1, keepdim=True) / w.shape[1] + 1e-6).rsqrt()
  normed = residual.expand(w.shape) + rows * scale * (gain.expand(w.shape) + 1)
  return (normed * w).sum(-1)

def loads(source: str, before_barrier: bool) -> list[str]:
  """The input buffer numbers of the kernel's global loads (one per access: scalar, vector or converted half), those
  before its first barrier or all; data0, the output, is not counted."""
  body = source[source.index("__global__"):]
  body = body[body.index("{"):]   # past the parameter list
  if before_barrier: body = body[:body.index("__syncthreads();")]
  return [number for number in re.findall(r"\bdata(\d+)(?:\[| \+)", body) if number != "0"]

def moved_and_kept(build, opts, monkeypatch) -> tuple[np.ndarray, str, np.ndarray, str]:
  """The kernel of build() with `opts` run on emulated CUDA with the pass and without it: (output, source) each."""
  moved, source = run_kernel_emulated(build(), list(opts))
  monkeypatch.setattr(linearizer, "hoist_early_loads", lambda program: program)
  kept, kept_source = run_kernel_emulated(build(), list(opts))
  monkeypatch.undo()
  return moved, source, kept, kept_source

@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
@pytest.mark.parametrize("seed", range(4))
def test_fused_norm_matvec_same_bits_with_the_loads_moved(seed, monkeypatch):
  rng = np.random.default_rng(seed)
  rows, group, per_thread = int(rng.integers(2, 7)), int(rng.choice([8, 16, 32])), int(rng.choice([2, 4]))
  columns = group * per_thread
  x, residual, gain = (rng.standard_normal((1, columns)).astype(np.float32) for _ in range(3))
  w = rng.standard_normal((rows, columns)).astype(np.float32)
  tensors = [Tensor(a, device="LLVM").realize() for a in (x, residual, gain, w)]
  opts = [Opt(OptOps.GROUP, 0, group), Opt(OptOps.UNROLL, 1, 0)]
  moved, source, kept, kept_source = moved_and_kept(lambda: norm_matvec(*tensors), opts, monkeypatch)
  # every input but the weight (the largest, read once) is loaded before the first barrier once moved, and more loads
  # are than before
  assert len(set(loads(source, False)) - set(loads(source, True))) == 1, source
  assert len(loads(source, True)) > len(loads(kept_source, True))
  np.testing.assert_array_equal(moved, kept)
  x64, r64, g64, w64 = (a.astype(np.float64) for a in (x, residual, gain, w))
  normed = r64 + x64 / np.sqrt((x64 * x64).sum() / columns + 1e-6) * (1 + g64)
  want = w64 @ normed[0]
  np.testing.assert_allclose(moved, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

# ---- seeded random fused kernels: two norms, one or two products, float16 or float32, rows per block
def two_norm_products(x, residual, gain1, gain2, w, two_products: bool) -> Tensor:
  """gemma3.py's gate/up pattern: a post-norm of x, the residual added, a pre-norm of the sum, then one or two
  products with rows of w (the second from its second half)."""
  rows, columns = w.shape[0] // 2, w.shape[1]
  xs = x.expand(rows, columns)
  h = residual.expand(rows, columns) + xs * ((xs * xs).mean(-1, keepdim=True) + 1e-6).rsqrt() * (gain1 + 1)
  normed = h * ((h * h).mean(-1, keepdim=True) + 1e-6).rsqrt() * (gain2 + 1)
  first = (normed * w[:rows]).sum(-1)
  return first * (normed * w[rows:]).sum(-1) if two_products else first

@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
@pytest.mark.parametrize("seed", range(6))
def test_random_two_norm_kernels_same_bits_with_the_loads_moved(seed, monkeypatch):
  rng = np.random.default_rng(100 + seed)
  rows, group, per_thread = int(rng.integers(2, 5)) * 2, int(rng.choice([8, 16, 32])), int(rng.choice([2, 4]))
  columns, dtype = group * per_thread, rng.choice([np.float32, np.float16])
  arrays = [rng.standard_normal((1, columns)).astype(dtype) for _ in range(4)] + \
           [(rng.standard_normal((2 * rows, columns)) * 0.1).astype(dtype)]
  two_products = bool(rng.integers(0, 2))
  def build() -> Tensor:
    return two_norm_products(*(Tensor(a, device="LLVM").realize() for a in arrays), two_products)
  opts = [Opt(OptOps.GROUP, 0, group), Opt(OptOps.UNROLL, 1, 0)]
  if rng.integers(0, 2): opts.append(Opt(OptOps.LOCAL, 0, 2))
  moved, source, kept, kept_source = moved_and_kept(build, opts, monkeypatch)
  assert len(loads(source, True)) > len(loads(kept_source, True)), source
  np.testing.assert_array_equal(moved, kept)

# ---- kernels whose code the pass changed when it came in (codegen_golden): a bias after a GROUP'd or staged matmul
@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
@pytest.mark.parametrize("opts", [
  (Opt(OptOps.GROUP, 0, 16),), (Opt(OptOps.GROUP, 0, 8), Opt(OptOps.SMEM, 0, 0)), (Opt(OptOps.SMEM, 0, 0),),
  (Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.SMEM, 1, 4), Opt(OptOps.UNROLL, 0, 4)),
  (Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 8), Opt(OptOps.UPCAST, 0, 2))], ids=str)
def test_linear_relu_same_bits_with_the_loads_moved(opts, monkeypatch):
  rng = np.random.default_rng(11)
  a, w, bias = (rng.standard_normal(shape).astype(np.float32) for shape in ((32, 64), (64, 48), (48,)))
  def build() -> Tensor:
    x, weight, b = (Tensor(v, device="LLVM").realize() for v in (a, w, bias))
    return (x @ weight + b).relu()
  moved, source, kept, kept_source = moved_and_kept(build, opts, monkeypatch)
  assert source != kept_source   # the bias's loads moved
  np.testing.assert_array_equal(moved, kept)
  want = np.maximum(a.astype(np.float64) @ w + bias, 0)
  np.testing.assert_allclose(moved.reshape(want.shape), want, rtol=1e-4, atol=1e-4)
