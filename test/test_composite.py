"""Composite ops as lazy-graph regions (tgrad/tensor_ops/composite.py): every lowering of every composite against
torch/numpy (float64) on random odd-sized inputs in float32 and float16 on the CPU (LLVM) device; the round trip
apply_lowering → "default" leaves the same kernels (AST keys) and values; regions_above's order; gradients after a
lowering is applied; refusals. The CUDA-only lowerings are rendered for CUDA and compiled by NVRTC (no GPU needed).
"""
import math, zlib
import numpy as np
import pytest
import torch
from tgrad import Tensor
from tgrad.dtype import dtypes
from tgrad.ops import Ops, exec_alu
from tgrad.schedule import create_schedule
from tgrad.regions import LOWERINGS, Region, apply_lowering, exact_lowering, lowerings_for, regions_above
from tgrad.tensor_ops.composite import round_to_tf32

RNG = np.random.default_rng(7)
torch_f = torch.nn.functional

@pytest.fixture(autouse=True)
def _data_of_each_test_fixed(request):
  """Each test draws the same inputs however the tests are ordered or spread over workers."""
  global RNG
  RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))

def data(shape, low=-3.0, high=3.0) -> np.ndarray: return RNG.uniform(low, high, shape)

def gelu_tanh_reference(x): return torch_f.gelu(x, approximate="tanh")
def gelu_exact_reference(x): return torch_f.gelu(x)

# composite → (input arrays, the Tensor call, the torch float64 reference, per-lowering references that differ)
CASES = {
  "exp": (lambda: [data((5, 7), -10, 10)], lambda x: x.exp(), torch.exp, {}),
  "log": (lambda: [data((5, 7), 0.01, 100)], lambda x: x.log(), torch.log, {}),
  "tanh": (lambda: [data((3, 11), -6, 6)], lambda x: x.tanh(), torch.tanh, {}),
  "sigmoid": (lambda: [data((13,), -12, 12)], lambda x: x.sigmoid(), torch.sigmoid, {}),
  "gelu": (lambda: [data((5, 7), -5, 5)], lambda x: x.gelu(), gelu_tanh_reference, {"erf": gelu_exact_reference}),
  "softmax": (lambda: [data((5, 33), -8, 8)], lambda x: x.softmax(), lambda x: torch.softmax(x, -1), {}),
  "log_softmax": (lambda: [data((7, 9), -8, 8)], lambda x: x.log_softmax(0), lambda x: torch.log_softmax(x, 0), {}),
  "logsumexp": (lambda: [data((6, 35), -8, 8)], lambda x: x.logsumexp(-1), lambda x: torch.logsumexp(x, -1), {}),
  "rms_norm": (lambda: [data((4, 19))], lambda x: x.rms_norm(eps=1e-5),
               lambda x: torch_f.rms_norm(x, (19,), eps=1e-5), {}),
  "layer_norm": (lambda: [data((4, 19))], lambda x: x.layernorm(), lambda x: torch_f.layer_norm(x, (19,)), {}),
  "scaled_dot_product_attention": (
    lambda: [data((2, 3, 5, 8)), data((2, 3, 7, 8)), data((2, 3, 7, 6))],
    lambda q, k, v: q.scaled_dot_product_attention(k, v), torch_f.scaled_dot_product_attention, {}),
  "matmul": (lambda: [data((5, 37)), data((37, 3))], lambda a, b: a @ b, torch.matmul, {}),
}
# absolute and relative tolerance per input dtype (float16 results are rounded to float16: ~1e-3 relative)
TOLERANCE = {dtypes.float32: (2e-6, 2e-5), dtypes.float16: (2e-3, 4e-3)}
# where a lowering or the composite's own float16 arithmetic is looser than the output's rounding: a float16 matmul
# rounds each product to float16 (2^-11 relative, 37 of them summed: ~0.03 absolute at these magnitudes), and an
# accumulator in float16 rounds every partial sum too; attention in float16 rounds its scores and weights to float16
# before the second product
LOOSER = {("matmul", dtypes.float16): (5e-2, 1e-2), ("matmul", "acc_float16"): (1.5e-1, 2e-2),
          ("scaled_dot_product_attention", dtypes.float16): (2e-2, 1e-2)}

def tolerance(name: str, lowering: str, dtype) -> tuple[float, float]:
  return LOOSER.get((name, lowering), LOOSER.get((name, dtype), TOLERANCE[dtype]))

def lowerings_on_cpu(name: str, dtype) -> list[tuple[str, str]]:
  region = _region_of(name, dtype)
  return [(name, lowering) for lowering in lowerings_for(region)]

def _region_of(name: str, dtype, device: str = "LLVM") -> Region:
  make, call, _, _ = CASES[name]
  out = call(*[Tensor(a.astype(np.float32), device=device).cast(dtype) for a in make()])
  return regions_above(out.lazydata)[0]

ALL_CPU = [(name, lowering, dtype) for dtype in (dtypes.float32, dtypes.float16) for name in CASES
           for name, lowering in lowerings_on_cpu(name, dtype)]

@pytest.mark.parametrize("name, lowering, dtype", ALL_CPU, ids=[f"{n}-{lo}-{d.name}" for n, lo, d in ALL_CPU])
def test_lowering_matches_reference(name, lowering, dtype):
  make, call, reference, references = CASES[name]
  arrays = [a.astype(dtype.np) for a in make()]
  out = call(*[Tensor(a) for a in arrays])
  region = regions_above(out.lazydata)[0]
  assert region.name == name and region.current == "default"
  apply_lowering(region, lowering)
  assert region.current == lowering
  want = references.get(lowering, reference)(*[torch.tensor(a.astype(np.float64)) for a in arrays]).numpy()
  atol, rtol = tolerance(name, lowering, dtype)
  got = out.numpy()
  assert got.dtype == dtype.np
  np.testing.assert_allclose(got.astype(np.float64), want, atol=atol, rtol=rtol, err_msg=f"{name} {lowering}")

def schedule_keys(out: Tensor) -> list[str]:
  return [item.ast.key for item in create_schedule([out.lazydata], commit=False)]

@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_restores_the_default_graph(name):
  make, call, _, _ = CASES[name]
  arrays = make()
  original = call(*[Tensor(a.astype(np.float32)) for a in arrays])
  keys, values = schedule_keys(original), original.numpy()
  out = call(*[Tensor(a.astype(np.float32)) for a in arrays])
  assert schedule_keys(out) == keys   # a fresh default graph: the same kernels
  region = regions_above(out.lazydata)[0]
  for lowering in lowerings_for(region)[1:]:
    apply_lowering(region, lowering)
    if (name, lowering) != ("gelu", "tanh"): assert schedule_keys(out) != keys, lowering   # gelu's default is tanh
    apply_lowering(region, "default")
    assert schedule_keys(out) == keys, lowering
  np.testing.assert_array_equal(out.numpy(), values)

def test_registry_shape_and_exact_lowerings():
  for name, lowerings in LOWERINGS.items():
    assert next(iter(lowerings)) == "default", name
    assert all(lowering.name == key and lowering.description for key, lowering in lowerings.items())
  assert [exact_lowering(n) for n in ("exp", "log", "tanh", "sigmoid", "gelu", "rms_norm", "matmul")] == \
    ["libm", "libm", "native", "default", "erf", "recip_sqrt", "acc_float32"]
  assert exact_lowering("softmax") == exact_lowering("logsumexp") == "default"

def test_lowerings_for_device_and_dtype():
  # every float composite also has the device alternatives: "numpy" anywhere, "on_LLVM" where it is not on LLVM
  assert lowerings_for(_region_of("exp", dtypes.float32)) == ["default", "libm", "numpy", "poly"]
  assert lowerings_for(_region_of("exp", dtypes.float32, "CUDA")) == ["default", "fast", "libm", "numpy", "on_LLVM",
                                                                      "poly"]
  assert lowerings_for(_region_of("exp", dtypes.float64, "CUDA")) == ["default", "libm", "numpy", "on_LLVM", "poly"]
  assert lowerings_for(_region_of("tanh", dtypes.float16, "CUDA")) == ["default", "fast", "native", "numpy", "on_LLVM",
                                                                       "via_exp"]
  assert lowerings_for(_region_of("matmul", dtypes.float32)) == ["default", "numpy"]   # tf32 is offered on CUDA only
  assert lowerings_for(_region_of("matmul", dtypes.float32, "CUDA")) == ["default", "numpy", "on_LLVM", "tf32"]
  assert "tf32" not in lowerings_for(_region_of("matmul", dtypes.float16, "CUDA"))
  assert lowerings_for(_region_of("matmul", dtypes.float16)) == ["default", "acc_float16", "acc_float32", "numpy"]
  assert lowerings_for(_region_of("matmul", dtypes.bfloat16)) == ["default", "acc_float32", "numpy"]
  ints = (Tensor(np.arange(6, dtype=np.int32).reshape(2, 3)) @ Tensor(np.ones((3, 2), np.int32))).lazydata
  assert lowerings_for(regions_above(ints)[0]) == ["default"]

def test_refusals():
  region = _region_of("tanh", dtypes.float32)
  with pytest.raises(ValueError, match="tanh.*'nope'"): apply_lowering(region, "nope")
  with pytest.raises(ValueError, match="'fast' of composite 'tanh'.*LLVM"): apply_lowering(region, "fast")
  with pytest.raises(ValueError, match="acc_float16.*matmul"): apply_lowering(_region_of("matmul", dtypes.float32),
                                                                              "acc_float16")
  with pytest.raises(ValueError, match="'tf32' of composite 'matmul'.*LLVM"):
    apply_lowering(_region_of("matmul", dtypes.float32), "tf32")
  out = Tensor(data((3, 5)).astype(np.float32)).tanh()
  region = regions_above(out.lazydata)[0]
  out.realize()
  assert regions_above(out.lazydata) == [] and out.lazydata.base.region is None   # realized: it lets go of inputs
  with pytest.raises(ValueError, match="realized"): apply_lowering(region, "native")

def test_regions_above_order_and_nesting():
  x = Tensor(data((4, 9)).astype(np.float32))
  a, b = x.gelu(), x.softmax()
  out = a + b
  order = [r.name for r in regions_above(out.lazydata)]
  assert order == ["gelu", "tanh", "softmax", "exp"]
  assert [r.name for r in regions_above(out.lazydata)] == order and regions_above(b.lazydata, a.lazydata)[0].name == \
    "softmax"
  gelu = regions_above(out.lazydata)[0]
  apply_lowering(gelu, "erf")   # the erf form: its exp replaces the tanh region under the current lowerings
  assert [r.name for r in regions_above(out.lazydata)] == ["gelu", "exp", "softmax", "exp"]
  apply_lowering(gelu, "default")
  assert [r.name for r in regions_above(out.lazydata)] == order
  # each region once, however many paths reach it
  shared = x.tanh()
  assert [r.name for r in regions_above((shared * shared + shared).lazydata)] == ["tanh"]

def test_region_records_inputs_params_and_root():
  x = Tensor(data((3, 5)).astype(np.float16))
  out = x.softmax(0)
  region = regions_above(out.lazydata)[0]
  assert region.inputs == (x.lazydata,) and region.params == (("axis", 0),) and region.root is out.lazydata.base
  matmul = regions_above((Tensor(data((5,)).astype(np.float32)) @ Tensor(data((5, 2)).astype(np.float32))).lazydata)
  assert matmul[0].params == (("acc_dtype", None),)
  ln = regions_above(Tensor(data((3, 5))).layernorm(eps=1e-3).lazydata)[0]
  assert ln.params == (("axis", -1), ("eps", 1e-3))

def test_three_kernels_softmax_is_three_kernels():
  x = Tensor(data((6, 33)).astype(np.float32))
  out = x.softmax()
  fused = len(create_schedule([out.lazydata], commit=False))
  apply_lowering(regions_above(out.lazydata)[0], "three_kernels")
  assert len([i for i in create_schedule([out.lazydata], commit=False) if i.ast.op is Ops.SINK]) == 3 > fused - 1

def test_a_view_output_gets_a_cast_identity_root():
  # a matrix–vector product's output is a reshape of its reduce: an alternative replaces the root with an identity
  a, v = data((4, 37)).astype(np.float16), data((37,)).astype(np.float16)
  out = Tensor(a) @ Tensor(v)
  region = regions_above(out.lazydata)[0]
  apply_lowering(region, "acc_float16")
  atol, rtol = tolerance("matmul", "acc_float16", dtypes.float16)
  np.testing.assert_allclose(out.numpy().astype(np.float64), a.astype(np.float64) @ v.astype(np.float64), atol=atol,
                             rtol=rtol)

GRADIENT_CASES = [("tanh", "native"), ("tanh", "via_exp"), ("sigmoid", "via_tanh"), ("gelu", "erf"),
                  ("softmax", "three_kernels"), ("log_softmax", "three_kernels"), ("softmax", "online"),
                  ("log_softmax", "online"), ("logsumexp", "online"), ("rms_norm", "recip_sqrt"),
                  ("layer_norm", "recip_sqrt"), ("exp", "libm"), ("log", "poly"),
                  ("scaled_dot_product_attention", "unfused_softmax")]

@pytest.mark.parametrize("name, lowering", GRADIENT_CASES, ids=[f"{n}-{lo}" for n, lo in GRADIENT_CASES])
def test_gradients_after_a_lowering(name, lowering):
  make, call, reference, _ = CASES[name]
  arrays = make()
  inputs = [Tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
  out = call(*inputs)
  apply_lowering(regions_above(out.lazydata)[0], lowering)
  weights = data(out.shape)
  (out * Tensor(weights.astype(np.float32))).sum().backward()
  torch_inputs = [torch.tensor(a, requires_grad=True) for a in arrays]
  (reference(*torch_inputs) * torch.tensor(weights)).sum().backward()
  for t, want in zip(inputs, torch_inputs):
    np.testing.assert_allclose(t.grad.numpy(), want.grad.numpy(), atol=2e-5, rtol=2e-4, err_msg=f"{name} {lowering}")

def test_exec_alu_tanh_and_edge_values():
  assert exec_alu(Ops.TANH, dtypes.float32, (0.5,)) == pytest.approx(math.tanh(0.5), rel=1e-7)
  edges = np.array([0.0, -0.0, 1e-20, -1e-6, 20.0, -20.0, np.inf, -np.inf, np.nan], np.float32)
  for lowering in ("default", "via_exp", "native"):
    out = Tensor(edges).tanh()
    apply_lowering(regions_above(out.lazydata)[0], lowering)
    np.testing.assert_allclose(out.numpy(), np.tanh(edges), atol=2e-7, err_msg=lowering)

def test_rms_norm_is_rmsnorm_and_gemma_norm_graph():
  x = Tensor(data((3, 8)).astype(np.float32))
  assert schedule_keys(x.rms_norm(-1, 1e-6)) == schedule_keys(x.rmsnorm(-1, 1e-6))
  from tgrad.models.gemma3 import Gemma3RMSNorm
  norm = Gemma3RMSNorm(Tensor(data((8,)).astype(np.float32)), 1e-6)
  x16 = Tensor(data((3, 8)).astype(np.float16))
  by_hand = (x16.float() * norm.inverse_rms(x16.float()) * (norm.weight.float() + 1.0)).cast(dtypes.float16)
  assert schedule_keys(norm(x16)) == schedule_keys(by_hand)

# ---------------------------------------------------------------------------------------------------------------
# CUDA: the lowerings rendered for CUDA and compiled by NVRTC (sm_90), without a GPU

def cuda_sources(out: Tensor) -> list[str]:
  from tgrad.codegen.kernel import Kernel
  from tgrad.codegen.linearizer import linearize
  from tgrad.codegen.heuristics import hand_coded_optimizations
  from tgrad.runtime.cuda.renderer import CUDARenderer
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  sources = []
  for item in create_schedule([out.lazydata], commit=False):
    if item.ast.op is not Ops.SINK: continue
    kernel = Kernel(item.ast, CUDARenderer())
    hand_coded_optimizations(kernel)
    src = kernel.renderer.render("composite_check", linearize(kernel))
    assert compile_cuda(src, "sm_90")[:4] == b"\x7fELF"
    sources.append(src)
  return sources

def needs_nvrtc():
  from tgrad.runtime.cuda.nvrtc import nvrtc_available
  if not nvrtc_available(): pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc)")

# composite, lowering, what the CUDA source must contain, what it must not
CUDA_CASES = [("exp", "default", "exp2f(", "ex2.approx"), ("exp", "fast", "ex2.approx.f32", "exp2f("),
              ("exp", "libm", "exp2f(", "ex2.approx"), ("exp", "poly", "<<", "exp2f("),
              ("log", "fast", "lg2.approx.f32", "log2f("), ("log", "poly", ">>", "log2f("),
              ("tanh", "native", "tanhf(", "exp2f("), ("tanh", "fast", "tanh.approx.f32", "tanhf("),
              ("tanh", "via_exp", "exp2f(", "tanhf("), ("sigmoid", "via_tanh", "exp2f(", "tanhf("),
              ("gelu", "erf", "exp2f(", "tanhf("), ("matmul", "acc_float16", "", ""),
              ("matmul", "acc_float32", "", ""), ("matmul", "tf32", "4294959104u", ""),   # TF32's keep mask
              ("softmax", "three_kernels", "exp2f(", ""),
              ("softmax", "online", "exp2f(", ""), ("log_softmax", "online", "log2(", ""),
              ("logsumexp", "online", "log2(", "")]   # log Σ exp in float64
MATMUL_LOWERING_DTYPES = {"acc_float16": dtypes.float16, "acc_float32": dtypes.float16, "tf32": dtypes.float32}
SOFTMAX_KERNELS = {"three_kernels": 3, "online": 1}

@pytest.mark.parametrize("name, lowering, present, absent", CUDA_CASES, ids=[f"{c[0]}-{c[1]}" for c in CUDA_CASES])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16], ids=["float32", "float16"])
def test_cuda_lowerings_compile(name, lowering, present, absent, dtype):
  needs_nvrtc()
  if name == "matmul" and dtype != MATMUL_LOWERING_DTYPES[lowering]: pytest.skip(f"{lowering} is not for {dtype}")
  region = _region_of(name, dtype, "CUDA")
  assert lowering in lowerings_for(region)
  apply_lowering(region, lowering)
  out = Tensor(region.root)
  sources = cuda_sources(out)
  if name == "softmax": assert len(sources) == SOFTMAX_KERNELS[lowering]
  text = "\n".join(sources)
  assert present in text and (not absent or absent not in text), text

# ---------------------------------------------------------------------------------------------------------------
# matmul "tf32": inputs rounded to TF32 in the graph, then the float32 sum (on TF32 tensor cores on CUDA sm_80+)

TF32_ULP_EXPONENT_OFFSET = 11   # a TF32 value in [2^(e-1), 2^e) is a multiple of 2^(e-11) (10 mantissa bits)
FLOAT32_MIN_NORMAL_EXPONENT = -125   # frexp's exponent of 2^-126: below it (subnormals) the spacing stays fixed

def tf32_reference(x: np.ndarray) -> np.ndarray:
  """float32 x rounded to the nearest TF32 value, ties away from zero, computed in float64 arithmetic (exact here):
  |x| over the TF32 spacing at its magnitude, + 1/2, floored; past the largest finite float32 it is inf. NaN and inf
  are kept."""
  x = np.asarray(x, np.float32)
  finite = np.isfinite(x)
  magnitude = np.abs(np.where(finite, x, 0).astype(np.float64))
  _, exponent = np.frexp(magnitude)
  spacing = np.ldexp(1.0, np.maximum(exponent, FLOAT32_MIN_NORMAL_EXPONENT) - TF32_ULP_EXPONENT_OFFSET)
  rounded = np.floor(magnitude / spacing + 0.5) * spacing
  with np.errstate(over="ignore"):
    out = np.where(np.signbit(x), -rounded, rounded).astype(np.float32)
  return np.where(finite, out, x)

TF32_EDGE_BITS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000,   # ±0, ±inf
                  0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0xFF801FFF,   # NaNs whose payloads would carry
                  0x7F7FFFFF, 0xFF7FFFFF, 0x7F7FEFFF, 0x7F7FF000,   # max finite → inf; just below and at the tie
                  0x3F801000, 0xBF801000, 0x3F803000, 0x3F800FFF,   # ties (away from zero, not to even), below one
                  0x00000001, 0x00000FFF, 0x00001000, 0x00001FFF, 0x007FFFFF, 0x807FF000]   # subnormals

def test_round_to_tf32_matches_the_reference():
  random_bits = RNG.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
  bits = np.concatenate([np.array(TF32_EDGE_BITS, np.uint32), random_bits])
  x = bits.view(np.float32)
  got = round_to_tf32(Tensor(x)).numpy()
  want = tf32_reference(x)
  np.testing.assert_array_equal(got.view(np.uint32) & 0x1FFF, np.where(np.isnan(x), bits & 0x1FFF, 0))
  nan = np.isnan(x)
  np.testing.assert_array_equal(got.view(np.uint32)[nan], bits[nan])   # a NaN is kept, payload and all
  np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
  assert got.view(np.uint32)[TF32_EDGE_BITS.index(0x7F7FFFFF)] == 0x7F800000   # rounds up to inf
  assert got.view(np.uint32)[TF32_EDGE_BITS.index(0x3F801000)] == 0x3F802000   # a tie goes away from zero
  assert got.view(np.uint32)[TF32_EDGE_BITS.index(0x007FFFFF)] == 0x00800000   # into the smallest normal

TF32_MATMUL_SHAPES = [((5, 37), (37, 3)), ((64, 64), (64, 64)), ((128, 40), (40, 96)), ((3, 32, 64), (3, 64, 24)),
                      ((2, 16, 48), (48, 32)), ((40,), (40, 8))]

@pytest.mark.parametrize("shapes", TF32_MATMUL_SHAPES, ids=str)
def test_tf32_matmul_is_the_float32_sum_of_rounded_inputs(shapes):
  """On the CPU (FMA) the lowering gives numpy's matmul of the TF32-rounded inputs to float32 accuracy, and differs
  from the float32 matmul by TF32's rounding (2^-11 relative per input): the rounding is there."""
  x, w = (data(s).astype(np.float32) for s in shapes)
  got = LOWERINGS["matmul"]["tf32"].build(Tensor(x), Tensor(w)).numpy().astype(np.float64)
  rounded = tf32_reference(x).astype(np.float64) @ tf32_reference(w).astype(np.float64)
  scale = np.abs(tf32_reference(x).astype(np.float64)) @ np.abs(tf32_reference(w).astype(np.float64))  # Σ |x'·w'|
  assert np.max(np.abs(got - rounded) / scale) < 1e-6
  off_exact = np.max(np.abs(got - x.astype(np.float64) @ w.astype(np.float64)) / scale)
  assert 1e-5 < off_exact < 2e-3, off_exact

def test_tf32_matmul_of_mixed_inputs():
  """A float32 result from a float16 and a float32 input: both are widened to float32 before the rounding."""
  x, w = data((6, 16)).astype(np.float16), data((16, 5)).astype(np.float32)
  got = LOWERINGS["matmul"]["tf32"].build(Tensor(x), Tensor(w)).numpy()
  want = tf32_reference(x.astype(np.float32)).astype(np.float64) @ tf32_reference(w).astype(np.float64)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  with pytest.raises(TypeError, match="float32"): round_to_tf32(Tensor(x))

def test_tf32_region_on_cuda_rounds_both_inputs():
  """The lowering applied to a CUDA region (built without a GPU) rounds both inputs in the matmul's one kernel."""
  region = _region_of("matmul", dtypes.float32, "CUDA")
  apply_lowering(region, "tf32")
  [kernel] = [item for item in create_schedule([region.root], commit=False) if item.ast.op is Ops.SINK]
  assert sum(u.op is Ops.BITCAST and u.dtype == dtypes.uint32 for u in kernel.ast.toposort()) == 2
