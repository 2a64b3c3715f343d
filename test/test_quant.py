"""tgrad/nn/quant.py: every ggml block type's dequantization equals llama.cpp's (gguf.quants.dequantize) bit for bit,
on random blocks whose fp16 scales include NaN, ±inf, subnormals and signed zeros, for odd block counts and several
shapes; the packed matvec is one kernel; errors for bytes that do not fit their type."""
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.ops import Ops
from tgrad.nn.quant import (BLOCK_LAYOUTS, DEQUANTIZERS, GGMLType, QuantError, QuantizedTensor, dequantize_blocks,
                            exact_common_type)

gguf = pytest.importorskip("gguf")

# fp16 bit patterns every scale position sees: quiet/signalling/negative NaN, ±inf, the smallest and largest
# subnormals, ±0, the largest finite, 1.0
SPECIAL_HALVES = np.array([0x7E00, 0x7C01, 0xFE00, 0x7C00, 0xFC00, 0x0001, 0x03FF, 0x8001, 0x0000, 0x8000, 0x7BFF,
                           0x3C00], dtype=np.uint16)
# byte offsets of the fp16 scales (d, and dmin/m where the type has one) inside a block
HALF_POSITIONS = {GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2),
                  GGMLType.Q8_0: (0,), GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,),
                  GGMLType.F16: (0,), GGMLType.BF16: (0,), GGMLType.F32: (0, 2)}
QUANT_TYPES = list(DEQUANTIZERS)
SHAPES_IN_BLOCKS = [(1,), (7,), (3, 5), (2, 3, 5)]   # the last dim counts blocks; odd counts on purpose
MATVEC_TYPES = [GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K]
MATVEC_RTOL = 1e-4    # a float32 dot product of K terms against numpy's, summed in another order

def random_blocks(ggml_type: GGMLType, n_blocks: int, seed: int) -> np.ndarray:
  """(n_blocks, block_bytes) random bytes; the fp16 scales of every odd block cycle through SPECIAL_HALVES (30 blocks
  see them all), even blocks keep random scales (mostly finite: a NaN scale would hide every other bit of a block)."""
  rng = np.random.default_rng(seed)
  blocks = rng.integers(0, 256, size=(n_blocks, BLOCK_LAYOUTS[ggml_type].block_bytes), dtype=np.uint8)
  specials = SPECIAL_HALVES.view(np.uint8).reshape(-1, 2)
  for i in range(1, n_blocks, 2):
    for j, position in enumerate(HALF_POSITIONS[ggml_type]):
      blocks[i, position:position + 2] = specials[(i // 2 + j * 5) % len(specials)]
  return blocks

def assert_bits_equal(got: np.ndarray, expected: np.ndarray) -> None:
  """Equal float32 bit patterns, except that any NaN matches any NaN."""
  assert got.shape == expected.shape and got.dtype == expected.dtype == np.float32
  got_nan, expected_nan = np.isnan(got), np.isnan(expected)
  np.testing.assert_array_equal(got_nan, expected_nan)
  np.testing.assert_array_equal(got.view(np.uint32)[~got_nan], expected.view(np.uint32)[~expected_nan])

def reference(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
  with np.errstate(invalid="ignore", over="ignore"):   # inf·0 and NaN scales are part of the test
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(ggml_type)))

@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape_in_blocks", SHAPES_IN_BLOCKS, ids=str)
def test_dequantize_matches_llama_cpp_bit_for_bit(ggml_type, shape_in_blocks):
  layout = BLOCK_LAYOUTS[ggml_type]
  n_blocks = int(np.prod(shape_in_blocks))
  raw = random_blocks(ggml_type, n_blocks, seed=n_blocks + int(ggml_type)).reshape(
    *shape_in_blocks[:-1], shape_in_blocks[-1] * layout.block_bytes)
  shape = (*shape_in_blocks[:-1], shape_in_blocks[-1] * layout.block_size)
  expected = reference(raw, ggml_type)
  assert expected.shape == shape
  assert_bits_equal(QuantizedTensor.from_bytes(raw, ggml_type, shape).dequantize().numpy(), expected)

@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_K, GGMLType.Q5_0], ids=lambda t: t.name)
def test_dequantize_to_half_is_the_cast_of_float32(ggml_type):
  raw = random_blocks(ggml_type, 5, seed=1)
  with np.errstate(over="ignore"): expected = reference(raw, ggml_type).astype(np.float16)   # beyond 65504: inf
  got = QuantizedTensor.from_bytes(raw, ggml_type, expected.shape).dequantize(dtypes.float16).numpy()
  assert got.dtype == np.float16
  np.testing.assert_array_equal(got, expected)

def test_known_blocks_without_the_reference():
  """Blocks built by hand, values worked out by hand: checks the layouts without trusting gguf.quants."""
  q8 = np.zeros(34, np.uint8)
  q8[0:2] = np.array([0.5], np.float16).view(np.uint8)
  q8[2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
  np.testing.assert_array_equal(QuantizedTensor.from_bytes(q8, GGMLType.Q8_0, (32,)).dequantize().numpy(),
                                np.arange(-16, 16, dtype=np.float32) * 0.5)
  q4 = np.zeros(18, np.uint8)
  q4[0:2] = np.array([2.0], np.float16).view(np.uint8)
  q4[2:] = np.arange(16, dtype=np.uint8) | (np.uint8(15) << 4)    # low nibbles 0..15, high nibbles all 15
  expected = np.concatenate([np.arange(16) - 8, np.full(16, 15 - 8)]).astype(np.float32) * 2
  np.testing.assert_array_equal(QuantizedTensor.from_bytes(q4, GGMLType.Q4_0, (32,)).dequantize().numpy(), expected)
  # Q4_K: d = 1, dmin = 0.5; sub-block 0 has scale 3 and min 2, sub-block 5 has scale 33 (low nibble 1 in byte 9,
  # top bits 10 in byte 1) and min 17 (high nibble 1 in byte 9, top bits 01 in byte 5); all quants are 7
  q4k = np.zeros(144, np.uint8)
  q4k[0:4] = np.array([1.0, 0.5], np.float16).view(np.uint8)
  scales = q4k[4:16]
  scales[0], scales[4] = 3, 2
  scales[9], scales[1], scales[5] = 0x11, 0b10 << 6, 0b01 << 6
  q4k[16:] = 0x77
  got = QuantizedTensor.from_bytes(q4k, GGMLType.Q4_K, (256,)).dequantize().numpy().reshape(8, 32)
  np.testing.assert_array_equal(got[0], np.full(32, 3 * 7 - 0.5 * 2, np.float32))
  np.testing.assert_array_equal(got[5], np.full(32, 33 * 7 - 0.5 * 17, np.float32))
  np.testing.assert_array_equal(got[1], np.zeros(32, np.float32))   # scale 0 and min 0 (byte 5's low bits)

def test_block_layouts_match_ggml():
  for ggml_type, layout in BLOCK_LAYOUTS.items():
    assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(ggml_type))] == (layout.block_size,
                                                                               layout.block_bytes), ggml_type.name

@pytest.mark.parametrize("ggml_type, out_features, in_features", [
  (GGMLType.Q8_0, 2048, 640), (GGMLType.Q5_0, 2048, 640), (GGMLType.Q4_K, 640, 1024), (GGMLType.Q6_K, 640, 2048)],
  ids=lambda v: v.name if isinstance(v, GGMLType) else str(v))
def test_packed_linear_is_one_kernel(ggml_type, out_features, in_features):
  """x·dequant(W)ᵀ reads the packed bytes inside the matmul: one kernel, no float copy of the weight."""
  layout = BLOCK_LAYOUTS[ggml_type]
  raw = random_blocks(ggml_type, out_features * in_features // layout.block_size, seed=3)
  for position in HALF_POSITIONS[ggml_type]:   # finite scales: the product is compared with a tolerance
    raw[:, position:position + 2] = np.array([1 / 64], np.float16).view(np.uint8)
  raw = raw.reshape(out_features, -1)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (out_features, in_features)).realize()
  x_np = np.random.default_rng(4).standard_normal((1, in_features)).astype(np.float32)
  x = Tensor(x_np).realize()
  out = weight.linear(x)
  assert len(out.schedule()) == 1
  expected = x_np.astype(np.float64) @ reference(raw, ggml_type).astype(np.float64).T
  np.testing.assert_allclose(weight.linear(x).numpy(), expected, rtol=MATVEC_RTOL,
                             atol=MATVEC_RTOL * np.abs(expected).max())

def test_dequantize_of_packed_weight_is_one_kernel():
  weight = QuantizedTensor.from_bytes(random_blocks(GGMLType.Q6_K, 6, seed=5).reshape(2, -1), GGMLType.Q6_K,
                                      (2, 768)).realize()
  assert len(weight.dequantize().schedule()) == 1

def test_packed_bytes_are_the_device_memory():
  raw = random_blocks(GGMLType.Q4_K, 10, seed=6).reshape(5, -1)
  weight = QuantizedTensor.from_bytes(raw, GGMLType.Q4_K, (5, 512)).realize()
  buffer = weight.packed.lazydata.realized
  assert buffer is not None and buffer.dtype == dtypes.uint8 and buffer.nbytes == raw.nbytes == weight.nbytes
  assert weight.packed.shape == (5, 2, 144)

def test_errors_name_the_problem():
  raw = random_blocks(GGMLType.Q8_0, 3, seed=7)
  with pytest.raises(QuantError, match="takes 102 bytes, got 101"):
    QuantizedTensor.from_bytes(raw.reshape(-1)[:101], GGMLType.Q8_0, (96,))
  with pytest.raises(QuantError, match="multiple of 32, got shape \\(3, 20\\)"):
    QuantizedTensor.from_bytes(raw, GGMLType.Q8_0, (3, 20))
  with pytest.raises(QuantError, match="no dequantization for ggml type Q2_K"):
    QuantizedTensor.from_bytes(np.zeros(84, np.uint8), GGMLType.Q2_K, (256,)).dequantize()
  with pytest.raises(QuantError, match="uint8 \\(n, 34\\)"):
    dequantize_blocks(Tensor(np.zeros((2, 33), np.uint8)), GGMLType.Q8_0)
  weight = QuantizedTensor.from_bytes(raw, GGMLType.Q8_0, (1, 96))
  with pytest.raises(QuantError, match="input of shape \\(2, 95\\)"):
    weight.linear(Tensor.zeros(2, 95))

def test_linear_with_batch_and_bias():
  raw = random_blocks(GGMLType.Q4_K, 6, seed=8)
  for position in HALF_POSITIONS[GGMLType.Q4_K]: raw[:, position:position + 2] = np.array([0.25], np.float16).view(
    np.uint8)
  raw = raw.reshape(3, -1)
  weight = QuantizedTensor.from_bytes(raw, GGMLType.Q4_K, (3, 512))
  rng = np.random.default_rng(9)
  x, bias = rng.standard_normal((2, 4, 512)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
  expected = x.astype(np.float64) @ reference(raw, GGMLType.Q4_K).astype(np.float64).T + bias
  got = weight.linear(Tensor(x), Tensor(bias)).numpy()
  assert got.shape == (2, 4, 3)
  np.testing.assert_allclose(got, expected, rtol=MATVEC_RTOL, atol=MATVEC_RTOL * np.abs(expected).max())

# ---- the two ways to use a packed weight are lowerings of the `dequantize` composite: paths the database measures
def _finite_weight(ggml_type: GGMLType, out_features: int, in_features: int,
                   seed: int) -> tuple[np.ndarray, QuantizedTensor]:
  layout = BLOCK_LAYOUTS[ggml_type]
  raw = random_blocks(ggml_type, out_features * in_features // layout.block_size, seed=seed)
  scales = np.random.default_rng(seed).uniform(1e-3, 1e-1, (raw.shape[0], 1)).astype(np.float16)   # 11-bit scales:
  for position in HALF_POSITIONS[ggml_type]: raw[:, position:position + 2] = scales.view(np.uint8)  # products round
  raw = raw.reshape(out_features, -1)
  return raw, QuantizedTensor.from_bytes(raw, ggml_type, (out_features, in_features)).realize()

@pytest.mark.parametrize("ggml_type", MATVEC_TYPES, ids=lambda t: t.name)
def test_dequantize_lowerings_compute_the_weight_as_their_dtype_says(ggml_type):
  """Every lowering's linear equals x·(W rounded to its copy's dtype)ᵀ; the copy is made once and read after."""
  from tgrad.nn.quant import DEQUANTIZE, _dense_copies
  from tgrad.regions import apply_lowering, lowerings_for, regions_above
  raw, weight = _finite_weight(ggml_type, 48, 512, seed=11)
  x_np = np.random.default_rng(12).standard_normal((3, 512)).astype(np.float32)
  x = Tensor(x_np).realize()
  values = reference(raw, ggml_type)
  rounded = {"default": values, "dequant_float32": values, "dequant_float16": values.astype(np.float16),
             "dequant_bfloat16": Tensor(values).cast(dtypes.bfloat16).float().numpy()}
  copies = []
  for lowering, w in rounded.items():
    for _ in range(2):
      out = weight.linear(x)
      [region] = [r for r in regions_above(out.lazydata) if r.name == DEQUANTIZE]
      assert lowerings_for(region) == ["default", "dequant_bfloat16", "dequant_float16", "dequant_float32"]
      apply_lowering(region, lowering)
      expected = x_np.astype(np.float64) @ w.astype(np.float64).T
      np.testing.assert_allclose(out.numpy(), expected, rtol=MATVEC_RTOL, atol=MATVEC_RTOL * np.abs(expected).max())
    copies.append(dict(_dense_copies.get(weight.packed.lazydata, {})))
  assert copies[0] == {}                                  # the packed path stores nothing but the blocks
  assert [len(c) for c in copies[1:]] == [1, 2, 3]        # one copy per dtype, made on first use only
  assert copies[3][dtypes.float32] is copies[1][dtypes.float32]

def test_dequantize_paths_are_measured_against_float64():
  """The paths of a packed matvec: the packed default and a dequantized copy per dtype, each with its time and its
  error against the float64 reference (built through the float16 scales' bitcast), ordered as the copies' rounding."""
  from tgrad.paths import iterate, measure
  _, weight = _finite_weight(GGMLType.Q4_K, 64, 512, seed=13)
  x = Tensor(np.random.default_rng(14).standard_normal((1, 512)).astype(np.float32)).realize()
  space = iterate(weight.linear(x))
  runs = {path.description.split(";")[0]: measure(space, path, repeats=1) for path in space}
  assert set(runs) == {"all default", "packed_linear=int8",
                       *(f"dequantize=dequant_{d}" for d in ("float32", "float16", "bfloat16"))}
  errors = {name: run.max_rel_error for name, run in runs.items()}
  assert all(run.times and not run.error for run in runs.values())
  assert errors["all default"] < 1e-3 and errors["dequantize=dequant_float32"] < 1e-3   # float32 sums of 512 terms
  assert errors["dequantize=dequant_float32"] < errors["dequantize=dequant_float16"]
  assert errors["dequantize=dequant_float16"] < errors["dequantize=dequant_bfloat16"] < 2
  assert errors["packed_linear=int8"] < 1e-3   # Q4_K keeps its float product on the int8 path (INT8_PATH_TYPES)

# ---- a packed weight times several rows (a prompt) on a CPU: dequantized once into float32 panels, then the blocked
# matmul (codegen/cpu_gemm.py), not a packed matrix-vector product per row

@pytest.mark.parametrize("ggml_type, out_features, in_features, rows, symbolic", [
  (GGMLType.Q5_0, 256, 640, 67, False), (GGMLType.Q4_K, 640, 1024, 128, True), (GGMLType.Q6_K, 128, 512, 5, True),
  (GGMLType.Q8_0, 256, 320, 131, True)], ids=lambda v: v.name if isinstance(v, GGMLType) else str(v))
def test_packed_linear_of_many_rows_is_a_blocked_matmul(ggml_type, out_features, in_features, rows, symbolic):
  from tgrad.codegen.cpu_gemm import pack_plan
  from tgrad.device import Device
  from tgrad.shape.sint import Variable
  raw, weight = _finite_weight(ggml_type, out_features, in_features, seed=21)
  x_np = np.random.default_rng(22).standard_normal((140, in_features)).astype(np.float32)
  length = Variable("n", 1, 140).bind(rows) if symbolic else rows
  x = Tensor(x_np).realize().shrink(((0, length), None))
  out = weight.linear(x)
  (item,) = [i for i in out.schedule() if i.ast.op is not Ops.EMPTY]
  plan = pack_plan(item.ast, Device["LLVM"].renderer)
  assert plan is not None and len(plan.steps) == 3   # the weight's panels (dequantized), x's copy, the matmul
  panels_ast = plan.steps[0][0]
  assert {u.dtype for u in panels_ast.toposort() if u.op is Ops.DEFINE_GLOBAL} >= {dtypes.uint8, dtypes.float32}
  got = out.numpy()
  values = reference(raw, ggml_type).reshape(out_features, in_features)
  expected = x_np[:rows].astype(np.float64) @ values.astype(np.float64).T
  np.testing.assert_allclose(got, expected, rtol=MATVEC_RTOL, atol=MATVEC_RTOL * np.abs(expected).max())
  dense = (x @ Tensor(values).T).numpy()   # the float path: the same values, the same blocked matmul
  np.testing.assert_allclose(got, dense, rtol=1e-6, atol=1e-6 * np.abs(expected).max())

@pytest.mark.parametrize("ggml_type", [GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0],
                         ids=lambda t: t.name)
def test_cpu_pack_setting_runs_the_packed_product(ggml_type):
  """CPU_PACK=0: a prompt (symbolic length) times a packed weight runs as its own kernel, the packed product (one
  kernel, no copies), with the values of numpy's product of the dequantized weight; CPU_PACK=1 (the default) runs the
  dequantizing copy and the blocked matmul (three kernels). Switching back and forth reuses neither's kernels."""
  from tgrad.helpers import Context
  from tgrad.realize import lower_schedule
  from tgrad.shape.sint import Variable
  raw, weight = _finite_weight(ggml_type, 256, 512, seed=23)
  x_np = np.random.default_rng(24).standard_normal((90, 512)).astype(np.float32)
  values = reference(raw, ggml_type).reshape(256, 512).astype(np.float64)
  for rows, pack, kernels in ((37, 0, 1), (70, 1, 3), (9, 0, 1)):
    with Context(CPU_PACK=pack):
      out = weight.linear(Tensor(x_np).realize().shrink(((0, Variable("n", 1, 90).bind(rows)), None)))
      (item,) = [i for i in out.schedule() if i.ast.op is not Ops.EMPTY]
      assert len(lower_schedule([item])) == kernels
      expected = x_np[:rows].astype(np.float64) @ values.T
      np.testing.assert_allclose(out.numpy(), expected, rtol=MATVEC_RTOL, atol=MATVEC_RTOL * np.abs(expected).max())

def test_a_cpu_holds_q5_0_weights_as_q8_0_and_the_gguf_loader_widens_them():
  """held_type: on LLVM (no local memory) Q5_0 is held as Q8_0 (CPU_HELD_TYPES), every other type as it is; the
  Gemma GGUF loader's packed weights follow it, and the values stay bit for bit (the widening test below)."""
  from tgrad.models.gemma3_gguf import _load_weight
  from tgrad.nn.quant import CPU_HELD_TYPES, WIDENINGS, held_type
  assert held_type(GGMLType.Q5_0, "LLVM") == GGMLType.Q8_0
  for ggml_type in (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K):
    assert held_type(ggml_type, "LLVM") == ggml_type
  assert all((narrow, wide) in WIDENINGS for narrow, wide in CPU_HELD_TYPES.items())
  raw = random_blocks(GGMLType.Q5_0, 2 * 20, seed=31).reshape(2, -1)
  loaded = _load_weight(QuantizedTensor.from_bytes(raw, GGMLType.Q5_0, (2, 640)), "blk.0.ffn_up.weight", "packed",
                        dtypes.float32)
  assert loaded.ggml_type == GGMLType.Q8_0
  assert_bits_equal(reference(loaded.packed.numpy().reshape(2, -1), GGMLType.Q8_0), reference(raw, GGMLType.Q5_0))

@pytest.mark.parametrize("narrow, wide", [(GGMLType.Q4_0, GGMLType.Q8_0), (GGMLType.Q5_0, GGMLType.Q8_0),
                                          (GGMLType.Q4_K, GGMLType.Q5_K)], ids=lambda t: t.name)
def test_widened_blocks_hold_the_same_values(narrow, wide):
  """A widening (WIDENINGS) re-encodes random blocks, special fp16 scales included, into the wider type: llama.cpp's
  dequantization of the new bytes equals its dequantization of the old ones, bit for bit."""
  rows, blocks_per_row = 3, 5
  raw = random_blocks(narrow, rows * blocks_per_row, seed=int(narrow)).reshape(rows, -1)
  shape = (rows, blocks_per_row * BLOCK_LAYOUTS[narrow].block_size)
  widened = QuantizedTensor.from_bytes(raw, narrow, shape).widened(wide)
  assert widened.ggml_type == wide and widened.packed.shape == (rows, blocks_per_row, BLOCK_LAYOUTS[wide].block_bytes)
  wide_bytes = widened.packed.numpy().reshape(rows, -1)
  assert_bits_equal(reference(wide_bytes, wide), reference(raw, narrow))
  assert exact_common_type([narrow, wide]) == exact_common_type([wide, narrow]) == wide
  assert exact_common_type([GGMLType.Q4_K, GGMLType.Q6_K]) is None   # Q6_K has no mins: no exact home for Q4_K
  with pytest.raises(QuantError, match="not all exact"): QuantizedTensor.from_bytes(raw, narrow, shape).widened(
    GGMLType.Q6_K)
