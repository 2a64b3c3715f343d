"""Reductions on the CPU against numpy in float64, at explicit tolerances: long rows (split across partials and
threads, summed in blocks with compensated block totals), column reduces (the strided axis: heuristics'
_cpu_column_reduce), odd sizes, size 1 and 0-d, float32 and float16, and the row ops built from them (softmax,
log_softmax, rms norm, layer norm). One test would fail for a plain float32 running sum: 16M values of 1e-3 on a large
offset, where float32 accumulating in sequence drifts by percent.
"""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, OptOps
from tgrad.device import Device
from tgrad.ops import Ops
from tgrad.schedule import create_schedule

LONG = (1 << 24) + 1   # past float32's 2^24 integers and odd: the split into partials can't divide it evenly
# |tgrad − float64| ≤ atol + rtol·|float64| per dtype; sums also get SUM_ATOL_PER_ROOT·√n·max|x| of rounding noise
RTOL = {np.float32: 2e-6, np.float16: 2e-3}
SUM_ATOL_PER_ROOT = {np.float32: 1e-6, np.float16: 1e-3}

def _check_sum(x: np.ndarray, got: np.ndarray, axis, dtype) -> None:
  want = x.astype(np.float64).sum(axis)
  n = x.size // max(1, np.size(want))
  atol = SUM_ATOL_PER_ROOT[dtype] * np.sqrt(max(n, 1)) * float(np.abs(x).max(initial=0.0))
  np.testing.assert_allclose(got.astype(np.float64), want, rtol=RTOL[dtype], atol=atol)

def test_long_sum_with_offset_is_not_a_running_float32_sum():
  """16M values of 1e-3 on an offset of 1000: float32 adding in sequence loses the 1e-3s against a total of 1.6e10
  (a running sum is off by several percent); blocks with compensated totals stay within a few float32 ulps."""
  x = np.full(LONG, 1000.001, dtype=np.float32)
  want = x.astype(np.float64).sum()
  running = np.cumsum(x, dtype=np.float32)[-1]   # what a single float32 accumulator would give
  assert abs(running - want) / want > 1e-3   # the test can fail: a naive sum is far outside the tolerance below
  got = float(Tensor(x).sum().numpy())
  assert abs(got - want) / want < 1e-6
  assert abs(float(Tensor(x).mean().numpy()) - want / LONG) / (want / LONG) < 1e-6

@pytest.mark.parametrize("size", [1, 7, 4097, 65537, LONG])
def test_long_row_sum_mean_max(size):
  rng = np.random.default_rng(size)
  x = (rng.standard_normal(size) + 3).astype(np.float32)
  t = Tensor(x)
  _check_sum(x, t.sum().numpy(), None, np.float32)
  np.testing.assert_allclose(float(t.mean().numpy()), x.astype(np.float64).mean(), rtol=2e-6)
  assert float(t.max().numpy()) == x.max()
  assert float(t.min().numpy()) == x.min()

def test_zero_d_and_empty():
  assert float(Tensor(np.float32(2.5)).sum().numpy()) == 2.5
  assert float(Tensor(np.float32(-1.5)).max().numpy()) == -1.5
  assert float(Tensor(np.zeros(0, np.float32)).sum().numpy()) == 0.0

@pytest.mark.parametrize("shape", [(4096, 257), (257, 4096), (3, 1000, 67), (1, 1), (33, 1), (65537, 3)])
@pytest.mark.parametrize("axis", [0, -1])
def test_matrix_sums_and_max_along_either_axis(shape, axis):
  rng = np.random.default_rng(sum(shape) + axis)
  x = rng.standard_normal(shape).astype(np.float32)
  t = Tensor(x)
  _check_sum(x, t.sum(axis).numpy(), axis, np.float32)
  np.testing.assert_array_equal(t.max(axis).numpy(), x.max(axis))
  np.testing.assert_allclose(t.mean(axis).numpy(), x.astype(np.float64).mean(axis), rtol=2e-6,
                             atol=1e-6 * np.sqrt(x.shape[axis]))

def test_float16_sums():
  rng = np.random.default_rng(16)
  x = rng.standard_normal((513, 1031)).astype(np.float16)
  t = Tensor(x)
  for axis in (0, 1, None):
    _check_sum(x, t.sum(axis).numpy(), axis, np.float16)
  np.testing.assert_array_equal(t.max(0).numpy(), x.max(0))

def test_column_sum_is_vectorized_along_the_output_axis():
  """x.sum(0) of a row-major matrix upcasts its contiguous output axis (heuristics._cpu_column_reduce): each step of
  the reduce loop reads a run of a row, not one float of a column."""
  out = Tensor.empty(4096, 512).sum(0).lazydata
  [kernel] = [Kernel(item.ast, Device["LLVM"].renderer) for item in create_schedule([out]) if item.ast.op is Ops.SINK]
  hand_coded_optimizations(kernel)
  assert any(opt.op is OptOps.UPCAST and opt.amount >= 8 for opt in kernel.applied_opts), kernel.applied_opts

def _softmax64(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

@pytest.mark.parametrize("shape", [(512, 2048), (3, 1001), (1, 1 << 20), (1, 1)])
def test_softmax_and_log_softmax_rows(shape):
  rng = np.random.default_rng(shape[-1])
  x = (rng.standard_normal(shape) * 4).astype(np.float32)
  t = Tensor(x)
  want = _softmax64(x)
  np.testing.assert_allclose(t.softmax(-1).numpy(), want, rtol=1e-5, atol=1e-7 / shape[-1])
  np.testing.assert_allclose(t.log_softmax(-1).numpy(), np.log(want), rtol=1e-5, atol=2e-5)

def test_norms_of_rows():
  rng = np.random.default_rng(7)
  x = (rng.standard_normal((777, 1024)) * 3 + 1).astype(np.float32)
  x64 = x.astype(np.float64)
  t = Tensor(x)
  rms = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(t.rms_norm(-1, eps=1e-6).numpy(), rms, rtol=1e-5, atol=1e-5)
  centered = x64 - x64.mean(-1, keepdims=True)
  layer = centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(t.layernorm(-1, eps=1e-5).numpy(), layer, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("size", [LONG, 4 * 1000003])
def test_reduce_no_part_count_divides_still_splits(size):
  """A long axis that no split part count divides (2^24 + 1, 4·1000003) splits its head and reduces the tail apart
  (lazy._split_with_tail): more than one kernel, so the head runs on every core."""
  from tgrad.lazy import SPLIT_REDUCE_PARTS
  assert all(size % p for p in SPLIT_REDUCE_PARTS)
  x = np.random.default_rng(size).standard_normal(size).astype(np.float32)
  for op in ("sum", "max"):
    out = getattr(Tensor(x), op)()
    assert len([item for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]) >= 3
    if op == "sum": _check_sum(x, out.numpy(), None, np.float32)
    else: assert float(out.numpy()) == x.max()

def test_narrow_column_sum_splits_its_rows():
  """An (n, 4) matrix's column sums have fewer outputs than a cache line holds per core: the rows split into partials
  (lazy.SPLIT_REDUCE_CPU_OUTPUTS_PER_CORE), each step of a partial reads one row's 4 values (the column rule)."""
  x = np.random.default_rng(4).standard_normal((1 << 17, 4)).astype(np.float32)
  out = Tensor(x).sum(0)
  assert len([item for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]) == 2
  _check_sum(x, out.numpy(), 0, np.float32)

@pytest.mark.parametrize("seed", range(3))
def test_column_max_propagates_nan_and_infinities(seed):
  """A column max (its output axis upcast into many accumulators: the LLVM renderer's compare-and-select max,
  MAX_LANES) against numpy on seeded random data with NaN, ±inf and signed zeros sprinkled in; also a row max (the
  llvm.maximum reduction) on the same data; the two kernels' sources show each took the form it is tested for."""
  from tgrad.codegen.linearizer import linearize
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((257, 256)).astype(np.float32)
  for value, count in ((np.nan, 5), (np.inf, 4), (-np.inf, 40), (0.0, 30), (-0.0, 30)):
    x.flat[rng.choice(x.size, count, replace=False)] = value
  x[:, 7] = -np.inf   # a column of -inf only
  got = Tensor(x).max(0).numpy()
  np.testing.assert_array_equal(got, x.max(0))   # NaN where numpy has NaN (assert_array_equal matches NaNs)
  np.testing.assert_array_equal(Tensor(x).max(1).numpy(), x.max(1))
  def rendered(out: Tensor) -> str:   # the LLVM source of out's kernel, under the heuristics' opts
    (item,) = [i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK]
    kernel = Kernel(item.ast, Device["LLVM"].renderer)
    hand_coded_optimizations(kernel)
    return kernel.renderer.render("k", linearize(kernel))
  columns, rows = rendered(Tensor.empty(257, 256).max(0)), rendered(Tensor.empty(257, 256).max(1))
  assert "llvm.maximum" not in columns and "fcmp uno" in columns   # the compare-and-select form was tested above
  assert "llvm.maximum" in rows
