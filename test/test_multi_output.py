"""Kernels with several outputs (schedule.py rule 2c): a realized copy of a run of a row kernel's value is stored by
that kernel (a masked second STORE) instead of a kernel of its own. Seeded random sizes against numpy on LLVM, the
kernel counts, the fallbacks (a copy the kernel would read back, a copy that is no run), the order of a reader of
the copy, and the CUDA renderings compiled with NVRTC."""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.helpers import Context
from tgrad.ops import Ops
from tgrad.schedule import create_schedule
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available

EPS = 1e-6
SEEDS = range(6)
needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")

def sizes(seed: int) -> tuple[int, int, int]:
  """(rows R, row length N, the copied row) — odd sizes."""
  rng = np.random.default_rng(seed)
  rows = int(rng.choice([1, 3, 7, 11, 33]))
  return rows, int(rng.choice([1, 5, 37, 129, 640])), int(rng.integers(0, rows))

def residual_matvec(h: Tensor, a: Tensor, w: Tensor, copied_row: int) -> tuple[Tensor, Tensor]:
  """out = W · e / rms(e) with e = h + a / rms(a), every row of W summing its own copy of e (as a decode step's
  residual add inside the next projection), and the copy of e in row `copied_row`, realized."""
  rows, n = w.shape
  def copies(x: Tensor) -> Tensor: return x.reshape(1, n).expand(rows, n)
  spread = copies(a)
  e = copies(h) + spread * (spread.square().mean(-1, keepdim=True) + EPS).rsqrt()
  out = (e * w).sum(-1) * (e.square().mean(-1) + EPS).rsqrt()
  return out, e[copied_row:copied_row + 1].reshape(n).contiguous()

def numpy_residual_matvec(h, a, w):
  e = h + a / np.sqrt((a * a).mean() + EPS)
  return (w @ e) / np.sqrt((e * e).mean() + EPS), e

def data(seed: int, rows: int, n: int):
  rng = np.random.default_rng(100 + seed)
  return [rng.standard_normal(shape).astype(np.float32) for shape in ((n,), (n,), (rows, n))]

def kernels(*outs: Tensor) -> list:
  return [item for item in create_schedule([o.lazydata for o in outs]) if item.ast.op is Ops.SINK]

@pytest.mark.parametrize("seed", SEEDS)
def test_copy_stored_by_the_matvec(seed):
  rows, n, copied = sizes(seed)
  h, a, w = data(seed, rows, n)
  out, stored = residual_matvec(Tensor(h).realize(), Tensor(a).realize(), Tensor(w).realize(), copied)
  (item,) = kernels(out, stored)
  assert item.output_count == 2 and item.outputs[0].size == rows and item.outputs[1].size == n
  Tensor.realize(out, stored)
  want_out, want_e = numpy_residual_matvec(h, a, w)
  np.testing.assert_allclose(stored.numpy(), want_e, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("seed", SEEDS)
def test_copy_of_a_row_kernel_beside_its_row_store(seed):
  """Both outputs span the rows: softmax's shifted rows, one of them copied."""
  rows, n, copied = sizes(seed)
  x = np.random.default_rng(seed).standard_normal((rows, n)).astype(np.float32)
  t = Tensor(x).realize()
  shifted = t - t.max(-1, keepdim=True)
  out = shifted.exp() / shifted.exp().sum(-1, keepdim=True)
  stored = shifted[copied].contiguous()
  (item,) = kernels(out, stored)
  assert item.output_count == 2
  Tensor.realize(out, stored)
  want = x - x.max(-1, keepdims=True)
  np.testing.assert_allclose(stored.numpy(), want[copied], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out.numpy(), np.exp(want) / np.exp(want).sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)

def test_reader_of_the_copy_runs_after_the_kernel():
  """A kernel reading the copy, scheduled in the same realize, comes after the kernel that stores it."""
  rows, n = 9, 37
  h, a, w = data(7, rows, n)
  out, stored = residual_matvec(Tensor(h).realize(), Tensor(a).realize(), Tensor(w).realize(), 0)
  later = (stored * 3).sum() + out.sum()
  items = kernels(later, stored)
  assert len(items) == 3 and items[0].output_count == 2   # then the two sums
  Tensor.realize(later, stored)
  want_out, want_e = numpy_residual_matvec(h, a, w)
  np.testing.assert_allclose(later.numpy(), (want_e * 3).sum() + want_out.sum(), rtol=1e-4, atol=1e-4)

def test_copy_read_back_by_the_kernel_keeps_its_own_kernel():
  """The matvec's weight depends on the copy: storing the copy there would be a cycle, so it has its own kernel."""
  rows, n = 5, 13
  h, a, w = data(8, rows, n)
  tw = Tensor(w).realize()
  def copies(x: Tensor) -> Tensor: return x.reshape(1, n).expand(rows, n)
  spread = copies(Tensor(a).realize())
  e = copies(Tensor(h).realize()) + spread * (spread.square().mean(-1, keepdim=True) + EPS).rsqrt()
  stored = e[0:1].reshape(n).contiguous()
  out = (e * (tw + stored.reshape(1, n))).sum(-1) * (e.square().mean(-1) + EPS).rsqrt()
  items = kernels(out, stored)
  assert all(item.output_count == 1 for item in items) and len(items) >= 2
  Tensor.realize(out, stored)
  e_np = h + a / np.sqrt((a * a).mean() + EPS)
  np.testing.assert_allclose(stored.numpy(), e_np, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.numpy(), ((w + e_np) @ e_np) / np.sqrt((e_np * e_np).mean() + EPS), rtol=1e-4,
                             atol=1e-4)

def test_strided_copy_is_no_second_output():
  """A copy that reads the rows out of order (a column) is no run of them: it keeps its own kernels; values hold."""
  rows, n = 6, 11
  h, a, w = data(9, rows, n)
  out, _ = residual_matvec(Tensor(h).realize(), Tensor(a).realize(), Tensor(w).realize(), 0)
  x = Tensor(np.random.default_rng(9).standard_normal((rows, n)).astype(np.float32)).realize()
  shifted = x - x.max(-1, keepdim=True)
  column = shifted[:, 2].contiguous()
  with Context(RIDERS=0):   # rule 5 may put the two kernels into one: this test is about rule 2c alone
    assert all(item.output_count == 1 for item in kernels(shifted.exp().sum(-1), column))
  xn = x.numpy()
  np.testing.assert_allclose(column.numpy(), (xn - xn.max(-1, keepdims=True))[:, 2], rtol=1e-6)
  np.testing.assert_allclose(out.numpy(), numpy_residual_matvec(h, a, w)[0], rtol=1e-4, atol=1e-4)

GPU_OPTS = [None, [], [Opt(OptOps.GROUP, 0, 8)], [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.GROUP, 0, 16)],
            [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.GROUP, 0, 8)]]

@needs_nvrtc
@pytest.mark.parametrize("opts", GPU_OPTS, ids=lambda o: "heuristics" if o is None else "-".join(x.op.name for x in o)
                         or "none")
def test_cuda_rendering_compiles(opts):
  """The two-output matvec for a GPU: the reduced output stored by each row's first GROUP thread, the copy by the
  first row's threads only."""
  h, a, w = data(10, 12, 640)
  out, stored = residual_matvec(Tensor(h), Tensor(a), Tensor(w), 0)
  (item,) = kernels(out, stored)
  kernel = Kernel(item.ast, CUDARenderer())
  if opts is None: hand_coded_optimizations(kernel)
  else:
    for opt in opts: kernel.apply_opt(opt)
  src = kernel.renderer.render("two_outputs", linearize(kernel))
  assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
  assert "data0[" in src and "data1" in src.split("{", 1)[1]
