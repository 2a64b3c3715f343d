"""Float sums of partial sums add with Kahan's compensation: a GROUP's combine of its threads' partials (CUDA) when the
sum is long or adds partial sums, and the reduce of _split_reduce's partials (every device).

No GPU is needed: CUDA kernels are rendered and compiled with NVRTC and their combine loops read; the reduce of
partials runs on LLVM, with explicit opts where a plain sum would be in sequence (several accumulators, which the loop
vectorizer may not reorder) and with the heuristics. Results on a GPU are in test/test_big_tensors.py.
"""
import re
import numpy as np
import pytest
import tgrad.lazy
from tgrad import Tensor
from tgrad.dtype import dtypes
from tgrad.ops import Ops
from tgrad.lazy import LazyBuffer
from tgrad.schedule import create_schedule
from tgrad.device import Device
from tgrad.realize import compile_kernel
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
BIG = (1 << 31) + 64
ODD = (1 << 24) - 1   # the largest odd float32 integer: k·ODD needs more than 24 bits for most k, so plain sums round
GROUP_LOOP = re.compile(r"for \(int ridx1\d\d\d = 0; ridx1\d\d\d < (\d+); ridx1\d\d\d\+\+\) \{\n(.*?)\n    \}", re.S)

def sink_kernels(out: LazyBuffer, renderer) -> list[Kernel]:
  return [Kernel(item.ast, renderer) for item in create_schedule([out]) if item.ast.op is Ops.SINK]

def cuda_sources(out: LazyBuffer) -> list[str]:
  """The CUDA source of each kernel of `out` with the GPU heuristics, each compiled to an sm_90 cubin by NVRTC."""
  sources = []
  for kernel in sink_kernels(out, CUDARenderer()):
    hand_coded_optimizations(kernel)
    src = kernel.renderer.render("sum_kernel", linearize(kernel))
    assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
    sources.append(src)
  return sources

def group_combines(src: str) -> list[tuple[int, str]]:
  """(trips, body) of each loop over a GROUP's partials (RANGE args 1000 + axis)."""
  return [(int(trips), body) for trips, body in GROUP_LOOP.findall(src)]

def accumulators_updated(body: str) -> int: return len(re.findall(r"^\s*acc\d+ = \w+;$", body, re.M))

def is_kahan(body: str) -> bool:
  """Two accumulators (total, compensation), the compensation's negations: value − c, (t' − t) − corrected, and the
  finiteness test t' − t' != 0 that zeroes it once the total is ±inf or NaN."""
  return (accumulators_updated(body) == 2 and len(re.findall(r"= \(-\w+\);", body)) == 4
          and re.search(r"= \(\w+ \? 0\.0f : \w+\);", body) is not None)

# ---- CUDA: the combine of a GROUP's partials

@needs_nvrtc
def test_group_combine_of_a_long_float_sum_is_compensated(monkeypatch):
  # the kernel of test_big_tensors' CUDA reduce over 2^31 + 64 positions: each thread's share is blocked, and the
  # block's combine of its threads' partials (millions each) is a Kahan loop
  monkeypatch.setattr(tgrad.lazy, "SPLIT_REDUCE_MIN_INPUTS", 1 << 62)
  positions = LazyBuffer.loadop(Ops.ARANGE, (BIG,), dtypes.int64, "LLVM")
  (src,) = cuda_sources(positions.alu(Ops.MOD, positions.const(2)).cast(dtypes.float32).r(Ops.ADD, (0,)))
  ((trips, body),) = group_combines(src)
  assert trips >= 64 and is_kahan(body), src

@needs_nvrtc
def test_split_sum_of_ones_combines_with_compensation():
  # ones(1.6e9).sum(): partials of 6.25M (a GROUP each), then one block adds the 256 partials; both combines compensate
  ones = LazyBuffer.const_of(1.0, dtypes.float32, "LLVM", (1_600_000_000,))
  sources = cuda_sources(ones.r(Ops.ADD, (0,)))
  assert len(sources) == 2
  for src in sources:
    combines = group_combines(src)
    assert combines and all(is_kahan(body) for _, body in combines), src

@needs_nvrtc
@pytest.mark.parametrize("dtype,op", [(dtypes.int32, Ops.ADD), (dtypes.float32, Ops.MAX)], ids=["int_sum", "max"])
def test_exact_combines_stay_plain(dtype, op):
  x = LazyBuffer.from_host(np.zeros((4, 1 << 14), dtype.np), "LLVM", dtype)
  (src,) = cuda_sources(x.r(op, (1,)))
  combines = group_combines(src)
  assert combines and all(accumulators_updated(body) == 1 and "(-" not in body for _, body in combines), src

# ---- the reduce of partials, run on LLVM

def run_llvm(out: LazyBuffer, opts=()) -> np.ndarray:
  """Run the one kernel of `out` (its inputs realized) on LLVM with explicit opts; its output."""
  (item,) = [i for i in create_schedule([out]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, Device["LLVM"].renderer)
  for opt in opts: kernel.apply_opt(opt)
  compile_kernel("LLVM", kernel)(list(item.bufs))
  return item.bufs[0].copyout()

def partial_sums(values: np.ndarray, compensated: bool) -> LazyBuffer:
  """Row sums of `values` (realized) as the reduce of a split's partials (compensated) or a plain reduce."""
  rows = Tensor(values, device="LLVM").realize().lazydata
  return rows._reduce(Ops.ADD, (1,), of_partials=compensated)

def within_half_a_spacing(got: np.ndarray, exact: np.ndarray) -> bool:
  return bool(np.all(np.abs(got.astype(np.float64) - exact) <= np.spacing(np.abs(exact).astype(np.float32)) / 2))

def test_sum_of_partials_in_sequence_is_correctly_rounded():
  # 4 outputs, upcast: 4 accumulators, each adding 256 odd integers in [2^23, 2^24) in sequence (no vectorizer
  # reordering). A plain running sum rounds at almost every step and drifts by hundreds of units (over 512 here); the
  # compensated sum is the float64 sum rounded once
  values = np.random.default_rng(5).integers(1 << 22, 1 << 23, (4, 256)) * 2 + 1
  exact = values.sum(1).astype(np.float64)
  partials = values.astype(np.float32)
  upcast = (Opt(OptOps.UPCAST, 0, 4),)
  assert within_half_a_spacing(run_llvm(partial_sums(partials, True), upcast), exact)
  plain = run_llvm(partial_sums(partials, False), upcast)
  assert np.max(np.abs(plain - exact)) > 2 * np.spacing(np.float32(exact.max())), "a plain sum of these drifts"

@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("opts", [(), (Opt(OptOps.UPCAST, 0, 4),), (Opt(OptOps.UNROLL, 0, 4),),
                                  (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 8))], ids=str)
def test_random_sums_of_partials_are_correctly_rounded(seed, opts):
  # large alike partials (what _split_reduce adds), mixed signs, odd lengths: within half a float32 spacing of the
  # float64 sum (Kahan's bound: 2ε·Σ|x| plus the final rounding, far tighter than a plain sum's n·ε)
  rng = np.random.default_rng(seed)
  partials = (rng.uniform(4e6, 2e7, (8, 200 + 8 * seed)) * rng.choice([1, 1, 1, -1], (8, 200 + 8 * seed)))
  partials = partials.astype(np.float32)
  exact = partials.astype(np.float64).sum(1)
  got = run_llvm(partial_sums(partials, True), opts)
  assert within_half_a_spacing(got, exact), (got - exact)

@pytest.mark.parametrize("opts", [(), (Opt(OptOps.UPCAST, 0, 4),), (Opt(OptOps.UNROLL, 0, 4),)], ids=str)
def test_sums_of_partials_with_infinities(opts):
  # inf − inf in the carried error made any compensated sum holding an inf NaN: a 10,000-element float32 sum on the
  # CPU, and a CUDA gather whose GROUP combine saw −inf (fuzz_ops seed 0 case 499)
  partials = np.ones((8, 64), np.float32)
  partials[1, 3] = np.inf
  partials[2, 5] = -np.inf
  partials[3, 0], partials[3, 63] = np.inf, -np.inf
  partials[4, 7] = partials[4, 8] = 3e38   # the sum overflows to inf
  partials[5, 9] = np.nan
  partials[6, 62] = -np.inf                # the last value
  with np.errstate(over="ignore", invalid="ignore"): want = partials.sum(1)
  np.testing.assert_array_equal(run_llvm(partial_sums(partials, True), opts), want)

def test_long_sums_with_infinities():
  # past ACCUMULATE_BLOCK values the kernel adds block totals with compensation
  x = np.ones((4, 10_000), np.float32)
  x[0, 5], x[1, 9_000], x[2, 7], x[2, 8_000] = np.inf, -np.inf, np.inf, -np.inf
  with np.errstate(invalid="ignore"): want = x.sum(1)
  np.testing.assert_array_equal(Tensor(x, device="LLVM").sum(1).numpy(), want)
  np.testing.assert_array_equal(Tensor(x[0], device="LLVM").sum().numpy(), np.float32(np.inf))

@needs_nvrtc
def test_short_sum_with_infinities_combines_plain():
  # fuzz_ops seed 0 case 499: v0[:, i] on (15, 16, 1) is a 16-long masked sum per output, a GROUP of 2 threads on CUDA.
  # A sum this short combines its partials plainly (reduces.long_reduce): no carried error, so a −inf total stays −inf
  # (a compensated combine must zero its error once the total is infinite: the long sums' tests check that guard).
  # Gathers are data-dependent loads now; the one-hot formulation (kept for empty tensors) still makes that masked sum
  from tgrad.tensor_ops.indexing import _IndexPlan
  x = Tensor(np.zeros((15, 16, 1), np.float32), device="LLVM")
  index = Tensor(np.array(10, np.int32), device="LLVM").realize()
  (src,) = cuda_sources(x._gather_one_hot(_IndexPlan(x.shape, (slice(None), index), x.device)).lazydata)
  combines = group_combines(src)
  assert combines and all(accumulators_updated(body) == 1 and "(-" not in body for _, body in combines), src

@needs_nvrtc
@pytest.mark.parametrize("length,compensated", [(2048, False), (4096, False), (8192, True)])
def test_group_combine_compensates_past_the_accumulate_block(length, compensated):
  # row sums split over a GROUP: up to ACCUMULATE_BLOCK values per output the partials add plainly (a decode matvec's
  # serial tail), past it with Kahan's compensation
  x = LazyBuffer.from_host(np.ones((16, length), np.float32), "LLVM", dtypes.float32)
  (src,) = cuda_sources(x.r(Ops.ADD, (1,)))
  combines = group_combines(src)
  assert combines and all(is_kahan(body) == compensated for _, body in combines), src

def lazy_reduces(out: LazyBuffer) -> list[LazyBuffer]:
  found, stack, seen = [], [out], set()
  while stack:
    lb = stack.pop().base
    if id(lb) in seen: continue
    seen.add(id(lb))
    if lb.op is Ops.REDUCE_AXIS: found.append(lb)
    stack.extend(lb.srcs)
  return found

def test_split_reduce_marks_its_partials(monkeypatch):
  # the split's second reduce is the one marked (arg (op, axes, True)); a reduce left whole is not
  monkeypatch.setattr(tgrad.lazy, "cpu_count", lambda: 2)
  x = LazyBuffer.const_of(1.0, dtypes.float32, "LLVM", (256, 1 << 16))
  partials_sum, chunk_sums = lazy_reduces(x.r(Ops.ADD, (0, 1)))   # outermost first
  assert partials_sum.arg[2:] == (True,) and len(chunk_sums.arg) == 2, (partials_sum.arg, chunk_sums.arg)
  (whole,) = lazy_reduces(x.r(Ops.ADD, (0,)))   # 65,536 outputs: no split
  assert whole.arg == (Ops.ADD, (0,))

@pytest.mark.parametrize("parts", [1, 256])
def test_sums_of_ones_past_2_24_are_exact(parts, monkeypatch):
  # 256 partials of ODD ones each (the split) or one kernel: 256·ODD exactly either way, with the LLVM heuristics
  monkeypatch.setattr(tgrad.lazy, "cpu_count", lambda: 2)
  if parts == 1: monkeypatch.setattr(tgrad.lazy, "SPLIT_REDUCE_MIN_INPUTS", 1 << 62)
  assert Tensor.ones(256 * ODD, device="LLVM").sum().item() == 256.0 * ODD
  assert Tensor.ones(1_600_000_000, device="LLVM").sum().item() == 1.6e9
