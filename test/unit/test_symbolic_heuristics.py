"""The GPU heuristics for kernels with symbolic sizes (tgrad/codegen/heuristics.py `_symbolic_rules`).

Without a GPU: the opts `hand_coded_optimizations` chooses on the CUDA renderer for gemma-3-270m's symbolic kernels
(a prefill matmul whose rows are the prompt length, decode attention's softmax·values over the filled cache slots, a
softmax over a symbolic row, the prefill's attention scores with both axes symbolic), rendered and compiled by NVRTC;
the same opts' values at several bound values (1, 7, 64, 100, 1000) against numpy: the whole CUDA kernel run on the CPU
(test/cuda_on_cpu.py: g++, a thread per CUDA thread), and its UPCAST/UNROLL opts on LLVM. With a GPU (marked `gpu`):
the heuristic kernels on CUDA at the same values against numpy, on poisoned outputs. Guarded GROUPs of every kind of
reduce over a symbolic axis (sum, max, min, logsumexp, softmax, var, argmax), run on the CPU against numpy.
"""
from __future__ import annotations
import math, re
import numpy as np
import pytest
from tgrad import Tensor, Variable, dtypes
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.compile import compile_kernel
from tgrad.device import Buffer, Device
from tgrad.models.gemma3 import decode_attention_values
from tgrad.ops import Ops
from tgrad.helpers import cpu_count
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.schedule import ScheduleItem, create_schedule
from tgrad.shape.sint import evaluate
from cuda_on_cpu import CPU_ARCH, TENSOR_CORE_ARCH, cpu_available, run_on_cpu

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
needs_cpu_compiler = pytest.mark.skipif(not cpu_available(), reason="g++ not found")
ARCH = "sm_90"
VALUES = (1, 7, 64, 100, 1000)   # bound values the kernels are checked at
BOUND = 1024                     # the variables' maximum
RTOL = 1e-4

def opts_of(*spec) -> list[Opt]: return [Opt(OptOps[op], axis, amount) for op, axis, amount in spec]

def single_kernel(out: Tensor) -> ScheduleItem:
  (item,) = [i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK]
  return item

def heuristic_kernel(item: ScheduleItem, renderer) -> Kernel:
  kernel = Kernel(item.ast, renderer)
  hand_coded_optimizations(kernel)
  return kernel

# ---- the kernels: numpy inputs, the tgrad graph at a bound value, the float64 reference at a value

class Problem:
  """A symbolic kernel and its inputs: `build(bound)` is the output tensor for a bound variable, `reference(value)` the
  float64 result at that value (flattened, as the output buffer holds it)."""
  variable_name = "n"
  def __init__(self, seed: int):
    self.rng = np.random.default_rng(seed)
    self.variable = Variable(self.variable_name, 1, BOUND)
  def item(self, value: int = 5) -> ScheduleItem: return single_kernel(self.build(self.variable.bind(value)))

class Matmul(Problem):
  """y = x[:n] · Wᵀ (a prefill projection: n the prompt length, W[N, K] as gemma3's Linear), in float32 or a half
  type (the inputs rounded to it; the reference multiplies the rounded values in float64)."""
  def __init__(self, columns: int, depth: int, seed: int = 0, dtype=dtypes.float32):
    super().__init__(seed)
    x = self.rng.standard_normal((BOUND, depth), dtype=np.float32)
    w = (self.rng.standard_normal((columns, depth), dtype=np.float32) / math.sqrt(depth)).astype(np.float32)
    self.tx, self.tw = (Tensor(a, device="LLVM").cast(dtype).realize() for a in (x, w))
    self.x, self.w = (t.float().numpy() for t in (self.tx, self.tw))
  def build(self, bound) -> Tensor: return self.tx[:bound] @ self.tw.T
  def reference(self, value: int) -> np.ndarray:
    return (self.x[:value].astype(np.float64) @ self.w.T.astype(np.float64)).reshape(-1)

class DecodeAttention(Problem):
  """softmax(scores[..., :n]) · values[:n] for one query token of 4 heads sharing one value head of 256 (gemma3's
  decode over the filled cache slots: gemma3.decode_attention_values over a symbolic key count)."""
  variable_name = "filled"
  HEADS, HEAD_DIM = 4, 256
  def __init__(self, seed: int = 0, dtype=dtypes.float32):
    super().__init__(seed)
    self.scores = 3 * self.rng.standard_normal((1, 1, self.HEADS, 1, BOUND), dtype=np.float32)
    self.values = self.rng.standard_normal((1, 1, BOUND, self.HEAD_DIM), dtype=np.float32)
    self.ts, self.tv = [Tensor(x, device="LLVM").cast(dtype).realize() for x in (self.scores, self.values)]
  def build(self, bound) -> Tensor:
    return decode_attention_values(self.ts.shrink((None, None, None, None, (0, bound))),
                                   self.tv.shrink((None, None, (0, bound), None)))
  def reference(self, value: int) -> np.ndarray:
    s = self.scores[..., :value].astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p.reshape(self.HEADS, value) @ self.values[0, 0, :value].astype(np.float64)).reshape(-1)

class SoftmaxRows(Problem):
  """softmax over a symbolic row: x[:, :n].softmax(-1), one row kernel that stores its rows."""
  ROWS = 48
  def __init__(self, seed: int = 0):
    super().__init__(seed)
    self.x = 4 * self.rng.standard_normal((self.ROWS, BOUND), dtype=np.float32)
    self.tx = Tensor(self.x, device="LLVM").realize()
  def build(self, bound) -> Tensor: return self.tx[:, :bound].softmax(-1)
  def reference(self, value: int) -> np.ndarray:
    s = self.x[:, :value].astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)).reshape(-1)

class DecodeScores(Problem):
  """q·kᵀ of one query token: q [4, 256] (4 heads of one key head), k [n, 256] the filled cache slots: out [4, n]."""
  variable_name = "filled"
  HEADS, HEAD_DIM = 4, 256
  def __init__(self, seed: int = 0):
    super().__init__(seed)
    self.q = self.rng.standard_normal((self.HEADS, self.HEAD_DIM), dtype=np.float32)
    self.k = self.rng.standard_normal((BOUND, self.HEAD_DIM), dtype=np.float32)
    self.tq, self.tk = Tensor(self.q, device="LLVM").realize(), Tensor(self.k, device="LLVM").realize()
  def build(self, bound) -> Tensor: return self.tq @ self.tk[:bound].T
  def reference(self, value: int) -> np.ndarray:
    return (self.q.astype(np.float64) @ self.k[:value].T.astype(np.float64)).reshape(-1)

class PrefillScores(Problem):
  """q·kᵀ of a prefill: q [4, n, 256], k [n, 256] (one key head), both axes of the output symbolic."""
  HEADS, HEAD_DIM = 4, 256
  def __init__(self, seed: int = 0):
    super().__init__(seed)
    self.q = self.rng.standard_normal((self.HEADS, BOUND, self.HEAD_DIM), dtype=np.float32)
    self.k = self.rng.standard_normal((BOUND, self.HEAD_DIM), dtype=np.float32)
    self.tq, self.tk = Tensor(self.q, device="LLVM").realize(), Tensor(self.k, device="LLVM").realize()
  def build(self, bound) -> Tensor: return self.tq[:, :bound] @ self.tk[:bound].T
  def reference(self, value: int) -> np.ndarray:
    return (self.q[:, :value].astype(np.float64) @ self.k[:value].T.astype(np.float64)).reshape(-1)

# ---- the opts chosen on the CUDA renderer for gemma-3-270m's shapes, compiled by NVRTC

# a prefill matmul's staged tiles, as a big concrete matmul's: the prompt rows padded once to the block's 64 (each
# replica tests row < n; the tile copies of x are masked), 8 rows × 8 columns per thread (two float4 groups), K
# unrolled by 8, 8×16 threads, x's and W's tiles in shared memory
PREFILL_MATMUL_OPTS = opts_of(("PADTO", 0, 64), ("UPCAST", 1, 4), ("UPCAST", 0, 8), ("UNROLL", 0, 8), ("LOCAL", 0, 8),
                              ("LOCAL", 1, 16), ("UPCAST", 1, 2), ("SMEM", 0, 0), ("SMEM", 1, 0))
# half: the rows padded to 4 row tiles of 16, 8 column tiles spread before TC (adjacent columns per lane), TC, 4 row
# tiles: one warp of 64×64 outputs, as a concrete half matmul whose rows are the tiles' rows
PREFILL_TC_OPTS = opts_of(("PADTO", 0, 64), ("UPCAST", 1, 8), ("TC", 0, 0), ("UPCAST", 0, 4))

GEMMA_CHOICES = {
  "gate_up": (lambda: Matmul(4096, 640), PREFILL_MATMUL_OPTS),   # N = 2·2048, K = 640
  "down": (lambda: Matmul(640, 2048), PREFILL_MATMUL_OPTS),
  # 4 head-dim outputs per block (16 bytes of each value row), 64 threads over the filled slots: 256 blocks
  "decode_attention": (DecodeAttention, opts_of(("LOCAL", 1, 4), ("GROUP", 0, 64))),
  # a block per key: its 64 threads read the key row once (float4s) for all 4 heads (UPCAST whole)
  "decode_scores": (DecodeScores, opts_of(("UPCAST", 0, 0), ("UNROLL", 0, 4), ("GROUP", 0, 64))),
  "softmax_rows": (SoftmaxRows, opts_of(("GROUP", 0, 64))),
  # 4 keys × 4 queries per thread (both symbolic: padded to 64 and upcast with the guard), the head dim unrolled by 4,
  # 16×16 threads over queries and keys
  "prefill_scores": (PrefillScores,
                     opts_of(("PADTO", 2, 64), ("PADTO", 1, 64), ("UPCAST", 2, 4), ("UPCAST", 1, 4), ("UNROLL", 0, 4),
                             ("LOCAL", 1, 16), ("LOCAL", 2, 16))),
}

@needs_nvrtc
@pytest.mark.parametrize("name", GEMMA_CHOICES)
def test_heuristic_opts_compile(name):
  problem, expected = GEMMA_CHOICES[name]
  kernel = heuristic_kernel(problem().item(), CUDARenderer())
  assert kernel.symbolic and kernel.applied_opts == expected
  src = kernel.renderer.render(name, linearize(kernel))
  assert compile_cuda(src, ARCH)[:4] == b"\x7fELF"
  # a guarded split indexes its pieces directly: no index is divided, only a grouped loop's trip count ceil(n/group)
  code = [line.strip() for line in re.sub(r"/\*.*?\*/|//.*", "", src).splitlines()
          if "asm(" not in line and "asm volatile(" not in line and "prefetch_line" not in line]   # (PDL's prefetch)
  integer_math = [line for line in code if re.search(r"[/%]", line) and not line.startswith("float")]
  if kernel.staged:   # the block's tile copies place each thread's runs and the pipeline wraps its step: 32-bit math
    assert all(re.fullmatch(r"int alu\d+ = \(\w+ [/%] \d+\);", x) for x in integer_math), integer_math   # by constants
    return
  assert len(integer_math) <= 1 and all(re.fullmatch(r"int alu\d+ = \(alu\d+ / \d+\);", x) for x in integer_math), \
    integer_math

@needs_nvrtc
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_half_decode_attention_gets_the_same_opts(dtype):
  """A half cache is read through a view that splits and expands the cache's: it is indexed directly (no strides
  lost), so the values' head dim is still found contiguous and shared by the block."""
  kernel = heuristic_kernel(DecodeAttention(dtype=dtype).item(), CUDARenderer())
  assert kernel.applied_opts == GEMMA_CHOICES["decode_attention"][1]
  assert compile_cuda(kernel.renderer.render("attention", linearize(kernel)), ARCH)[:4] == b"\x7fELF"

def test_decode_attention_fills_the_gpu():
  """At least SYMBOLIC_MIN_BLOCKS blocks of 256 threads whatever the number of filled slots."""
  from tgrad.codegen.heuristics import SYMBOLIC_MIN_BLOCKS
  kernel = heuristic_kernel(DecodeAttention().item(), CUDARenderer())
  global_size, local_size = kernel.launch_dims()
  assert math.prod(local_size) == 256 and math.prod(evaluate(g, {"filled": 2000}) for g in global_size) >= \
    SYMBOLIC_MIN_BLOCKS

def test_group_of_a_max_gets_a_padding_guard():
  """A guarded GROUP of a max over a symbolic axis is legal: the padding reads the max's identity, not 0."""
  kernel = Kernel(SoftmaxRows().item().ast, CUDARenderer())
  kernel.apply_opt(Opt(OptOps.GROUP, 0, 32))
  assert len(kernel.padding_guards) == 1
  src = kernel.renderer.render("softmax", linearize(kernel))
  assert "0xFF800000u" in src, "-inf stands in for the padding of the max"

def test_cpu_rules_split_only_known_axes():
  """On a CPU a symbolic kernel gets the concrete CPU rules on its axes of known size (the matmul's register tile on
  its columns, their panels outermost, the thread split of a prefill matmul's columns) and nothing on a symbolic axis:
  no guard, its loop runs to the call's value (the rows get the tile where cpu_gemm.pack_plan padded them)."""
  for name, (problem, _) in GEMMA_CHOICES.items():
    item = problem().item()
    kernel = heuristic_kernel(item, Device["LLVM"].renderer)
    unoptimized = Kernel(item.ast, Device["LLVM"].renderer)
    assert not kernel.padding_guards, name
    assert [s for s in kernel.full_shape if not isinstance(s, int)] == \
      [s for s in unoptimized.full_shape if not isinstance(s, int)], (name, kernel.applied_opts)
  gate_up = heuristic_kernel(GEMMA_CHOICES["gate_up"][0]().item(), Device["LLVM"].renderer)
  if cpu_count() > 1:   # its columns' panels across the cores
    assert [o.op for o in gate_up.applied_opts] == [OptOps.UPCAST, OptOps.SWAP, OptOps.THREAD]

@pytest.mark.parametrize("name", ["gate_up", "decode_attention", "softmax_rows", "prefill_scores"])
def test_cpu_heuristic_kernels_on_llvm(name):
  """The CPU heuristics' symbolic kernels (threads included) on LLVM at several values, against numpy."""
  problem = GEMMA_CHOICES[name][0]()
  item = problem.item()
  runner = compile_kernel("LLVM", heuristic_kernel(item, Device["LLVM"].renderer))
  for value in (1, 7, 33):
    out = Buffer("LLVM", item.bufs[0].size, item.bufs[0].dtype).copyin(np.full(item.bufs[0].size, np.nan, np.float32))
    runner([out, *item.inputs], var_vals=values_at(item, problem.variable_name, value))
    check(out.copyout(), problem.reference(value), value)

# ---- values: the CUDA kernels run on the CPU, their UPCAST/UNROLL opts on LLVM, and on a GPU

# smaller shapes of the same structure (the same kinds of opts), so the emulated threads finish quickly
VALUE_CASES = {"matmul": lambda: Matmul(96, 64), "staged_matmul": lambda: Matmul(256, 64),
               "decode_attention": DecodeAttention, "decode_scores": DecodeScores, "softmax_rows": SoftmaxRows,
               "prefill_scores": PrefillScores}

def check(out: np.ndarray, ref: np.ndarray, value: int) -> None:
  out = out[:ref.size].astype(np.float64)
  tol = RTOL * (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))
  assert np.all(np.abs(out - ref) <= tol), f"at {value}: max err/tol {np.max(np.abs(out - ref) / tol)}"

def input_arrays(item: ScheduleItem) -> list[np.ndarray]:
  return [b.copyout() for b in item.inputs]

def values_at(item: ScheduleItem, name: str, value: int) -> dict[str, int]:
  """The item's var_vals (its lifted scalars' parameters too) with the variable `name` at `value`."""
  return {**item.var_vals, name: value}

def launch_values(kernel: Kernel, var_vals: dict[str, int]) -> list[int]:
  """The values of the kernel's parameters in the order the emulated launch takes them (by name)."""
  return [var_vals[v.arg[0]] for v in kernel.parameters]

@needs_cpu_compiler
@pytest.mark.parametrize("name", VALUE_CASES)
def test_cuda_kernel_values_on_cpu(name):
  problem = VALUE_CASES[name]()
  item = problem.item()
  kernel = heuristic_kernel(item, CUDARenderer(CPU_ARCH))
  assert any(o.op in (OptOps.LOCAL, OptOps.GROUP) for o in kernel.applied_opts), kernel.applied_opts
  src = kernel.renderer.render("kernel", linearize(kernel))
  inputs = input_arrays(item)
  global_size, local_size = kernel.launch_dims()
  for value in VALUES:
    var_vals = values_at(item, problem.variable_name, value)
    out = np.full(item.bufs[0].size, np.nan, np.float32)
    run_on_cpu(src, "kernel", tuple(evaluate(g, var_vals) for g in global_size), local_size, [out, *inputs],
               launch_values(kernel, var_vals))
    check(out, problem.reference(value), value)

@pytest.mark.parametrize("name", VALUE_CASES)
def test_upcasts_and_unrolls_on_llvm(name):
  """On LLVM (no thread blocks) the CUDA choice's UPCAST and UNROLL opts that apply, at every value."""
  problem = VALUE_CASES[name]()
  item = problem.item()
  kernel = Kernel(item.ast, Device["LLVM"].renderer)
  for opt in heuristic_kernel(item, CUDARenderer()).applied_opts:
    if opt.op not in (OptOps.UPCAST, OptOps.UNROLL): continue
    try: kernel.apply_opt(opt)
    except KernelOptError: pass
  runner = compile_kernel("LLVM", kernel)
  for value in VALUES:
    out = Buffer("LLVM", item.bufs[0].size, item.bufs[0].dtype).copyin(np.full(item.bufs[0].size, np.nan, np.float32))
    runner([out, *item.inputs], var_vals=values_at(item, problem.variable_name, value))
    check(out.copyout(), problem.reference(value), value)

@pytest.mark.gpu
@pytest.mark.parametrize("name", VALUE_CASES)
def test_gpu_heuristic_kernels_match_numpy(name):
  problem = VALUE_CASES[name]()
  item = problem.item()
  kernel = heuristic_kernel(item, Device["CUDA"].renderer)
  runner = compile_kernel("CUDA", kernel)
  inputs = [Buffer("CUDA", a.size, item.bufs[0].dtype).copyin(a) for a in input_arrays(item)]
  for value in VALUES:
    out = Buffer("CUDA", item.bufs[0].size, item.bufs[0].dtype).copyin(np.full(item.bufs[0].size, np.nan, np.float32))
    runner([out, *inputs], var_vals=values_at(item, problem.variable_name, value))
    check(out.copyout(), problem.reference(value), value)

@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gate_up", "decode_attention"])
def test_gpu_gemma_shaped_kernels_match_numpy(name):
  problem = GEMMA_CHOICES[name][0]()
  item = problem.item()
  runner = compile_kernel("CUDA", heuristic_kernel(item, Device["CUDA"].renderer))
  inputs = [Buffer("CUDA", a.size, item.bufs[0].dtype).copyin(a) for a in input_arrays(item)]
  for value in VALUES:
    out = Buffer("CUDA", item.bufs[0].size, item.bufs[0].dtype).copyin(np.full(item.bufs[0].size, np.nan, np.float32))
    runner([out, *inputs], var_vals=values_at(item, problem.variable_name, value))
    check(out.copyout(), problem.reference(value), value)

# ---- Gemma's prefill matmuls: the prompt rows symbolic, tiled with a guard (float32) or on tensor cores (half)

PREFILL_MATMULS = {"qkv": (1536, 640), "o_proj": (640, 1024), "gate_up": (4096, 640), "down": (640, 2048)}   # (N, K)
PREFILL_OPTS = {dtypes.float32: PREFILL_MATMUL_OPTS, dtypes.float16: PREFILL_TC_OPTS}
PREFILL_ROWS_PER_THREAD = {dtypes.float32: 8, dtypes.float16: 8}   # an 8-row tile; 4 row tiles × a lane's 2 rows
GUARDED_LENGTHS = (1, 7, 16, 17, 100, 520)   # prompt lengths: below, at and just past a tile and a block
POISON_BITS = 0xFFFF   # a NaN as float16 and as bfloat16 (outputs are filled with it: what no kernel writes)

def code_lines(src: str) -> list[str]: return [line.strip() for line in src.splitlines()]

@needs_nvrtc
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16], ids=str)
@pytest.mark.parametrize("name", PREFILL_MATMULS)
def test_gemma_prefill_matmul_opts(name, dtype):
  """Gemma's four prefill projections get the big concrete matmul's staged tiles (float32: 8×8 per thread, 8×16
  threads, both inputs in shared memory) or tensor cores (float16), the prompt rows guarded: NVRTC compiles them;
  every load of x (data1) is masked and every store gated, by one test per row of the thread's tile (each upcast
  replica its own row < n; staged, x's loads are the block's tile copies, masked by the row each copies); W's loads
  (data2) are not masked (a padded row reads the first row's W: each load is shared by the thread's rows)."""
  kernel = heuristic_kernel(Matmul(*PREFILL_MATMULS[name], dtype=dtype).item(), CUDARenderer())
  assert kernel.applied_opts == PREFILL_OPTS[dtype]
  src = kernel.renderer.render(name, linearize(kernel))
  assert compile_cuda(src, ARCH)[:4] == b"\x7fELF"
  lines = code_lines(src)
  x_loads, w_loads = [x for x in lines if "(data1 + " in x], [x for x in lines if "(data2 + " in x]
  stores = [x for x in lines if re.search(r"data0\[|\(data0 \+", x)]
  assert x_loads and all(re.search(r"\((alu\d+) \? \*", x) for x in x_loads), x_loads
  assert w_loads and not any("?" in x for x in w_loads), w_loads
  gates = {re.match(r"if \((alu\d+)\)", x).group(1) for x in stores if x.startswith("if (")}
  assert len(stores) >= len(gates) == PREFILL_ROWS_PER_THREAD[dtype] and all(x.startswith("if (") for x in stores)
  if dtype == dtypes.float16:   # unstaged: each replica's loads and store test the same row
    assert {re.search(r"\((alu\d+) \? \*", x).group(1) for x in x_loads} == gates

def float64_values(out: np.ndarray, dtype) -> np.ndarray:
  """An output buffer's values (bfloat16 is its raw bits in uint16)."""
  if dtype == dtypes.bfloat16: return (out.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
  return out.astype(np.float64)

def poisoned_output(item: ScheduleItem) -> np.ndarray:
  return np.full(item.bufs[0].size * item.bufs[0].dtype.itemsize, 0xFF, np.uint8).view(item.bufs[0].dtype.np)

def check_rows(out: np.ndarray, problem: Matmul, value: int, dtype) -> None:
  """Rows < value match numpy (to the output's rounding); every element from row `value` on is still the poison:
  a padded row's replica stored nothing."""
  ref = problem.reference(value)
  assert np.all(out.view(np.uint8)[ref.size * out.itemsize:] == 0xFF), f"at {value}: a padded row was stored"
  eps = {dtypes.float32: RTOL, dtypes.float16: 2.0 ** -10, dtypes.bfloat16: 2.0 ** -7}[dtype]
  got, tol = float64_values(out[:ref.size], dtype), eps * (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))
  assert np.all(np.abs(got - ref) <= tol), f"at {value}: max err/tol {np.max(np.abs(got - ref) / tol)}"

def emulated_rows(kernel: Kernel, item: ScheduleItem, problem: Matmul, dtype,
                  lengths: tuple[int, ...] = GUARDED_LENGTHS) -> None:
  """Run the kernel on the CPU at every one of `lengths` and check its rows (check_rows)."""
  src = kernel.renderer.render("kernel", linearize(kernel))
  inputs, (global_size, local_size) = input_arrays(item), kernel.launch_dims()
  for value in lengths:
    out = poisoned_output(item)
    run_on_cpu(src, "kernel", tuple(evaluate(g, {"n": value}) for g in global_size), local_size, [out, *inputs],
               launch_values(kernel, values_at(item, "n", value)))
    check_rows(out, problem, value, dtype)

# guarded UPCASTs of the rows axis, alone or with other guards; None: the heuristics' choice
GUARDED_UPCASTS = {
  "heuristic": None,
  "upcast_then_local": opts_of(("UPCAST", 0, 4), ("UPCAST", 1, 4), ("UNROLL", 0, 4), ("LOCAL", 0, 8), ("LOCAL", 1, 8)),
  "local_then_upcast": opts_of(("LOCAL", 0, 16), ("UPCAST", 0, 4), ("LOCAL", 1, 4)),
  "upcast3_twice": opts_of(("UPCAST", 0, 3), ("UPCAST", 0, 2), ("LOCAL", 1, 16)),
  "padto_upcast": opts_of(("PADTO", 0, 32), ("UPCAST", 0, 8), ("LOCAL", 0, 4)),
}

def guarded_kernel(item: ScheduleItem, renderer, opts) -> Kernel:
  if opts is None: return heuristic_kernel(item, renderer)
  kernel = Kernel(item.ast, renderer)
  for opt in opts: kernel.apply_opt(opt)
  return kernel

@needs_cpu_compiler
@pytest.mark.parametrize("opts", GUARDED_UPCASTS)
def test_guarded_upcast_values_on_cpu(opts):
  """A prefill-shaped float32 matmul whose symbolic rows are upcast with a guard, run on the CPU at 1..520 rows
  against numpy, on a poisoned output: the rows < n are right and nothing past them is written (at n = 17 the last
  tile of 4 rows has 3 padded replicas)."""
  problem = Matmul(96, 64)
  item = problem.item()
  kernel = guarded_kernel(item, CUDARenderer(CPU_ARCH), GUARDED_UPCASTS[opts])
  assert any(o.op is OptOps.UPCAST and o.axis == 0 for o in kernel.applied_opts), kernel.applied_opts
  emulated_rows(kernel, item, problem, dtypes.float32)

@pytest.mark.parametrize("opts", ["upcast", "upcast_unroll", "padto_upcast"])
def test_guarded_upcast_values_on_llvm(opts):
  """The same guarded upcasts on LLVM (no threads: the padded rows are loop iterations), poisoned outputs."""
  problem = Matmul(96, 64)
  item = problem.item()
  spec = {"upcast": opts_of(("UPCAST", 0, 4)), "upcast_unroll": opts_of(("UPCAST", 0, 4), ("UPCAST", 1, 4),
                                                                        ("UNROLL", 0, 4)),
          "padto_upcast": opts_of(("PADTO", 0, 16), ("UPCAST", 0, 4), ("UPCAST", 0, 2))}[opts]
  runner = compile_kernel("LLVM", guarded_kernel(item, Device["LLVM"].renderer, spec))
  for value in GUARDED_LENGTHS:
    out = Buffer("LLVM", item.bufs[0].size, item.bufs[0].dtype).copyin(poisoned_output(item))
    runner([out, *item.inputs], var_vals=values_at(item, "n", value))
    check_rows(out.copyout(), problem, value, dtypes.float32)

@needs_cpu_compiler
@pytest.mark.parametrize("opts", ["heuristic", "tc_alone", "tc_local"])
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_symbolic_tensor_core_values_on_cpu(dtype, opts):
  """A half matmul whose symbolic rows feed a tensor core (padded: masked fragment loads, gated stores), its mma.sync
  emulated on the CPU (test/cuda_on_cpu.py), at 1..520 rows against numpy on a poisoned output."""
  problem = Matmul(96, 64, dtype=dtype)
  item = problem.item()
  spec = {"heuristic": None, "tc_alone": opts_of(("TC", 0, 0)),
          "tc_local": opts_of(("TC", 0, 0), ("UPCAST", 0, 2), ("LOCAL", 0, 2), ("LOCAL", 1, 3))}[opts]
  kernel = guarded_kernel(item, CUDARenderer(TENSOR_CORE_ARCH), spec)
  assert kernel.tensor_core is not None
  emulated_rows(kernel, item, problem, dtype)

STAGED_SYMBOLIC_OPTS = {"heuristic": PREFILL_MATMUL_OPTS, "smem_x": opts_of(("SMEM", 0, 0)),
                        "group_smem": opts_of(("GROUP", 0, 8), ("SMEM", 0, 0)),
                        "local_smem_padded": opts_of(("LOCAL", 0, 8), ("SMEM", 1, 4), ("UNROLL", 0, 4)),
                        "padto_staged_w": opts_of(("PADTO", 0, 32), ("UPCAST", 0, 4), ("LOCAL", 0, 8), ("LOCAL", 1, 16),
                                                  ("UNROLL", 0, 8), ("SMEM", 1, 0))}

@needs_cpu_compiler
@pytest.mark.parametrize("opts", STAGED_SYMBOLIC_OPTS)
def test_staged_symbolic_matmul_values_on_cpu(opts):
  """A float32 matmul over x[:n] with tiles staged in shared memory (the heuristics' staged prefill tiles, and other
  legal SMEM lists), emulated at 1..520 rows against numpy on poisoned outputs: the masked tile copies read nothing
  past row n and the padded rows store nothing."""
  problem = Matmul(256, 64)
  item = problem.item()
  kernel = Kernel(item.ast, CUDARenderer(CPU_ARCH))
  for opt in STAGED_SYMBOLIC_OPTS[opts]: kernel.apply_opt(opt)
  assert kernel.staged
  # group_smem launches a block of 8 threads per (column, row): its rows have no tile, so 100 rows show what 520 would
  # (and 520 took 14 of its 20 emulated seconds)
  lengths = tuple(v for v in GUARDED_LENGTHS if v <= 100) if opts == "group_smem" else GUARDED_LENGTHS
  emulated_rows(kernel, item, problem, dtypes.float32, lengths)

def test_a_symbolic_reduce_stages_no_tile():
  kernel = Kernel(DecodeAttention().item().ast, CUDARenderer())
  with pytest.raises(KernelOptError, match="symbolic length"): kernel.apply_opt(Opt(OptOps.SMEM, 0, 0))

@needs_cpu_compiler
def test_symbolic_tf32_tensor_core_values_on_cpu():
  """A float32 matmul whose inputs the graph rounds to TF32 (m16n8k8 core), its symbolic rows padded, emulated at
  1..520 rows against numpy on the rounded inputs (to nearest, ties away: dtype.TF32_*), poisoned outputs."""
  from tgrad.dtype import TF32_KEEP_MASK, TF32_ROUNDING_BIAS
  from tgrad.tensor_ops.composite import round_to_tf32
  problem = Matmul(96, 64)
  item = single_kernel(round_to_tf32(problem.tx[:problem.variable.bind(5)]) @ round_to_tf32(problem.tw).T)
  kernel = Kernel(item.ast, CUDARenderer(TENSOR_CORE_ARCH))
  kernel.apply_opt(Opt(OptOps.TC, 0, 0))
  assert kernel.tensor_core is not None and kernel.tensor_core.core.tf32
  def rounded(a: np.ndarray) -> np.ndarray:
    bits = a.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(TF32_ROUNDING_BIAS)) & np.uint32(TF32_KEEP_MASK)).view(np.float32)
  problem.x, problem.w = rounded(problem.x), rounded(problem.w)   # the reference multiplies the rounded values
  emulated_rows(kernel, item, problem, dtypes.float32)

@needs_cpu_compiler
def test_half_prefill_scores_tensor_cores_on_cpu():
  """q·kᵀ of a half prefill: rows (queries) and columns (keys) both symbolic, both padded to the warp's tiles; the
  heuristics' tensor-core kernel emulated at several lengths against numpy, nothing written past the n×n scores."""
  problem = PrefillScores()
  tq, tk = problem.tq.cast(dtypes.float16).realize(), problem.tk.cast(dtypes.float16).realize()
  q, k = (t.float().numpy().astype(np.float64) for t in (tq, tk))
  bound = problem.variable.bind(5)
  item = single_kernel(tq[:, :bound] @ tk[:bound].T)
  kernel = heuristic_kernel(item, CUDARenderer(TENSOR_CORE_ARCH))
  assert kernel.tensor_core is not None and [o.op for o in kernel.applied_opts[:2]] == [OptOps.PADTO, OptOps.PADTO]
  src = kernel.renderer.render("kernel", linearize(kernel))
  inputs, (global_size, local_size) = input_arrays(item), kernel.launch_dims()
  for value in (1, 7, 17, 100):
    out = poisoned_output(item)
    run_on_cpu(src, "kernel", tuple(evaluate(g, {"n": value}) for g in global_size), local_size, [out, *inputs],
               launch_values(kernel, values_at(item, "n", value)))
    ref = (q[:, :value] @ k[:value].T).reshape(-1)
    assert np.all(out.view(np.uint16)[ref.size:] == POISON_BITS), f"at {value}: a padded score was stored"
    np.testing.assert_allclose(out[:ref.size].astype(np.float64), ref, rtol=2.0 ** -10, atol=2.0 ** -10 * 16)

def test_tensor_cores_refuse_a_symbolic_reduce():
  """The keys of a prefill's p·v are its reduce: symbolic K has no tensor core (and PADTO pads no symbolic reduce)."""
  n = Variable("n", 1, BOUND)
  p, v = Tensor.empty(BOUND, BOUND, dtype=dtypes.float16), Tensor.empty(BOUND, 64, dtype=dtypes.float16)
  kernel = Kernel(single_kernel(p[:n.bind(5), :n.bind(5)] @ v[:n.bind(5)]).ast, CUDARenderer())
  for opt in opts_of(("TC", 0, 0), ("PADTO", kernel.first_reduce, 16)):
    with pytest.raises(KernelOptError): kernel.apply_opt(opt)

def test_rounded_up_size_is_at_least_its_size():
  """ceil(n/64)·64 >= n for every n (what a guard's padding needs), which the bounds of the difference can't show."""
  from tgrad.shape.sint import ceil_div, canonical, definitely_le, smin
  n = Variable("n", 1, 4096)
  padded = canonical(ceil_div(n, 64) * 64)
  assert definitely_le(n, padded) and not definitely_le(padded, n) and not definitely_le(n + 1, padded)
  assert definitely_le(n, canonical(ceil_div(canonical(ceil_div(n, 4) * 4), 16) * 16))   # a guard of a guard
  assert smin(n, padded) is n   # a mask bound clamped to the padded size stays n
  assert all(v <= (v + 63) // 64 * 64 for v in range(1, 4097))

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("name", PREFILL_MATMULS)
def test_gpu_prefill_matmuls_match_numpy(name, dtype):
  """Gemma's prefill projections with the heuristics' guarded tiles (float32) or tensor cores (half) on CUDA at
  1..520 prompt rows against numpy, on poisoned outputs (nothing past row n is written)."""
  problem = Matmul(*PREFILL_MATMULS[name], dtype=dtype)
  item = problem.item()
  runner = compile_kernel("CUDA", heuristic_kernel(item, Device["CUDA"].renderer))
  inputs = [Buffer("CUDA", b.size, b.dtype).copyin(a) for b, a in zip(item.inputs, input_arrays(item))]
  for value in GUARDED_LENGTHS:
    out = Buffer("CUDA", item.bufs[0].size, item.bufs[0].dtype).copyin(poisoned_output(item))
    runner([out, *inputs], var_vals=values_at(item, "n", value))
    check_rows(out.copyout(), problem, value, dtype)

# ---- guarded GROUPs of every kind of reduce over a symbolic axis, run on the CPU

GUARDED_REDUCES = {
  "sum": (lambda t: t.sum(0), lambda x: x.sum(0)),
  "max": (lambda t: t.max(0), lambda x: x.max(0)),
  "min": (lambda t: t.min(0), lambda x: x.min(0)),
  "logsumexp": (lambda t: t.logsumexp(0), lambda x: np.log(np.exp(x - x.max(0)).sum(0)) + x.max(0)),
  "softmax": (lambda t: t.softmax(0), lambda x: np.exp(x - x.max(0)) / np.exp(x - x.max(0)).sum(0)),
  "var": (lambda t: t.var(0, correction=0), lambda x: x.var(0)),
  "argmax": (lambda t: t.argmax(0).float(), lambda x: x.argmax(0).astype(np.float64)),
}
GUARDED_OPTS = {"group16": opts_of(("GROUP", 0, 16)), "grouptop64": opts_of(("GROUPTOP", 0, 64)),
                "local8_group32": opts_of(("LOCAL", 0, 8), ("GROUP", 0, 32))}
GUARDED_COLUMNS = 24

@needs_cpu_compiler
@pytest.mark.parametrize("opts", GUARDED_OPTS)
@pytest.mark.parametrize("reduce", GUARDED_REDUCES)
def test_guarded_groups_on_cpu(reduce, opts):
  """Each reduce over the rows x[:n] (all negative, so a padding read as 0 would win a max), with a GROUP of the
  symbolic axis that pads it: a sum ignores the padding, every other reduce gets a padding guard. The kernels run on
  the CPU at every value against numpy."""
  build, reference = GUARDED_REDUCES[reduce]
  x = -1 - np.random.default_rng(1).random((BOUND, GUARDED_COLUMNS), dtype=np.float32)
  n = Variable("n", 1, BOUND)
  items = [i for i in create_schedule([build(Tensor(x, device="LLVM").realize()[:n.bind(5)]).lazydata])
           if i.ast.op is Ops.SINK]
  kernels = []
  for item in items:   # the kernels in order (each reads the earlier ones' outputs)
    kernel = Kernel(item.ast, CUDARenderer(CPU_ARCH))
    for opt in GUARDED_OPTS[opts]: kernel.apply_opt(opt)
    kernels.append((kernel, kernel.renderer.render("kernel", linearize(kernel)), *kernel.launch_dims()))
  if reduce != "sum": assert kernels[-1][0].padding_guards, "the padding would change this reduce: it is guarded"
  for value in (1, 7, 100, 1000):
    written: dict[int, np.ndarray] = {}   # id of a Buffer → what the emulated kernels wrote there
    for item, (kernel, src, global_size, local_size) in zip(items, kernels):
      inputs = [written[id(b)] if id(b) in written else b.copyout() for b in item.inputs]
      out = np.full(item.bufs[0].size, np.nan, np.float32)
      run_on_cpu(src, "kernel", tuple(evaluate(g, {"n": value}) for g in global_size), local_size, [out, *inputs],
                 launch_values(kernel, values_at(item, "n", value)))
      written[id(item.bufs[0])] = out
    check(written[id(items[-1].bufs[0])], reference(x[:value].astype(np.float64)).reshape(-1), value)
