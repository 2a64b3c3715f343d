"""The CUDA device on a real GPU: every op against numpy at explicit tolerances (exact where the op is IEEE-rounded or
integer), kernels under explicit opts, copies between devices, the caching allocator and event timing.

Every test is marked `gpu`; test/conftest.py skips them without an NVIDIA GPU and pycuda. Graphs are built as
LazyBuffers, so the tests depend only on the scheduler and the code generator, not on the Tensor front end. The
elementwise, cast and bitcast references follow the Ops docstring (ops.py) and the renderers' documented choices:
half and bfloat16 math in float32, rounded to the format after every op; float → int truncating and saturating, NaN → 0.
"""
import numpy as np
import pytest
from tgrad.dtype import DType, dtypes
from tgrad.ops import Ops
from tgrad.lazy import LazyBuffer
from tgrad.device import Device, Buffer
from tgrad.schedule import create_schedule
from tgrad.realize import realize, run_schedule, compile_kernel
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.helpers import Context

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(0)
FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64]
ALL = [dtypes.bool] + INTS + FLOATS
N = 1024   # elements per elementwise test: a multiple of 4·256, so the heuristics vectorize
DEVICE = "CUDA"   # where the elementwise, cast and bitcast tests run; their references are numpy's

def numpy_of(out: LazyBuffer) -> np.ndarray:
  out = out.contiguous()
  realize(out)
  data = out.base.buffer.copyout().reshape(out.shape)
  return data.view(np.uint16) if out.dtype == dtypes.bfloat16 else data

def special_values(dtype: DType, n: int = N) -> np.ndarray:
  """n values of dtype with its edge cases first (0, -0, ±1, limits, inf, NaN), then random ones."""
  if dtype.is_bool: return RNG.integers(0, 2, n).astype(bool)
  if dtype.is_int:
    edges = [0, 1, -1, 2, -2, 7, -7, dtypes.min(dtype), dtypes.max(dtype), dtypes.min(dtype) + 1]
    info = np.iinfo(dtype.np)
    edges = [e for e in edges if info.min <= e <= info.max]
    rand = RNG.integers(info.min, info.max, n, dtype=dtype.np, endpoint=True)
    rand[:len(edges)] = edges
    return rand
  edges = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.5, 1e-30, 1e30, 65504.0, 70000.0, 3e9, -3e9, 1e20, np.inf, -np.inf,
           np.nan]
  rand = (RNG.standard_normal(n) * RNG.choice([1e-3, 1, 100, 1e5], n)).astype(np.float64)
  rand[:len(edges)] = edges
  if dtype == dtypes.bfloat16:
    bits = rand.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)   # the bfloat16 bits of each value
  return rand.astype(dtype.np)

def on(device: str, data: np.ndarray, dtype: DType) -> LazyBuffer: return LazyBuffer.from_host(data, device, dtype)

def as_float64(x: np.ndarray, dtype: DType) -> np.ndarray:
  """The values of dtype's bits (bfloat16 arrives as uint16) as float64; signaling NaNs become quiet NaNs."""
  with np.errstate(invalid="ignore"):
    return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64) if dtype == dtypes.bfloat16 else \
      x.astype(np.float64)

def bfloat16_bits(x: np.ndarray) -> np.ndarray:
  """float32 values rounded to the nearest bfloat16 (ties to even), as its uint16 bits; NaN → the quiet NaN 0x7FC0."""
  bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
  return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)

def round_to(values: np.ndarray, dtype: DType) -> np.ndarray:
  """Float values (float32 or float64) rounded once to dtype, as the array that holds its bits."""
  if dtype == dtypes.bfloat16: return bfloat16_bits(values.astype(np.float32))
  with np.errstate(over="ignore"): return values.astype(dtype.np)

def assert_matches(got: np.ndarray, want: np.ndarray, dtype: DType, what: str) -> None:
  """Exactly equal: bytes for ints and bools, values for floats (NaN equals NaN, -0.0 equals 0.0). `dtype` is the
  result's; bfloat16 results are compared as values."""
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  if dtype.is_float and got.dtype != np.bool_:
    np.testing.assert_array_equal(as_float64(got, dtype), as_float64(want, dtype), err_msg=what)
  else:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    np.testing.assert_array_equal(got, want, err_msg=what)

# ---- elementwise ops against numpy

FLOAT_UNARY_EXACT = [Ops.SQRT, Ops.RECIP, Ops.NEG, Ops.TRUNC]
FLOAT_TRANSCENDENTAL = [Ops.EXP2, Ops.LOG2, Ops.SIN]
FLOAT_BINARY = [Ops.ADD, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.CMPLT, Ops.CMPNE]
INT_BINARY = [Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR,
              Ops.SHL, Ops.SHR]

def _cases():
  for dt in FLOATS:
    for op in FLOAT_UNARY_EXACT + FLOAT_TRANSCENDENTAL + FLOAT_BINARY + [Ops.WHERE]: yield op, dt
  for dt in INTS:
    for op in INT_BINARY + [Ops.NEG, Ops.WHERE]: yield op, dt
  for op in [Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPLT, Ops.MAX, Ops.WHERE]: yield op, dtypes.bool

def float_reference(op: Ops, a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
  """op on dtype's values, computed in float32 (float64 for float64) and rounded once to dtype: IEEE results for
  these ops, and what the renderers do for half and bfloat16. Comparisons give bools; WHERE picks a where a != b."""
  compute = np.float64 if dtype == dtypes.float64 else np.float32
  x, y = as_float64(a, dtype).astype(compute), as_float64(b, dtype).astype(compute)
  with np.errstate(all="ignore"):
    if op is Ops.CMPLT: return x < y
    if op is Ops.CMPNE: return x != y
    result = {Ops.SQRT: lambda: np.sqrt(x), Ops.RECIP: lambda: compute(1) / x, Ops.NEG: lambda: -x,
              Ops.TRUNC: lambda: np.trunc(x), Ops.ADD: lambda: x + y, Ops.MUL: lambda: x * y, Ops.FDIV: lambda: x / y,
              Ops.MAX: lambda: np.maximum(x, y), Ops.WHERE: lambda: np.where(x != y, x, y)}[op]()
  return round_to(result, dtype)

def _wrap(value: int, dtype: DType) -> int:
  """A Python int as dtype holds it: two's complement wrap-around."""
  value &= (1 << dtype.bits) - 1
  return value - (1 << dtype.bits) if not dtype.is_unsigned and value >= 1 << (dtype.bits - 1) else value

def _c_divide(x: int, y: int) -> int:
  """Division rounding toward zero, x / 0 = 0 (the Ops docstring's IDIV)."""
  if y == 0: return 0
  quotient = abs(x) // abs(y)
  return quotient if (x >= 0) == (y >= 0) else -quotient

INT_REFERENCE = {
  Ops.ADD: lambda x, y: x + y, Ops.MUL: lambda x, y: x * y, Ops.IDIV: _c_divide,
  Ops.MOD: lambda x, y: 0 if y == 0 else x - _c_divide(x, y) * y, Ops.MAX: max, Ops.AND: lambda x, y: x & y,
  Ops.OR: lambda x, y: x | y, Ops.XOR: lambda x, y: x ^ y, Ops.SHL: lambda x, y: x << y,
  Ops.SHR: lambda x, y: x >> y,   # Python's >> is arithmetic; unsigned values are never negative: logical
  Ops.NEG: lambda x, y: -x, Ops.WHERE: lambda x, y: x if x != y else y}

def int_reference(op: Ops, a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
  """op on Python ints (exact), wrapped to dtype; comparisons give bools."""
  if op is Ops.CMPLT: return a < b
  if op is Ops.CMPNE: return a != b
  fn = INT_REFERENCE[op]
  return np.array([_wrap(fn(x, y), dtype) for x, y in zip(a.tolist(), b.tolist())], dtype.np)

BOOL_REFERENCE = {Ops.AND: np.logical_and, Ops.OR: np.logical_or, Ops.XOR: np.logical_xor, Ops.CMPNE: np.not_equal,
                  Ops.CMPLT: np.less, Ops.MAX: np.logical_or, Ops.WHERE: lambda a, b: np.where(a != b, a, b)}

@pytest.mark.parametrize("op,dtype", list(_cases()), ids=lambda x: getattr(x, "name", str(x)))
def test_elementwise_matches_numpy(op: Ops, dtype: DType):
  a, b = special_values(dtype), np.roll(special_values(dtype), 3)
  if op in (Ops.SHL, Ops.SHR): b = (np.abs(b.astype(np.int64)) % dtype.bits).astype(dtype.np)   # amounts in [0, bits)
  if op is Ops.WHERE: fn = lambda x, y: x.alu(Ops.CMPNE, y).alu(Ops.WHERE, x, y)  # noqa: E731
  elif op in FLOAT_UNARY_EXACT + FLOAT_TRANSCENDENTAL or op is Ops.NEG: fn = lambda x, y: x.alu(op)  # noqa: E731
  else: fn = lambda x, y: x.alu(op, y)  # noqa: E731
  got = numpy_of(fn(on(DEVICE, a, dtype), on(DEVICE, b, dtype)))
  if op in FLOAT_TRANSCENDENTAL:   # polynomial approximations: within a few ulp of numpy in float64
    with np.errstate(all="ignore"):
      want = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin}[op](as_float64(a, dtype))
    rtol = {dtypes.float16: 2e-3, dtypes.bfloat16: 1e-2, dtypes.float32: 1e-6, dtypes.float64: 1e-14}[dtype]
    tiny = {dtypes.float16: 6e-8, dtypes.bfloat16: 1e-38, dtypes.float32: 1e-38, dtypes.float64: 1e-300}[dtype]
    want = want.astype(dtype.np if dtype != dtypes.bfloat16 else np.float32)
    np.testing.assert_allclose(as_float64(got, dtype), want, rtol=rtol, atol=tiny, err_msg=str(op))
    return
  if dtype.is_bool: want = BOOL_REFERENCE[op](a, b)
  elif dtype.is_float: want = float_reference(op, a, b, dtype)
  else: want = int_reference(op, a, b, dtype)
  assert_matches(got, want, dtype, f"{op} {dtype}")

def cast_reference(data: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  """data (src's bits) converted to dst as the renderers do: to bool is != 0 (NaN → True); float → int truncates
  toward zero and saturates, NaN → 0; to half or bfloat16 goes through float32 (one rounding from float64 to half,
  cvt.rn.f16.f64); ints wrap or extend."""
  if dst.is_bool: return (as_float64(data, src) != 0) if src.is_float else data != 0
  if src.is_float and not dst.is_float:
    low, high = dtypes.min(dst), dtypes.max(dst)
    def saturate(x: float) -> int:
      if np.isnan(x): return 0
      if np.isinf(x): return high if x > 0 else low
      return min(max(int(x), low), high)   # int() truncates toward zero
    return np.array([saturate(x) for x in as_float64(data, src).tolist()], dst.np)
  if src.is_float:
    values = as_float64(data, src)
    if dst == dtypes.float16 and src == dtypes.float64: return round_to(values, dst)
    return round_to(values if dst == dtypes.float64 else values.astype(np.float32), dst)
  if dst.is_float:   # from ints and bools: one rounding to float32 (or float64), then to half or bfloat16
    return round_to(data.astype(np.float64 if dst == dtypes.float64 else np.float32), dst)
  return data.astype(dst.np)   # two's complement: truncate, or extend by the source's signedness

@pytest.mark.parametrize("src", ALL, ids=lambda d: d.name)
def test_casts_match_numpy(src: DType):
  """Every conversion, including out-of-range and NaN floats to ints (saturating, NaN → 0)."""
  data = special_values(src)
  for dst in ALL:
    if dst == src: continue
    got = numpy_of(on(DEVICE, data, src).cast(dst))
    assert_matches(got, cast_reference(data, src, dst), dst, f"{src} → {dst}")

@pytest.mark.parametrize("src", [d for d in ALL if not d.is_bool], ids=lambda d: d.name)
def test_bitcasts_match_numpy(src: DType):
  """The same bits reinterpreted (numpy's view); bfloat16 results compare as values, since bfloat16 lives in float
  registers and a NaN pattern comes out as the quiet NaN."""
  data = special_values(src)
  for dst in [d for d in ALL if d.itemsize == src.itemsize and d != src and not d.is_bool]:
    got = numpy_of(on(DEVICE, data, src).cast(dst, bitcast=True))
    want = data.view(dst.np)
    if dst == dtypes.bfloat16: assert_matches(got, want, dst, f"bitcast {src} → {dst}")
    else: assert_matches(got.view(np.uint8), want.view(np.uint8), dtypes.uint8, f"bitcast {src} → {dst}")

def test_integer_division_edge_cases():
  a = np.array([7, -7, 7, -7, 5, -2**31, -2**31, 0, 3], np.int32)
  b = np.array([2, 2, -2, -2, 0, -1, 1, 0, 3], np.int32)
  div = numpy_of(on("CUDA", a, dtypes.int32).alu(Ops.IDIV, on("CUDA", b, dtypes.int32)))
  mod = numpy_of(on("CUDA", a, dtypes.int32).alu(Ops.MOD, on("CUDA", b, dtypes.int32)))
  np.testing.assert_array_equal(div, [3, -3, -3, 3, 0, -2**31, -2**31, 0, 1])
  np.testing.assert_array_equal(mod, [1, -1, 1, -1, 0, 0, 0, 0, 0])

def test_max_propagates_nan():
  a = np.array([np.nan, 1.0, np.nan, -1.0], np.float32)
  b = np.array([1.0, np.nan, np.nan, -2.0], np.float32)
  out = numpy_of(on("CUDA", a, dtypes.float32).alu(Ops.MAX, on("CUDA", b, dtypes.float32)))
  np.testing.assert_array_equal(out, [np.nan, np.nan, np.nan, -1.0])

# ---- reductions, matmul, masks, against numpy

def run_with_opts(out: LazyBuffer, opts: list[Opt]) -> np.ndarray:
  """Realize out's inputs, then run its last kernel on CUDA with exactly `opts`."""
  def apply(kernel: Kernel) -> None:
    for opt in opts: kernel.apply_opt(opt)
  return run_optimized(out, apply)

def run_optimized(out: LazyBuffer, optimize) -> np.ndarray:
  """Realize out's inputs, then run its last kernel on CUDA after `optimize(kernel)` applied its opts."""
  items = create_schedule([out])
  run_schedule(items[:-1])
  kernel = Kernel(items[-1].ast, Device["CUDA"].renderer)
  optimize(kernel)
  runner = compile_kernel("CUDA", kernel, "test_opts")
  result = Buffer("CUDA", items[-1].outputs[0].size, out.dtype)
  runner([result] + list(items[-1].inputs))
  return result.copyout()

REDUCE_OPTS = [[], [Opt(OptOps.GROUP, 0, 16)], [Opt(OptOps.GROUPTOP, 0, 16)], [Opt(OptOps.UNROLL, 0, 4)],
               [Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.GROUP, 0, 64)],
               [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.GROUP, 0, 8)],
               [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUPTOP, 0, 8), Opt(OptOps.UPCAST, 0, 2)],
               [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 0, 8)]]

@pytest.mark.parametrize("opts", REDUCE_OPTS, ids=str)
@pytest.mark.parametrize("op,np_fn", [(Ops.ADD, np.sum), (Ops.MAX, np.max), (Ops.MUL, np.prod)],
                         ids=["sum", "max", "prod"])
def test_row_reduce_with_opts(op, np_fn, opts):
  x = RNG.uniform(0.9, 1.1, (64, 256)).astype(np.float32)
  got = run_with_opts(on("CUDA", x, dtypes.float32).r(op, (1,)), opts)
  np.testing.assert_allclose(got, np_fn(x.astype(np.float64), axis=1), rtol=1e-5)

@pytest.mark.parametrize("shape,axes", [((1 << 22,), (0,)), ((4096, 1024), (1,)), ((4096, 64), (0,)),
                                        ((3, 1000, 7), (1,)), ((37, 1031), (0, 1))], ids=str)
def test_reductions_with_heuristics(shape, axes):
  x = RNG.standard_normal(shape).astype(np.float32)
  lb = on("CUDA", x, dtypes.float32)
  np.testing.assert_allclose(numpy_of(lb.r(Ops.ADD, axes)), x.astype(np.float64).sum(axes, keepdims=True),
                             rtol=1e-4, atol=1e-3)
  np.testing.assert_array_equal(numpy_of(lb.r(Ops.MAX, axes)), x.max(axes, keepdims=True))

def test_softmax_rows():
  x = RNG.standard_normal((512, 1000)).astype(np.float32)
  lb = on("CUDA", x, dtypes.float32)
  shifted = lb.alu(Ops.ADD, lb.r(Ops.MAX, (1,)).expand(x.shape).alu(Ops.NEG))
  e = shifted.alu(Ops.MUL, lb.const(1 / np.log(2))).alu(Ops.EXP2)
  got = numpy_of(e.alu(Ops.FDIV, e.r(Ops.ADD, (1,)).expand(x.shape)))
  want = np.exp(x - x.max(1, keepdims=True))
  np.testing.assert_allclose(got, want / want.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)

def matmul(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
  (n, k), m = a.shape, b.shape[1]
  product = a.reshape((n, k, 1)).expand((n, k, m)).alu(Ops.MUL, b.reshape((1, k, m)).expand((n, k, m)))
  return product.r(Ops.ADD, (1,)).reshape((n, m))

@pytest.mark.parametrize("n,k,m", [(256, 512, 128), (64, 4096, 64), (1, 1024, 1024), (100, 30, 70)], ids=str)
def test_matmul(n, k, m):
  a, b = RNG.standard_normal((n, k)).astype(np.float32), RNG.standard_normal((k, m)).astype(np.float32)
  got = numpy_of(matmul(on("CUDA", a, dtypes.float32), on("CUDA", b, dtypes.float32)))
  np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)

def _up(axis: int, amount: int) -> Opt: return Opt(OptOps.UPCAST, axis, amount)
def _local(axis: int, amount: int) -> Opt: return Opt(OptOps.LOCAL, axis, amount)
def _unroll(amount: int) -> Opt: return Opt(OptOps.UNROLL, 0, amount)
def _stage(operand: int, padding: int = 0) -> Opt: return Opt(OptOps.SMEM, operand, padding)
STAGED_MATMULS = [  # (n, k, m, opts): loads staged in shared memory (OptOps.SMEM) with tiles, threads and padding
  (256, 512, 256, [_up(0, 8), _up(1, 4), _unroll(8), _local(0, 16), _local(1, 16), _up(1, 2), _stage(0), _stage(1)]),
  (128, 256, 128, [_up(0, 4), _unroll(4), _local(0, 8), _local(1, 32), _stage(1, 4), _stage(0, 4)]),
  (64, 96, 64, [_stage(0)]), (64, 96, 64, [_local(1, 16), _stage(1), _up(0, 2)]),
  (100, 30, 70, [Opt(OptOps.PADTO, 0, 32), Opt(OptOps.PADTO, 1, 16), _local(0, 8), _local(1, 16), _stage(0),
                 _stage(1)]),
  (60, 48, 52, [_up(0, 3), _local(1, 13), _unroll(3), _stage(0, 1), _stage(1)]),   # a tile not a multiple of threads
  (16, 4096, 16, [Opt(OptOps.GROUP, 0, 32), _local(1, 4), _stage(0), _stage(1)]),
  (32, 64, 48, [_unroll(0), _local(0, 4), _local(1, 8), _stage(0)]),   # no reduce loop: one buffer
  (64, 40, 64, [_up(0, 4), _up(1, 4), _unroll(8), _local(0, 8), _local(1, 16), _stage(0), _stage(1)]),   # 5 steps
]

@pytest.mark.parametrize("n,k,m,opts", STAGED_MATMULS, ids=str)
def test_staged_matmul(n, k, m, opts):
  a, b = RNG.standard_normal((n, k)).astype(np.float32), RNG.standard_normal((k, m)).astype(np.float32)
  got = run_with_opts(matmul(on("CUDA", a, dtypes.float32), on("CUDA", b, dtypes.float32)), opts)
  np.testing.assert_allclose(got.reshape(n, m), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)

def test_staged_masked_input():
  """A staged load with a mask (a padded input): the copy reads zeros where the kernel would."""
  a, b = RNG.standard_normal((30, 40)).astype(np.float32), RNG.standard_normal((44, 24)).astype(np.float32)
  padded = on("CUDA", a, dtypes.float32).pad(((2, 0), (0, 4)))
  got = run_with_opts(matmul(padded, on("CUDA", b, dtypes.float32)), [_local(1, 8), _up(0, 4), _stage(0), _stage(1)])
  np.testing.assert_allclose(got.reshape(32, 24), np.pad(a, ((2, 0), (0, 4))).astype(np.float64) @ b, rtol=1e-4,
                             atol=1e-3)

FUZZ_CASES = 120          # random (matmul, opt sequence) pairs on the GPU
FUZZ_MAX_OPTS = 7
FUZZ_TRIES = 40           # random opts tried per case to find legal ones

def _random_opt(rng, half: bool) -> Opt:
  op = rng.choice([OptOps.UPCAST, OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.LOCAL, OptOps.GROUP,
                   OptOps.GROUPTOP, OptOps.PADTO, OptOps.SMEM, OptOps.SMEM, OptOps.SWAP] + [OptOps.TC] * 2 * half)
  if op is OptOps.SMEM: return Opt(op, rng.randrange(3), rng.choice([0, 1, 4, 8]))
  if op is OptOps.TC: return Opt(op, rng.randrange(2), 0)
  if op is OptOps.SWAP: return Opt(op, rng.randrange(3), rng.randrange(3))
  return Opt(op, rng.randrange(3), rng.choice([0, 2, 3, 4, 8, 16]))

def test_fuzz_random_opts_with_shared_memory():
  """Random legal opt sequences (shared-memory staging, tensor cores, threads, groups, padding, tiles) on random
  matmuls, some of half inputs, some with a padded (masked) input: every result matches numpy."""
  import random
  rng = random.Random(11)
  applied: set[OptOps] = set()
  for case in range(FUZZ_CASES):
    n, k, m = (rng.choice([1, 3, 8, 16, 24, 33, 48, 64]) for _ in range(3))
    half = rng.random() < 0.4
    a = RNG.standard_normal((n, k)).astype(np.float16 if half else np.float32)
    b = RNG.standard_normal((k, m)).astype(np.float16 if half else np.float32)
    dtype = dtypes.float16 if half else dtypes.float32
    a_lazy, a_ref = on("CUDA", a, dtype), a.astype(np.float64)
    if rng.random() < 0.25:   # a masked input: rows of zeros above a
      a_lazy, a_ref = a_lazy.pad(((2, 0), (0, 0))), np.pad(a_ref, ((2, 0), (0, 0)))
    out = half_dot(a_lazy, on("CUDA", b, dtype)) if half else matmul(a_lazy, on("CUDA", b, dtype))
    chosen: list[Opt] = []
    tensor_cores_first = half and rng.random() < 0.5   # TC applies to a fresh kernel only: half the half cases start so
    def optimize(kernel: Kernel) -> None:
      if tensor_cores_first:
        try:
          kernel.apply_opt(opt := Opt(OptOps.TC, rng.randrange(2), 0))
          chosen.append(opt)
        except KernelOptError: pass
      for _ in range(FUZZ_TRIES):
        if len(chosen) == FUZZ_MAX_OPTS: return
        opt = _random_opt(rng, half)
        try: kernel.apply_opt(opt)
        except KernelOptError: continue
        chosen.append(opt)
    got = run_optimized(out, optimize).reshape(a_ref.shape[0], m).astype(np.float64)
    applied.update(o.op for o in chosen)
    # half products are rounded to half unless tensor cores (exact) compute them
    atol = (2e-3 if half else 1e-4) * np.sqrt(k) + 1e-4
    np.testing.assert_allclose(got, a_ref @ b.astype(np.float64), rtol=1e-3, atol=atol,
                               err_msg=f"case {case}: {(n, k, m)} half={half} opts {chosen}")
  assert {OptOps.SMEM, OptOps.TC, OptOps.LOCAL, OptOps.GROUP, OptOps.PADTO, OptOps.UNROLL} <= applied

def test_half_matmul():
  a, b = RNG.standard_normal((128, 64)).astype(np.float16), RNG.standard_normal((64, 128)).astype(np.float16)
  got = numpy_of(matmul(on("CUDA", a, dtypes.float16), on("CUDA", b, dtypes.float16)))
  np.testing.assert_allclose(got.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-2, atol=0.1)

# ---- tensor cores (OptOps.TC, mma.sync m16n8k16): against float64 products of the exact half/bfloat16 inputs

def half_dot(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
  """a @ b as Tensor.dot builds it for half inputs: products cast to float32, summed. a's leading axes are a batch;
  b is (k, m) or has the same batch."""
  *batch, n, k = a.shape
  m, batch = b.shape[-1], tuple(batch)
  x = a.reshape(batch + (n, k, 1)).expand(batch + (n, k, m))
  y = b.reshape(batch + (1, k, m) if len(b.shape) > 2 else (1,) * len(batch) + (1, k, m)).expand(batch + (n, k, m))
  return x.alu(Ops.MUL, y).cast(dtypes.float32).r(Ops.ADD, (len(batch) + 1,)).reshape(batch + (n, m))

def random_low_precision(shape: tuple[int, ...], dtype: DType) -> np.ndarray:
  """Standard normal values in dtype (bfloat16: its bits as uint16, rounded to nearest even)."""
  x = RNG.standard_normal(shape).astype(np.float32)
  if dtype == dtypes.float16: return x.astype(np.float16)
  bits = x.view(np.uint32)
  return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)

def tc_tolerance(k: int) -> dict:
  """float32 accumulation of exact products: relative error ~1e-6·√k per term; 1e-3 leaves room, and a wrong
  fragment layout is off by O(1)."""
  return {"rtol": 1e-3, "atol": 1e-3 * np.sqrt(k)}

TC = Opt(OptOps.TC, 0, 0)
TC_CASES = [  # (a shape, b shape, opts, b stored transposed)
  ((16, 16), (16, 8), [TC], False), ((64, 64), (64, 64), [TC], False), ((48, 4096), (4096, 40), [TC], False),
  ((64, 128), (128, 64), [TC, _up(0, 2), _up(1, 4), _local(0, 2), _local(1, 2), Opt(OptOps.UNROLL, 0, 2)], False),
  ((3, 32, 64), (3, 64, 24), [TC, _up(2, 3)], False), ((32, 64), (64, 32), [TC], True),
  ((128, 64), (64, 128), [TC, Opt(OptOps.PADTO, 0, 3), _local(0, 3), _up(1, 2)], True),
  ((128, 256), (256, 256), [_up(1, 8), TC, _up(0, 4), _local(0, 2), _local(1, 2)], False),
  ((64, 128), (128, 128), [Opt(OptOps.UNROLL, 0, 2), _up(1, 4), TC, Opt(OptOps.UNROLL, 0, 0), _up(0, 2)], True),
  ((128, 256), (256, 256), [_up(1, 8), TC, _up(0, 4), _local(0, 2), _local(1, 2), Opt(OptOps.SMEM, 0, 8),
                            Opt(OptOps.SMEM, 1, 8)], False),
  ((64, 128), (128, 64), [TC, _up(0, 2), Opt(OptOps.UNROLL, 0, 2), _local(1, 2), Opt(OptOps.SMEM, 1, 0),
                          Opt(OptOps.SMEM, 0, 0)], True),
  # fragments loaded from the staged tiles with ldmatrix (B's column tiles contiguous: no UPCAST before TC)
  ((128, 256), (256, 256), [TC, _up(0, 4), _up(1, 4), _local(0, 2), _local(1, 2), Opt(OptOps.UNROLL, 0, 2),
                            Opt(OptOps.SMEM, 0, 8), Opt(OptOps.SMEM, 1, 8)], False),
  ((96, 64), (64, 48), [TC, _up(1, 3), _local(0, 3), Opt(OptOps.SMEM, 0, 0), Opt(OptOps.SMEM, 1, 0)], False),
  ((64, 48), (48, 64), [TC, _up(0, 2), _up(1, 4), Opt(OptOps.SMEM, 0, 8), Opt(OptOps.SMEM, 1, 8)], False),  # 3 steps
  # 72 KiB of tiles: dynamic shared memory
  ((128, 512), (512, 256), [TC, _up(0, 4), _up(1, 8), _local(0, 2), _local(1, 2), Opt(OptOps.UNROLL, 0, 4),
                            Opt(OptOps.SMEM, 0, 8), Opt(OptOps.SMEM, 1, 8)], False)]

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("a_shape,b_shape,opts,transposed", TC_CASES, ids=str)
def test_tensor_core_matmul(dtype, a_shape, b_shape, opts, transposed):
  a, b = random_low_precision(a_shape, dtype), random_low_precision(b_shape, dtype)
  b_memory = np.ascontiguousarray(np.swapaxes(b, -1, -2)) if transposed else b
  b_lazy = on("CUDA", b_memory, dtype)
  if transposed: b_lazy = b_lazy.permute(tuple(range(b.ndim - 2)) + (b.ndim - 1, b.ndim - 2))
  got = run_with_opts(half_dot(on("CUDA", a, dtype), b_lazy), opts)
  want = as_float64(a, dtype) @ as_float64(b, dtype)
  np.testing.assert_allclose(got.reshape(want.shape), want, **tc_tolerance(a_shape[-1]))

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_tensor_core_heuristics_with_epilogue(dtype):
  """Default opts (tensor cores first) on relu(a @ b + bias) with the result in the inputs' dtype, as Tensor.dot and
  a linear layer build it: the output replicas and the fused epilogue line up with the C fragments."""
  n, k, m = 256, 512, 192
  a, b, bias = (random_low_precision(s, dtype) for s in ((n, k), (k, m), (m,)))
  product = half_dot(on("CUDA", a, dtype), on("CUDA", b, dtype)).cast(dtype)
  biased = product.alu(Ops.ADD, on("CUDA", bias, dtype).reshape((1, m)).expand((n, m)))
  got = as_float64(numpy_of(biased.alu(Ops.MAX, biased.const(0.0))), dtype)
  want = np.maximum(as_float64(a, dtype) @ as_float64(b, dtype) + as_float64(bias, dtype), 0)
  np.testing.assert_allclose(got, want, rtol=2e-2 if dtype == dtypes.bfloat16 else 4e-3, atol=1e-3 * np.sqrt(k) * 2)

# ---- TF32 tensor cores (mma.sync m16n8k8 .tf32): float32 inputs rounded to TF32 in the graph (the matmul lowering
# "tf32", composite.round_to_tf32), summed in float32: against float64 products of the rounded inputs

TF32_KEEP_MASK_BITS = 0xFFFFE000
TF32_HALF_ULP_BITS = 0x1000
# TF32 products are exact; the core's float32 sums (truncating, in K blocks of 8) stay within a few units of 2^-23 of
# each partial sum, far below this fraction of Σ|a'·b'| (a wrong fragment layout is off by O(1) of it)
TF32_SUM_TOLERANCE = 1e-5

def tf32_values(x: np.ndarray) -> np.ndarray:
  """Finite float32 values rounded to TF32 (to nearest, ties away from zero), as test_composite.py checks bit by bit."""
  return ((x.astype(np.float32).view(np.uint32) + np.uint32(TF32_HALF_ULP_BITS)) &
          np.uint32(TF32_KEEP_MASK_BITS)).view(np.float32)

def tf32_rounded_on_cuda(x: np.ndarray) -> LazyBuffer:
  from tgrad import Tensor
  from tgrad.tensor_ops.composite import round_to_tf32
  return round_to_tf32(Tensor(on("CUDA", x, dtypes.float32))).lazydata

def tf32_dot(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
  """a @ b as float32 products summed in float32 (a's leading axes a batch; b is (k, m) or has the same batch)."""
  *batch, n, k = a.shape
  m, batch = b.shape[-1], tuple(batch)
  x = a.reshape(batch + (n, k, 1)).expand(batch + (n, k, m))
  y = b.reshape(batch + (1, k, m) if len(b.shape) > 2 else (1,) * len(batch) + (1, k, m)).expand(batch + (n, k, m))
  return x.alu(Ops.MUL, y).r(Ops.ADD, (len(batch) + 1,)).reshape(batch + (n, m))

def assert_tf32_matmul(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
  a64, b64 = tf32_values(a).astype(np.float64), tf32_values(b).astype(np.float64)
  want, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
  error = np.max(np.abs(got.reshape(want.shape) - want) / scale)
  assert error < TF32_SUM_TOLERANCE, error

@pytest.mark.parametrize("a_shape,b_shape,opts,transposed", TC_CASES, ids=str)
def test_tf32_tensor_core_matmul(a_shape, b_shape, opts, transposed):
  """Every opt sequence of the half tensor-core cases on the TF32 core (the staged ones read fragments from the
  tiles: TF32 has no ldmatrix form)."""
  a, b = RNG.standard_normal(a_shape).astype(np.float32), RNG.standard_normal(b_shape).astype(np.float32)
  b_memory = np.ascontiguousarray(np.swapaxes(b, -1, -2)) if transposed else b
  b_lazy = tf32_rounded_on_cuda(b_memory)
  if transposed: b_lazy = b_lazy.permute(tuple(range(b.ndim - 2)) + (b.ndim - 1, b.ndim - 2))
  got = run_with_opts(tf32_dot(tf32_rounded_on_cuda(a), b_lazy), opts)
  assert_tf32_matmul(got, a, b)

@pytest.mark.parametrize("a_shape,b_shape,uses_tc", [((64, 64), (64, 64), True), ((128, 40), (40, 96), True),
                                                     ((3, 32, 64), (3, 64, 24), True), ((256, 512), (512, 192), True),
                                                     ((2048, 64), (64, 2048), True), ((100, 30), (30, 70), False)],
                         ids=str)
def test_tf32_tensor_core_heuristics(a_shape, b_shape, uses_tc):
  """The default opts: tensor cores where the shape tiles (a 2048² output stages both inputs), FMA where it doesn't
  (K = 30): the same numbers either way."""
  from tgrad.codegen.heuristics import hand_coded_optimizations
  a, b = RNG.standard_normal(a_shape).astype(np.float32), RNG.standard_normal(b_shape).astype(np.float32)
  kernels: list[Kernel] = []
  def optimize(kernel: Kernel) -> None:
    hand_coded_optimizations(kernel)
    kernels.append(kernel)
  got = run_optimized(tf32_dot(tf32_rounded_on_cuda(a), tf32_rounded_on_cuda(b)), optimize)
  assert (kernels[0].tensor_core is not None) == uses_tc
  assert_tf32_matmul(got, a, b)

def test_tf32_lowering_through_the_tensor_api():
  """Tensor @ on CUDA with the region's lowering set to "tf32" (as a selected path does), then with BEAM=2: the same
  numbers; the default float32 matmul stays on FMA and exact to float32."""
  from tgrad import Tensor
  from tgrad.regions import apply_lowering, regions_above
  a, b = RNG.standard_normal((128, 96)).astype(np.float32), RNG.standard_normal((96, 64)).astype(np.float32)
  for beam in (0, 2):
    out = Tensor(a, device="CUDA") @ Tensor(b, device="CUDA")
    apply_lowering(regions_above(out.lazydata)[0], "tf32")
    with Context(BEAM=beam): assert_tf32_matmul(out.numpy(), a, b)
  exact = (Tensor(a, device="CUDA") @ Tensor(b, device="CUDA")).numpy()
  np.testing.assert_allclose(exact, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)

def test_tf32_path_is_measured():
  """The tf32 path of a CUDA matmul measures against the float64 reference (built from the default lowering, so its
  bitcasts don't stop it) with TF32's error, far above the default's."""
  from tgrad import Tensor
  from tgrad.paths.path import iterate, measure, reference_outputs
  a, b = RNG.standard_normal((256, 128)).astype(np.float32), RNG.standard_normal((128, 128)).astype(np.float32)
  space = iterate(Tensor(a, device="CUDA") @ Tensor(b, device="CUDA"))
  assert "tf32" in space.options[0]
  reference = reference_outputs(space)
  runs = {path.choices[0]: measure(space, path, reference, repeats=2) for path in space
          if path.choices[0] in ("default", "tf32")}
  assert not runs["tf32"].error and not runs["default"].error
  # K = 128 products of N(0, 1) values: float32's sum is off by ~2e-5 at most, TF32's input rounding (~2.8e-4 rms
  # relative per input) by ~0.015 (numpy, same shapes)
  assert runs["default"].max_abs_error < 1e-4
  assert 2e-3 < runs["tf32"].max_abs_error < 5e-2 and runs["tf32"].kernels == runs["default"].kernels

def test_round_to_tf32_on_cuda_is_bit_exact():
  """The rounding's bit arithmetic on the GPU: the same bits as on the CPU (NaN payloads, inf, ties, subnormals)."""
  from tgrad import Tensor
  from tgrad.tensor_ops.composite import round_to_tf32
  bits = np.concatenate([np.array([0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F7FFFFF, 0x3F801000, 0xBF801000,
                                   0x00001000, 0x007FFFFF, 0x80000000, 0xFF800000], np.uint32),
                         RNG.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)])
  x = bits.view(np.float32)
  on_gpu = round_to_tf32(Tensor(x, device="CUDA")).numpy().view(np.uint32)
  on_cpu = round_to_tf32(Tensor(x, device="LLVM")).numpy().view(np.uint32)
  np.testing.assert_array_equal(on_gpu, on_cpu)

def test_padding_shrink_and_arange():
  x = RNG.standard_normal((30, 32)).astype(np.float32)
  padded = numpy_of(on("CUDA", x, dtypes.float32).pad(((1, 1), (4, 0))).alu(Ops.SQRT))
  np.testing.assert_array_equal(padded, np.sqrt(np.pad(x, ((1, 1), (4, 0)))))
  y = RNG.standard_normal(65).astype(np.float32)
  np.testing.assert_array_equal(numpy_of(on("CUDA", y, dtypes.float32).shrink(((1, 65),)).alu(Ops.NEG)), -y[1:])
  counter = LazyBuffer.loadop(Ops.ARANGE, (1000,), dtypes.int32, "CUDA").pad(((2, 2),))
  np.testing.assert_array_equal(numpy_of(counter), np.pad(np.arange(1000, dtype=np.int32), 2))

@pytest.mark.parametrize("index_dtype,table_dtype", [(dtypes.int32, dtypes.float32), (dtypes.int8, dtypes.float16),
                                                     (dtypes.int64, dtypes.bfloat16)])
@pytest.mark.parametrize("opts", [None, (Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 8), Opt(OptOps.LOCAL, 0, 2))])
def test_gather_reads_rows_clamped(index_dtype, table_dtype, opts):
  """A data-dependent load (GATHER) times 2: the heuristics' or explicit opts; out-of-range ids read clamped rows."""
  rows, hidden = 100, 64
  bits = RNG.integers(0, 1 << 14, (rows, hidden)).astype(np.uint16)   # small positive half/bfloat16 values
  table = {dtypes.float32: RNG.standard_normal((rows, hidden)).astype(np.float32),
           dtypes.float16: bits.view(np.float16), dtypes.bfloat16: bits}[table_dtype]
  ids = np.array([3, 99, 0, -4, 120, 7], index_dtype.np)
  index = on("CUDA", ids, index_dtype).reshape((6, 1)).expand((6, hidden))
  out = on("CUDA", table, table_dtype).gather(index, 0)
  out = out.alu(Ops.MUL, out.const(2.0))
  if opts is None: got = numpy_of(out)
  else:
    got = run_with_opts(out, list(opts)).reshape(6, hidden)
    if table_dtype == dtypes.bfloat16: got = got.view(np.uint16)
  rows_read = as_float64(table, table_dtype)[np.clip(ids.astype(np.int64), 0, rows - 1)]
  np.testing.assert_array_equal(as_float64(got, table_dtype), rows_read * 2)

@pytest.mark.parametrize("shape", [(70000, 4), (3, 70000, 2)], ids=str)
def test_grid_limits_without_opts(shape):
  """One thread per element and no LOCAL: a 70000 axis can't be blockIdx.y (≤ 65535), so it is folded."""
  x = RNG.standard_normal(shape).astype(np.float32)
  transposed = on("CUDA", x.T.copy(), dtypes.float32).permute(tuple(reversed(range(len(shape)))))   # axes don't merge
  with Context(NOOPT=1): got = numpy_of(transposed.alu(Ops.NEG))
  np.testing.assert_array_equal(got, -x)

# ---- device plumbing

@pytest.mark.parametrize("nbytes", [12, 3 << 20, (20 << 20) + 4], ids=["small", "staged", "staged-uneven"])
def test_copies_between_devices(nbytes):
  data = RNG.integers(0, 255, nbytes, dtype=np.uint8)
  on_cuda = LazyBuffer.from_host(data, "LLVM").copy_to_device("CUDA")
  back = on_cuda.alu(Ops.ADD, on_cuda.const(1)).copy_to_device("LLVM")
  realize(back)
  np.testing.assert_array_equal(back.base.buffer.copyout(), data + np.uint8(1))

@pytest.mark.parametrize("to_device", ["CUDA", "LLVM"])
def test_copies_of_views(to_device):
  """A copy moves a whole buffer: permuted and shrunk views are made contiguous on their device first."""
  x = RNG.standard_normal((6, 8)).astype(np.float32)
  source = on("LLVM" if to_device == "CUDA" else "CUDA", x, dtypes.float32)
  for view, want in [(source.permute((1, 0)), x.T), (source.shrink(((1, 4), (2, 8))), x[1:4, 2:8])]:
    np.testing.assert_array_equal(numpy_of(view.copy_to_device(to_device).alu(Ops.NEG)), -want)

@pytest.mark.parametrize("device", ["CUDA", "LLVM"])
def test_stream_ordered_copies(device):
  """copyin_async lands after the queued kernels and before later ones; copyout_async reads what the queued work
  left; more reads in flight than the pinned ring has slots keep their values; copies past a slot fall back."""
  rng = np.random.default_rng(5)
  from tgrad.runtime.cuda.runtime import ASYNC_SLOTS, ASYNC_SLOT_BYTES
  buffer = Buffer(device, 256, dtypes.int32).copyin(np.zeros(256, np.int32))
  reads = []
  for _ in range(3 * ASYNC_SLOTS):
    value = rng.integers(-1000, 1000, 256, dtype=np.int32)
    buffer.copyin_async(value)
    value[:] = 0   # the source may be reused at once: the allocator staged it
    reads.append(buffer.copyout_async())
  for read in reads: assert read.wait().shape == (256,) and read.wait().dtype == np.int32
  rng = np.random.default_rng(5)
  for step, read in enumerate(reads):
    np.testing.assert_array_equal(read.wait(), rng.integers(-1000, 1000, 256, dtype=np.int32), err_msg=f"{step}")
  big = np.arange(ASYNC_SLOT_BYTES // 4 + 7, dtype=np.int32)
  large = Buffer(device, big.size, dtypes.int32).copyin_async(big)
  np.testing.assert_array_equal(large.copyout_async().wait(), big)
  # ordered with kernels: a kernel's result is read back without a synchronize, and a later copyin does not race it
  x = RNG.standard_normal(4096).astype(np.float32)
  lazy = on(device, x, dtypes.float32)
  out = lazy.alu(Ops.MUL, lazy.const(2.0))
  realize(out)
  pending = out.base.buffer.copyout_async()
  out.base.buffer.copyin_async(np.zeros(4096, np.float32))
  np.testing.assert_array_equal(pending.wait(), x * 2)
  np.testing.assert_array_equal(out.base.buffer.copyout_async().wait(), np.zeros(4096, np.float32))

def test_allocator_reuses_freed_blocks_by_exact_size():
  allocator = Device["CUDA"].allocator
  first = allocator.alloc(4096)
  allocator.free(first, 4096)
  assert allocator.alloc(4096) is first
  other = allocator.alloc(4100)
  assert other is not first
  allocator.free(other, 4100)

def test_device_limits_come_from_the_gpu():
  device = Device["CUDA"]
  renderer = device.renderer
  assert renderer.max_local_size >= 1024 and renderer.max_grid[0] == 2**31 - 1 and renderer.max_grid[1] == 65535
  assert renderer.shared_memory_bytes >= 48 * 1024 and device.compiler.arch == renderer.arch
  assert renderer.arch.startswith("sm_") and device.compiler.cache_key.startswith("nvrtc-")

def test_event_timing_measures_the_kernel():
  x = on("CUDA", np.ones(1 << 24, np.float32), dtypes.float32)
  items = create_schedule([x.alu(Ops.EXP2)])
  run_schedule(items[:-1])
  kernel = Kernel(items[-1].ast, Device["CUDA"].renderer)
  runner = compile_kernel("CUDA", kernel, "timed")
  out = Buffer("CUDA", 1 << 24, dtypes.float32)
  seconds = [runner([out, items[-1].inputs[0]], wait=True) for _ in range(3)]
  assert all(isinstance(s, float) and 1e-6 < s < 0.5 for s in seconds), seconds   # 128 MB moved: µs to ms
  np.testing.assert_allclose(out.copyout()[:4], 2.0)
