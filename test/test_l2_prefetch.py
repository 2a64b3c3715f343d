"""L2 prefetch before a dependent launch's wait (tgrad/runtime/cuda/prefetch.py), without a GPU.

The interval each block prefetches is checked against the elements its loads really read: every always-run load's
index is evaluated (numpy, here) over every value of the thread and loop indices for a few block indices, and the
emitted bounds must be exactly that set's least and greatest element, inside the buffer's real size (the
ScheduleItem's Buffer). On gemma-3-270m's decode step (bench/decode_kernels.py, scheduled for CUDA without a GPU)
every kernel that reads a weight of 512 KiB or more prefetches one, and the packed (ggml block) matvecs do too. The
CUDA-on-CPU emulator (test/cuda_on_cpu.py) runs sm_90 kernels with the prefetch: the values are numpy's, and the
lines prefetched over the whole grid are exactly the weight's lines. NVRTC compiles the sources for sm_90.
"""
import os
import sys
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.linearizer import linearize
from tgrad.dtype import dtypes
from tgrad.helpers import Context, settings_key
from tgrad.nn.quant import GGMLType, QuantizedTensor
from tgrad.ops import Ops, UOp
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.runtime.cuda.prefetch import (PREFETCH_INSTRUCTION, PREFETCH_LINE_BYTES, BlockPrefetch, _split_index,
                                         always_run_loads, block_prefetch)
from tgrad.runtime.cuda.renderer import CUDARenderer, DEPENDENT_LAUNCH_PROLOGUE
from tgrad.schedule import create_schedule
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "unit"))
from cuda_on_cpu import cpu_available, run_on_cpu  # noqa: E402
from decode_kernels import decode_step_kernels  # noqa: E402
from test_packed_matvec import random_weight  # noqa: E402

ARCH = "sm_90"
WAIT = DEPENDENT_LAUNCH_PROLOGUE[0]
WEIGHT_BYTES = 512 * 1024   # a decode kernel reading an input this big is a matvec over a weight
needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
needs_gxx = pytest.mark.skipif(not cpu_available(), reason="g++ not found")

# ---- index math evaluated in numpy, as C evaluates it (division truncates)

def _c_div(a, b): return np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))

_NUMPY_OPS = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal,
              Ops.IDIV: _c_div, Ops.MOD: lambda a, b: a - b * _c_div(a, b)}

def evaluate(roots: list[UOp], env: dict) -> list[np.ndarray]:
  """The values of index math `roots` with each symbol (SPECIAL, RANGE, DEFINE_VAR) from `env` (broadcasting
  arrays), shared parts computed once."""
  values: dict[UOp, np.ndarray] = {}
  for x in UOp(Ops.SINK, dtypes.void, tuple(roots)).toposort()[:-1]:
    if x in env: values[x] = np.asarray(env[x], np.int64)
    elif x.op is Ops.CONST: values[x] = np.asarray(x.arg)
    elif x.op in _NUMPY_OPS: values[x] = _NUMPY_OPS[x.op](*(values[s] for s in x.src))
    elif x.op is Ops.WHERE: values[x] = np.where(*(values[s] for s in x.src))
    else: raise AssertionError(f"{x.op} in a prefetched index")
  return [values[root] for root in roots]

def thread_grid(uops: list[UOp]) -> dict:
  """Every thread and loop index (lidx SPECIALs, RANGEs) as an array broadcast over its own axis: all their value
  combinations at once."""
  symbols = [u for u in uops if (u.op is Ops.SPECIAL and u.arg[0].startswith("lidx")) or u.op is Ops.RANGE]
  env = {}
  for axis, s in enumerate(symbols):
    shape = [1] * len(symbols)
    shape[axis] = s.vmax - s.vmin + 1
    env[s] = np.arange(s.vmin, s.vmax + 1).reshape(shape)
  return env

def read_elements(uops: list[UOp], buffer: UOp, block: dict) -> np.ndarray:
  """The elements of `buffer` the always-run loads read in the block at `block` (gidx SPECIAL → value)."""
  indices = [u.src[1] for u in always_run_loads(uops) if u.src[0] is buffer]
  return np.unique(np.concatenate([np.reshape(v, -1) for v in evaluate(indices, {**thread_grid(uops), **block})]))

def check_interval(uops: list[UOp], plan: BlockPrefetch, buffer_bytes: int, variables: dict = {}) -> None:
  """For the first, second and last block: each of the plan's ranges holds elements read, its bounds are the least and
  greatest element read inside it, and every element read is in one of them; all lie inside the buffer; the block
  reads at least 1/4 of the ranges' elements."""
  specials = [u for u in uops if u.op is Ops.SPECIAL and u.arg[0].startswith("gidx")]
  sizes = [s.arg[1] if isinstance(s.arg[1], int) else s.arg[1].vmax for s in specials]
  for corner in ({s: 0 for s in specials}, {s: min(1, n - 1) for s, n in zip(specials, sizes)},
                 {s: n - 1 for s, n in zip(specials, sizes)}):
    block = {**corner, **variables}
    elements = read_elements(uops, plan.buffer, block)
    first = int(evaluate([plan.first], block)[0])
    inside = np.zeros(len(elements), bool)
    for lo, hi in plan.ranges:
      mine = elements[(elements >= first + lo) & (elements <= first + hi)]
      assert len(mine) and (first + lo, first + hi) == (mine.min(), mine.max()), (corner, plan)
      inside |= (elements >= first + lo) & (elements <= first + hi)
    assert inside.all(), (corner, plan)
    assert 0 <= (first + plan.low) * plan.itemsize and (first + plan.high + 1) * plan.itemsize <= buffer_bytes
    assert len(elements) * 4 >= plan.elements

def prefetch_precedes_wait(source: str) -> bool:
  body = source[source.index("__global__"):]
  return PREFETCH_INSTRUCTION in body and body.index(PREFETCH_INSTRUCTION) < body.index(WAIT)

# ---- gemma-3-270m's decode step

@pytest.fixture(scope="module")
def decode_kernels():
  """(ScheduleItem, linear uops, sm_90 source) of each distinct kernel of one decode step, float16 and packed (the
  GGUF layout's Q4_K, Q5_0, Q6_K and Q8_0 projections)."""
  distinct = {}
  for packed in (False, True):
    for item in decode_step_kernels("270m", "CUDA", "float16", position=600, packed=packed):
      if item.ast.op is Ops.SINK: distinct.setdefault(item.ast.key, item)   # (flash decoding is a custom kernel)
  out = []
  for item in distinct.values():
    kernel = Kernel(item.ast, CUDARenderer(ARCH))
    hand_coded_optimizations(kernel)
    uops = linearize(kernel)
    out.append((item, uops, kernel.renderer.render("decode", uops)))
  return out

def test_decode_weights_are_prefetched_before_the_wait(decode_kernels):
  """Every decode kernel reading an input of 512 KiB or more (the matvecs: projections, MLP, the 335 MB head) prefetches
  one such input, before the wait; only attention's KV-cache reads, a loop over the filled slots (a symbolic count),
  and gathers (an index loaded from memory) don't: a packed Q6_K down projection too, whose threads take lidx % 4
  of a 32-lane axis (a MOD over whole periods). The per-block intervals are exact."""
  prefetched = planar = 0
  for item, uops, source in decode_kernels:
    plan = block_prefetch(uops)
    weight_loads = [u for u in uops if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL and
                    item.bufs[u.src[0].arg].nbytes >= WEIGHT_BYTES]
    reads_weight = any(not any(x.op is Ops.LOAD for x in u.src[1].toposort()) for u in weight_loads)
    symbolic_loop = any(u.op is Ops.RANGE and u.src[1].op is not Ops.CONST for u in uops)
    if reads_weight and not symbolic_loop and planar_parts(weight_loads):
      assert plan is None or item.bufs[plan.buffer.arg].nbytes < WEIGHT_BYTES, item   # x at most: see planar_parts
      planar += 1
    elif reads_weight and not symbolic_loop:
      assert plan is not None and item.bufs[plan.buffer.arg].nbytes >= WEIGHT_BYTES, item
      prefetched += 1
    if plan is None:
      assert PREFETCH_INSTRUCTION not in source
      continue
    assert prefetch_precedes_wait(source) and source.count(WAIT) == 1
    variables = {u: item.var_vals[u.arg[0]] for u in uops if u.op is Ops.DEFINE_VAR}
    check_interval(uops, plan, item.bufs[plan.buffer.arg].nbytes, variables)
  assert prefetched >= 16   # q/k/v, o, gate/up, down projections of both layer kinds, the head; dense and packed
  assert planar == 1        # the packed step's tied head (Q8_0, held planar on a GPU)

def planar_parts(loads: list[UOp]) -> bool:
  """Whether a weight's loads read it in parts whose offsets differ from block to block (a planar weight's quants and
  scales, nn/quant.py): no one interval a block reads, so no weight prefetch (prefetch.py). Measured on an H200, the
  planar head (262144×640 Q8_0) with both planes prefetched by hand: 59.4 µs a launch against 50.1 without."""
  parts = [split[0] for u in loads if (split := _split_index(u.src[1])) is not None]
  return any(part != parts[0] for part in parts)

@needs_nvrtc
def test_nvrtc_compiles_prefetching_decode_kernels(decode_kernels):
  for _, uops, source in decode_kernels[:6]:
    if block_prefetch(uops) is not None: assert compile_cuda(source, ARCH)

def render(out: Tensor, arch: str = ARCH) -> tuple[object, list[UOp], str, Kernel]:
  (item,) = [i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, CUDARenderer(arch))
  hand_coded_optimizations(kernel)
  uops = linearize(kernel)
  return item, uops, kernel.renderer.render("kernel", uops), kernel

def matvec(rows: int, columns: int, dtype=np.float16) -> Tensor:
  rng = np.random.default_rng(rows)
  x = Tensor(rng.standard_normal((1, columns)).astype(dtype), device="LLVM").realize()
  w = Tensor(rng.standard_normal((rows, columns)).astype(dtype), device="LLVM").realize()
  return x @ w.T

@pytest.mark.parametrize("arch,pdl,prefetch", [(ARCH, 1, 0), (ARCH, 0, 1), ("sm_89", 1, 1)])
def test_no_prefetch_when_off_without_pdl_or_before_hopper(arch, pdl, prefetch):
  with Context(PDL=pdl, PDL_PREFETCH=prefetch): _, _, source, _ = render(matvec(64, 256), arch)
  assert PREFETCH_INSTRUCTION not in source

def test_pdl_prefetch_is_a_code_setting():
  with Context(PDL_PREFETCH=0): off = settings_key()
  with Context(PDL_PREFETCH=1): on = settings_key()
  assert off != on

def test_strided_and_gathered_reads():
  """A column sum reads its block's columns with a row stride: prefetched only where the block reads at least 1/4 of
  its interval (check_interval), exactly. A gather's row index is loaded (after the wait), so its table is never
  prefetched."""
  rng = np.random.default_rng(0)
  for columns in (96, 4096):
    w = Tensor(rng.standard_normal((64, columns)).astype(np.float32), device="LLVM")
    item, uops, _, _ = render((w * 2).sum(axis=0))
    if (plan := block_prefetch(uops)) is not None: check_interval(uops, plan, item.bufs[plan.buffer.arg].nbytes)
  table = Tensor(rng.standard_normal((1000, 64)).astype(np.float32), device="LLVM")
  index = Tensor(np.array([3, 999, 0], np.int32), device="LLVM")
  item, uops, _, _ = render(table[index] * 1)
  plan = block_prefetch(uops)
  assert plan is None or item.bufs[plan.buffer.arg].nbytes < 1000 * 64 * 4

# ---- run on the CPU

def emulate(out: Tensor, reference: np.ndarray, rtol: float) -> None:
  """The kernel of `out` for sm_90 (prefetch on), run on the CPU: values against `reference`, and the lines its
  prefetches named over the whole grid are exactly the lines of its prefetched buffer (a matvec reads all of it)."""
  item, uops, source, kernel = render(out)
  plan = block_prefetch(uops)
  assert plan is not None and prefetch_precedes_wait(source)
  check_interval(uops, plan, item.bufs[plan.buffer.arg].nbytes)
  global_size, local_size = kernel.launch_dims()
  result = np.full(item.bufs[0].size, np.nan, item.bufs[0].dtype.np)
  buffers = [result] + [b.copyout() for b in item.inputs]
  addresses = run_on_cpu(source, "kernel", global_size, local_size, buffers,
                         [item.var_vals[name] for name in sorted(item.var_vals)])
  np.testing.assert_allclose(result.astype(np.float64).reshape(reference.shape), reference, rtol=rtol,
                             atol=rtol * np.abs(reference).max())
  prefetched = buffers[plan.buffer.arg]
  base = prefetched.ctypes.data
  lines = {address & ~(PREFETCH_LINE_BYTES - 1) for address in range(base, base + prefetched.nbytes)}
  assert set(addresses) == lines

@needs_gxx
@pytest.mark.parametrize("rows,columns,dtype", [(24, 640, np.float16), (7, 257, np.float32)], ids=str)
def test_dense_matvec_on_emulated_cuda(rows, columns, dtype):
  out = matvec(rows, columns, dtype)
  rng = np.random.default_rng(rows)
  x, w = rng.standard_normal((1, columns)).astype(dtype), rng.standard_normal((rows, columns)).astype(dtype)
  emulate(out, x.astype(np.float64) @ w.astype(np.float64).T, 8 * 2.0 ** -11 if dtype == np.float16 else 1e-4)

@needs_gxx
@pytest.mark.parametrize("ggml_type,rows,columns", [(GGMLType.Q8_0, 37, 96), (GGMLType.Q4_K, 6, 1024)], ids=str)
def test_packed_matvec_on_emulated_cuda(ggml_type, rows, columns):
  raw = random_weight(ggml_type, rows, columns, seed=rows + columns)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "LLVM").realize()
  x = np.random.default_rng(1).standard_normal((1, columns)).astype(np.float32)
  reference = x.astype(np.float16).astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
  emulate(weight.linear(Tensor(x, device="LLVM").cast(dtypes.float16).realize()), reference, 8 * 2.0 ** -11)
