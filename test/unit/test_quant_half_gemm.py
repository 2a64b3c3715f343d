"""A prompt times a packed weight on a GPU (tgrad/nn/quant.py `runs_as_dense_gemm`): the weight is dequantized into a
half temporary by a kernel of its own, then multiplied by the float16 model's own matmul (the tensor cores' graph); a
float32 prompt's temporary is float32 (the values exactly) and its matmul the float32 model's.

Without a GPU, the LLVM device is made to offer the HALF_GEMM trait (as CUDA's traits do), so packed_linear's default
takes the same decision and builds the same graph; its values are checked against numpy (x and the weight rounded to
half once, as in the float16 model) and bit for bit against the dense half model, for Q4_K, Q5_0, Q6_K and Q8_0, odd
row counts and a symbolic prompt length, inside a TinyJit too. The two kernels are rendered for CUDA with the GPU
heuristics, compiled by NVRTC (the matmul on tensor cores) and run on the CPU emulator (test/cuda_on_cpu.py).
"""
import contextlib, dataclasses
from typing import Iterator
import os, sys
import numpy as np
import pytest
from tgrad import Tensor, TinyJit, Variable, dtypes
from tgrad.backend import REGISTRY
from tgrad.codegen.compile import render_source
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel
from tgrad.helpers import Context
from tgrad.nn.quant import (HALF_GEMM, HALF_GEMM_MIN_ROWS, GGMLType, QuantizedTensor, runs_as_dense_gemm,
                             runs_as_half_gemm)
from tgrad.ops import Ops
from tgrad.packed_gemm_kernel import unsupported
import tgrad.realize as realize_module
from tgrad.runtime.cuda.nvrtc import compile_cuda, nvrtc_available
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.schedule import create_schedule
from tgrad.shape.sint import evaluate
from cuda_on_cpu import TENSOR_CORE_ARCH, cpu_available, run_on_cpu
sys.path.insert(0, os.path.dirname(__file__))
from test_packed_matvec import random_weight  # noqa: E402  (packed bytes: random quants, finite scales)

TYPES = [GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q6_K, GGMLType.Q8_0]
# x·W16ᵀ of half values: products rounded to half (LLVM's float16 multiply; a tensor core's are exact), summed in
# float32, rounded to half once: within a few half spacings of the largest output
HALF_RTOL = 8 * 2.0 ** -11
MAX_ROWS = 256   # the symbolic prompt length's bound

@pytest.fixture
def half_gemm_on_llvm(monkeypatch):
  """The LLVM device offers HALF_GEMM, as a GPU with tensor cores does."""
  backend = REGISTRY.backends["LLVM"]
  traits = dataclasses.replace(backend.traits, lowerings=backend.traits.lowerings | {HALF_GEMM})
  monkeypatch.setitem(REGISTRY.backends, "LLVM", dataclasses.replace(backend, traits=traits))

def packed_weight(ggml_type: GGMLType, out_features: int, in_features: int, seed: int = 0
                  ) -> tuple[QuantizedTensor, np.ndarray]:
  """The weight, and its values rounded to float16 once (what a float16 model's dense weight holds)."""
  weight = QuantizedTensor.from_bytes(random_weight(ggml_type, out_features, in_features, seed), ggml_type,
                                      (out_features, in_features), "LLVM").realize()
  return weight, weight.dequantize().numpy().astype(np.float16)

def kernel_items(out: Tensor) -> list:
  return [item for item in create_schedule([out.lazydata]) if item.ast.op in (Ops.SINK, Ops.CUSTOM)]

def assert_close_to_half_model(got: np.ndarray, x16: np.ndarray, w16: np.ndarray) -> None:
  reference = x16.astype(np.float64) @ w16.astype(np.float64).T
  np.testing.assert_allclose(got.astype(np.float64).reshape(reference.shape), reference, rtol=HALF_RTOL,
                             atol=HALF_RTOL * np.abs(reference).max())

@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 7, 17, 200])
def test_prompt_rows_take_a_half_temporary_and_the_dense_matmul(half_gemm_on_llvm, ggml_type, rows):
  """At HALF_GEMM_MIN_ROWS rows or more: a dequantizing kernel writes the half (out, in) weight from the packed bytes,
  and the matmul reads only it and x, bit for bit the dense float16 model's result. Fewer rows: the packed product,
  one kernel over the bytes, as on a device without the trait."""
  out_features, in_features = 48, 512
  weight, w16 = packed_weight(ggml_type, out_features, in_features, seed=rows)
  x16 = np.random.default_rng(rows).standard_normal((rows, in_features)).astype(np.float16)
  x = Tensor(x16, device="LLVM").realize()
  out = weight.linear(x)
  items = kernel_items(out)
  if rows < HALF_GEMM_MIN_ROWS:
    assert not runs_as_half_gemm(x) and len(items) == 1
    assert any(b.dtype == dtypes.uint8 for b in items[0].inputs)
  else:
    assert runs_as_half_gemm(x)
    dequantize, matmul = items
    assert dequantize.bufs[0].dtype == dtypes.float16 and dequantize.bufs[0].size == out_features * in_features
    assert [b.dtype for b in dequantize.inputs] == [dtypes.uint8]
    assert all(b.dtype == dtypes.float16 for b in matmul.bufs)
  got = out.numpy()
  assert got.dtype == np.float16 and got.shape == (rows, out_features)
  assert_close_to_half_model(got, x16, w16)
  if rows >= HALF_GEMM_MIN_ROWS: np.testing.assert_array_equal(got, (x @ Tensor(w16, device="LLVM").T).numpy())

@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_K, GGMLType.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 7, 200])
def test_a_symbolic_prompt_length_takes_the_half_matmul(half_gemm_on_llvm, ggml_type, rows):
  """A prompt's length is symbolic: its bound decides (one compiled graph serves every length, 1 included)."""
  weight, w16 = packed_weight(ggml_type, 40, 256, seed=3)
  x16 = np.random.default_rng(4).standard_normal((MAX_ROWS, 256)).astype(np.float16)
  x = Tensor(x16, device="LLVM").realize()[:Variable("prompt_len", 1, MAX_ROWS).bind(rows)]
  out = weight.linear(x)
  assert runs_as_half_gemm(x) and len(kernel_items(out)) == 2
  assert_close_to_half_model(out.numpy(), x16[:rows], w16)

def test_bfloat16_rows_take_a_bfloat16_temporary(half_gemm_on_llvm):
  weight, _ = packed_weight(GGMLType.Q6_K, 32, 512, seed=5)
  x32 = np.random.default_rng(6).standard_normal((24, 512)).astype(np.float32)
  x = Tensor(x32, device="LLVM").cast(dtypes.bfloat16).realize()
  out = weight.linear(x)
  dequantize, _ = kernel_items(out)
  assert dequantize.bufs[0].dtype == dtypes.bfloat16
  w = weight.dequantize().cast(dtypes.bfloat16).float().numpy().astype(np.float64)
  reference = x.float().numpy().astype(np.float64) @ w.T
  bfloat16_rtol = 8 * 2.0 ** -8
  np.testing.assert_allclose(out.float().numpy(), reference, rtol=bfloat16_rtol,
                             atol=bfloat16_rtol * np.abs(reference).max())

@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_K, GGMLType.Q8_0])
def test_float32_rows_take_a_float32_temporary(half_gemm_on_llvm, ggml_type):
  """A float32 prompt is not rounded to half: its weight is dequantized into a float32 temporary (the values exactly)
  and multiplied by the float32 model's matmul; the product equals x times the dequantized weight in float64 up to
  float32 sums."""
  weight, _ = packed_weight(ggml_type, 48, 512, seed=7)
  x32 = Tensor(np.random.default_rng(8).standard_normal((24, 512)).astype(np.float32), device="LLVM").realize()
  assert runs_as_dense_gemm(x32) and not runs_as_half_gemm(x32)
  out = weight.linear(x32)
  dequantize, _ = kernel_items(out)
  assert dequantize.bufs[0].dtype == dtypes.float32 and out.dtype == dtypes.float32
  reference = x32.numpy().astype(np.float64) @ weight.dequantize().numpy().astype(np.float64).T
  np.testing.assert_allclose(out.numpy(), reference, rtol=1e-5, atol=1e-5 * np.abs(reference).max())

def test_few_rows_and_devices_without_the_trait_keep_the_packed_product(half_gemm_on_llvm, monkeypatch):
  """Fewer rows than a tile keep the packed product; a device without HALF_GEMM (the CPU) keeps its own prompt
  path, for half and float32 x alike."""
  weight, _ = packed_weight(GGMLType.Q4_K, 32, 512, seed=7)
  rows = Tensor(np.random.default_rng(8).standard_normal((HALF_GEMM_MIN_ROWS - 1, 512)).astype(np.float32),
                device="LLVM").realize()
  assert not runs_as_dense_gemm(rows) and len(kernel_items(weight.linear(rows))) == 1
  monkeypatch.undo()
  x32 = Tensor(np.random.default_rng(8).standard_normal((64, 512)).astype(np.float32), device="LLVM").realize()
  x16 = x32.cast(dtypes.float16).realize()
  for x in (x32, x16): assert not runs_as_dense_gemm(x) and len(kernel_items(weight.linear(x))) == 1

def test_the_setting_turns_it_off(half_gemm_on_llvm):
  """HALF_GEMM=0 keeps the packed product (for comparison), read when the graph is built."""
  weight, _ = packed_weight(GGMLType.Q8_0, 32, 256, seed=12)
  x = Tensor(np.random.default_rng(13).standard_normal((64, 256)).astype(np.float16), device="LLVM").realize()
  with Context(HALF_GEMM=0): assert not runs_as_half_gemm(x) and len(kernel_items(weight.linear(x))) == 1
  assert runs_as_half_gemm(x) and len(kernel_items(weight.linear(x))) == 2

def test_jitted_prompts_plan_the_temporaries_and_keep_only_packed_weights(half_gemm_on_llvm):
  """Two projections in a TinyJit over a symbolic length: replays at other lengths equal the eager results, the only
  weights are the packed bytes, and the two half temporaries share the activations' arena."""
  first, w1 = packed_weight(GGMLType.Q4_K, 256, 512, seed=9)
  second, w2 = packed_weight(GGMLType.Q8_0, 512, 256, seed=10)
  data = (np.random.default_rng(11).standard_normal((MAX_ROWS, 512)) / 64).astype(np.float16)   # no half overflow
  x_full = Tensor(data, device="LLVM").realize()
  @TinyJit
  def prompt(x: Tensor) -> Tensor: return second.linear(first.linear(x).relu()).realize()
  for rows in (40, 17, 130, 3):
    x = x_full[:Variable("prompt_len", 1, MAX_ROWS).bind(rows)]
    got = prompt(x).numpy()
    hidden = np.maximum(data[:rows].astype(np.float64) @ w1.astype(np.float64).T, 0).astype(np.float16)
    reference = hidden.astype(np.float64) @ w2.astype(np.float64).T
    np.testing.assert_allclose(got.astype(np.float64), reference, rtol=4 * HALF_RTOL,
                               atol=4 * HALF_RTOL * np.abs(reference).max())
  parts = prompt.captured.memory_breakdown()["LLVM"]

  assert parts["weight"] == first.nbytes + second.nbytes
  assert parts["activation"] < parts["activations unplanned"]

# ---- the CUDA kernels: the GPU heuristics' opts, rendered, compiled by NVRTC, and run on the CPU emulator

def cuda_kernel(item, arch: str) -> tuple[Kernel, str]:
  """The kernel with the GPU heuristics' opts and its source as a realize renders it (a warpgroup matmul whole)."""
  kernel = Kernel(item.ast, CUDARenderer(arch))
  hand_coded_optimizations(kernel)
  return kernel, render_source(kernel, "kernel")[0]

@pytest.mark.skipif(not nvrtc_available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc)")
@pytest.mark.parametrize("ggml_type,dtype", [(t, dtypes.float16) for t in TYPES] + [(GGMLType.Q4_K, dtypes.bfloat16)],
                         ids=str)
def test_cuda_kernels_compile_and_the_matmul_takes_tensor_cores(half_gemm_on_llvm, ggml_type, dtype):
  weight, _ = packed_weight(ggml_type, 640, 1024)
  x = Tensor.empty(MAX_ROWS, 1024, dtype=dtype, device="LLVM")[:Variable("prompt_len", 1, MAX_ROWS).bind(99)]
  dequantize, matmul = kernel_items(weight.linear(x))
  assert dequantize.bufs[0].dtype == dtype
  for arch in ("sm_80", "sm_90a"):   # sm_90a: an H100 or H200 (the arch with warpgroup MMA)
    _, dequantize_source = cuda_kernel(dequantize, arch)
    kernel, matmul_source = cuda_kernel(matmul, arch)
    assert "mma" in matmul_source, [str(opt) for opt in kernel.applied_opts]
    for source in (dequantize_source, matmul_source): assert compile_cuda(source, arch)[:4] == b"\x7fELF"

@pytest.mark.skipif(not cpu_available(), reason="g++ not found")
@pytest.mark.parametrize("ggml_type,rows", [(GGMLType.Q4_K, 17), (GGMLType.Q6_K, 40), (GGMLType.Q5_0, 3),
                                            (GGMLType.Q8_0, 200)], ids=str)
def test_cuda_kernels_on_the_emulator_match_the_half_model(half_gemm_on_llvm, ggml_type, rows):
  """A prompt of symbolic length: the dequantizing kernel's half weight equals the float32 values rounded once; the
  tensor-core matmul of x by it (mma.sync, exact products) is within half rounding of x16·W16ᵀ in float64."""
  out_features, in_features, max_rows = 128, 512, 256   # big enough for the heuristics to take tensor cores
  weight, w16 = packed_weight(ggml_type, out_features, in_features, seed=rows)
  x16 = np.random.default_rng(rows).standard_normal((max_rows, in_features)).astype(np.float16)
  x = Tensor(x16, device="LLVM").realize()[:Variable("prompt_len", 1, max_rows).bind(rows)]
  dequantize, matmul = kernel_items(weight.linear(x))
  kernel, source = cuda_kernel(dequantize, TENSOR_CORE_ARCH)
  half_weight = np.full(dequantize.bufs[0].size, np.nan, np.float16)
  run_on_cpu(source, "kernel", *kernel.launch_dims(), [half_weight] + [b.copyout() for b in dequantize.inputs], [])
  np.testing.assert_array_equal(half_weight.reshape(w16.shape), w16)
  kernel, source = cuda_kernel(matmul, TENSOR_CORE_ARCH)
  assert "mma.sync" in source
  out = np.full(matmul.bufs[0].size, np.nan, np.float16)
  inputs = [half_weight if b is dequantize.bufs[0] else b.copyout() for b in matmul.inputs]
  global_size, local_size = kernel.launch_dims()
  global_size = tuple(evaluate(size, {"prompt_len": rows}) for size in global_size)   # the grid over the rows
  run_on_cpu(source, "kernel", global_size, local_size, [out] + inputs, [rows])
  assert_close_to_half_model(out[:rows * out_features], x16[:rows], w16)

@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,symbolic", [(1, False), (17, False), (200, True), (3, True)], ids=str)
@pytest.mark.parametrize("packed_gemm", [0, 1], ids=lambda v: f"PACKED_GEMM={v}")
def test_on_a_gpu(ggml_type, rows, symbolic, packed_gemm):
  """On CUDA itself (no trait set by hand): a prompt's rows take the temporary and the tensor-core matmul (on sm_90a
  the one warpgroup kernel over the packed blocks: tgrad/packed_gemm_kernel.py), a single concrete row the packed
  product; each within half rounding of x16·W16ᵀ, and close to the dense float16 model."""
  raw = random_weight(ggml_type, 640, 1024, seed=rows)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (640, 1024), "CUDA").realize()
  w16 = QuantizedTensor.from_bytes(raw, ggml_type, (640, 1024), "LLVM").dequantize().numpy().astype(np.float16)
  x16 = np.random.default_rng(rows).standard_normal((MAX_ROWS, 1024)).astype(np.float16)
  x = Tensor(x16, device="CUDA").realize()[:Variable("prompt_len", 1, MAX_ROWS).bind(rows) if symbolic else rows]
  with Context(PACKED_GEMM=packed_gemm):
    out = weight.linear(x)
    one_kernel = unsupported(x.lazydata, weight.packed.lazydata, ggml_type.name, (640, 1024)) is None
  prompt = symbolic or rows >= HALF_GEMM_MIN_ROWS
  assert len(kernel_items(out)) == (2 if prompt and not one_kernel else 1)
  got = out.numpy()
  assert_close_to_half_model(got, x16[:rows], w16)
  dense = (x @ Tensor(w16, device="CUDA").T).numpy().astype(np.float64)
  np.testing.assert_allclose(got.astype(np.float64), dense, rtol=HALF_RTOL, atol=HALF_RTOL * np.abs(dense).max())

@pytest.mark.gpu
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,symbolic", [(1, False), (17, False), (200, True)], ids=str)
def test_float32_on_a_gpu(ggml_type, rows, symbolic):
  """A float32 prompt on CUDA: the float32 temporary and the float32 model's matmul (3xTF32 on sm_90a), a single
  concrete row the packed product; each close to x times the dequantized weight at float32 accuracy."""
  raw = random_weight(ggml_type, 640, 1024, seed=rows)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (640, 1024), "CUDA").realize()
  w32 = QuantizedTensor.from_bytes(raw, ggml_type, (640, 1024), "LLVM").dequantize().numpy().astype(np.float64)
  x32 = np.random.default_rng(rows).standard_normal((MAX_ROWS, 1024)).astype(np.float32)
  x = Tensor(x32, device="CUDA").realize()[:Variable("prompt_len", 1, MAX_ROWS).bind(rows) if symbolic else rows]
  out = weight.linear(x)
  assert len(kernel_items(out)) == (2 if symbolic or rows >= HALF_GEMM_MIN_ROWS else 1)
  reference = x32[:rows].astype(np.float64) @ w32.T
  np.testing.assert_allclose(out.numpy().astype(np.float64), reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())

# ---- a Gemma 3 prompt with packed weights: the same logits as the float16 model (the weights rounded to half once)

def q8_0_models(seed: int):
  """A small float16 Gemma 3 whose projections are Q8_0 blocks (llama.cpp's quantizer, gguf.quants), and the same
  model with those blocks dequantized into dense float16 weights (a GGUF file loaded as `dequant` float16)."""
  gguf = pytest.importorskip("gguf")
  from tgrad.models.gemma3 import Gemma3, Gemma3Config
  config = dataclasses.replace(Gemma3Config.preset("tiny"), hidden_size=64, head_dim=32, intermediate_size=128)
  packed, dense = {}, {}
  for name, w in Gemma3.random(config, dtype=dtypes.float16, seed=seed, progress=False).state_dict().items():
    if name.endswith("proj.weight"):
      blocks = gguf.quants.quantize(w.float().numpy(), gguf.GGMLQuantizationType.Q8_0)
      packed[name] = QuantizedTensor.from_bytes(blocks, GGMLType.Q8_0, w.shape)
      dense[name] = packed[name].dequantize(dtypes.float16).realize()
    else: packed[name] = dense[name] = w
  return config, Gemma3(config, packed), Gemma3(config, dense)

@contextlib.contextmanager
def create_schedule_spy() -> Iterator[list]:
  """Inside: every ScheduleItem that realize lowers (and runs) is recorded, in order."""
  items: list = []
  lower = realize_module.lower_schedule
  def record(scheduled):
    items.extend(scheduled)
    return lower(scheduled)
  realize_module.lower_schedule = record
  try: yield items
  finally: realize_module.lower_schedule = lower

def test_gemma_prompt_with_packed_weights_equals_the_float16_model(half_gemm_on_llvm):
  """Prefill logits bit for bit equal to the dense float16 model's, eager and jitted (a TinyJit whose only weights
  are the blocks, its temporaries planned in the arena); each temporary's kernel runs right before its matmul. A
  decode step keeps the packed product (float32 products: close, not equal)."""
  config, packed, dense = q8_0_models(seed=1)
  prompt = np.random.default_rng(4).integers(0, config.vocab_size, (1, 37)).astype(np.int32)
  logits = {}
  for name, model in (("packed", packed), ("dense", dense)):
    model.reset_cache(1, 64)
    with create_schedule_spy() as items: logits[name] = model(Tensor(prompt)).numpy()
    if name == "packed":
      temporaries = [i for i, item in enumerate(items) if item.ast.op is Ops.SINK and
                     item.bufs[0].dtype == dtypes.float16 and [b.dtype for b in item.inputs] == [dtypes.uint8]]
      assert len(temporaries) == 4 * config.num_hidden_layers   # qkv and gate/up (stacked), o, down
      for i in temporaries: assert items[i].bufs[0] in items[i + 1].inputs   # read by the very next kernel
    logits[name + " decode"] = model(Tensor([[7]], dtype=dtypes.int32), start_pos=prompt.shape[1]).numpy()
    model.reset_cache(1, 64)
    for length in (prompt.shape[1], 20, 29):   # captured at the second call; replayed at other lengths
      logits[f"{name} jit {length}"] = model(Tensor(prompt[:, :length]), last_only=True, jit=True).numpy().copy()
      model.reset_cache(1, 64)
  np.testing.assert_array_equal(logits["packed"], logits["dense"])
  for length in (20, 29): np.testing.assert_array_equal(logits[f"packed jit {length}"], logits[f"dense jit {length}"])
  decode, dense_decode = logits["packed decode"].astype(np.float64), logits["dense decode"].astype(np.float64)
  assert 0 < np.abs(decode - dense_decode).max() < 1e-2 * np.abs(dense_decode).max()
  parts = packed._prefill_jit.captured.memory_breakdown()["LLVM"]
  dense_parts = dense._prefill_jit.captured.memory_breakdown()["LLVM"]
  assert parts["weight"] < dense_parts["weight"]
  assert parts["activation"] < parts["activations unplanned"]
