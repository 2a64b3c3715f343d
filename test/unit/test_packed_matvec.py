"""Matrix–vector products over block-quantized weights (tgrad/codegen/heuristics.py `packed_matvec_layout`, the GPU
rule `_packed_matvec`, the CPU rule `_cpu_packed_matvec`).

Without a GPU: the layout detection on the kernels of QuantizedTensor.linear for the ggml types of gemma-3-270m's
GGUF; the opts the GPU heuristics choose (a group of threads per row over the blocks, the innermost block axis
unrolled), rendered and compiled with NVRTC; the CPU rule (a whole block per loop iteration) run on LLVM against
the dequantized weight, for every type tgrad dequantizes. With a GPU (marked `gpu`): the GPU kernels against x times
the weight as the CPU dequantizes it, in float64, M = 1 and M = 3, float32 and float16.
"""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.heuristics import hand_coded_optimizations, packed_matvec_layout
from tgrad.codegen.kernel import Kernel, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.dtype import dtypes
from tgrad.nn.quant import BLOCK_LAYOUTS, GGMLType, QuantizedTensor
from tgrad.ops import Ops
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.llvm.renderer import reorderable_accumulators, reorderable_summands
from tgrad.schedule import create_schedule

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
  products are reorderable summands) and the values stay x·Wᵀ against float64."""
  from tgrad.device import Device
  kernel = Kernel(linear_ast(ggml_type, rows, columns), Device["LLVM"].renderer)
  block_axes = kernel.first_upcast - kernel.first_reduce - 1
  hand_coded_optimizations(kernel)
  assert [o.op for o in kernel.applied_opts].count(OptOps.UNROLL) == block_axes, kernel.applied_opts
  uops = linearize(kernel)
  assert len(reorderable_summands(uops, reorderable_accumulators(uops))) > 0
  source = kernel.renderer.render("packed_matvec", uops)
  assert "reassoc nsz" in source and "llvm.vectorize.enable" not in source and \
    '!"llvm.loop.vectorize.enable", i1 0' in source and "distinct" in source
  raw = random_weight(ggml_type, rows, columns, seed=rows * columns)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "LLVM").realize()
  x = np.random.default_rng(5).standard_normal((1, columns)).astype(np.float32)
  reference = x.astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
  np.testing.assert_allclose(weight.linear(Tensor(x, device="LLVM")).numpy(), reference, rtol=FLOAT32_RTOL,
                             atol=FLOAT32_RTOL * np.abs(reference).max())
