"""The warpgroup-MMA matmul over a packed GGUF weight (runtime/cuda/packed_wgmma.py) without a GPU: NVRTC compiles it
for sm_90a for each ggml type it reads, and the CPU emulator (test/cuda_on_cpu.py: cp.async, the swizzled shared
tiles, wgmma read through the descriptors, all written from the PTX ISA) runs a small case per type against numpy's
float64 product of x and the weight's values rounded once to half (llama.cpp's values: tgrad's dequantize, checked
against gguf.quants in test_quant.py): odd M, K over several blocks and super-blocks, rows of W past N, bfloat16.
Then packed_linear's default through the whole pipeline, the LLVM device made to offer the kernel (as an sm_90a GPU
does) and its runner the emulator: one kernel over the packed bytes, a symbolic prompt length, a TinyJit.
"""
import dataclasses, os, sys
import numpy as np
import pytest
from tgrad import Tensor, TinyJit, Variable, dtypes
from tgrad import packed_gemm_kernel
from tgrad.backend import REGISTRY
from tgrad.helpers import Context
from tgrad.nn.quant import HALF_GEMM, GGMLType, QuantizedTensor
from tgrad.ops import Ops
from tgrad.packed_gemm_kernel import PACKED_WGMMA, PackedGemmKernel
from tgrad.schedule import create_schedule
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

# (type, M, N, K, tile (consumer warpgroups, producer warpgroups, block_n, stages), dtype): K over 3 to 8 tiles
# (several super-blocks), N past the last tile's rows (W's rows past N read zeros), one case with two consumer
# warpgroups, one with two producers, one in bfloat16
CASES = [(GGMLType.Q8_0, 67, 96, 192, (1, 1, 64, 4), dtypes.float16),
         (GGMLType.Q5_0, 133, 128, 256, (2, 1, 128, 3), dtypes.float16),
         (GGMLType.Q4_K, 45, 64, 512, (1, 2, 64, 5), dtypes.float16),
         (GGMLType.Q6_K, 29, 72, 512, (1, 1, 64, 3), dtypes.bfloat16)]

@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
@pytest.mark.parametrize("ggml_type,m,n,k,tile,dtype", CASES, ids=str)
def test_emulated_kernel_matches_numpy(ggml_type, m, n, k, tile, dtype):
  fmt = packed_wgmma.FORMATS[ggml_type.name]
  config = packed_wgmma.make_config(fmt, *tile)
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

# ---- packed_linear's default through the whole pipeline: the LLVM device made to offer the kernel, its runner the
# CUDA source on the emulator

class EmulatedPackedRunner:
  """The kernel's CUDA source on the CPU emulator, over LLVM Buffers (copied out, run, the output copied in)."""
  flops, nbytes = 0, 0
  launches = 0
  def __init__(self, kernel):
    self.kernel, self.entry, self.variables = kernel, kernel.entry(), kernel.variables()
    self.name, self.source = "emulated " + self.entry, kernel.source(self.entry)
  def launch_dims(self, var_vals=None): return self.kernel.launch_dims(var_vals or {})
  def __call__(self, bufs, wait=False, var_vals=None):
    EmulatedPackedRunner.launches += 1
    arrays = [b.copyout() for b in bufs]
    global_size, local_size = self.launch_dims(var_vals)
    run_on_cpu(self.source, self.entry, global_size, local_size, arrays, [var_vals[v] for v in self.variables])
    bufs[0].copyin(arrays[0])
    return 0.0 if wait else None

@pytest.fixture
def packed_wgmma_on_llvm(monkeypatch):
  """The LLVM device offers HALF_GEMM and the packed warpgroup kernel (as an sm_90a GPU does), run on the emulator."""
  backend = REGISTRY.backends["LLVM"]
  traits = dataclasses.replace(backend.traits, lowerings=backend.traits.lowerings | {HALF_GEMM, PACKED_WGMMA})
  monkeypatch.setitem(REGISTRY.backends, "LLVM", dataclasses.replace(backend, traits=traits))
  monkeypatch.setattr(packed_gemm_kernel, "has_warpgroup_mma", lambda device: True)
  monkeypatch.setattr(PackedGemmKernel, "runner", lambda self, device: EmulatedPackedRunner(self))
  with Context(PACKED_GEMM=1): yield

def kernel_items(out: Tensor) -> list:
  return [item for item in create_schedule([out.lazydata]) if item.ast.op in (Ops.SINK, Ops.CUSTOM)]

@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
def test_a_jitted_prompt_is_one_kernel_over_the_packed_blocks(packed_wgmma_on_llvm):
  """A prompt of symbolic length times a Q8_0 weight is one CUSTOM kernel reading x in place and the packed bytes (no
  half temporary); a TinyJit replays it at other lengths; PACKED_GEMM=0 keeps the temporary and the dense matmul."""
  n, k, max_rows = 64, 128, 80
  raw = random_weight(GGMLType.Q8_0, n, k, seed=3)
  weight = QuantizedTensor.from_bytes(raw, GGMLType.Q8_0, (n, k), "LLVM").realize()
  w16 = weight.dequantize().numpy().astype(np.float16).astype(np.float64)
  data = np.random.default_rng(4).standard_normal((max_rows, k)).astype(np.float16)
  x_full = Tensor(data, device="LLVM").realize()
  def prompt(rows: int) -> Tensor: return x_full[:Variable("prompt_len", 1, max_rows).bind(rows)]
  (item,) = kernel_items(weight.linear(prompt(33)))
  assert isinstance(item.ast.arg, PackedGemmKernel) and item.ast.arg.ggml_type == "Q8_0"
  with Context(PACKED_GEMM=0): assert len(kernel_items(weight.linear(prompt(33)))) == 2
  step = TinyJit(lambda x: weight.linear(x).realize())
  before = EmulatedPackedRunner.launches
  for rows in (33, 17, 70):
    got = step(prompt(rows)).numpy().astype(np.float64)
    expected = data[:rows].astype(np.float64) @ w16.T
    np.testing.assert_allclose(got, expected, rtol=HALF_RTOL, atol=HALF_RTOL * np.abs(expected).max())
  assert EmulatedPackedRunner.launches - before == 3

def test_where_the_kernel_does_not_apply(packed_wgmma_on_llvm, monkeypatch):
  """K not a multiple of 64, a type it does not read, float32 x and a device without warpgroup MMA keep the others."""
  x16 = Tensor.empty(32, 96, dtype=dtypes.float16, device="LLVM")
  assert "K=96" in packed_gemm_kernel.unsupported(x16.lazydata, x16.lazydata, "Q8_0", (64, 96))
  x = Tensor.empty(32, 128, dtype=dtypes.float16, device="LLVM")
  assert "Q4_0" in packed_gemm_kernel.unsupported(x.lazydata, x.lazydata, "Q4_0", (64, 128))
  assert "float32" in packed_gemm_kernel.unsupported(x.float().lazydata, x.lazydata, "Q8_0", (64, 128))
  # blocks padded to whole words (Q6_K's on a GPU: the packed tensor a view of the padded buffer) are not read in
  # place by the kernel, and not copied into an unpadded weight on every call either: the half temporary takes them
  padded = Tensor.empty(64, 1, 212, dtype=dtypes.uint8, device="LLVM").shrink(((0, 64), (0, 1), (0, 210)))
  x256 = Tensor.empty(32, 256, dtype=dtypes.float16, device="LLVM")
  assert "padded" in packed_gemm_kernel.unsupported(x256.lazydata, padded.lazydata, "Q6_K", (64, 256))
  assert packed_gemm_kernel.unsupported(x256.lazydata, padded.contiguous().lazydata, "Q6_K", (64, 256)) is None
  monkeypatch.setattr(packed_gemm_kernel, "has_warpgroup_mma", lambda device: False)
  assert "sm_90a" in packed_gemm_kernel.unsupported(x.lazydata, x.lazydata, "Q8_0", (64, 128))

def test_x_is_read_in_place_unless_its_view_reorders(packed_wgmma_on_llvm):
  """A prompt sliced to its length is read where it lies (one kernel); a transposed x is made contiguous first."""
  weight = QuantizedTensor.from_bytes(random_weight(GGMLType.Q6_K, 64, 256, seed=5), GGMLType.Q6_K, (64, 256), "LLVM")
  sliced = Tensor.empty(40, 256, dtype=dtypes.float16, device="LLVM").realize()[:Variable("prompt_len", 1, 40).bind(20)]
  assert [item.ast.op for item in kernel_items(weight.linear(sliced))] == [Ops.CUSTOM]
  transposed = Tensor.empty(256, 24, dtype=dtypes.float16, device="LLVM").realize().T
  assert [item.ast.op for item in kernel_items(weight.linear(transposed))] == [Ops.SINK, Ops.CUSTOM]
