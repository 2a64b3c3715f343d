"""The int8 product of a packed weight (tgrad/nn/quant.py `int8_linear`, the "int8" path of `packed_linear`) and the
codegen that makes it integer arithmetic (codegen/reduces.py `factor_integer_terms`, scratch.py's narrow scratch).

On LLVM: the activation's quantization (quantize_activation) equals numpy's of the same definition exactly; every
type's integer form (IntegerBlocks) gives the float32 dequantization; the int8 product equals a float64 sum of exact
integer products times the group factors, for Q4_K, Q5_0, Q6_K, Q8_0 (and Q4_0, Q4_1, Q5_1) with odd row counts and M
of 1 and 3; its distance from the float32 product stays within the activation's rounding bound; and the rendered
kernel sums each group's products as int32 (a Q8_0 matvec's assembly multiplies by vpmaddwd on an AVX2 host).
"""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.dtype import dtypes
from tgrad.nn.quant import (BLOCK_LAYOUTS, INTEGER_FORMS, Q8_BLOCK, GGMLType, QuantizedTensor, int8_linear,
                            quantize_activation)
from tgrad.realize import lower_schedule

# byte offsets of the float16 factors of each type (set to finite values: random bytes would make NaN and inf scales)
HALF_POSITIONS = {GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2),
                  GGMLType.Q8_0: (0,), GGMLType.Q4_K: (0, 2), GGMLType.Q6_K: (208,)}
CASES = [(GGMLType.Q8_0, 37, 96), (GGMLType.Q5_0, 45, 160), (GGMLType.Q4_K, 13, 512), (GGMLType.Q6_K, 11, 512),
         (GGMLType.Q4_0, 7, 64), (GGMLType.Q4_1, 9, 64), (GGMLType.Q5_1, 5, 96)]
PRODUCT_RTOL = 1e-5   # of Σ|terms|: float32 group factors and a float32 sum over the groups, against float64

def packed_weight(ggml_type: GGMLType, rows: int, columns: int, seed: int) -> tuple[np.ndarray, QuantizedTensor]:
  layout = BLOCK_LAYOUTS[ggml_type]
  rng = np.random.default_rng(seed)
  raw = rng.integers(0, 256, (rows * columns // layout.block_size, layout.block_bytes), dtype=np.uint8)
  halves = rng.uniform(1e-3, 1e-1, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
  for position in HALF_POSITIONS[ggml_type]: raw[:, position:position + 2] = halves
  raw = raw.reshape(rows, -1)
  return raw, QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns)).realize()

def numpy_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """quantize_activation's definition in numpy, float32 throughout: d = max|x| / 127, q = round(x · (1/d))."""
  blocks = x.astype(np.float32).reshape(*x.shape[:-1], -1, Q8_BLOCK)
  scale = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
  with np.errstate(divide="ignore"):
    inverse = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
  return np.round(blocks * inverse).astype(np.int8), scale

def integer_form(weight: QuantizedTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
  """The weight's integer quants, scales and offsets (float64, broadcast to the quants) as numpy arrays, each
  (rows, columns) in the values' order, and the offset's sign."""
  layout = BLOCK_LAYOUTS[weight.ggml_type]
  ints = INTEGER_FORMS[weight.ggml_type](weight.packed.reshape(-1, layout.block_bytes))
  def dense(t: Tensor) -> np.ndarray:
    return np.broadcast_to(t.numpy(), ints.quants.shape).reshape(weight.shape).astype(np.float64)
  offset = dense(ints.offset) if ints.offset is not None else np.zeros(weight.shape)
  return dense(ints.quants), dense(ints.scale), offset, -1.0 if ints.negated else 1.0

def test_quantize_activation_matches_numpy():
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((3, 160)) * rng.uniform(0.01, 100, (3, 1))).astype(np.float32)
  x[1, 32:64] = 0                       # an all-zero block: scale 0, quants 0
  x[2, 5] = 1e30                        # one huge value: the rest of its block rounds to 0
  quants, scales = quantize_activation(Tensor(x))
  expected_quants, expected_scales = numpy_quantize(x)
  np.testing.assert_array_equal(quants.numpy(), expected_quants)
  np.testing.assert_array_equal(scales.numpy(), expected_scales)
  assert np.abs(quants.numpy().astype(np.int32)).max() <= 127
  assert quants.dtype == dtypes.int8 and scales.dtype == dtypes.float32

@pytest.mark.parametrize("ggml_type,rows,columns", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_integer_forms_give_the_dequantized_values(ggml_type, rows, columns):
  _, weight = packed_weight(ggml_type, rows, columns, seed=1)
  quants, scale, offset, sign = integer_form(weight)
  assert np.array_equal(quants, np.round(quants))
  np.testing.assert_allclose(scale * quants + sign * offset, weight.dequantize().numpy(), rtol=1e-6, atol=1e-7)

@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("ggml_type,rows,columns", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_int8_product_matches_integer_reference(ggml_type, rows, columns, batch):
  _, weight = packed_weight(ggml_type, rows, columns, seed=2)
  x = np.random.default_rng(3).standard_normal((batch, columns)).astype(np.float32)
  got = int8_linear(Tensor(x), weight.packed, ggml_type, weight.shape).numpy()
  quants, scale, offset, sign = integer_form(weight)
  x_quants, x_scales = numpy_quantize(x)
  xq = x_quants.reshape(batch, columns).astype(np.float64)
  dx = np.repeat(x_scales.reshape(batch, -1), Q8_BLOCK, axis=-1).astype(np.float64)
  # term (b, r, i): exact integer product q·xq times the group factor scale·dx, plus the offset's xq·offset·dx
  terms = (quants[None] * xq[:, None]) * (scale[None] * dx[:, None]) + sign * xq[:, None] * offset[None] * dx[:, None]
  np.testing.assert_allclose(got, terms.sum(-1), rtol=0, atol=PRODUCT_RTOL * np.abs(terms).sum(-1).max())
  # within the activation's rounding of the float32 product: |Σ w·(x − dx·xq)| ≤ Σ |w|·dx/2
  exact = x.astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
  bound = (np.abs(weight.dequantize().numpy().astype(np.float64))[None] * dx[:, None] / 2).sum(-1)
  assert np.all(np.abs(got - exact) <= bound * 1.001 + 1e-5 * np.abs(exact).max())

def test_int8_kernel_sums_groups_as_integers():
  """The Q8_0 product's kernel converts one int32 sum per block to float (not each product), and on an AVX2 host
  LLVM multiplies the bytes with vpmaddwd."""
  _, weight = packed_weight(GGMLType.Q8_0, 37, 96, seed=4)
  x = Tensor(np.random.default_rng(5).standard_normal((1, 96)).astype(np.float32)).realize()
  items = lower_schedule(int8_linear(x, weight.packed, GGMLType.Q8_0, weight.shape).schedule())
  source = items[-1].runner.src
  assert source.count("sitofp i32") == 1 and source.count("mul i32") == Q8_BLOCK   # one block per loop iteration
  import llvmlite.binding as llvm
  from tgrad.runtime.llvm.runtime import LLVMCompiler, host_target_machine
  if "+avx2" not in llvm.get_host_cpu_features().flatten(): pytest.skip("no AVX2 on this host")
  module = llvm.parse_assembly(source)
  compiler = LLVMCompiler()
  tuning = llvm.create_pipeline_tuning_options(speed_level=3)
  tuning.slp_vectorization = True
  builder = llvm.create_pass_builder(compiler.target_machine, tuning)
  builder.getModulePassManager().run(module, builder)
  assert "vpmaddwd" in host_target_machine().emit_assembly(module)

def test_int8_path_is_measured_against_float64():
  """packed_linear's paths over a Q8_0 weight: the float product and the int8 one, each measured with its error
  against the float64 reference; the int8 path's is the activation's rounding, far above the float path's (per element
  relative to max(|ref|, 1e-3·max|ref|): 6% here, beyond float32's sanity bound of 5e-2 — see docs/paths.md)."""
  from tgrad.paths import iterate, measure
  _, weight = packed_weight(GGMLType.Q8_0, 33, 256, seed=6)
  x = Tensor(np.random.default_rng(7).standard_normal((1, 256)).astype(np.float32)).realize()
  space = iterate(weight.linear(x))
  runs = {path.description.split(";")[0]: measure(space, path, repeats=1) for path in space}
  assert "packed_linear=int8" in runs and all(run.times and not run.error for run in runs.values())
  assert runs["all default"].max_rel_error < 1e-4 < runs["packed_linear=int8"].max_rel_error < 0.1
