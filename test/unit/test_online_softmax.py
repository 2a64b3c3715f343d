"""The LOGADDEXP reduce (log Σ exp in one pass: codegen/reduces.py keeps a running max and a rescaled sum) and the
"online" lowerings of softmax, log_softmax and logsumexp built on it (tensor_ops/composite.py): the combine against
float64 (exec_alu is its oracle; the linearizer's state formulas folded on constants follow it, in any order and
grouping), values against torch at explicit tolerances (odd sizes, −inf/+inf/NaN rows, large magnitudes, float16,
other axes, 0-d and size 1, random legal opts), one kernel per row op, gradients, and CUDA renderings with GROUP opts
compiled by NVRTC.
"""
import math, random
import numpy as np
import pytest
import torch
from tgrad import Tensor
from tgrad.lazy import SPLIT_REDUCE_CPU_ROW_MIN_INPUTS
from tgrad.dtype import dtypes
from tgrad.ops import Ops, UOp, exec_alu, identity_of_reduce
from tgrad.schedule import create_schedule, MAX_ROW_FUSION_SIZE
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.llvm.renderer import LLVMRenderer
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.codegen.reduces import online_merge, online_result, online_step
from tgrad.device import Buffer
from tgrad.realize import compile_kernel
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.regions import apply_lowering, lowerings_for, regions_above
from tgrad.tensor_ops.composite import _log_sum_exp
from cuda_on_cpu import CPU_ARCH, cpu_available, run_on_cpu

inf, nan = math.inf, math.nan
needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
OPS = {"softmax": (lambda t, axis: t.softmax(axis), torch.softmax),
       "log_softmax": (lambda t, axis: t.log_softmax(axis), torch.log_softmax),
       "logsumexp": (lambda t, axis: t.logsumexp(axis), torch.logsumexp)}
# float32 against torch's float32 result: torch itself is ~3e-6 from float64 on these rows; the online state's sum
# rounds once per unrolled step (CPU_ONLINE_UNROLL values), and log Σ exp once at the end
RTOL_F32 = 1e-5
TINY = 1e-35   # an absolute floor for outputs that underflow (both sides flush to 0 at slightly different points)

def normal(*shape, scale=5.0, seed=0, dtype=np.float32) -> np.ndarray:
  return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)

def online(name: str, x, axis=-1, device: str = "LLVM") -> Tensor:
  out = OPS[name][0](x if isinstance(x, Tensor) else Tensor(x, device=device), axis)
  [region] = [r for r in regions_above(out.lazydata) if r.name == name]
  apply_lowering(region, "online")
  return out

def torch_of(name: str, x: np.ndarray, axis=-1, dtype=torch.float32) -> np.ndarray:
  return OPS[name][1](torch.tensor(x, dtype=dtype), axis).numpy()

def kernels(out: Tensor) -> int:
  return sum(1 for item in create_schedule([out.lazydata], commit=False) if item.ast.op is Ops.SINK)

# ---- the combine and the state formulas

EDGES = [-inf, inf, nan, 0.0, -0.0, 1.0, -3.5, 88.0, -104.0, 1e4, -1e30, 3e38]

def reference(values) -> float:
  """log Σ exp in float64 with torch.logsumexp's conventions (equal infinities give themselves, NaN wins)."""
  return float(torch.logsumexp(torch.tensor(values, dtype=torch.float64), 0)) if len(values) else -inf

def same(a: float, b: float, rtol: float, atol: float = 0.0) -> bool:
  if math.isnan(a) or math.isnan(b): return math.isnan(a) and math.isnan(b)
  if math.isinf(a) or math.isinf(b): return a == b
  return abs(a - b) <= atol + rtol * abs(b)

def test_exec_alu_logaddexp_is_the_float64_combine():
  assert identity_of_reduce(Ops.LOGADDEXP, dtypes.float32) == -inf
  for a in EDGES:
    for b in EDGES:
      got = exec_alu(Ops.LOGADDEXP, dtypes.float64, (a, b))
      assert same(got, reference([a, b]), 1e-13, 1e-15), (a, b, got)
      assert same(got, exec_alu(Ops.LOGADDEXP, dtypes.float64, (b, a)), 0.0), "commutative"
  assert exec_alu(Ops.LOGADDEXP, dtypes.float32, (1e4, 1e4)) == np.float32(1e4 + math.log(2))

def _const(v: float) -> UOp: return UOp.const(dtypes.float32, v)

def folded_state(values: list[float]) -> tuple[UOp, UOp]:
  """The linearizer's state of one step, built on constants: every op folds through exec_alu in float32."""
  return online_step([_const(v) for v in values])

def test_state_formulas_fold_to_the_combine_on_edges():
  """online_step / online_merge / online_result, evaluated on constants (float32), agree with float64 log Σ exp on
  every pair and triple of edge values, whichever side holds which value."""
  for a in EDGES:
    for b in EDGES:
      for parts in ([[a], [b]], [[a, b]], [[a], [b, 1.0]], [[a, b], [2.0]]):
        state = (_const(-inf), _const(0.0))
        for part in parts: state = online_merge(*state, *folded_state(part))
        got, want = online_result(*state, dtypes.float32), reference([v for part in parts for v in part])
        assert got.op is Ops.CONST and same(got.arg, want, 1e-6, 1e-6), (parts, got.arg, want)

@pytest.mark.parametrize("seed", range(20))
def test_combine_is_associative_and_commutative_numerically(seed):
  """A row split at random into steps, the steps merged in a random order, and partial results merged again as
  one-value states (as a GROUP combines its threads' results): always log Σ exp within float32 rounding."""
  rng = random.Random(seed)
  n = rng.choice([1, 2, 3, 17, 100, 1000])
  values = [float(v) for v in np.float32(np.random.default_rng(seed).standard_normal(n) * rng.choice([1, 5, 30]))]
  if rng.random() < 0.3: values[rng.randrange(n)] = -inf
  cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randrange(0, 12)))) if n > 1 else []
  steps = [values[i:j] for i, j in zip([0] + cuts, cuts + [n])]
  rng.shuffle(steps)
  groups = [steps[i::3] for i in range(3)]   # three "threads", each merging its own steps
  partials = []
  for group in groups:
    state = (_const(-inf), _const(0.0))
    for step in group: state = online_merge(*state, *folded_state(step))
    partials.append(online_result(*state, dtypes.float32).arg)
  rng.shuffle(partials)
  state = (_const(-inf), _const(0.0))
  for p in partials: state = online_merge(*state, *folded_state([p]))
  got, want = online_result(*state, dtypes.float32).arg, reference(values)
  assert same(got, want, 2e-6, 2e-6), (n, got, want)

# ---- values against torch

@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("size", [1, 7, 1000, 4096])
def test_rows_match_torch_in_one_kernel(name, size):
  x = normal(6, size, seed=size)
  out = online(name, x)
  assert kernels(out) == 1
  got, want = out.numpy(), torch_of(name, x)
  if name == "softmax": np.testing.assert_allclose(got, want, rtol=RTOL_F32, atol=TINY)
  else:   # log-domain outputs: the error of log Σ exp is absolute, ~1e-6 at these magnitudes
    np.testing.assert_allclose(got, want, rtol=RTOL_F32, atol=2e-6 * max(1.0, float(np.abs(want).max()) / 64))

def test_rows_above_the_row_fusion_limit_are_two_kernels():
  x = normal(2, MAX_ROW_FUSION_SIZE + 8, seed=3)
  out = online("softmax", x)
  assert kernels(out) == 2   # log Σ exp, then exp(x − lse): the three_kernels lowering's max and Σ exp are one
  np.testing.assert_allclose(out.numpy(), torch_of("softmax", x), rtol=2 * RTOL_F32, atol=TINY)

def test_masked_and_infinite_rows_match_torch():
  rows = np.array([[1, 2, -inf, 3, -inf], [-inf] * 5, [inf, 1, 2, 3, 4], [inf, inf, 0, 1, 2], [nan, 1, 2, 3, 4],
                   [-inf, 5, -inf, -inf, -inf], [-inf, -inf, -inf, -inf, 7e3]], np.float32)
  for name in OPS:   # a fully masked row is NaN for softmax and log_softmax (and −inf for logsumexp), as torch
    np.testing.assert_allclose(online(name, rows).numpy(), torch_of(name, rows), rtol=1e-6, atol=1e-7, err_msg=name)

def test_large_magnitudes():
  spread = normal(4, 1000, scale=1e4, seed=5)   # one element dominates each row: exactly torch's one-hot
  np.testing.assert_allclose(online("softmax", spread).numpy(), torch_of("softmax", spread), rtol=1e-6, atol=TINY)
  # rows around 1e4: lse is a float64 value, so x − lse keeps no rounding of it (in float32, half an ulp of 1e4 would
  # be 4.9e-4 relative error in every output)
  offset = (normal(4, 1000, scale=1.0, seed=6) + np.float32(1e4)).astype(np.float32)
  for name in ("softmax", "log_softmax"):
    want = torch_of(name, offset, dtype=torch.float64)
    np.testing.assert_allclose(online(name, offset).numpy(), want, rtol=3e-6, atol=3e-6, err_msg=name)
  np.testing.assert_allclose(online("logsumexp", offset).numpy(), torch_of("logsumexp", offset, dtype=torch.float64),
                             rtol=1e-7)

@pytest.mark.parametrize("name", list(OPS))
def test_float16_accumulates_in_float32(name):
  x = normal(5, 333, seed=7, dtype=np.float16)
  out = online(name, x)
  [item] = [i for i in create_schedule([out.lazydata], commit=False) if i.ast.op is Ops.SINK]
  # the state (running max, rescaled sum) in float32, the source's dtype; the result, log Σ exp, in float64
  assert [(u.src[0].dtype, u.dtype) for u in item.ast.toposort() if u.op is Ops.REDUCE_AXIS] == \
    [(dtypes.float32, dtypes.float64)]
  got, want = out.numpy(), torch_of(name, x, dtype=torch.float64)
  assert got.dtype == np.float16
  np.testing.assert_allclose(got.astype(np.float64), want, rtol=4e-3, atol=2e-3)

@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("axis", [0, 1])
def test_other_axes(name, axis):
  x = normal(37, 5, 3, seed=8)
  got = online(name, x, axis).numpy()
  np.testing.assert_allclose(got, torch_of(name, x, axis), rtol=RTOL_F32, atol=2e-6)

def test_zero_d_size_one_and_a_split_reduce():
  for name in OPS:
    np.testing.assert_allclose(online(name, np.float32(3.0), 0).numpy(), torch_of(name, np.float32(3.0), 0))
    ones = np.ones((3, 1), np.float32)
    np.testing.assert_allclose(online(name, ones).numpy(), torch_of(name, ones))
  # a big reduce with one output splits into partial reduces and a reduce of the partials (lazy._split_reduce; on the
  # CPU a contiguous row from SPLIT_REDUCE_CPU_ROW_MIN_INPUTS values)
  x = normal(SPLIT_REDUCE_CPU_ROW_MIN_INPUTS, seed=9)
  out = online("logsumexp", x, 0)
  assert kernels(out) == 2
  np.testing.assert_allclose(out.numpy(), torch_of("logsumexp", x, 0, torch.float64), rtol=1e-6)

def test_registered_with_descriptions_and_valid_on_both_devices():
  for device in ("LLVM", "CUDA"):
    for name in OPS:
      out = OPS[name][0](Tensor(normal(2, 8), device=device), -1)
      [region] = [r for r in regions_above(out.lazydata) if r.name == name]
      assert "online" in lowerings_for(region), (name, device)

# ---- gradients

def test_logsumexp_function_gradient_is_softmax():
  x = normal(4, 33, seed=10)
  t = Tensor(x, requires_grad=True)
  weights = normal(4, 1, seed=11)
  (_log_sum_exp(t, -1) * Tensor(weights)).sum().backward()
  xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
  (torch.logsumexp(xt, -1, keepdim=True) * torch.tensor(weights, dtype=torch.float64)).sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-7)

@pytest.mark.parametrize("name", list(OPS))
def test_gradients_after_the_online_lowering(name):
  x = normal(3, 17, scale=3.0, seed=12)
  t = Tensor(x, requires_grad=True)
  out = online(name, t)
  weights = normal(*out.shape, seed=13)
  (out * Tensor(weights)).sum().backward()
  xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
  (OPS[name][1](xt, -1) * torch.tensor(weights, dtype=torch.float64)).sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), xt.grad.numpy(), rtol=2e-4, atol=2e-5)

# ---- kernels: opts on the CPU, CUDA renderings

def online_kernel(name: str, shape: tuple[int, ...], renderer, seed: int = 0):
  x = normal(*shape, seed=seed)
  [item] = [i for i in create_schedule([online(name, Tensor(x).realize()).lazydata]) if i.ast.op is Ops.SINK]
  return x, item, Kernel(item.ast, renderer)

def test_heuristics_unroll_the_online_reduce_on_the_cpu():
  _, _, kernel = online_kernel("softmax", (4, 4096), LLVMRenderer())
  hand_coded_optimizations(kernel)
  assert Opt(OptOps.UNROLL, 0, 16) in kernel.applied_opts
  program = linearize(kernel)
  assert not any(u.op is Ops.LOGADDEXP for u in program)   # expanded into ALU ops: renderers never see it
  accumulators = [u.dtype for u in program if u.op is Ops.DEFINE_ACC]   # the result, the running max, the rescaled sum
  assert accumulators == [dtypes.float64, dtypes.float32, dtypes.float32]

@pytest.mark.parametrize("seed", range(12))
def test_random_legal_opts_keep_the_values(seed):
  rng = random.Random(seed)
  name = rng.choice(list(OPS))
  shape = (rng.choice([1, 2, 3, 4, 6]), rng.choice([2, 3, 5, 12, 16, 17, 64]))
  x, item, kernel = online_kernel(name, shape, LLVMRenderer(), seed)
  for _ in range(30):
    if len(kernel.applied_opts) == 3: break
    op = rng.choice([OptOps.UPCAST, OptOps.UNROLL, OptOps.UNROLL, OptOps.THREAD, OptOps.PADTO, OptOps.SWAP])
    try: kernel.apply_opt(Opt(op, rng.randrange(kernel.shape_len + 1), rng.choice([0, 2, 3, 4, 8, 16])))
    except KernelOptError: continue
  want = torch_of(name, x)
  out = Buffer("LLVM", want.size, dtypes.float32)
  out.copyin(np.full(want.size, np.nan, np.float32))   # an element the kernel forgets stays NaN
  # on a GPU machine the inputs were realized on CUDA: the CPU kernel reads host copies of them
  inputs = [b if b.device == "LLVM" else Buffer("LLVM", b.size, b.dtype).copyin(b.copyout()) for b in item.inputs]
  compile_kernel("LLVM", kernel)([out, *inputs], var_vals=item.var_vals)
  np.testing.assert_allclose(out.copyout().reshape(want.shape), want, rtol=1e-5, atol=1e-6,
                             err_msg=f"{name} {shape} {kernel.applied_opts}")

def test_padding_a_log_sum_exp_is_refused():
  _, _, kernel = online_kernel("logsumexp", (4, 17), LLVMRenderer())
  with pytest.raises(KernelOptError): kernel.apply_opt(Opt(OptOps.PADTO, 1, 32))

CUDA_OPTS = [[], [Opt(OptOps.GROUP, 0, 16)], [Opt(OptOps.GROUPTOP, 0, 8)],
             [Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.GROUP, 0, 8)], [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.GROUP, 0, 32)],
             [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 16), Opt(OptOps.UNROLL, 1, 2)],
             [Opt(OptOps.NOLOCALS), Opt(OptOps.UNROLL, 0, 8)]]

@needs_nvrtc
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("opts", CUDA_OPTS, ids=lambda opts: "-".join(o.op.name for o in opts) or "none")
def test_cuda_renderings_compile(name, opts):
  _, _, kernel = online_kernel(name, (8, 128), CUDARenderer())
  for opt in opts: kernel.apply_opt(opt)
  src = kernel.renderer.render("online", linearize(kernel))
  assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
  assert "exp2f(" in src
  if kernel.group_for_reduces:   # one combine per row a thread serves: each thread's m + log d to shared memory
    rows = int(np.prod([kernel.full_shape[a] for a in kernel.upcast_axes if not kernel.is_reduce_axis(a)]))
    assert src.count("__syncthreads();") == rows

@needs_nvrtc
@pytest.mark.parametrize("size", [7, 1000, 4096])
def test_cuda_heuristics_group_the_row_and_compile(size):
  _, _, kernel = online_kernel("softmax", (3, size), CUDARenderer())
  hand_coded_optimizations(kernel)
  if size >= 64: assert kernel.group_for_reduces == 1, "a block shares each row"
  assert compile_cuda(kernel.renderer.render("online", linearize(kernel)), "sm_90")[:4] == b"\x7fELF"

# rows whose threads' partials cover the combine's cases: ordinary, some threads' shares all −inf, a fully masked
# row, one and two +inf, NaN, a 1e4 spread (one element dominates), equal values (every partial equal)
def combine_rows(width: int) -> np.ndarray:
  rows = normal(12, width, seed=21)   # 12: every opt list above divides it
  rows[1, : width // 2] = -inf
  rows[2] = -inf
  rows[3, 5] = inf
  rows[4, [3, width - 1]] = inf
  rows[5, 7] = nan
  rows[6] *= 2e3
  rows[7] = 0.25
  rows[8, : width - 1] = -inf
  return rows

@pytest.mark.skipif(not cpu_available(), reason="no C++ compiler for the CUDA emulation")
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("opts", [o for o in CUDA_OPTS if any(opt.op in (OptOps.GROUP, OptOps.GROUPTOP) for opt in o)],
                         ids=lambda opts: "-".join(o.op.name for o in opts))
def test_group_combine_values_emulated_on_cpu(name, opts):
  """The GROUP combine of a CUDA kernel (the threads' partials: their max, then a float32 sum of exponentials,
  reduces.logaddexp_of_partials) run on the CPU (test/cuda_on_cpu.py) against torch, on rows with infinities and NaN."""
  x = combine_rows(128)
  [item] = [i for i in create_schedule([online(name, Tensor(x).realize()).lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, CUDARenderer(CPU_ARCH))
  for opt in opts: kernel.apply_opt(opt)
  assert kernel.group_for_reduces
  want = torch_of(name, x)
  out = np.full(want.size, np.nan, np.float32)
  global_size, local_size = kernel.launch_dims()
  run_on_cpu(kernel.renderer.render("kernel", linearize(kernel)), "kernel", global_size, local_size, [out, x],
             [item.var_vals[v.arg[0]] for v in kernel.parameters])   # the lifted scalars' values
  np.testing.assert_allclose(out.reshape(want.shape), want, rtol=RTOL_F32, atol=2e-6, err_msg=f"{name} {opts}")

@pytest.mark.gpu
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("shape", [(5, 7), (2, 1000), (4, 4096), (1, 1)])
def test_values_on_the_gpu(name, shape):
  x = normal(*shape, seed=14)
  out = online(name, x, device="CUDA")
  assert kernels(out) == 1
  np.testing.assert_allclose(out.numpy(), torch_of(name, x), rtol=RTOL_F32, atol=2e-6)

@pytest.mark.parametrize("axis", [(0, 2), [0, 2], None, 1])
def test_logsumexp_composite_over_several_axes_in_every_lowering(axis):
  x = normal(3, 4, 5, seed=15)
  want = torch.logsumexp(torch.tensor(x, dtype=torch.float64), tuple(range(3)) if axis is None else axis).numpy()
  for lowering in ("default", "online", "numpy"):
    out = Tensor(x).logsumexp(axis)
    apply_lowering(regions_above(out.lazydata)[0], lowering)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6, err_msg=lowering)

def test_reduce_dtype_refusals():
  x = Tensor(normal(4, 8)).lazydata
  with pytest.raises(TypeError, match="LOGADDEXP reduces floats"): Tensor(np.ones((2, 3), np.int32)).lazydata.r(
    Ops.LOGADDEXP, (1,))
  with pytest.raises(TypeError, match="ADD reduce of float32 can't give float64"): x.r(Ops.ADD, (1,), dtypes.float64)
  with pytest.raises(TypeError, match="LOGADDEXP reduce of float32 can't give float16"):
    x.r(Ops.LOGADDEXP, (1,), dtypes.float16)
  assert x.r(Ops.LOGADDEXP, (1,), dtypes.float64).dtype == dtypes.float64

@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("size", [7, 1000, 4096])
def test_one_kernel_on_cuda_too(name, size):   # scheduled for CUDA, no GPU needed
  assert kernels(online(name, normal(3, size, seed=16), device="CUDA")) == 1
