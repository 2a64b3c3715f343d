"""Fewer kernels per decode step: argmax over a long axis in two kernels, a gather recomputed inside the kernels that
read it, and the kernel count of gemma-3-270m's decode step on CUDA, scheduled without a GPU (bench/decode_kernels.py:
nothing is compiled or run), which must not grow back."""
import os, sys, zlib
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.helpers import Context
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.ops import Ops
from tgrad.nn.quant import GGMLType, QuantizedTensor
from tgrad.models.gemma3 import Gemma3Embedding
from tgrad.models.gemma3_projections import project, stacked_rows

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from decode_kernels import decode_step_kernels, schedule_only  # noqa: E402

# gemma-3-270m's decode step (18 layers) on CUDA: 155 kernels before the fusions this file tests (148 before
# the residual sum moved into the next qkv kernel, schedule rule 2c; 132 before the 18 cache writes became one
# kernel, schedule rule 5; 115 before the last layer's residual sum moved into the final norm's row kernel, rule 2b;
# 114 with RIDERS=1 and 131 without before each layer's attention and cache write became one flash-decoding kernel;
# 96 before flash decoding's scratch was zero-filled once, by the first step, instead of in every replayed step; 95
# before the step read its rotary tables from the cache's bank instead of computing them: gemma3._rotary_bank)
DECODE_KERNELS_270M = 94
# the same step with packed weights in the types of llama.cpp's Q4_K_M file (bench/decode_kernels.py PACKED_Q4_K_M):
# the 94 and the packed embedding's own kernel (107 before the row's block scales and its dequantization became one
# kernel, schedule rule 1, and q, k and v of the layers that keep v in Q8_0 were widened into one buffer)
PACKED_DECODE_KERNELS_270M = 95
# the step without flash decoding (FLASH_DECODING=0, FLASH_ATTENTION=0, the CPU), RIDERS=0: 7
# kernels a layer and 4 more (5 before the rotary bank)
PLAIN_DECODE_KERNELS_270M = 130
# on the CPU also the embedding row realized once (gemma3._fuse_into_consumer): 1 more (GELU(gate)·up is the gate/up
# kernel's own output on every device: Gemma3MLP.after_residual)
CPU_PLAIN_DECODE_KERNELS_270M = PLAIN_DECODE_KERNELS_270M + 1

def kernels(t: Tensor) -> int: return sum(1 for item in t.schedule() if item.ast.op is Ops.SINK)
def kernels_of(t: Tensor, *more: Tensor) -> int: return sum(1 for item in t.schedule(*more) if item.ast.op is Ops.SINK)

@pytest.mark.parametrize("shape, axis", [((262144,), 0), ((2, 65536), 1), ((40000,), 0), ((3, 32768), 1),
                                         ((32768, 3), 0), ((2, 32768, 1), 1)])
@pytest.mark.parametrize("case", ["random", "ties", "nan", "all_equal"])
def test_long_argmax_matches_numpy(shape, axis, case):
  rng = np.random.default_rng(zlib.crc32(repr((shape, axis, case)).encode()))
  a = rng.standard_normal(shape).astype(np.float32)
  if case == "ties": a = np.round(a * 2)   # many equal maxima: the first one wins
  if case == "nan":
    flat = a.reshape(-1)
    flat[rng.integers(0, flat.size, 3)] = np.nan   # the first NaN counts as the maximum, as numpy
  if case == "all_equal": a[...] = 1.5
  t = Tensor(a)
  np.testing.assert_array_equal(t.argmax(axis).numpy(), a.argmax(axis))
  np.testing.assert_array_equal(t.argmax(axis, keepdim=True).numpy(), np.expand_dims(a.argmax(axis), axis))
  np.testing.assert_array_equal(t.argmin(axis).numpy(), a.argmin(axis))

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.int32, dtypes.bool])
def test_long_argmax_other_dtypes(dtype):
  rng = np.random.default_rng(1)
  a = rng.integers(-3, 4, 65536 + 4096).astype(dtype.np)   # 69632 = 272 · 256: chunks of 272
  np.testing.assert_array_equal(Tensor(a).argmax().numpy(), a.argmax())
  np.testing.assert_array_equal(Tensor(a).argmin().numpy(), a.argmin())

def test_long_argmax_is_two_kernels():
  x = Tensor(np.random.default_rng(2).standard_normal(262144).astype(np.float32)).realize()
  assert kernels(x.argmax()) == 2   # chunk maxima (a row kernel), then the first chunk holding the largest
  assert kernels(Tensor(np.zeros(1000, np.float32)).realize().argmax()) == 1   # short axes: one row kernel

def test_shared_gather_is_recomputed_in_each_reader():
  """A small gather (an embedding lookup times a constant) read by several kernels is computed in each of them
  (rule 1: it reads only the table and the index), not stored by a kernel of its own."""
  rng = np.random.default_rng(3)
  table, ids = rng.standard_normal((50, 24)).astype(np.float32), np.array([[7, 0, 49]], np.int32)
  w1, w2 = rng.standard_normal((24, 5)).astype(np.float32), rng.standard_normal((24, 6)).astype(np.float32)
  t, i = Tensor(table).realize(), Tensor(ids).realize()
  a, b = Tensor(w1).realize(), Tensor(w2).realize()
  rows = t[i] * 2.5
  y, z = rows @ a, (rows * rows).sum(-1)
  assert sum(1 for item in y.schedule(z) if item.ast.op is Ops.SINK) == 2
  Tensor.realize(y, z)
  np.testing.assert_allclose(y.numpy(), (table[ids] * 2.5) @ w1, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(z.numpy(), ((table[ids] * 2.5) ** 2).sum(-1), rtol=1e-5)
  np.testing.assert_allclose((rows @ b).numpy(), (table[ids] * 2.5) @ w2, rtol=1e-5, atol=1e-5)

def test_packed_embedding_row_read_by_several_kernels_is_one_kernel():
  """A packed embedding lookup (a gathered row of Q8_0 blocks, dequantized) read by two kernels is computed once, by
  one kernel: its block scales, which only the row's dequantization reads, are inlined into it again (schedule rule
  1); the values equal llama.cpp's dequantization of the row."""
  gguf = pytest.importorskip("gguf")
  rng = np.random.default_rng(4)
  vocab, hidden = 40, 96
  table = gguf.quants.quantize(rng.standard_normal((vocab, hidden)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
  rows = Gemma3Embedding(QuantizedTensor.from_bytes(table, GGMLType.Q8_0, (vocab, hidden)).realize(), dtypes.float32)
  ids = np.array([[31]], np.int32)
  x = rows(Tensor(ids).realize())
  w = rng.standard_normal((hidden, 7)).astype(np.float32)
  y, z = x @ Tensor(w).realize(), (x * x).sum(-1)
  assert kernels_of(y, z) == 3   # the row, the product, the sum of squares
  Tensor.realize(y, z)
  expected = gguf.quants.dequantize(table, gguf.GGMLQuantizationType.Q8_0)[ids] * np.float32(np.sqrt(hidden))
  np.testing.assert_allclose(y.numpy(), expected @ w, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(z.numpy(), (expected ** 2).sum(-1), rtol=1e-5)

def test_packed_projections_of_two_types_share_one_kernel():
  """q and k in Q5_0 and v in Q8_0 (a Q4_K_M file's layer) stack into one Q8_0 buffer (Q5_0's values are exact Q8_0
  values): one matrix-vector kernel, and the outputs equal those of the weights as the file holds them."""
  gguf = pytest.importorskip("gguf")
  rng = np.random.default_rng(5)
  hidden, types = 64, (GGMLType.Q5_0, GGMLType.Q5_0, GGMLType.Q8_0)
  weights = [QuantizedTensor.from_bytes(gguf.quants.quantize(rng.standard_normal((rows, hidden)).astype(np.float32),
                                                             gguf.GGMLQuantizationType(int(t))), t, (rows, hidden))
             for rows, t in zip((64, 32, 32), types)]
  buffers, views = stacked_rows(*weights)
  assert len(buffers) == 1 and buffers[0].ggml_type == GGMLType.Q8_0
  assert [v.shape for v in views] == [(64, 64), (32, 64), (32, 64)]
  x = Tensor(rng.standard_normal((1, hidden)).astype(np.float32)).realize()
  assert kernels_of(project(x, buffers[0])) == 1
  for view, weight in zip(views, weights):
    np.testing.assert_allclose(project(x, view).numpy(), project(x, weight).numpy(), rtol=1e-6, atol=1e-6)

def test_schedule_only_runs_nothing():
  with schedule_only() as items:
    x = Tensor.arange(10).reshape(2, 5).sum(1).realize()
  assert [item.ast.op for item in items] == [Ops.SINK] and not x.lazydata.base.buffer.is_allocated

@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_gemma_270m_decode_step_kernel_count_on_cuda(dtype):
  """One decode step of the 18-layer gemma-3-270m in each compute dtype on CUDA (FLASH_DECODING=1, the default;
  scheduled without a GPU): at most DECODE_KERNELS_270M kernels, 5 per layer (qkv matvec with the input norm and,
  from the second layer on, the previous layer's post-norm and residual sum, stored as its second output; one
  flash-decoding kernel: q's and the new key's norm and RoPE, the cache write as its second output (schedule rule
  2d), the attention over the filled slots; o_proj; the residual sum and pre-norm in the gate/up matvec; down with
  GELU) and 4 more: the last layer's residual sum inside the final norm's row kernel (three reduces over one row:
  rule 2b), the head's matvec and the argmax's two (the rotary tables are rows of the cache's bank, read in place;
  flash decoding's scratch was zero-filled by the first call). Riders (rule 5) change nothing."""
  for riders in (0, 1):
    with Context(RIDERS=riders, FLASH_DECODING=1): found = decode_step_kernels("270m", "CUDA", dtype, position=600)
    assert len(found) <= DECODE_KERNELS_270M, len(found)
  assert len(decode_step_kernels("270m", "CUDA", dtype, position=600)) == len(found)   # the default step
  with Context(FLASH_DECODING=0):
    assert len(decode_step_kernels("270m", "CUDA", "float16", position=600)) == PLAIN_DECODE_KERNELS_270M
  attention = [k for k in found if k.ast.op is Ops.CUSTOM]
  assert len(attention) == 18 and all(k.output_count == 2 for k in attention)   # the output, the cache it wrote
  assert {k.outputs[1].size for k in attention} == {2 * 256 * 512, 2 * 256 * 1024}
  assert all(k.outputs[1] in k.inputs for k in attention)   # the cache it reads is the buffer it writes
  qkv = next(k for k in found if k.outputs[0].size == 1536)
  assert qkv.inputs[0].dtype == dtypes.int32   # the first layer's: the embedding lookup inside it
  # every later layer's qkv kernel also stores the residual stream (float32 in a float16 model): 17 of them
  residual_stores = [k for k in found if k.output_count == 2 and k.outputs[0].size == 1536]
  assert len(residual_stores) == 17 and all(k.outputs[1].size == 640 for k in residual_stores)
  final_norm = found[-4]   # before the head's matvec and the argmax's two: one row of the hidden size, 3 reduces
  assert final_norm.outputs[0].size == 640 and sum(u.op is Ops.REDUCE_AXIS for u in final_norm.ast.toposort()) == 3

def test_gemma_270m_packed_decode_step_kernel_count_on_cuda():
  """The decode step with packed Q4_K_M weights (bench/decode_kernels.py --packed): PACKED_DECODE_KERNELS_270M at most,
  one qkv matvec in every layer (Q5_0 q and k widened into v's Q8_0 where they differ) and one kernel for the
  embedding row (gathered and dequantized at once)."""
  with Context(FLASH_DECODING=1): found = decode_step_kernels("270m", "CUDA", "float16", position=600, packed=True)
  assert len(found) <= PACKED_DECODE_KERNELS_270M, len(found)
  qkv = [k for k in found if k.outputs[0].size == 1536]
  assert len(qkv) == 18, [k.outputs[0].size for k in found]
  embedding = [k for k in found if any(b.dtype == dtypes.int32 and b.size == 1 for b in k.inputs)]
  assert len(embedding) == 1 and embedding[0].outputs[0].size == 640

def test_gemma_270m_plain_decode_step_kernel_count():
  """Without flash decoding: 7 kernels a layer (the scores with q's norm and RoPE and the new key's, softmax times
  values, the cache write), one kernel for all 18 cache writes with RIDERS=1 (rule 5)."""
  with Context(RIDERS=1, FLASH_ATTENTION=0): found = decode_step_kernels("270m", "CUDA", "float16", position=600)
  assert len(found) == PLAIN_DECODE_KERNELS_270M - 17, len(found)
  cache_writes = [k for k in found if k.output_count == 18]
  assert len(cache_writes) == 1 and {b.size for b in cache_writes[0].outputs} == {2 * 256 * 512, 2 * 256 * 1024}

@pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
def test_decode_cache_writes_and_scores_compile_for_cuda():
  """The kernel of the 18 cache writes (rule 5) and a scores kernel that takes the new key from k (a row reduce
  beside the dot products), under the GPU heuristics, compile with NVRTC; so does a flash-decoding kernel of the
  default step, from the graph's own layouts and variables."""
  with Context(RIDERS=1, FLASH_ATTENTION=0): found = decode_step_kernels("270m", "CUDA", "float16", position=600)
  writes = next(k for k in found if k.output_count == 18)
  scores = next(k for k in found if k.outputs[0].size == 2048)
  for item in (writes, scores):
    kernel = Kernel(item.ast, CUDARenderer())
    hand_coded_optimizations(kernel)
    assert compile_cuda(kernel.renderer.render("decode", linearize(kernel)), "sm_90")[:4] == b"\x7fELF"
  for item in [k for k in decode_step_kernels("270m", "CUDA", "float16", position=600) if k.ast.op is Ops.CUSTOM][:2]:
    kernel = item.ast.arg   # a full layer's and a sliding one's
    assert set(kernel.variables()) <= set(item.var_vals), (kernel.variables(), item.var_vals)
    assert compile_cuda(kernel.source("decode"), "sm_90")[:4] == b"\x7fELF"

def test_decode_kernels_timed_alone_on_llvm():
  """bench/decode_kernels.py --time: kernels of a (tiny) decode step (its first layer's) lowered and launched alone, a
  time each."""
  from decode_kernels import kernel_seconds
  found = decode_step_kernels("tiny", "LLVM", "float32", position=5, context=64)[:6]
  seconds = kernel_seconds(found, repeats=2)
  assert len(seconds) == len(found) and all(s > 0 for s in seconds)

@pytest.mark.parametrize("dtype, device", [("float32", "CUDA"), ("float16", "LLVM")])
def test_gemma_270m_decode_step_kernel_count_other_dtypes_and_devices(dtype, device):
  """Without flash decoding (turned off on CUDA; the CPU has none) the default step (RIDERS=0: each of the 18 cache
  writes its own kernel) has the plain graph's count (on the CPU with the producers it realizes once)."""
  with Context(RIDERS=0, FLASH_DECODING=0): found = decode_step_kernels("270m", device, dtype, position=600)
  assert len(found) == (PLAIN_DECODE_KERNELS_270M if device == "CUDA" else CPU_PLAIN_DECODE_KERNELS_270M)
