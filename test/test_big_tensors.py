"""Tensors past 2^31 elements: 64-bit sizes, strides, offsets, loop bounds and reduce counts, on LLVM and CUDA.

Tests marked `big` allocate a uint8 buffer of 2^31 + 64 elements (2 GiB, and one 2 GiB copy at a time) or compute
over that many positions without memory (arange, expanded constants). They run in CI, one at a time across xdist
workers (a file lock), so a 2-core job with ~7 GB free holds them. Values are checked at sampled positions (the first,
around 2^31, the last) against closed forms; nothing large is copied back to the host. The same ops run on a GPU in
the tests marked `gpu`. Without a GPU, the CUDA code of kernels over more than 2^31 elements is still rendered and
compiled with NVRTC, and its index math is checked: 64-bit where values pass 2^31, 32-bit where the bounds fit.
Float32 sums over huge axes accumulate in blocks (reduces.ACCUMULATE_BLOCK) and are checked against float64.
"""
import fcntl, os, re, tempfile
import numpy as np
import pytest
import tgrad.lazy
from tgrad import Tensor
from tgrad.dtype import dtypes
from tgrad.ops import Ops
from tgrad.lazy import LazyBuffer
from tgrad.schedule import create_schedule
from tgrad.device import Buffer, Device
from tgrad.realize import compile_kernel
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.reduces import ACCUMULATE_BLOCK, BLOCK_LOOP_ARG
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.cuda.renderer import CUDARenderer, CUDA_MAX_GRID
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available

BIG = (1 << 31) + 64        # elements: past the int32 range, and even (the CPU's THREAD opt splits it in two)
RESIDUE = 251               # the big buffer holds i % RESIDUE at position i: every sampled value says where it was read
SAMPLES = (0, 1, (1 << 31) - 3, 1 << 31, (1 << 31) + 1, BIG - 2, BIG - 1)
LOCK_PATH = os.path.join(tempfile.gettempdir(), "tgrad-big-tensor-tests.lock")

class _MemoryLock:
  """One big test at a time across the xdist workers of a run (an flock), re-entrant within a process."""
  depth, handle = 0, None
  def __enter__(self):
    if _MemoryLock.depth == 0:
      _MemoryLock.handle = open(LOCK_PATH, "w")
      fcntl.flock(_MemoryLock.handle, fcntl.LOCK_EX)
    _MemoryLock.depth += 1
  def __exit__(self, *exc):
    _MemoryLock.depth -= 1
    if _MemoryLock.depth == 0 and _MemoryLock.handle is not None:
      fcntl.flock(_MemoryLock.handle, fcntl.LOCK_UN)
      _MemoryLock.handle.close()
      _MemoryLock.handle = None

@pytest.fixture
def one_at_a_time():
  with _MemoryLock(): yield

@pytest.fixture
def no_split_reduce(monkeypatch):
  """Reduces stay one kernel (no _split_reduce into partials): each accumulator loops over the whole axis."""
  monkeypatch.setattr(tgrad.lazy, "SPLIT_REDUCE_MIN_INPUTS", 1 << 62)

def residues(device: str) -> Tensor:
  """BIG uint8 values i % RESIDUE, realized: one kernel writing 2^31 + 64 bytes from 64-bit positions."""
  return (Tensor.arange(BIG, dtype=dtypes.int64, device=device) % RESIDUE).cast(dtypes.uint8).realize()

def expected_residues(positions) -> np.ndarray:
  return (np.asarray(positions, dtype=np.int64) % RESIDUE).astype(np.uint8)

def residue_sum(n: int) -> int:
  """Σ (i % RESIDUE) for i < n."""
  whole, rest = divmod(n, RESIDUE)
  return whole * (RESIDUE * (RESIDUE - 1) // 2) + rest * (rest - 1) // 2

def sample(x: Tensor, positions=SAMPLES) -> np.ndarray:
  """x's elements at a few flat positions, each read by a small kernel through a shrunk view (an offset past 2^31)."""
  return np.concatenate([x[p:p + 1].numpy() for p in positions])

# ---------------------------------------------------------------------------------------------------------------
# over 2^31 elements on a device: copy, sum, strided views, a reduce over a long axis

@pytest.fixture(scope="module")
def llvm_residues():
  with _MemoryLock():
    yield residues("LLVM")

def check_copy(x: Tensor):
  np.testing.assert_array_equal(sample(x), expected_residues(SAMPLES))
  reversed_copy = x.flip(0).contiguous().realize()   # reads run from BIG - 1 down: negative strides past 2^31
  np.testing.assert_array_equal(sample(reversed_copy), expected_residues([BIG - 1 - p for p in SAMPLES]))

def check_sum(x: Tensor):
  total = x.sum()
  assert total.dtype == dtypes.uint64 and total.item() == residue_sum(BIG)
  halves = x.reshape(2, BIG // 2).sum(1).numpy()   # two outputs, each a reduce whose inputs start at 0 and 2^30+32
  np.testing.assert_array_equal(halves, [residue_sum(BIG // 2), residue_sum(BIG) - residue_sum(BIG // 2)])

def check_strided_views(x: Tensor):
  boundary = 1 << 31
  np.testing.assert_array_equal(x[boundary - 8:boundary + 8].numpy(), expected_residues(range(boundary - 8,
                                                                                               boundary + 8)))
  step = (1 << 20) + 7   # a stride that lands on both sides of 2^31 and on odd residues
  np.testing.assert_array_equal(x[::step].numpy(), expected_residues(range(0, BIG, step)))
  rows, columns = 64, BIG // 64   # a transposed view: element (c, r) sits at r·columns + c, up to BIG - 1
  tail = x.reshape(rows, columns).permute(1, 0)[columns - 2:].numpy()
  np.testing.assert_array_equal(tail, expected_residues(np.arange(rows)[None, :] * columns +
                                                        np.arange(columns - 2, columns)[:, None]))
  np.testing.assert_array_equal(x.flip(0)[:5].numpy(), expected_residues(range(BIG - 1, BIG - 6, -1)))
  padded = x[BIG - 4:].pad(((2, 3),)).numpy()   # a mask right at the end of the buffer
  np.testing.assert_array_equal(padded, np.concatenate([[0, 0], expected_residues(range(BIG - 4, BIG)), [0, 0, 0]]))

def check_long_reduces(device: str):
  # one accumulator loops over more than 2^31 positions (no memory: arange), in int64 and in float32
  positions = Tensor.arange(BIG, dtype=dtypes.int64, device=device)
  assert (positions % 3).sum().item() == (BIG // 3) * 3 + (BIG % 3) * (BIG % 3 - 1) // 2
  assert (positions % 2).cast(dtypes.float32).sum().item() == np.float32(BIG // 2)   # blocked: ones stay exact
  ones = Tensor.ones(4, 1 << 31, device=device).sum(1).numpy()
  np.testing.assert_array_equal(ones, np.full(4, 2.0 ** 31, np.float32))
  assert Tensor.ones(BIG, dtype=dtypes.uint8, device=device).sum().item() == BIG
  found = (positions == BIG - 2).argmax()   # an index past 2^31: argmax counts in int64 on such an axis
  assert found.dtype == dtypes.int64 and found.item() == BIG - 2

@pytest.mark.big
def test_copy_past_2_31(llvm_residues):
  check_copy(llvm_residues)

@pytest.mark.big
def test_sum_past_2_31(llvm_residues):
  check_sum(llvm_residues)

@pytest.mark.big
def test_strided_views_across_2_31(llvm_residues):
  check_strided_views(llvm_residues)

@pytest.mark.big
def test_reduce_over_an_axis_past_2_31(one_at_a_time, no_split_reduce):
  check_long_reduces("LLVM")

@pytest.mark.big
@pytest.mark.gpu
def test_cuda_past_2_31(one_at_a_time):
  x = residues("CUDA")
  check_copy(x)
  check_sum(x)
  check_strided_views(x)

@pytest.mark.big
@pytest.mark.gpu
def test_cuda_reduce_over_an_axis_past_2_31(one_at_a_time, no_split_reduce):
  check_long_reduces("CUDA")

# ---------------------------------------------------------------------------------------------------------------
# sums of expanded constants (no memory) and float32 accuracy

@pytest.mark.parametrize("device", ["LLVM", pytest.param("CUDA", marks=pytest.mark.gpu)])
def test_sums_of_huge_expanded_constants(device):
  # a reduce of a value its loops don't change is value × trips: exact, and no 2^40-iteration loop
  assert Tensor.ones(1 << 40, device=device).sum().item() == 2.0 ** 40
  assert Tensor.ones(1_600_000_000, device=device).sum().item() == 1.6e9
  assert Tensor.full((3, 1 << 33), 2, dtype=dtypes.int32, device=device).sum(1).tolist() == [1 << 34] * 3   # int64
  assert Tensor.ones(1 << 33, dtype=dtypes.uint8, device=device).sum().item() == 1 << 33                     # uint64
  assert Tensor.full((1 << 34,), -3.5, device=device).max().item() == -3.5

ACCURACY_SIZE = 10_000_019   # prime: no split into partials divides it, so one kernel sums all of it
FLOAT32_SUM_RTOL = 2e-6      # blocked: ~5e-7 measured; one running float32 sum of these values is off by ~1e-4

@pytest.mark.parametrize("device", ["LLVM", pytest.param("CUDA", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("split", [True, False], ids=["split", "one_kernel"])
def test_float32_sum_of_ten_million_random_values(device, split, monkeypatch):
  if not split: monkeypatch.setattr(tgrad.lazy, "SPLIT_REDUCE_MIN_INPUTS", 1 << 62)
  values = np.random.default_rng(7).random(ACCURACY_SIZE, dtype=np.float32) * 2 - 0.5
  expected = values.astype(np.float64).sum()
  got = Tensor(values, device=device).sum().item()
  assert abs(got - expected) <= FLOAT32_SUM_RTOL * abs(expected), (got, expected)
  rows = values[:ACCURACY_SIZE - 19].reshape(4, -1)   # 4 outputs of 2.5M: one accumulator each, no split on a CPU
  np.testing.assert_allclose(Tensor(rows, device=device).sum(1).numpy(), rows.astype(np.float64).sum(1),
                             rtol=FLOAT32_SUM_RTOL)

def test_float32_sum_of_many_alternating_values():
  # 0, 1, 0, 1, … over 1.6e9 positions (no memory): a single running float32 sum would stop at 2^24
  assert (Tensor.arange(1_600_000_000, device="LLVM") % 2).cast(dtypes.float32).sum().item() == 8e8

def _linear_program(out: LazyBuffer, renderer=None) -> list:
  (item,) = [i for i in create_schedule([out]) if i.ast.op is Ops.SINK]
  return linearize(Kernel(item.ast, renderer or CUDARenderer()))

def test_blocked_accumulation_structure(monkeypatch):
  # a float sum over more than ACCUMULATE_BLOCK values: a loop over blocks with a Kahan total (2 accumulators) around
  # the block's loop; an int sum, a max and a sum within the limit keep one loop and one accumulator
  monkeypatch.setattr(tgrad.lazy, "SPLIT_REDUCE_MIN_INPUTS", 1 << 62)
  def loops_and_accumulators(dtype, op: Ops, length: int) -> tuple[int, int]:
    x = LazyBuffer.loadop(Ops.ARANGE, (2, length), dtypes.int32, "LLVM").cast(dtype)
    uops = _linear_program(x.r(op, (1,)))
    block_loops = [u for u in uops if u.op is Ops.RANGE and u.arg >= BLOCK_LOOP_ARG]
    return len(block_loops), sum(1 for u in uops if u.op is Ops.DEFINE_ACC)
  assert loops_and_accumulators(dtypes.float32, Ops.ADD, 3 * ACCUMULATE_BLOCK) == (1, 3)
  assert loops_and_accumulators(dtypes.float32, Ops.ADD, 3 * ACCUMULATE_BLOCK + 1) == (1, 3)   # a block's end: min
  assert loops_and_accumulators(dtypes.int64, Ops.ADD, 3 * ACCUMULATE_BLOCK) == (0, 1)
  assert loops_and_accumulators(dtypes.float32, Ops.MAX, 3 * ACCUMULATE_BLOCK) == (0, 1)
  assert loops_and_accumulators(dtypes.float32, Ops.ADD, ACCUMULATE_BLOCK) == (0, 1)

def test_blocked_sum_with_several_accumulators_stays_accurate(no_split_reduce):   # one kernel on any core count
  # four upcast accumulators: LLVM may not reorder their sums (one vector lane each), so without blocks each would add
  # 2^26 values of 0, 1, 2 in sequence and stall past 2^25 (where the float32 spacing is 4); blocked, all stay close
  rows = 1 << 26
  positions = LazyBuffer.loadop(Ops.ARANGE, (rows, 4), dtypes.int32, "LLVM")
  columns = positions.alu(Ops.MOD, positions.const(3)).cast(dtypes.float32).r(Ops.ADD, (0,))
  (item,) = [i for i in create_schedule([columns]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, Device["LLVM"].renderer)
  kernel.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  out = Buffer("LLVM", 4, dtypes.float32)
  compile_kernel("LLVM", kernel)([out])
  exact = [sum(((4 * r + c) % 3) for r in range(3)) * (rows // 3) + sum((4 * r + c) % 3 for r in range(rows % 3))
           for c in range(4)]
  np.testing.assert_allclose(out.copyout(), exact, rtol=1e-6)

@pytest.mark.parametrize("length", [3 * ACCUMULATE_BLOCK + 5, 2 * 3 * 5 * 7 * 11 * 13 * 17])
def test_blocked_sums_match_numpy(length, monkeypatch):
  # blocks that divide the axis and blocks whose last one is short (a prime-ish length): every position once
  monkeypatch.setattr(tgrad.lazy, "SPLIT_REDUCE_MIN_INPUTS", 1 << 62)
  values = np.random.default_rng(length).integers(0, 32, (3, length)).astype(np.float32)   # every sum < 2^24: exact
  np.testing.assert_array_equal(Tensor(values, device="LLVM").sum(1).numpy(), values.astype(np.float64).sum(1))

# ---------------------------------------------------------------------------------------------------------------
# CUDA code for more than 2^31 elements, compiled with NVRTC (no GPU needed)

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")

def cuda_sources(out: LazyBuffer, heuristics: bool = True) -> list[tuple[Kernel, str]]:
  """(kernel, source) of each kernel of `out` for CUDA, each compiled to an sm_90 cubin by NVRTC."""
  found = []
  for item in create_schedule([out]):
    if item.ast.op is not Ops.SINK: continue
    kernel = Kernel(item.ast, CUDARenderer())
    if heuristics: hand_coded_optimizations(kernel)
    src = kernel.renderer.render("big_kernel", linearize(kernel))
    assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
    found.append((kernel, src))
  return found

def declared(src: str, ctype: str) -> list[str]:
  """The right-hand sides of the `ctype name = ...;` declarations in src."""
  return re.findall(rf"^\s*{ctype} \w+ = (.*);$", src, re.MULTILINE)

def assert_fits_grid(kernel: Kernel):
  global_size, local_size = kernel.launch_dims()
  assert all(g <= limit for g, limit in zip(global_size, CUDA_MAX_GRID)) and len(global_size) <= 3, global_size

@needs_nvrtc
@pytest.mark.parametrize("heuristics", [True, False], ids=["heuristics", "no_opts"])
def test_cuda_index_math_past_2_31(heuristics):
  positions = LazyBuffer.loadop(Ops.ARANGE, (BIG,), dtypes.int64, "LLVM")
  out = positions.alu(Ops.MOD, positions.const(RESIDUE)).cast(dtypes.uint8).contiguous()
  ((kernel, src),) = cuda_sources(out, heuristics)
  assert_fits_grid(kernel)
  # the flat position passes 2^31: it is long long, computed from 32-bit thread ids widened before the math
  wide = declared(src, "long long")
  assert wide and any("(long long)" in rhs for rhs in wide), src
  # thread ids and products the bounds keep below 2^31 stay int; no thread id is ever long long
  assert re.search(r"const int gidx0 = blockIdx\.x;", src) and not re.search(r"long long \w+ = (blockIdx|threadIdx)",
                                                                           src)
  if heuristics: assert any(re.fullmatch(r"\(gidx0 \* \d+\)", rhs) for rhs in declared(src, "int")), src

@needs_nvrtc
def test_cuda_strided_view_and_small_kernels_past_2_31():
  buffer = LazyBuffer.from_host(np.zeros(64, np.uint8), "LLVM").reshape((64, 1)).expand((64, BIG // 64))
  # a transposed view of a (64, BIG/64) uint8 tensor: reads at r·(BIG/64) + c pass 2^31
  ((kernel, src),) = cuda_sources(buffer.contiguous().permute((1, 0)).contiguous())[-1:]
  assert declared(src, "long long"), src
  # a kernel whose every index fits 32 bits has no 64-bit math at all
  small = LazyBuffer.from_host(np.zeros((64, 300), np.float32), "LLVM")
  ((_, small_src),) = cuda_sources(small.permute((1, 0)).alu(Ops.ADD, small.permute((1, 0))).r(Ops.ADD, (1,)))
  # (the L2 prefetch before a dependent launch's wait computes its byte addresses in 64 bits: not index math)
  small_src = re.sub(r"\{  // L2 prefetch.*?\n  \}\n", "", small_src, flags=re.S)
  assert "long long" not in small_src and not re.search(r"\b\d+ll\b", small_src), small_src

@needs_nvrtc
@pytest.mark.parametrize("shape", [(1 << 33,), ((1 << 31) + 11,), (1 << 20, 1 << 20)], ids=str)
def test_cuda_grid_fits_any_size(shape):
  # a global axis past gridDim.x's 2^31 - 1 is split (padded when nothing divides it) so launch dims fit the grid
  positions = LazyBuffer.loadop(Ops.ARANGE, shape, dtypes.int64, "LLVM").cast(dtypes.uint8).contiguous()
  for heuristics in (False, True):
    ((kernel, src),) = cuda_sources(positions, heuristics)
    assert_fits_grid(kernel)
    launched = np.prod(kernel.launch_dims()[0], dtype=object) * np.prod(kernel.launch_dims()[1], dtype=object)
    assert launched * kernel.upcast_size >= np.prod(shape, dtype=object), (kernel.full_shape, kernel.launch_dims())
    if any(s % 2 for s in shape): assert "if (" in src, "padded positions must not store"

@needs_nvrtc
def test_cuda_blocked_and_folded_sums_compile(no_split_reduce):   # 4 outputs split on a CPU of more cores
  ones = LazyBuffer.const_of(1.0, dtypes.float32, "LLVM", (4, 1 << 31))
  ((_, folded),) = cuda_sources(ones.r(Ops.ADD, (1,)))
  # a sum of a constant is value × trips: what loops are left (over a GROUP's partials) are short
  assert all(int(bound) <= 1024 for bound in re.findall(r"ridx\d+ < (\d+)", folded)), folded
  positions = LazyBuffer.loadop(Ops.ARANGE, (4, 1 << 31), dtypes.int64, "LLVM").cast(dtypes.float32)
  ((_, blocked),) = cuda_sources(positions.r(Ops.ADD, (1,)))
  assert any(re.search(rf"for \(int ridx{BLOCK_LOOP_ARG + axis} = 0;", blocked) for axis in range(4)), blocked

@needs_nvrtc
@pytest.mark.parametrize("maximum,ctype", [(4096, "int"), (1 << 40, "long long")])
def test_cuda_variables_are_64_bit_parameters(maximum, ctype):
  # a symbolic size arrives as a 64-bit kernel parameter (the runtime packs "q") and is narrowed where its bounds fit
  from tgrad.ops import UOp
  buffer = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
  thread = UOp(Ops.SPECIAL, dtypes.index, (), ("gidx0", 1024))
  position = UOp.variable("pos", 1, maximum)
  index = thread * position
  uops = [buffer, thread, position, UOp.const(dtypes.index, 1024), index,
          UOp(Ops.STORE, dtypes.void, (buffer, index, UOp.const(dtypes.float32, 1.0)))]
  src = CUDARenderer().render("variable_kernel", uops)
  assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
  assert "long long pos_arg" in src and f"const {ctype} pos = ({ctype})pos_arg;" in src, src
