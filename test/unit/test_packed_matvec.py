"""Matrix–vector products over block-quantized weights (tgrad/codegen/matvec_rules.py `packed_matvec_layout`, the GPU
rule `_packed_matvec`, the CPU rule `_cpu_packed_matvec`).

Without a GPU: the layout detection on the kernels of QuantizedTensor.linear for the ggml types of gemma-3-270m's
GGUF; the opts the GPU heuristics choose (threads over a row's blocks and over 32-bit words of each block, the rest of
a block unrolled; all of them in BEAM's action space), rendered and compiled with NVRTC, their bytes read as whole
words (vectors.byte_runs: aligned loads, funnel shifts where the block size leaves the alignment unknown), and run on
the CPU through test/cuda_on_cpu.py against the dequantized weight; the CPU rule (a whole block per loop iteration) run
on LLVM for every type tgrad dequantizes, and float16 inputs rounded once (products and sums in float32). With a GPU
(marked `gpu`): the GPU kernels against x times the weight as the CPU dequantizes it, in float64, M = 1 and M = 3,
float32 and float16.
"""
import re
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.bounds import drop_pending_checks, pending_checks
from tgrad.codegen.heuristics import CPU_VALUE_LOOP_MIN, CPU_VALUE_LOOP_SUB_BLOCKS, hand_coded_optimizations
from tgrad.codegen import matvec_rules
from tgrad.codegen.matvec_rules import packed_matvec_layout
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.dtype import dtypes
from tgrad.helpers import prod
from tgrad.nn import quant
from tgrad.nn.quant import BLOCK_LAYOUTS, GGMLType, QuantizedTensor, stored_block_bytes
from tgrad.ops import Ops
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.llvm.renderer import reorderable_accumulators, reorderable_summands, unvectorized_loops
from tgrad.runtime.cuda.vectors import BytePiece, byte_run_pieces
from tgrad.schedule import create_schedule
from cuda_on_cpu import CPU_ARCH, TENSOR_CORE_ARCH, cpu_available, run_kernel_emulated

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
ARCH = "sm_90"
# (type, rows, columns): gemma-3-270m's decode projections in its Q4_K_M file, and odd row counts
CASES = [(GGMLType.Q8_0, 256, 640), (GGMLType.Q5_0, 2048, 640), (GGMLType.Q4_K, 640, 1024),
         (GGMLType.Q6_K, 640, 2048), (GGMLType.Q8_0, 37, 96), (GGMLType.Q4_K, 3, 512)]
FLOAT32_RTOL, HALF_RTOL = 1e-4, 8 * 2.0 ** -11

# byte offsets of the float16 scales in a block of each type (d, and dmin where the type has one)
SCALE_POSITIONS = {GGMLType.Q8_0: (0,), GGMLType.Q5_0: (0,), GGMLType.Q4_K: (0, 2), GGMLType.Q6_K: (208,)}

def random_weight(ggml_type: GGMLType, rows: int, columns: int, seed: int) -> np.ndarray:
  """Packed bytes of a random weight: random quants, finite random float16 scales."""
  rng = np.random.default_rng(seed)
  layout = BLOCK_LAYOUTS[ggml_type]
  raw = rng.integers(0, 256, (rows * columns // layout.block_size, layout.block_bytes), dtype=np.uint8)
  scales = rng.uniform(1e-3, 1e-1, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
  for position in SCALE_POSITIONS[ggml_type]: raw[:, position:position + 2] = scales
  return raw.reshape(rows, -1)

def linear_ast(ggml_type: GGMLType, rows: int, columns: int, m: int = 1, dtype=dtypes.float32):
  weight = QuantizedTensor.from_bytes(random_weight(ggml_type, rows, columns, 0), ggml_type, (rows, columns), "LLVM")
  out = weight.linear(Tensor.empty(m, columns, dtype=dtype, device="LLVM"))
  (item,) = [item for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]
  return item.ast

@pytest.mark.parametrize("ggml_type,rows,columns", CASES, ids=str)
def test_packed_matvec_layout(ggml_type, rows, columns):
  kernel = Kernel(linear_ast(ggml_type, rows, columns), CUDARenderer())
  layout = packed_matvec_layout(kernel)
  assert layout is not None and layout.k_axis == kernel.first_reduce == 1 and layout.n_axis == 0
  assert kernel.full_shape[1] == columns // BLOCK_LAYOUTS[ggml_type].block_size   # the blocks of a row

def test_packed_matvec_layout_refuses_dense_and_wide_m():
  dense = Tensor.empty(1, 640, device="LLVM") @ Tensor.empty(640, 256, device="LLVM")
  (item,) = [i for i in create_schedule([dense.lazydata]) if i.ast.op is Ops.SINK]
  assert packed_matvec_layout(Kernel(item.ast, CUDARenderer())) is None               # one reduce axis, float loads
  assert packed_matvec_layout(Kernel(linear_ast(GGMLType.Q8_0, 64, 256, m=16), CUDARenderer())) is None   # a matmul

@needs_nvrtc
@pytest.mark.parametrize("ggml_type,rows,columns", CASES, ids=str)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16], ids=str)
def test_packed_matvec_opts_compile(ggml_type, rows, columns, dtype):
  kernel = Kernel(linear_ast(ggml_type, rows, columns, dtype=dtype), CUDARenderer())
  hand_coded_optimizations(kernel)
  ops = [opt.op for opt in kernel.applied_opts]
  assert OptOps.GROUP in ops and OptOps.UNROLL in ops, kernel.applied_opts
  compile_cuda(kernel.renderer.render("packed_matvec", linearize(kernel)), ARCH)

@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type,rows,columns", CASES, ids=str)
@pytest.mark.parametrize("m,dtype", [(1, dtypes.float32), (3, dtypes.float32), (1, dtypes.float16)], ids=str)
def test_gpu_packed_matvec_matches_reference(ggml_type, rows, columns, m, dtype):
  raw = random_weight(ggml_type, rows, columns, seed=rows + columns)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "CUDA").realize()
  x = np.random.default_rng(m).standard_normal((m, columns)).astype(np.float32)
  out = weight.linear(Tensor(x, device="CUDA").cast(dtype).realize())
  assert len(out.schedule()) == 1
  # the weight's values from the CPU's dequantization (bit-exact against gguf's: test/test_quant.py)
  values = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "LLVM").dequantize().numpy()
  reference = x.astype(dtype.np).astype(np.float64) @ values.astype(np.float64).T
  rtol = HALF_RTOL if dtype == dtypes.float16 else FLOAT32_RTOL
  np.testing.assert_allclose(out.numpy().astype(np.float64), reference, rtol=rtol,
                             atol=rtol * np.abs(reference).max())

# every type tgrad dequantizes in 32- and 256-value blocks at an odd row count, and the model's shapes above
CPU_CASES = [(t, rows, columns) for t, columns in [(GGMLType.Q4_0, 96), (GGMLType.Q4_1, 64), (GGMLType.Q5_0, 160),
                                                   (GGMLType.Q5_1, 96), (GGMLType.Q8_0, 64), (GGMLType.Q4_K, 512),
                                                   (GGMLType.Q5_K, 256), (GGMLType.Q6_K, 512)]
             for rows in (7,)] + CASES
# byte offsets of the float16 scales of the types the GPU cases above do not use
SCALE_POSITIONS.update({GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_1: (0, 2), GGMLType.Q5_K: (0, 2)})

@pytest.mark.parametrize("ggml_type,rows,columns", CPU_CASES, ids=str)
def test_cpu_packed_matvec_matches_reference(ggml_type, rows, columns):
  """On LLVM the rule unrolls every axis inside a block (one block per loop iteration, one row per accumulator, so its
  products are reorderable summands), except a super-block's innermost run of values (the K-quants), which stays a
  loop the loop vectorizer may take; the values stay x·Wᵀ against float64."""
  from tgrad.device import Device
  kernel = Kernel(linear_ast(ggml_type, rows, columns), Device["LLVM"].renderer)
  block_axes = kernel.first_upcast - kernel.first_reduce - 1
  shape, first, last = kernel.full_shape, kernel.first_reduce, kernel.first_upcast
  value_loop = shape[last - 1] >= CPU_VALUE_LOOP_MIN and prod(shape[first + 1:last - 1]) >= CPU_VALUE_LOOP_SUB_BLOCKS
  # a K-quant weight of several super-blocks a row keeps its values' loop; the 32-value types unroll whole
  assert value_loop == (BLOCK_LAYOUTS[ggml_type].block_size == 256 and columns > 256)
  hand_coded_optimizations(kernel)
  assert [o.op for o in kernel.applied_opts].count(OptOps.UNROLL) == block_axes - value_loop, kernel.applied_opts
  uops = linearize(kernel)
  summands = reorderable_summands(uops, reorderable_accumulators(uops))
  assert len(summands) > 0
  # the loops keep the loop vectorizer off, but a super-block's value loop (the innermost)
  if value_loop: assert [u for u in uops if u.op is Ops.RANGE][-1] not in unvectorized_loops(uops, summands)
  source = kernel.renderer.render("packed_matvec", uops)
  assert "reassoc nsz" in source and "llvm.vectorize.enable" not in source and \
    '!"llvm.loop.vectorize.enable", i1 0' in source and "distinct" in source
  raw = random_weight(ggml_type, rows, columns, seed=rows * columns)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "LLVM").realize()
  x = np.random.default_rng(5).standard_normal((1, columns)).astype(np.float32)
  reference = x.astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
  np.testing.assert_allclose(weight.linear(Tensor(x, device="LLVM")).numpy(), reference, rtol=FLOAT32_RTOL,
                             atol=FLOAT32_RTOL * np.abs(reference).max())

# ---- the GPU rule's threads, and the bytes read as words

GEMMA_CASES = CASES[:4]

@pytest.mark.parametrize("ggml_type,rows,columns", CASES, ids=str)
def test_gpu_rule_spreads_a_row_over_blocks_and_words(ggml_type, rows, columns):
  """Two GROUPs (the row's blocks, the 32-bit words of a block's quant run) give every row at least 32 threads where
  the row has that many words, and a third (a loop inside the block) where a thread's share of a block would still be
  PACKED_SPREAD_MIN_VALUES values (Q6_K's 64: 32 after it); nothing but the blocks' GROUP remains a loop inside a
  block; a block of threads has PACKED_MATVEC_BLOCK_THREADS at least where the rows allow; BEAM can reach every
  opt."""
  from tgrad.codegen.search import ACTIONS
  kernel = Kernel(linear_ast(ggml_type, rows, columns), CUDARenderer())
  hand_coded_optimizations(kernel)
  spread = ggml_type is GGMLType.Q6_K
  assert kernel.group_for_reduces == (3 if spread else 2), kernel.applied_opts
  group = range(kernel.first_reduce, kernel.first_reduce + kernel.group_for_reduces)
  row_threads = prod(kernel.full_shape[a] for a in group)
  share = prod(kernel.full_shape[a] for a in range(kernel.first_reduce + kernel.group_for_reduces + 1,
                                                   kernel.shape_len) if kernel.is_reduce_axis(a))
  assert share < matvec_rules.PACKED_SPREAD_MIN_VALUES, (share, kernel.applied_opts)
  block_rows = prod(kernel.full_shape[a] for a in range(kernel.global_dims, kernel.first_reduce))
  wanted = -(-matvec_rules.PACKED_MATVEC_BLOCK_THREADS // row_threads)   # rows a block, rounded up (40 threads: 4)
  if rows % wanted == 0 and rows // wanted >= matvec_rules.MATVEC_MIN_BLOCKS: assert block_rows == wanted, block_rows
  words_per_row = columns // BLOCK_LAYOUTS[ggml_type].block_size * BLOCK_LAYOUTS[ggml_type].block_bytes // 4
  assert row_threads >= min(32, words_per_row // 8), (row_threads, kernel.applied_opts)
  loops = range(kernel.first_reduce + kernel.group_for_reduces + 1, kernel.first_upcast)
  assert all(kernel.full_shape[a] == 1 for a in loops), kernel.full_shape
  assert all(opt in ACTIONS for opt in kernel.applied_opts), kernel.applied_opts

def cuda_source(ggml_type, rows, columns, dtype=dtypes.float32, arch=ARCH) -> str:
  kernel = Kernel(linear_ast(ggml_type, rows, columns, dtype=dtype), CUDARenderer(arch))
  hand_coded_optimizations(kernel)
  return kernel.renderer.render("packed_matvec", linearize(kernel))

@pytest.mark.parametrize("ggml_type,rows,columns", GEMMA_CASES, ids=str)
def test_packed_bytes_are_read_as_words(ggml_type, rows, columns):
  """No byte of the weight is loaded alone: Q4_K's 144-byte blocks keep its runs 4-byte aligned (uchar4, or uint1
  where byte lanes read the word, and uint4 loads, no funnel shift); Q8_0 (34), Q5_0 (22) and Q6_K (210) leave them
  2-byte aligned, read as aligned words joined by a funnel shift."""
  source = cuda_source(ggml_type, rows, columns)
  weight_buffer = "data2"
  assert not re.search(rf"{weight_buffer}\[", source), "a byte loaded alone"
  funnels = len(re.findall(r">> shift\d+\)", source))
  assert (funnels == 0) == (BLOCK_LAYOUTS[ggml_type].block_bytes % 4 == 0), funnels
  assert re.search(r"const (unsigned int word|uchar4 vec|uint1 vec)\d+ = ", source), "no 32-bit load of quants"
  if ggml_type == GGMLType.Q4_K: assert "const uint4 word" in source   # d, dmin and the 12 scale bytes in one load

def test_byte_run_pieces():
  assert byte_run_pieces(32, 16) == [BytePiece(0, 16), BytePiece(16, 16)]
  assert byte_run_pieces(12, 4) == [BytePiece(0, 4), BytePiece(4, 4), BytePiece(8, 4)]
  assert byte_run_pieces(6, 16) == [BytePiece(0, 4), BytePiece(4, 2)]   # never past the run: no 8-byte load
  assert byte_run_pieces(2, 2) == [BytePiece(0, 2)]
  assert byte_run_pieces(7, 2) == [BytePiece(0, 4, True), BytePiece(4, 2), BytePiece(6, 1)]
  assert byte_run_pieces(8, 1) == [BytePiece(0, 4, True), BytePiece(4, 4, True)]
  assert byte_run_pieces(3, 1) == [BytePiece(0, 1), BytePiece(1, 1), BytePiece(2, 1)]

needs_gxx = pytest.mark.skipif(not cpu_available(), reason="g++ not found")

@needs_gxx
@pytest.mark.parametrize("ggml_type,rows,columns,m,dtype", [
  (GGMLType.Q8_0, 12, 640, 1, dtypes.float16), (GGMLType.Q5_0, 8, 640, 1, dtypes.float32),
  (GGMLType.Q4_K, 6, 1024, 1, dtypes.float16), (GGMLType.Q6_K, 4, 2048, 1, dtypes.float32),
  (GGMLType.Q8_0, 37, 96, 3, dtypes.float32), (GGMLType.Q4_K, 3, 512, 1, dtypes.float32)], ids=str)
def test_gpu_rule_values_on_emulated_cuda(ggml_type, rows, columns, m, dtype):
  """The GPU kernels (two GROUPs, word loads and funnel shifts) against x·Wᵀ in float64, run on the CPU."""
  raw = random_weight(ggml_type, rows, columns, seed=rows + columns)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "LLVM").realize()
  x = np.random.default_rng(m).standard_normal((m, columns)).astype(np.float32)
  arch = CPU_ARCH if dtype == dtypes.float32 else TENSOR_CORE_ARCH   # half conversions are PTX, emulated from sm_80
  got, _ = run_kernel_emulated(weight.linear(Tensor(x, device="LLVM").cast(dtype).realize()), arch=arch)
  reference = x.astype(dtype.np).astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
  rtol = HALF_RTOL if dtype == dtypes.float16 else FLOAT32_RTOL
  np.testing.assert_allclose(got.astype(np.float64).reshape(reference.shape), reference, rtol=rtol,
                             atol=rtol * np.abs(reference).max())

@needs_gxx
def test_funnel_shifted_words_at_every_misalignment():
  """Runs of 4 bytes at 5i + 1 (i = 0..11: every start mod 4) read through funnel shifts give the bytes themselves."""
  data = np.random.default_rng(0).integers(0, 256, (12, 5), dtype=np.uint8)
  weights = np.array([1, 3, 5, 7], np.float32)   # a different weight per byte: a byte out of place changes the sum
  values = Tensor(data, device="LLVM").realize()[:, 1:5].cast(dtypes.float32) * Tensor(weights, device="LLVM").realize()
  got, source = run_kernel_emulated(values.sum(axis=1), [Opt(OptOps.UNROLL, 0, 0)])
  assert len(re.findall(r">> shift\d+\)", source)) == 1 and not re.search(r"data1\[", source)
  np.testing.assert_array_equal(got, data[:, 1:5].astype(np.float32) @ weights)

def test_half_inputs_are_rounded_once_on_llvm():
  """x in float16: each product and the sum are float32 (the dequantized values are), and only the result rounds to
  half, so every output is within half a float16 spacing (plus float32's sum error) of x·Wᵀ in float64."""
  rows, columns = 16, 2048
  raw = random_weight(GGMLType.Q8_0, rows, columns, seed=7)
  weight = QuantizedTensor.from_bytes(raw, GGMLType.Q8_0, (rows, columns), "LLVM").realize()
  x = np.random.default_rng(3).standard_normal((1, columns)).astype(np.float16)
  got = weight.linear(Tensor(x, device="LLVM")).numpy().astype(np.float64)
  reference = x.astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
  half_spacing = np.abs(reference) * 2.0 ** -11
  assert np.all(np.abs(got - reference) <= half_spacing * 1.01 + 1e-5 * np.abs(reference).max())

@needs_gxx
@pytest.mark.parametrize("row_kernel", [False, True], ids=["sum", "row_kernel"])
def test_two_group_axes_on_emulated_cuda(row_kernel):
  """GROUP on two reduce axes (each thread of a block takes one position of both; the partials combine over both) for
  a plain sum and for a row kernel whose later pass reads the first pass's result in every thread."""
  padded = np.random.default_rng(2).standard_normal((6, 8, 13)).astype(np.float32)
  x = padded[:, :, :12]   # rows of 13 read 12 at a time: the two reduce axes can't merge into one
  t = Tensor(padded, device="LLVM").realize()[:, :, :12]
  out = (t - t.max(axis=(1, 2), keepdim=True)).exp().sum(axis=(1, 2)) if row_kernel else t.sum(axis=(1, 2))
  want = np.exp(x - x.max(axis=(1, 2), keepdims=True)).sum(axis=(1, 2)) if row_kernel else x.sum(axis=(1, 2))
  got, source = run_kernel_emulated(out, [Opt(OptOps.GROUP, 0, 4), Opt(OptOps.GROUP, 1, 0), Opt(OptOps.UNROLL, 2, 2)])
  assert "threadIdx.y" in source
  np.testing.assert_allclose(got, want, rtol=1e-5)

def test_gpu_rule_gives_many_rows_fewer_threads_each():
  """A projection with many rows (gemma's tied head: 262,144 Q8_0 rows) gets a row's word threads only, each thread
  PACKED_ROWS_PER_THREAD rows with its loop over the row's blocks unrolled, 16 rows to a block of threads; a
  decode-sized one keeps its row spread over blocks and words."""
  from tgrad.codegen.matvec_rules import PACKED_ROWS_PER_THREAD
  packed = Tensor.empty(262144, 640 // 32, BLOCK_LAYOUTS[GGMLType.Q8_0].block_bytes, dtype=dtypes.uint8, device="LLVM")
  out = QuantizedTensor(packed, GGMLType.Q8_0, (262144, 640)).linear(Tensor.empty(1, 640, dtype=dtypes.float16,
                                                                                   device="LLVM"))
  (item,) = [item for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]
  head = Kernel(item.ast, CUDARenderer())
  hand_coded_optimizations(head)
  global_size, local_size = head.launch_dims()
  assert (global_size, local_size) == ((16384,), (16 // PACKED_ROWS_PER_THREAD, 8)), head.applied_opts
  assert Opt(OptOps.UPCAST, 0, PACKED_ROWS_PER_THREAD) in head.applied_opts
  assert "< 20;" not in head.renderer.render("head", linearize(head))   # the row's 20 blocks unrolled: no loop
  small = Kernel(linear_ast(GGMLType.Q8_0, 256, 640, dtype=dtypes.float16), CUDARenderer())
  hand_coded_optimizations(small)
  assert prod(small.launch_dims()[1]) == 80, small.applied_opts

@needs_gxx
@pytest.mark.parametrize("ggml_type,rows,columns", [(GGMLType.Q8_0, 40, 640), (GGMLType.Q5_0, 24, 640),
                                                    (GGMLType.Q6_K, 12, 512)], ids=str)
def test_few_threads_per_row_values_on_emulated_cuda(ggml_type, rows, columns, monkeypatch):
  """The many-rows layout (forced on small weights by a small GPU thread budget) against x·Wᵀ in float64."""
  from tgrad.codegen import matvec_rules
  monkeypatch.setattr(matvec_rules, "PACKED_MATVEC_GPU_THREADS", rows)   # one thread of budget per row
  raw = random_weight(ggml_type, rows, columns, seed=rows)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "LLVM").realize()
  x = np.random.default_rng(rows).standard_normal((1, columns)).astype(np.float32)
  got, source = run_kernel_emulated(weight.linear(Tensor(x, device="LLVM").realize()))
  reference = x.astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
  np.testing.assert_allclose(got.astype(np.float64).reshape(reference.shape), reference, rtol=FLOAT32_RTOL,
                             atol=FLOAT32_RTOL * np.abs(reference).max())

# ---- Q6_K blocks padded to whole words on a GPU (nn/quant.py stored_block_bytes)
PAD_ROWS, PAD_COLUMNS = 12, 2048   # a Q6_K weight of 8 blocks a row

def test_which_blocks_are_padded():
  assert stored_block_bytes(GGMLType.Q6_K, "CUDA") == 212    # +1%
  assert stored_block_bytes(GGMLType.Q6_K, "LLVM") == 210    # a CPU keeps the file's layout
  for ggml_type in (GGMLType.Q5_0, GGMLType.Q8_0):            # +9%, +6%: over MAX_PADDING_FRACTION
    assert stored_block_bytes(ggml_type, "CUDA") == quant.BLOCK_LAYOUTS[ggml_type].block_bytes
  assert stored_block_bytes(GGMLType.Q4_K, "CUDA") == 144    # whole words already

@pytest.fixture
def padded_on_llvm(monkeypatch):
  """LLVM pads as a GPU does (the same views and kernels, runnable here)."""
  original = quant.stored_block_bytes
  monkeypatch.setattr(quant, "stored_block_bytes", lambda ggml_type, device: original(ggml_type, "CUDA"))

def unpadded_q6_k(raw: np.ndarray) -> QuantizedTensor:
  """The same Q6_K bytes as a plain (n, 210) packed tensor on LLVM, not through from_bytes."""
  return QuantizedTensor(Tensor(raw.reshape(PAD_ROWS, -1, 210), device="LLVM"), GGMLType.Q6_K, (PAD_ROWS, PAD_COLUMNS))

def test_padded_weight_is_a_view_with_the_same_values(padded_on_llvm):
  raw = random_weight(GGMLType.Q6_K, PAD_ROWS, PAD_COLUMNS, seed=3)
  padded = QuantizedTensor.from_bytes(raw, GGMLType.Q6_K, (PAD_ROWS, PAD_COLUMNS), "LLVM")
  assert padded.packed.shape == (PAD_ROWS, PAD_COLUMNS // 256, 210)
  assert padded.packed.lazydata.base.size == PAD_ROWS * 8 * 212
  np.testing.assert_array_equal(padded.packed.numpy().reshape(PAD_ROWS, -1), raw)
  plain = unpadded_q6_k(raw)
  np.testing.assert_array_equal(padded.dequantize().numpy(), plain.dequantize().numpy())
  x = np.random.default_rng(0).standard_normal((2, PAD_COLUMNS)).astype(np.float32)
  np.testing.assert_allclose(padded.linear(Tensor(x, device="LLVM")).numpy(),
                             plain.linear(Tensor(x, device="LLVM")).numpy(), rtol=1e-5, atol=1e-5)

@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
def test_padded_blocks_are_read_as_aligned_words_on_cuda(padded_on_llvm):
  raw = random_weight(GGMLType.Q6_K, PAD_ROWS, PAD_COLUMNS, seed=4)
  x = np.random.default_rng(1).standard_normal((1, PAD_COLUMNS)).astype(np.float32)
  sources = {}
  padded = QuantizedTensor.from_bytes(raw, GGMLType.Q6_K, (PAD_ROWS, PAD_COLUMNS), "LLVM")
  for label, weight in (("padded", padded), ("plain", unpadded_q6_k(raw))):
    out = weight.realize().linear(Tensor(x, device="LLVM").realize())
    got, sources[label] = run_kernel_emulated(out, arch=CPU_ARCH)
    reference = x.astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
    np.testing.assert_allclose(got.reshape(reference.shape), reference, rtol=1e-4,
                               atol=1e-4 * np.abs(reference).max())
  funnels = {label: len(re.findall(r">> shift\d+\)", source)) for label, source in sources.items()}
  assert funnels["plain"] > 0 and funnels["padded"] == 0, funnels
  # 4-byte loads, no shifts (a uint1 where byte lanes read the word)
  assert "* 212)" in sources["padded"] and re.search(r"const (uchar4|uint1) vec", sources["padded"])
  assert not re.search(r"data2\[", sources["padded"]), "a byte loaded alone"

@pytest.mark.gpu
def test_padded_q6_k_matvec_on_the_gpu():
  raw = random_weight(GGMLType.Q6_K, 640, PAD_COLUMNS, seed=5)
  weight = QuantizedTensor.from_bytes(raw, GGMLType.Q6_K, (640, PAD_COLUMNS), "CUDA")
  assert weight.packed.lazydata.base.size == 640 * 8 * 212
  x = np.random.default_rng(2).standard_normal((1, PAD_COLUMNS)).astype(np.float32)
  reference = x.astype(np.float64) @ QuantizedTensor.from_bytes(raw, GGMLType.Q6_K, (640, PAD_COLUMNS), "LLVM") \
    .dequantize().numpy().astype(np.float64).T
  got = weight.linear(Tensor(x, device="CUDA")).numpy()
  np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())

def test_gathered_table_is_never_the_weight():
  """A matvec whose x is a row gathered from a larger packed table (a decode step's embedding row recomputed inside
  the kernel that reads it) takes its weight, not the table, as the packed stream: the rule's layout and threads. The
  table is planar, as a GPU holds gemma's: its scales plane starts 2.6 MB into the buffer, past the weight's bytes."""
  table = QuantizedTensor.planar(Tensor.empty(4096 * 20 * 34, dtype=dtypes.uint8, device="LLVM"), GGMLType.Q8_0,
                                 (4096, 640))
  ids = Tensor.zeros(1, dtype=dtypes.int32, device="LLVM").contiguous().realize()
  x = quant.dequantize_blocks(table.rows(ids).reshape(-1, 34), GGMLType.Q8_0).reshape(1, 640)
  weight = QuantizedTensor(Tensor.empty(256, 640 // 32, 34, dtype=dtypes.uint8, device="LLVM"), GGMLType.Q8_0,
                           (256, 640))
  checks_before = pending_checks()
  try: (item,) = [item for item in create_schedule([weight.linear(x).lazydata]) if item.ast.op is Ops.SINK]
  finally: drop_pending_checks(keep=checks_before)   # the gather's index check: nothing here runs the kernel
  assert any(b.size == 4096 * 20 * 34 for b in item.bufs)   # the gather is inside the kernel
  kernel = Kernel(item.ast, CUDARenderer())
  assert packed_matvec_layout(kernel) is not None
  hand_coded_optimizations(kernel)
  plain = Kernel(linear_ast(GGMLType.Q8_0, 256, 640), CUDARenderer())
  hand_coded_optimizations(plain)
  assert kernel.launch_dims() == plain.launch_dims(), (kernel.applied_opts, plain.applied_opts)
