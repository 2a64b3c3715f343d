"""The warpgroup-MMA matmul over a packed GGUF weight (runtime/cuda/packed_wgmma.py) without a GPU: NVRTC compiles it
for sm_90a for each ggml type it reads, and the CPU emulator (test/cuda_on_cpu.py: cp.async, the swizzled shared
tiles, wgmma read through the descriptors, all written from the PTX ISA) runs a small case per type against numpy's
float64 product of x and the weight's values rounded once to half (llama.cpp's values: tgrad's dequantize, checked
against gguf.quants in test_quant.py): odd M, K over several blocks and super-blocks, rows of W past N, bfloat16.
"""
import os, sys
import numpy as np
import pytest
from tgrad import dtypes
from tgrad.nn.quant import GGMLType, QuantizedTensor
from tgrad.runtime.cuda import packed_wgmma
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.runtime.cuda.wgmma import MatmulShape, float_of_bits
from cuda_on_cpu import cpu_available, run_on_cpu
sys.path.insert(0, os.path.dirname(__file__))
from test_packed_matvec import random_weight  # noqa: E402  (packed bytes: random quants, finite scales)

TYPES = [GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K]
# the output is rounded to half once; the products of half values are exact and summed in float32
HALF_RTOL, BFLOAT16_RTOL = 2e-3, 1.6e-2

def weight_values(ggml_type: GGMLType, raw: np.ndarray, n: int, k: int) -> np.ndarray:
  """The weight's float32 values (llama.cpp's) from its packed bytes, through tgrad's dequantize on the CPU."""
  return QuantizedTensor.from_bytes(raw, ggml_type, (n, k), "LLVM").dequantize().numpy()

def half_bits(values: np.ndarray, dtype) -> np.ndarray:
  if dtype == dtypes.float16: return values.astype(np.float16).view(np.uint16)
  bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)   # round to nearest even
  return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)

@pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_compiles_for_sm_90a(ggml_type):
  fmt = packed_wgmma.FORMATS[ggml_type.name]
  config = packed_wgmma.packed_config(fmt, 512, 640)
  source = packed_wgmma.packed_matmul_source("packed", fmt, MatmulShape("(int)var_prompt_len", 640, 1024),
                                             dtypes.float16, config, ("var_prompt_len",))
  assert compile_cuda(source, "sm_90a")[:4] == b"\x7fELF"

# (type, M, N, K, tile (warpgroups, block_n, stages), dtype): K over 3 to 8 tiles (several super-blocks), N past the
# last tile's rows (W's rows past N read zeros), one case with two warpgroups and one in bfloat16
CASES = [(GGMLType.Q8_0, 67, 96, 192, (1, 64, 4), dtypes.float16),
         (GGMLType.Q5_0, 133, 128, 256, (2, 128, 3), dtypes.float16),
         (GGMLType.Q4_K, 45, 64, 512, (1, 64, 4), dtypes.float16),
         (GGMLType.Q6_K, 29, 72, 512, (1, 64, 3), dtypes.bfloat16)]

@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
@pytest.mark.parametrize("ggml_type,m,n,k,tile,dtype", CASES, ids=str)
def test_emulated_kernel_matches_numpy(ggml_type, m, n, k, tile, dtype):
  fmt = packed_wgmma.FORMATS[ggml_type.name]
  warpgroups, block_n, stages = tile
  config = packed_wgmma.PackedConfig(warpgroups, block_n, stages,
                                     staging_bytes=packed_wgmma.staging_bytes(fmt, block_n))
  raw = random_weight(ggml_type, n, k, seed=m)
  w = weight_values(ggml_type, raw, n, k)
  x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
  x_bits, w_bits = half_bits(x, dtype), half_bits(w, dtype)
  source = packed_wgmma.packed_matmul_source("packed", fmt, MatmulShape("(int)rows_arg", n, k), dtype, config,
                                             ("rows_arg",))
  out = np.full(m * n, 0xFFFF, np.uint16)   # NaN: an output never written shows
  run_on_cpu(source, "packed", packed_wgmma.grid(config, m, n), (config.threads,), [out, x_bits, raw.reshape(-1)],
             [m])
  got = float_of_bits(out.reshape(m, n), dtype).astype(np.float64)
  expected = float_of_bits(x_bits, dtype).astype(np.float64) @ float_of_bits(w_bits, dtype).astype(np.float64).T
  assert not np.isnan(got).any(), f"{np.isnan(got).sum()} outputs never written"
  rtol = HALF_RTOL if dtype == dtypes.float16 else BFLOAT16_RTOL
  np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * np.abs(expected).max())
