"""The flash-attention CUDA kernel (tgrad/runtime/cuda/flash_attention.py): NVRTC compiles for sm_80 and sm_90, and the
kernel run on the CPU emulator (test/cuda_on_cpu.py: threads, barriers, cp.async, ldmatrix, mma.sync, shuffles)
against numpy in float64 on small shapes: odd lengths, GQA groups, causal and sliding-window masks, strided inputs."""
from __future__ import annotations
import math
import numpy as np
import pytest
from tgrad.dtype import bfloat16_to_float32
from tgrad.custom import device_values
from tgrad.dtype import dtypes
from tgrad.runtime.cuda.flash_attention import (BLOCK_THREADS, SIZE_NAMES, SUPPORTED_HEAD_DIMS, FlashConfig,
                                                 flash_attention_source, grid)
from tgrad.runtime.cuda.nvrtc import nvrtc_available
from test.cuda_on_cpu import cpu_available, run_on_cpu

TOLERANCE = {"float16": 3e-3, "bfloat16": 2.5e-2}   # the probabilities are rounded to the input type for P·V

def reference(q, k, v, scale, causal, window):
  """softmax(q·kᵀ·scale + mask)·v in float64; q [B, Hq, L, D], k and v [B, Hkv, S, D]."""
  group = q.shape[1] // k.shape[1]
  k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
  scores = np.einsum("bhld,bhsd->bhls", q, k) * scale
  L, S = q.shape[2], k.shape[2]
  keep = np.ones((L, S), bool)
  if causal: keep &= np.arange(S)[None, :] <= np.arange(L)[:, None]
  if window: keep &= np.arange(L)[:, None] - np.arange(S)[None, :] < window
  scores = np.where(keep, scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  return np.einsum("bhls,bhsd->bhld", weights / weights.sum(-1, keepdims=True), v)

def as_float(bits: np.ndarray, dtype: str) -> np.ndarray:
  """Kernel values (16-bit patterns) as float64."""
  if dtype == "bfloat16": return bfloat16_to_float32(bits).astype(np.float64)
  return bits.view(np.float16).astype(np.float64)

def run_case(dtype, batch, heads, kv_heads, length, keys, head_dim, causal, window, seed=0, layout="bhld"):
  """The kernel on the emulator for q [B, heads, L, D] (stored [B, L, heads, D] when layout is "blhd"), k and v
  [B, kv_heads, S, D] (v a slice of a wider buffer: an offset and a row stride), against numpy."""
  rng = np.random.default_rng(seed)
  element = dtypes.float16 if dtype == "float16" else dtypes.bfloat16
  q = device_values(rng.standard_normal((batch, heads, length, head_dim)), element)
  k = device_values(rng.standard_normal((batch, kv_heads, keys, head_dim)), element)
  wide = device_values(rng.standard_normal((batch, kv_heads, keys, 3 * head_dim)), element)
  v = wide[..., head_dim:2 * head_dim]
  scale = 1 / math.sqrt(head_dim)
  D = head_dim
  if layout == "blhd":
    q_buffer = np.ascontiguousarray(q.transpose(0, 2, 1, 3))
    q_strides = (length * heads * D, D, heads * D)
  else: q_buffer, q_strides = q, (heads * length * D, length * D, D)
  sizes = dict(zip(SIZE_NAMES, ("n_l", "n_s", "0", *map(str, q_strides), "0", f"{kv_heads} * n_s * {D}", f"n_s * {D}",
                                str(D), str(D), f"{kv_heads} * n_s * {3 * D}", f"n_s * {3 * D}", str(3 * D))))
  config = FlashConfig(dtype, head_dim, heads // kv_heads, kv_heads, scale, causal, window)
  source = flash_attention_source(config, "attention", sizes, ("n_l", "n_s"))
  out = np.full((batch, heads, length, head_dim), 0x7E00, np.uint16)   # NaN bits: every element must be written
  run_on_cpu(source, "attention", grid(config, length, batch), (BLOCK_THREADS,),
             [out, q_buffer.reshape(-1), k.reshape(-1), np.ascontiguousarray(wide).reshape(-1)], [length, keys])
  expected = reference(as_float(q, dtype), as_float(k, dtype), as_float(np.ascontiguousarray(v), dtype), scale,
                       causal, window)
  got = as_float(out, dtype)
  np.testing.assert_allclose(got, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])

needs_emulator = pytest.mark.skipif(not cpu_available(), reason="no g++ for the CUDA-on-CPU emulator")

@needs_emulator
@pytest.mark.parametrize("dtype,batch,heads,kv_heads,length,keys,head_dim,causal,window,layout", [
  ("float16", 1, 4, 1, 37, 37, 64, True, None, "blhd"),       # GQA group 4, odd length, q stored [B, L, H, D]
  ("float16", 2, 2, 2, 21, 21, 64, True, 5, "bhld"),          # sliding window, batch 2, no GQA
  ("float16", 1, 2, 1, 13, 70, 64, False, None, "bhld"),      # no mask, more keys than queries (two K tiles + edge)
  ("bfloat16", 1, 4, 2, 19, 19, 128, True, 7, "blhd"),        # bfloat16, D 128, group 2
  ("float16", 1, 4, 1, 40, 40, 256, True, 16, "blhd"),        # Gemma 3's shape: D 256, group 4, several K tiles
])
def test_emulated_kernel_matches_numpy(dtype, batch, heads, kv_heads, length, keys, head_dim, causal, window, layout):
  run_case(dtype, batch, heads, kv_heads, length, keys, head_dim, causal, window, layout=layout)

@pytest.mark.skipif(not nvrtc_available(), reason="no NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_compiles_with_nvrtc(arch, dtype):
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  sizes = {name: "n" if name in ("L", "S") else "0" if name.endswith("offset") else "1" for name in SIZE_NAMES}
  for head_dim in SUPPORTED_HEAD_DIMS:
    config = FlashConfig(dtype, head_dim, 4, 1, 0.0625, True, 512)
    assert config.shared_bytes <= 163 * 1024   # fits sm_80's opt-in shared memory
    assert len(compile_cuda(flash_attention_source(config, "attention", sizes, ("n",)), arch)) > 0

def test_bad_configs_raise():
  with pytest.raises(ValueError, match="head dim 96"): FlashConfig("float16", 96, 1, 1, 1.0, False)
  with pytest.raises(ValueError, match="window"): FlashConfig("float16", 64, 1, 1, 1.0, False, 8)
  with pytest.raises(ValueError, match="dtype"): FlashConfig("float32", 64, 1, 1, 1.0, False)
  with pytest.raises(ValueError, match="no size"):
    flash_attention_source(FlashConfig("float16", 64, 1, 1, 1.0, False), "attention", {"L": "1"})
