"""Reduces of one pass that a GROUP combines across threads share one barrier (value_graph.ValueBuilder.pass_barrier):
every partial of the pass is stored before any thread waits, so a fully unrolled reduce's loads are not held behind
the previous reduce's barrier. Checked on CUDA kernels run on the CPU (test/cuda_on_cpu.py) against numpy, with seeded
random sizes, and by the barriers in their source.
"""
import re
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.kernel import Opt, OptOps
from cuda_on_cpu import cpu_available, run_kernel_emulated

pytestmark = pytest.mark.skipif(not cpu_available(), reason="g++ not found")

def three_sums(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
  """Σ x·w1[i] · Σ x² + Σ x·w2[i] for each row i: three reduces of one pass in one kernel (x read as one copy a row,
  as gemma3.py's fused norms read it)."""
  rows = x.expand(w1.shape)
  return (rows * w1).sum(-1) * (rows * rows).sum(-1) + (rows * w2).sum(-1)

def barriers_between_stores_and_combine(source: str) -> list[int]:
  """The number of barriers after each shared-memory store of a partial, up to the next store or the first read."""
  stores = [m.start() for m in re.finditer(r"temp\d+\[[^\]]+\] = ", source)]
  first_read = min(m.start() for m in re.finditer(r"= temp\d+\[", source))
  ends = stores[1:] + [first_read]
  return [source.count("__syncthreads();", start, end) for start, end in zip(stores, ends)]

@pytest.mark.parametrize("seed", range(3))
def test_sibling_reduces_store_every_partial_before_one_barrier(seed):
  rng = np.random.default_rng(seed)
  rows, group, per_thread = int(rng.integers(2, 9)), int(rng.choice([4, 8, 16])), int(rng.choice([2, 4, 8]))
  columns = group * per_thread
  x = rng.standard_normal((1, columns)).astype(np.float32)
  w1, w2 = (rng.standard_normal((rows, columns)).astype(np.float32) for _ in range(2))
  out = three_sums(*(Tensor(a, device="LLVM").realize() for a in (x, w1, w2)))
  # the reduce axis spread over `group` threads, the rest of it unrolled: each thread's partials are straight-line code
  got, source = run_kernel_emulated(out, [Opt(OptOps.GROUP, 0, group), Opt(OptOps.UNROLL, 1, 0)])
  assert barriers_between_stores_and_combine(source) == [0, 0, 1], source
  x64, w1_64, w2_64 = (a.astype(np.float64) for a in (x, w1, w2))
  want = (w1_64 @ x64[0]) * (x64 * x64).sum() + w2_64 @ x64[0]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())

def test_reduces_of_different_passes_keep_their_own_barriers():
  """A row kernel: the sum of exponentials reads the max (a later pass), so its partial can't be stored before the
  max's combine: one barrier each."""
  rng = np.random.default_rng(5)
  x = rng.standard_normal((4, 64)).astype(np.float32)
  t = Tensor(x, device="LLVM").realize()
  got, source = run_kernel_emulated((t - t.max(-1, keepdim=True)).exp().sum(-1), [Opt(OptOps.GROUP, 0, 16)])
  assert barriers_between_stores_and_combine(source)[0] == 1, source
  want = np.exp(x - x.max(-1, keepdims=True)).sum(-1)
  np.testing.assert_allclose(got, want, rtol=1e-5)
