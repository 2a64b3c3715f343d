"""Schedule rule 5 (tgrad/schedule_riders.py): a small kernel that nothing orders between it and a neighbouring one
runs inside it, its loops padded to the host's. Seeded random shapes and reduce ops against numpy on LLVM, with the
kernel counts with and without the rule (Context RIDERS); the padding identities (max of negatives, product), lifted
scalars of both kernels, an in-place region write riding beside a reader of the old value, the fallbacks (a reader
of the rider's output, a host too big to pad into), and the CUDA renderings compiled with NVRTC."""
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

SEEDS = range(8)

@pytest.fixture(autouse=True)
def riders_on():
  """The rule is off by default (measured slower in Gemma on an H100); every test here turns it on."""
  with Context(RIDERS=1): yield
needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
REDUCES = {"sum": (lambda t, a: t.sum(a), lambda x, a: x.sum(a)), "max": (lambda t, a: t.max(a), lambda x, a: x.max(a)),
           "prod": (lambda t, a: t.prod(a), lambda x, a: x.prod(a))}

def kernels(*outs: Tensor) -> list:
  return [item for item in create_schedule([t.lazydata for t in outs]) if item.ast.op is Ops.SINK]

def pair(seed: int):
  """A host (a reduce over rows of a random [m, r]) and a rider that fits it (at most 2x padding), random data."""
  rng = np.random.default_rng(seed)
  m, r = int(rng.integers(3, 12)), int(rng.integers(3, 40))
  mb = int(rng.integers(max(1, (m + 1) // 2), m + 1))
  rb = int(rng.integers(max(1, -(-m * r // (2 * mb))), r + 1))
  host = rng.standard_normal((m, r)).astype(np.float32)
  rider = (rng.standard_normal((mb, rb)) - 1.5).astype(np.float32)   # mostly negative: a max padded with 0 is wrong
  op = ["sum", "max", "prod"][seed % 3]
  return host, rider, op

@pytest.mark.parametrize("seed", SEEDS)
def test_rider_matches_numpy(seed):
  host, rider, op = pair(seed)
  make, ref = REDUCES[op]
  rider = rider * 0.5 if op == "prod" else rider   # products of a few dozen factors stay in float32's range
  def build():
    a, b = Tensor(host), Tensor(rider)
    return (a.exp() * 0.5 + 1).sum(1), make(b.reshape(*rider.shape) * 1.25, 1).reshape(-1, 1) * 2 - 1
  x, y = build()
  assert len(kernels(x, y)) == 1
  Tensor.realize(x, y)
  np.testing.assert_allclose(x.numpy(), (np.exp(host) * 0.5 + 1).sum(1), rtol=1e-5)
  np.testing.assert_allclose(y.numpy(), ref(rider * 1.25, 1).reshape(-1, 1) * 2 - 1, rtol=1e-4, atol=1e-5)
  with Context(RIDERS=0):
    x2, y2 = build()
    assert len(kernels(x2, y2)) == 2
    np.testing.assert_allclose(y2.numpy(), y.numpy(), rtol=1e-6)

@pytest.mark.parametrize("seed", SEEDS)
def test_elementwise_rider_in_a_reduce_kernel(seed):
  """A kernel without reduces (an elementwise value of a few outputs) rides in a matrix-vector kernel's epilogue."""
  rng = np.random.default_rng(100 + seed)
  m, n = int(rng.integers(4, 20)), int(rng.integers(2, 50))
  w, v = rng.standard_normal((m, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  e = rng.standard_normal(int(rng.integers((m + 1) // 2, m + 1))).astype(np.float32)
  out, side = Tensor(w) @ Tensor(v), (Tensor(e) * 3).exp() - Tensor(e)
  assert len(kernels(out, side)) == 1
  Tensor.realize(out, side)
  np.testing.assert_allclose(out.numpy(), w @ v, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(side.numpy(), np.exp(e * 3) - e, rtol=1e-5)

def test_riders_of_one_shape_share_a_kernel():
  """Several independent reduces of one shape are one kernel; a merged kernel rides on."""
  rng = np.random.default_rng(7)
  xs = [rng.standard_normal((6, 9)).astype(np.float32) for _ in range(5)]
  outs = [(Tensor(x) * (k + 1)).max(1) for k, x in enumerate(xs)]
  assert len(kernels(*outs)) == 1
  Tensor.realize(*outs)
  for k, (x, o) in enumerate(zip(xs, outs)): np.testing.assert_allclose(o.numpy(), (x * (k + 1)).max(1), rtol=1e-6)

def test_kernels_of_two_devices_never_share_one():
  """Reduces of one shape on LLVM and LLVM:1 stay a kernel per device (one kernel can't touch both devices' memory);
  those of each device still share one."""
  rng = np.random.default_rng(11)
  xs = [rng.standard_normal((6, 9)).astype(np.float32) for _ in range(4)]
  ins = [Tensor(x, device="LLVM" if k % 2 else "LLVM:1").realize() for k, x in enumerate(xs)]
  outs = [(t * (k + 1)).max(1) for k, t in enumerate(ins)]
  found = kernels(*outs)
  assert len(found) == 2 and all(len({b.device for b in item.bufs}) == 1 for item in found)
  Tensor.realize(*outs)
  for k, (x, o) in enumerate(zip(xs, outs)): np.testing.assert_allclose(o.numpy(), (x * (k + 1)).max(1), rtol=1e-6)

def test_reader_of_the_rider_keeps_it_apart():
  """The host reads the rider's output: no ride (the rider runs first, its own kernel)."""
  rng = np.random.default_rng(8)
  a, b = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((8, 12)).astype(np.float32)
  s = Tensor(b).sum(1).contiguous()
  out = (Tensor(a) * s.reshape(8, 1)).sum(1)
  assert len(kernels(out, s)) == 2
  Tensor.realize(out, s)
  np.testing.assert_allclose(out.numpy(), (a * b.sum(1, keepdims=True)).sum(1), rtol=1e-4, atol=1e-5)

def test_host_too_big_to_pad_into():
  rng = np.random.default_rng(9)
  a, b = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
  x, y = Tensor(a).sum(1), Tensor(b).sum(1)
  assert len(kernels(x, y)) == 2
  Tensor.realize(x, y)
  np.testing.assert_allclose(y.numpy(), b.sum(1), rtol=1e-5)

@pytest.mark.parametrize("seed", range(4))
def test_region_write_rides_after_the_reader_of_the_old_value(seed):
  """A cache-like write of one row (a region ASSIGN) and a kernel reading the whole buffer's old value: the write
  must not run before the read. It rides in a later independent kernel, or stays alone; the values are numpy's."""
  rng = np.random.default_rng(200 + seed)
  rows, width = int(rng.integers(3, 9)), int(rng.integers(4, 33))
  start = rng.standard_normal((rows, width)).astype(np.float32)
  new = rng.standard_normal((1, width)).astype(np.float32)
  other = rng.standard_normal((rows + 2, width)).astype(np.float32)
  slot = int(rng.integers(0, rows))
  cache = Tensor(start).contiguous().realize()
  old_sums = (cache * 2).sum(1)                      # reads the old value
  cache.assign_region(((slot, slot + 1), None), (Tensor(new) * 3).exp())
  later = (Tensor(other) - 1).max(1)                 # an independent kernel the write can ride in
  Tensor.realize(old_sums, cache, later)
  expected = start.copy()
  expected[slot] = np.exp(new[0] * 3)
  np.testing.assert_allclose(old_sums.numpy(), (start * 2).sum(1), rtol=1e-5)
  np.testing.assert_allclose(cache.numpy(), expected, rtol=1e-5)
  np.testing.assert_allclose(later.numpy(), (other - 1).max(1), rtol=1e-6)

def test_lifted_scalars_of_both_kernels_on_replay():
  """Each kernel's lifted Python scalars keep their own parameters in the merged kernel, also when a schedule of the
  same structure is replayed from the schedule cache with other values."""
  rng = np.random.default_rng(11)
  a, b = rng.standard_normal((6, 10)).astype(np.float32), rng.standard_normal((5, 7)).astype(np.float32)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  for c, d in [(2.5, -1.5), (0.25, 4.0), (-3.0, 0.5)]:
    x, y = (ta * c).sum(1), (tb + d).max(1)
    Tensor.realize(x, y)
    np.testing.assert_allclose(x.numpy(), (a * c).sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y.numpy(), (b + d).max(1), rtol=1e-6)

GPU_OPTS = [None, [], [Opt(OptOps.GROUP, 0, 8)], [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.GROUP, 0, 4)]]

@needs_nvrtc
@pytest.mark.parametrize("opts", GPU_OPTS, ids=lambda o: "heuristics" if o is None else "-".join(x.op.name for x in o)
                         or "none")
def test_cuda_rendering_compiles(opts):
  rng = np.random.default_rng(12)
  a, b = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((40, 52)).astype(np.float32)
  (item,) = kernels(Tensor(a).sum(1), Tensor(b).exp().max(1))
  assert item.output_count == 2
  kernel = Kernel(item.ast, CUDARenderer())
  if opts is None: hand_coded_optimizations(kernel)
  else:
    for opt in opts: kernel.apply_opt(opt)
  src = kernel.renderer.render("rider", linearize(kernel))
  assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
