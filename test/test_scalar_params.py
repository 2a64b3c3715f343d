"""Python scalars as kernel parameters (tgrad/scalars.py, docs/scalars.md): one compiled kernel and one schedule
template for every value of `x * c`, values as numpy's for every dtype, literal values kept literal, TinyJit replays
and CUDA renderings (NVRTC, and the CUDA-on-CPU emulator) of kernels with scalar parameters."""
import math
import sys
from pathlib import Path
import numpy as np
import pytest
from tgrad import Tensor, TinyJit, dtypes
from tgrad import realize as realize_module
from tgrad import schedule_cache
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.linearizer import linearize
from tgrad.jit import JitError
from tgrad.ops import Ops
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.scalars import is_scalar_param, param_value
from tgrad.schedule import create_schedule
sys.path.insert(0, str(Path(__file__).parent))
from cuda_on_cpu import CPU_ARCH, cpu_available, run_on_cpu  # noqa: E402

RTOL = {dtypes.float32: 1e-6, dtypes.float16: 1e-3}
POW_RTOL = 2e-6   # x ** c goes through exp2(c · log2 x): a few float32 roundings
DISTINCT_CONSTANTS = 200

def compiled() -> int: return len(realize_module._runner_cache)

def kernel_items(t: Tensor):
  return [item for item in create_schedule([t.lazydata]) if item.ast.op is Ops.SINK]

def test_distinct_constants_compile_one_kernel_and_keep_one_template():
  data = np.linspace(-3, 3, 96, dtype=np.float32)
  x = Tensor(data).realize()
  (x * 0.5).numpy()   # the one compile and the one template
  kernels, templates, nodes = compiled(), len(schedule_cache._templates), schedule_cache._cached_nodes
  for i in range(DISTINCT_CONSTANTS):
    c = 0.37 * i + 0.011
    np.testing.assert_array_equal((x * c).numpy(), data * np.float32(c))
  assert (compiled(), len(schedule_cache._templates), schedule_cache._cached_nodes) == (kernels, templates, nodes)

def test_parameters_in_the_ast_and_values_in_var_vals():
  x = Tensor(np.ones(8, np.float32)).realize()
  [item] = kernel_items((x * 2.5 + 0.75) < 3.25)
  params = {u.arg for u in item.ast.toposort() if u.op is Ops.CONST and not isinstance(u.arg, (int, float, bool))}
  assert all(is_scalar_param(p) for p in params) and len(params) == 3
  assert {p.arg[0]: param_value(item.var_vals[p.arg[0]], p) for p in params} == \
    {"scalar0": 2.5, "scalar1": 0.75, "scalar2": 3.25}
  [other] = kernel_items((x * 7.0 + 1.5) < -2.0)   # other values: the same AST, other var_vals
  assert other.ast is item.ast and other.var_vals != item.var_vals

@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, True])
def test_literal_values_stay_literal(value):
  x = Tensor(np.ones(4, np.float32)).realize()
  [item] = kernel_items(x * value)
  assert not any(k.startswith("scalar") for k in item.var_vals)

def test_constant_expressions_fold_as_before():
  x = Tensor(np.ones(3, np.float32)).realize()
  [item] = kernel_items((Tensor.full((3,), 3.0) * 2 + 5).sqrt() * x)   # one folded constant, no parameter
  assert not item.var_vals and any(u.op is Ops.CONST and u.arg == np.float32(math.sqrt(11.0))
                                   for u in item.ast.toposort())

def test_integer_divisors_and_shifts_stay_literal():
  x = Tensor(np.arange(-20, 20, dtype=np.int32)).realize()
  for out in (x // 7, x % 5, x << 3, x >> 2, x.div(3, rounding_mode="trunc")):
    [item] = kernel_items(out)
    assert not item.var_vals, item.var_vals
  np.testing.assert_array_equal((x // 7).numpy(), np.arange(-20, 20) // 7)
  np.testing.assert_array_equal((x % 5).numpy(), np.arange(-20, 20) % 5)

def _float_case(rng, dtype):
  """A random expression with distinct Python scalars: (tgrad function, numpy function, rtol)."""
  a, b = float(rng.uniform(-4, 4)), float(rng.uniform(0.1, 4))
  npt = dtype.np
  def f(v): return npt.type(v)
  cases = [
    (lambda t: t * a + b, lambda d: d * f(a) + f(b), None),
    (lambda t: a - t, lambda d: f(a) - d, None),
    (lambda t: t / b, lambda d: d / f(b), None),
    (lambda t: (t < a).where(t, b), lambda d: np.where(d < f(a), d, f(b)), None),
    (lambda t: t.maximum(a) - b, lambda d: np.maximum(d, f(a)) - f(b), None),
    (lambda t: (t > b) | (t <= a), lambda d: (d > f(b)) | (d <= f(a)), None),
  ]
  if dtype == dtypes.float32:
    cases.append((lambda t: t.abs() ** b, lambda d: np.abs(d) ** f(b), POW_RTOL))
    cases.append((lambda t: (t.abs() + 0.5) ** 3.5, lambda d: (np.abs(d) + f(0.5)) ** f(3.5), POW_RTOL))
  return cases[int(rng.integers(len(cases)))]

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16])
def test_random_float_expressions_match_numpy(dtype):
  rng = np.random.default_rng(24)
  data = rng.uniform(-5, 5, 64).astype(dtype.np)
  x = Tensor(data).realize()
  for _ in range(40):
    fn, reference, rtol = _float_case(rng, dtype)
    want = reference(data)
    got = fn(x).numpy()
    if want.dtype == np.bool_: np.testing.assert_array_equal(got, want)
    else: np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol or RTOL[dtype],
                                     atol=1e-6)

@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int8, dtypes.uint32])
def test_random_int_expressions_match_numpy(dtype):
  rng = np.random.default_rng(5)
  low = 0 if dtype == dtypes.uint32 else -50
  data = rng.integers(low, 50, 64).astype(dtype.np)
  x = Tensor(data).realize()
  for _ in range(30):
    k, m = int(rng.integers(2, 40)), int(rng.integers(2, 9))
    cases = [(x + k, data + dtype.np.type(k)), (x * k - m, data * dtype.np.type(k) - dtype.np.type(m)),
             (x // m + k, data // dtype.np.type(m) + dtype.np.type(k)), (x < k, data < k),
             ((x > k).where(x, m), np.where(data > k, data, dtype.np.type(m))), (x & k, data & dtype.np.type(k))]
    out, want = cases[int(rng.integers(len(cases)))]
    with np.errstate(over="ignore"): np.testing.assert_array_equal(out.numpy(), want)

def test_bool_scalars():
  data = np.array([True, False, True, False])
  b = Tensor(data).realize()
  np.testing.assert_array_equal((b ^ True).numpy(), data ^ True)
  np.testing.assert_array_equal(b.where(2.5, -1.25).numpy(), np.where(data, 2.5, -1.25).astype(np.float32))

@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.0])
def test_special_scalars_give_numpys_values(value):
  data = np.array([-2.0, -0.0, 0.0, 1.5, np.inf, np.nan], np.float32)
  x = Tensor(data).realize()
  c = np.float32(value)
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    for got, want in (((x * value).numpy(), data * c), ((x + value).numpy(), data + c),
                      ((value - x).numpy(), c - data), ((x < value).numpy(), data < c)):
      np.testing.assert_array_equal(got, want)
      if want.dtype != np.bool_:   # -0.0 stays -0.0 (a NaN's sign bit means nothing)
        np.testing.assert_array_equal(np.signbit(got[~np.isnan(want)]), np.signbit(want[~np.isnan(want)]))

def test_tinyjit_replays_its_constant_and_refuses_another():
  data = np.arange(8, dtype=np.float32)
  @TinyJit
  def scaled(x: Tensor, c: float) -> Tensor: return (x * c + 1.25).contiguous()
  for _ in range(4):   # run, capture, replay, replay
    np.testing.assert_array_equal(scaled(Tensor(data).realize(), 2.75).numpy(), data * np.float32(2.75) + 1.25)
  with pytest.raises(JitError, match="'c' is 3.5 in this call but was 2.75"): scaled(Tensor(data).realize(), 3.5)

# ---- CUDA: the renderer's parameters compile with NVRTC and compute the same values on the CUDA-on-CPU emulator

CUDA_DTYPES = [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int32, dtypes.uint8]

def _cuda_case(dtype):
  data = (np.arange(12) % 7 + 1).astype(np.float32 if dtype == dtypes.bfloat16 else dtype.np)
  x = Tensor(data, dtype=dtype)
  out = (x * 3 + 5) if dtype.is_int else (x * 0.375 - 2.5)
  [item] = kernel_items(out)
  return item, data

@pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
def test_cuda_scalar_parameters_compile(dtype):
  item, _ = _cuda_case(dtype)
  src = CUDARenderer("sm_90").render("scaled", linearize(Kernel(item.ast, CUDARenderer("sm_90"))))
  assert "long long scalar0_arg" in src and "long long scalar1_arg" in src
  assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"

@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
def test_cuda_scalar_parameters_on_cpu(dtype):
  item, data = _cuda_case(dtype)
  kernel = Kernel(item.ast, CUDARenderer(CPU_ARCH))
  global_size, local_size = kernel.launch_dims()
  input_dtype = next(u.dtype for u in item.ast.toposort() if u.op is Ops.DEFINE_GLOBAL and u.arg == 1)
  # bfloat16 memory holds the high halves of float32s (these values are exact in bfloat16)
  def memory(a: np.ndarray, dt) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) if dt == dtypes.bfloat16 else a.astype(dt.np)
  inputs, out = memory(data, input_dtype), memory(np.zeros(data.size), dtype)
  values = [item.var_vals[name] for name in sorted(item.var_vals)]
  run_on_cpu(kernel.renderer.render("kernel", linearize(kernel)), "kernel", global_size, local_size, [out, inputs],
             values)
  if dtype == dtypes.bfloat16: out = (out.astype(np.uint32) << 16).view(np.float32)
  want = data * 3 + 5 if dtype.is_int else data.astype(np.float64) * 0.375 - 2.5
  np.testing.assert_allclose(out.astype(np.float64), want, rtol=1e-6)
