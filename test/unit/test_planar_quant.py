"""Q8_0 weights held planar on a GPU (nn/quant.py: all quants, then all scales; `packed` the blocks as two views side by
side) and the matrix-vector rule's 16-byte pieces for them (codegen/matvec_rules.py, PACKED_VECTOR_BYTES).

Without a GPU: LLVM made to hold Q8_0 planar as a GPU does (the same views and graphs, runnable here): the blocks,
values, products, gathered rows, copies to another device and stacked rows equal the interleaved weight's; the head's
rule reads the planar quants as aligned 16-byte loads and the interleaved ones as words, and the planar kernels run
through test/cuda_on_cpu.py against float64. With a GPU (marked `gpu`): a planar Q8_0 weight loaded onto CUDA, its
product against the dequantized weight in float64.
"""
import re
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel, Opt, OptOps
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.matvec_rules import PACKED_VECTOR_BYTES
from tgrad.dtype import dtypes
from tgrad.helpers import Context
from tgrad.nn import quant
from tgrad.nn.quant import BLOCK_LAYOUTS, GGMLType, QuantError, QuantizedTensor, planar_held
from tgrad.ops import Ops
from tgrad.packed_gemm_kernel import unsupported
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.schedule import create_schedule
from cuda_on_cpu import CPU_ARCH, cpu_available, run_kernel_emulated

needs_gxx = pytest.mark.skipif(not cpu_available(), reason="g++ not found")
ROWS, COLUMNS = 24, 640          # 20 Q8_0 blocks a row
HEAD_ROWS = 262144               # gemma-3-270m's tied head: the many-rows layout
RTOL = 1e-4

def random_q8_0(rows: int, columns: int, seed: int) -> np.ndarray:
  """Packed Q8_0 bytes: random quants, finite random float16 scales (bytes 0-1 of every block)."""
  rng = np.random.default_rng(seed)
  raw = rng.integers(0, 256, (rows * columns // 32, 34), dtype=np.uint8)
  raw[:, :2] = rng.uniform(1e-3, 1e-1, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
  return raw.reshape(rows, -1)

@pytest.fixture
def planar_on_llvm(monkeypatch):
  """LLVM holds Q8_0 planar as a GPU does."""
  original = quant.planar_held
  monkeypatch.setattr(quant, "planar_held", lambda ggml_type, device: original(ggml_type, "CUDA"))

def interleaved(raw: np.ndarray) -> QuantizedTensor:
  rows, columns = raw.shape[0], raw.shape[1] // 34 * 32
  return QuantizedTensor(Tensor(raw.reshape(rows, -1, 34), device="LLVM"), GGMLType.Q8_0, (rows, columns))

def test_which_weights_are_held_planar():
  assert planar_held(GGMLType.Q8_0, "CUDA") and not planar_held(GGMLType.Q8_0, "LLVM")
  for ggml_type in (GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K): assert not planar_held(ggml_type, "CUDA")

def test_planar_storage_is_quants_then_scales(planar_on_llvm):
  raw = random_q8_0(ROWS, COLUMNS, seed=1)
  weight = QuantizedTensor.from_bytes(raw, GGMLType.Q8_0, (ROWS, COLUMNS), "LLVM")
  assert weight.is_planar and weight.storage.shape == (raw.size,)
  blocks = raw.reshape(-1, 34)
  storage = weight.realize().storage.numpy()
  np.testing.assert_array_equal(storage[:blocks.shape[0] * 32], blocks[:, 2:].reshape(-1))
  np.testing.assert_array_equal(storage[blocks.shape[0] * 32:], blocks[:, :2].reshape(-1))
  assert weight.storage.lazydata.base.buffer is not None   # realize() realizes the storage, not the blocks' view
  np.testing.assert_array_equal(weight.packed.numpy().reshape(ROWS, -1), raw)

def test_planar_weight_has_the_interleaved_values(planar_on_llvm):
  raw = random_q8_0(ROWS, COLUMNS, seed=2)
  planar, plain = QuantizedTensor.from_bytes(raw, GGMLType.Q8_0, (ROWS, COLUMNS), "LLVM").realize(), interleaved(raw)
  np.testing.assert_array_equal(planar.dequantize().numpy(), plain.dequantize().numpy())
  x = np.random.default_rng(0).standard_normal((3, COLUMNS)).astype(np.float32)
  np.testing.assert_allclose(planar.linear(Tensor(x, device="LLVM")).numpy(),
                             plain.linear(Tensor(x, device="LLVM")).numpy(), rtol=1e-5, atol=1e-5)
  ids = Tensor(np.array([[5, 0, 23], [7, 7, 1]], np.int32), device="LLVM")
  np.testing.assert_array_equal(planar.rows(ids).numpy(), plain.rows(ids).numpy())
  moved = planar.to("LLVM:1")
  assert moved.is_planar and moved.device == "LLVM:1"
  np.testing.assert_array_equal(moved.dequantize().numpy(), plain.dequantize().numpy())
  stacked = planar.packed.cat(planar.packed, dim=0).realize()   # stacking realizes interleaved blocks
  np.testing.assert_array_equal(stacked.numpy().reshape(2 * ROWS, -1), np.concatenate([raw, raw]))

def test_planar_checks_its_storage():
  with pytest.raises(QuantError, match="needs uint8"):
    QuantizedTensor.planar(Tensor.empty(100, dtype=dtypes.uint8, device="LLVM"), GGMLType.Q8_0, (2, 64))
  with pytest.raises(QuantError, match="not held planar"):
    QuantizedTensor.planar(Tensor.empty(36, dtype=dtypes.uint8, device="LLVM"), GGMLType.Q4_0, (2, 32))

def test_packed_gemm_refuses_planar_blocks():
  """The prompt's warpgroup kernel reads a buffer of blocks: a planar weight's are computed (the graph is built for
  CUDA, which needs no GPU until the checks ask it), so a prompt takes the dequantized path instead of realizing
  interleaved blocks."""
  def why(weight: QuantizedTensor):
    x = Tensor.empty(128, COLUMNS, dtype=dtypes.float16, device="CUDA")
    with Context(PACKED_GEMM=1): return unsupported(x.lazydata, weight.packed.lazydata, "Q8_0", (ROWS, COLUMNS))
  planar = QuantizedTensor.planar(Tensor.empty(ROWS * COLUMNS // 32 * 34, dtype=dtypes.uint8, device="CUDA"),
                                  GGMLType.Q8_0, (ROWS, COLUMNS))
  assert "computed" in why(planar)

def head_kernel(planar: bool) -> Kernel:
  """The tied head's kernel (262144 × 640 Q8_0, float16 x) with the GPU heuristics' opts."""
  nbytes = HEAD_ROWS * COLUMNS // 32 * 34
  if planar:
    weight = QuantizedTensor.planar(Tensor.empty(nbytes, dtype=dtypes.uint8, device="LLVM"), GGMLType.Q8_0,
                                    (HEAD_ROWS, COLUMNS))
  else:
    weight = QuantizedTensor(Tensor.empty(HEAD_ROWS, COLUMNS // 32, 34, dtype=dtypes.uint8, device="LLVM"),
                             GGMLType.Q8_0, (HEAD_ROWS, COLUMNS))
  out = weight.linear(Tensor.empty(1, COLUMNS, dtype=dtypes.float16, device="LLVM"))
  (item,) = [item for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, CUDARenderer())
  hand_coded_optimizations(kernel)
  return kernel

def test_planar_head_reads_quants_as_16_byte_vectors():
  """Planar: 16 quants a load (2 threads a block's run, 4 over the row's blocks); interleaved: 32-bit words (8 threads
  a run). Both keep 8 threads a row, 4 rows a thread and 16 rows a block of threads."""
  from tgrad.codegen.search import ACTIONS
  for planar, unroll, threads in ((True, PACKED_VECTOR_BYTES, (4, 4, 2)), (False, 4, (4, 8))):
    kernel = head_kernel(planar)
    assert kernel.applied_opts[0] == Opt(OptOps.UNROLL, 1, unroll), kernel.applied_opts
    assert all(opt in ACTIONS for opt in kernel.applied_opts), kernel.applied_opts   # BEAM can reach the rule's
    global_size, local_size = kernel.launch_dims()
    assert global_size == (16384,) and sorted(local_size) == sorted(threads), kernel.applied_opts
    source = kernel.renderer.render("head", linearize(kernel))
    assert bool(re.search(r"const uint4 \w+ = \*\(\(const uint4\*\)\(data2", source)) == planar
    assert ("shift" in source) != planar   # interleaved: every other block's run 2 bytes off a word

def test_vector_pieces_need_aligned_runs():
  """The interleaved head's runs start 2 bytes into a 34-byte block: never 16-byte pieces, whatever the row count."""
  kernel = head_kernel(False)
  assert all(opt.amount != PACKED_VECTOR_BYTES for opt in kernel.applied_opts)

@needs_gxx
@pytest.mark.parametrize("m", [1, 2])
def test_planar_vector_kernel_values_on_emulated_cuda(planar_on_llvm, monkeypatch, m):
  """The many-rows planar kernel (forced on a small weight by a small GPU thread budget) against x·Wᵀ in float64."""
  from tgrad.codegen import matvec_rules
  monkeypatch.setattr(matvec_rules, "PACKED_MATVEC_GPU_THREADS", ROWS)
  raw = random_q8_0(ROWS, COLUMNS, seed=3)
  weight = QuantizedTensor.from_bytes(raw, GGMLType.Q8_0, (ROWS, COLUMNS), "LLVM").realize()
  x = np.random.default_rng(m).standard_normal((m, COLUMNS)).astype(np.float32)
  got, source = run_kernel_emulated(weight.linear(Tensor(x, device="LLVM").realize()), arch=CPU_ARCH)
  assert "uint4" in source
  reference = x.astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
  np.testing.assert_allclose(got.astype(np.float64).reshape(reference.shape), reference, rtol=RTOL,
                             atol=RTOL * np.abs(reference).max())

@pytest.mark.gpu
@pytest.mark.parametrize("rows", [ROWS, 4096])
def test_planar_q8_0_matvec_on_the_gpu(rows):
  raw = random_q8_0(rows, COLUMNS, seed=rows)
  weight = QuantizedTensor.from_bytes(raw, GGMLType.Q8_0, (rows, COLUMNS), "CUDA").realize()
  assert weight.is_planar and weight.storage.lazydata.base.size == raw.size
  x = np.random.default_rng(0).standard_normal((1, COLUMNS)).astype(np.float32)
  got = weight.linear(Tensor(x, device="CUDA")).numpy().astype(np.float64)
  values = weight.dequantize().numpy().astype(np.float64)
  np.testing.assert_array_equal(values, interleaved(raw).dequantize().numpy())
  reference = x.astype(np.float64) @ values.T
  np.testing.assert_allclose(got, reference, rtol=RTOL, atol=RTOL * np.abs(reference).max())
  ids = Tensor(np.array([rows - 1, 0, 3], np.int32), device="CUDA")
  np.testing.assert_array_equal(weight.rows(ids).numpy(), raw.reshape(rows, -1, 34)[[rows - 1, 0, 3]])
  assert BLOCK_LAYOUTS[GGMLType.Q8_0].block_bytes == 34

def test_to_holds_the_weight_as_the_device_does(monkeypatch):
  """`to(device)` gives the layout `device` holds the type in: planar storage onto a device that keeps blocks becomes
  blocks again, interleaved blocks onto a device that keeps planes become planes; the values are the same."""
  raw = random_q8_0(ROWS, COLUMNS, seed=5)
  blocks = raw.reshape(-1, 34)
  storage = Tensor(np.concatenate([blocks[:, 2:].reshape(-1), blocks[:, :2].reshape(-1)]), device="LLVM")
  planar = QuantizedTensor.planar(storage, GGMLType.Q8_0, (ROWS, COLUMNS))
  values = interleaved(raw).dequantize().numpy()
  plain = planar.to("LLVM:1")   # LLVM keeps blocks
  assert not plain.is_planar and plain.device == "LLVM:1"
  np.testing.assert_array_equal(plain.realize().packed.numpy().reshape(ROWS, -1), raw)
  original = quant.planar_held
  monkeypatch.setattr(quant, "planar_held", lambda ggml_type, device: original(ggml_type, "CUDA"))
  planes = interleaved(raw).to("LLVM:1")   # now LLVM keeps planes
  assert planes.is_planar and planes.device == "LLVM:1"
  np.testing.assert_array_equal(planes.realize().storage.numpy(), storage.numpy())
  for moved in (plain, planes): np.testing.assert_array_equal(moved.dequantize().numpy(), values)
