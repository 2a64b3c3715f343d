"""Scaled-dot-product attention's "flash" lowering through the whole pipeline without a GPU: the LLVM device is made
to offer it and the kernel's runner runs the CUDA source on the CPU emulator (test/cuda_on_cpu.py), so the region's
lowering, the inputs read in place through their views, symbolic lengths (a TinyJit replayed at other lengths) and
Gemma's prefill are checked against numpy and against the default graph."""
from __future__ import annotations
import dataclasses, math
import numpy as np
import pytest
from tgrad import Tensor, TinyJit, Variable, dtypes
from tgrad.backend import REGISTRY
from tgrad.helpers import Context
from tgrad.regions import regions_above
from tgrad.attention_kernel import (FLASH_LOWERING, CacheUpdate, FlashAttentionKernel, FlashAttentionRunner,
                                    FlashDecodingKernel, decoding_unsupported, flash_decoding, unsupported)
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS
from test.cuda_on_cpu import cpu_available, run_on_cpu

pytestmark = pytest.mark.skipif(not cpu_available(), reason="no g++ for the CUDA-on-CPU emulator")

class EmulatedFlashRunner:
  """The kernel's CUDA source on the CPU emulator, over LLVM Buffers (copied out, run, the output copied in)."""
  flops, nbytes = 0, 0
  launches = 0   # every launch of any emulated kernel
  cluster = 0    # no thread block clusters
  def __init__(self, kernel: FlashAttentionKernel):
    self.kernel, self.entry, self.variables = kernel, kernel.entry(), kernel.variables()
    self._dims_at: dict = {}   # FlashAttentionRunner.launch_dims's memo
    self.name, self.source = "emulated " + self.entry, kernel.source(self.entry)
  launch_dims = FlashAttentionRunner.launch_dims
  def __call__(self, bufs, wait=False, var_vals=None):
    EmulatedFlashRunner.launches += 1
    arrays = [b.copyout() for b in bufs]
    global_size, local_size = self.launch_dims(var_vals)
    run_on_cpu(self.source, self.entry, global_size, local_size, arrays, [var_vals[v] for v in self.variables])
    bufs[0].copyin(arrays[0])
    return 0.0 if wait else None

class EmulatedDecodingRunner:
  """The flash-decoding kernel's CUDA source on the emulator: one array per distinct Buffer (the cache it appends to
  is both the step's second output and an input), and every Buffer it writes (the output, the caches, the scratch)
  copied back in."""
  flops, nbytes = 0, 0
  launches = 0
  cluster = 0
  def __init__(self, kernel: FlashDecodingKernel):
    self.kernel, self.entry, self.variables = kernel, kernel.entry(), kernel.variables()
    self._dims_at: dict = {}   # FlashAttentionRunner.launch_dims's memo
    self.name, self.source = "emulated " + self.entry, kernel.source(self.entry)
  launch_dims = FlashAttentionRunner.launch_dims
  def __call__(self, bufs, wait=False, var_vals=None):
    EmulatedDecodingRunner.launches += 1
    arrays = {}
    for b in bufs: arrays.setdefault(id(b), b.copyout())
    global_size, local_size = self.launch_dims(var_vals)
    run_on_cpu(self.source, self.entry, global_size, local_size, [arrays[id(b)] for b in bufs],
               [var_vals[v] for v in self.variables])
    for role, b in zip(self.kernel.roles, bufs):
      if role == "out" or role.startswith("written") or role == "scratch": b.copyin(arrays[id(b)])
    return 0.0 if wait else None

@pytest.fixture
def flash_on_llvm(monkeypatch):
  backend = REGISTRY.backends["LLVM"]
  traits = dataclasses.replace(backend.traits, lowerings=backend.traits.lowerings | {FLASH_LOWERING})
  monkeypatch.setitem(REGISTRY.backends, "LLVM", dataclasses.replace(backend, traits=traits))
  monkeypatch.setattr(FlashAttentionKernel, "runner", lambda self, device: EmulatedFlashRunner(self))

def reference(q, k, v, scale, causal, window=None):
  """float64 numpy; q [B, Hq, L, D], k and v [B, Hkv, S, D]."""
  group = q.shape[1] // k.shape[1]
  k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)
  scores = np.einsum("bhld,bhsd->bhls", q, k) * scale
  distance = np.arange(q.shape[2])[:, None] - np.arange(k.shape[2])[None, :]
  keep = np.ones_like(distance, bool)
  if causal: keep &= distance >= 0
  if window: keep &= distance < window
  scores = np.where(keep, scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  return np.einsum("bhls,bhsd->bhld", weights / weights.sum(-1, keepdims=True), v)

def attention_region(out: Tensor):
  [region] = [r for r in regions_above(out.lazydata) if r.name == "scaled_dot_product_attention"]
  return region

def half_inputs(rng, B, heads, kv_heads, L, D):
  q = rng.standard_normal((B, L, heads, D)).astype(np.float16)      # stored [B, L, H, D]: read through a permute
  kv = rng.standard_normal((B, L, 3 * kv_heads * D)).astype(np.float16)   # k and v slices of a wider row
  return q, kv

def test_window_in_the_default_graph_matches_numpy():
  rng = np.random.default_rng(0)
  q, k, v = (rng.standard_normal((1, 2, 11, 8)).astype(np.float32) for _ in range(3))
  out = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True, window=3).numpy()
  np.testing.assert_allclose(out, reference(q, k, v, 1 / math.sqrt(8), True, 3), rtol=1e-5, atol=1e-5)
  causal = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True)
  assert attention_region(causal).current == "default"   # the CPU offers no flash kernel
  with pytest.raises(ValueError, match="window"): Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), window=3)

def test_unsupported_says_why():
  q = Tensor.zeros(1, 2, 5, 64, dtype=dtypes.float16, device="LLVM").lazydata   # a device without the kernel
  assert "device" in unsupported(q, q, q, False, None, True)
  with Context(FLASH_ATTENTION=0): assert unsupported(q, q, q, False, None, True) == "FLASH_ATTENTION=0"

@pytest.mark.parametrize("window", [None, 5])
def test_flash_lowering_matches_numpy(flash_on_llvm, window):
  rng = np.random.default_rng(1)
  B, heads, kv_heads, L, D = 2, 4, 2, 19, 64
  q, kv = half_inputs(rng, B, heads, kv_heads, L, D)
  qt, kvt = Tensor(q), Tensor(kv)
  k = kvt[..., :kv_heads * D].reshape(B, L, kv_heads, D).permute(0, 2, 1, 3)
  v = kvt[..., 2 * kv_heads * D:].reshape(B, L, kv_heads, D).permute(0, 2, 1, 3)
  out = qt.permute(0, 2, 1, 3).scaled_dot_product_attention(k, v, is_causal=True, enable_gqa=True, window=window)
  assert attention_region(out).current == FLASH_LOWERING
  f64 = lambda x: x.astype(np.float64)
  kn = f64(kv[..., :kv_heads * D].reshape(B, L, kv_heads, D).transpose(0, 2, 1, 3))
  vn = f64(kv[..., 2 * kv_heads * D:].reshape(B, L, kv_heads, D).transpose(0, 2, 1, 3))
  expected = reference(f64(q).transpose(0, 2, 1, 3), kn, vn, 1 / math.sqrt(D), True, window)
  np.testing.assert_allclose(out.numpy().astype(np.float64), expected, rtol=3e-3, atol=3e-3)
  with Context(FLASH_ATTENTION=0):
    default = qt.permute(0, 2, 1, 3).scaled_dot_product_attention(k, v, is_causal=True, enable_gqa=True, window=window)
    assert attention_region(default).current == "default"
  np.testing.assert_allclose(default.numpy().astype(np.float64), expected, rtol=1e-2, atol=1e-2)

def test_symbolic_length_replays_at_other_lengths(flash_on_llvm):
  rng = np.random.default_rng(2)
  B, heads, kv_heads, T, D = 1, 2, 1, 24, 64
  q, kv = half_inputs(rng, B, heads, kv_heads, T, D)
  q_in, kv_in = Tensor(q).realize(), Tensor(kv).realize()
  length = Variable("length", 1, T)
  @TinyJit
  def step(q_all: Tensor, kv_all: Tensor, n) -> Tensor:
    qs, kvs = q_all.shrink((None, (0, n), None, None)), kv_all.shrink((None, (0, n), None))
    k = kvs[..., :D].reshape(B, n, kv_heads, D).permute(0, 2, 1, 3)
    v = kvs[..., 2 * D:].reshape(B, n, kv_heads, D).permute(0, 2, 1, 3)
    return qs.permute(0, 2, 1, 3).scaled_dot_product_attention(k, v, is_causal=True, enable_gqa=True).realize()
  before = EmulatedFlashRunner.launches
  for n in (9, 17, 5, 24):   # capture on the second call, replays after
    out = step(q_in, kv_in, length.bind(n)).numpy()
    f64 = lambda x: x.astype(np.float64)
    k = f64(kv[:, :n, :D].reshape(B, n, kv_heads, D).transpose(0, 2, 1, 3))
    v = f64(kv[:, :n, 2 * D:].reshape(B, n, kv_heads, D).transpose(0, 2, 1, 3))
    expected = reference(f64(q[:, :n]).transpose(0, 2, 1, 3), k, v, 1 / math.sqrt(D), True)
    np.testing.assert_allclose(out[:, :, :n].astype(np.float64), expected, rtol=3e-3, atol=3e-3, err_msg=f"n={n}")
  assert EmulatedFlashRunner.launches - before == 4

def test_gemma_prefill_with_flash_matches_the_default_graph(flash_on_llvm):
  config = Gemma3Config.from_dict({**PRESETS["tiny"], "head_dim": 64, "sliding_window": 5, "num_hidden_layers": 2,
                                   "layer_types": ["sliding_attention", "full_attention"]})
  model = Gemma3.random(config, dtype=dtypes.float16, device="LLVM", seed=3)
  tokens = Tensor(np.random.default_rng(4).integers(0, config.vocab_size, (1, 13)).astype(np.int32))
  model.reset_cache(1, 32)
  before = EmulatedFlashRunner.launches
  flash = model(tokens).numpy().astype(np.float64)
  assert EmulatedFlashRunner.launches - before == config.num_hidden_layers   # one kernel per layer
  with Context(FLASH_ATTENTION=0):
    model.reset_cache(1, 32)
    default = model(tokens).numpy().astype(np.float64)
  scale = np.abs(default).max()
  assert np.abs(flash - default).max() <= 2e-2 * scale, np.abs(flash - default).max() / scale

@pytest.fixture
def decoding_on_llvm(flash_on_llvm, monkeypatch):
  monkeypatch.setattr(FlashDecodingKernel, "runner", lambda self, device: EmulatedDecodingRunner(self))
  with Context(FLASH_DECODING=1): yield

@pytest.mark.parametrize("keys, head_dim, dtype", [(1, 64, np.float16), (70, 96, np.float16), (300, 128, np.float16),
                                                   (70, 96, np.float32), (300, 128, np.float32)])
def test_one_query_position_is_flash_decoding(decoding_on_llvm, keys, head_dim, dtype):
  """scaled_dot_product_attention of one query position (GQA 4:1, batch 2, keys read in place from a wider row): the
  flash-decoding kernel (head dims the prefill kernel does not take too; float32, which it does not take, too),
  against numpy."""
  rng = np.random.default_rng(keys)
  B, heads, kv_heads, D = 2, 4, 1, head_dim
  q = rng.standard_normal((B, heads, 1, D)).astype(dtype)
  kv = rng.standard_normal((B, keys, 2 * kv_heads * D)).astype(dtype)
  kvt = Tensor(kv)
  k = kvt[..., :kv_heads * D].reshape(B, keys, kv_heads, D).permute(0, 2, 1, 3)
  v = kvt[..., kv_heads * D:].reshape(B, keys, kv_heads, D).permute(0, 2, 1, 3)
  before = EmulatedDecodingRunner.launches
  out = Tensor(q).scaled_dot_product_attention(k, v, enable_gqa=True).numpy().astype(np.float64)
  assert EmulatedDecodingRunner.launches - before == 1
  f64 = lambda x: x.astype(np.float64)
  kn = f64(kv[..., :kv_heads * D].reshape(B, keys, kv_heads, D).transpose(0, 2, 1, 3))
  vn = f64(kv[..., kv_heads * D:].reshape(B, keys, kv_heads, D).transpose(0, 2, 1, 3))
  tolerance = 2e-3 if dtype == np.float16 else 1e-5
  np.testing.assert_allclose(out, reference(f64(q), kn, vn, 1 / math.sqrt(D), False), rtol=tolerance, atol=tolerance)

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16, dtypes.float32])
def test_gemma_decode_with_flash_decoding_matches_the_default_graph(decoding_on_llvm, dtype):
  """Gemma's decode steps through one flash-decoding kernel a layer (q's and the new key's norm and RoPE, the cache
  append, the attention) against the default graph, replayed by the decode step's TinyJit at positions that wrap the
  sliding layer's ring (window 5) and grow the full layer's keys."""
  config = Gemma3Config.from_dict({**PRESETS["tiny"], "head_dim": 64, "sliding_window": 5, "num_hidden_layers": 2,
                                   "layer_types": ["sliding_attention", "full_attention"]})
  model = Gemma3.random(config, dtype=dtype, device="LLVM", seed=5)
  rng = np.random.default_rng(6)
  prompt = Tensor(rng.integers(0, config.vocab_size, (1, 4)).astype(np.int32))
  steps = rng.integers(0, config.vocab_size, 7).astype(np.int32)
  def run() -> list[np.ndarray]:
    model.reset_cache(1, 32)
    logits = [model(prompt, last_only=True).numpy().astype(np.float64)]
    for i, token in enumerate(steps):
      ids = Tensor(np.array([[token]], np.int32))
      logits.append(model.forward(ids, start_pos=4 + i, last_only=True, jit=True).numpy().astype(np.float64))
    return logits
  before = EmulatedDecodingRunner.launches
  flash = run()
  assert EmulatedDecodingRunner.launches - before == config.num_hidden_layers * len(steps)
  model = Gemma3.random(config, dtype=dtype, device="LLVM", seed=5)   # a new model: no captured step is replayed
  with Context(FLASH_ATTENTION=0): default = run()
  assert EmulatedDecodingRunner.launches - before == config.num_hidden_layers * len(steps)
  for i, (a, b) in enumerate(zip(flash, default)):
    scale = np.abs(b).max()
    assert np.abs(a - b).max() <= 2e-2 * scale, (i, np.abs(a - b).max() / scale)

def test_decoding_unsupported_says_why(decoding_on_llvm):
  def lb(*shape, dtype=dtypes.float16): return Tensor.zeros(*shape, dtype=dtype).lazydata
  q, k = lb(1, 4, 1, 64), lb(1, 2, 9, 64)
  assert decoding_unsupported(q, k, k) is None
  assert "query length" in decoding_unsupported(lb(1, 4, 2, 64), k, k)
  assert "dtypes" in decoding_unsupported(lb(1, 4, 1, 64, dtype=dtypes.float32), k, k)
  assert "head dim 100" in decoding_unsupported(lb(1, 4, 1, 100), lb(1, 2, 9, 100), lb(1, 2, 9, 100))
  assert "multiple" in decoding_unsupported(lb(1, 3, 1, 64), k, k)
  assert "value of shape" in decoding_unsupported(q, k, lb(1, 2, 8, 64))
  with Context(FLASH_ATTENTION=0): assert decoding_unsupported(q, k, k) == "FLASH_ATTENTION=0"
  with Context(FLASH_DECODING=0): assert decoding_unsupported(q, k, k) == "FLASH_DECODING=0"

def test_cache_update_runs_after_the_old_cache_is_read(decoding_on_llvm):
  """flash_decoding's in-place append (schedule rule 2d): a value of the old cache realized in the same schedule is
  computed before the kernel writes the slot; the slot then holds the new key and value, the rest is unchanged, and
  the attention saw the new ones there."""
  rng = np.random.default_rng(7)
  B, heads, kv_heads, S, D, slot = 1, 2, 1, 9, 64, 5
  cache_values = rng.standard_normal((2, B, kv_heads, S, D)).astype(np.float16)
  qkv_values = rng.standard_normal((B, (heads + 2 * kv_heads) * D)).astype(np.float16)
  cache, qkv = Tensor(cache_values).realize(), Tensor(qkv_values).realize()
  q = qkv[:, :heads * D].reshape(B, heads, 1, D)
  k_new = qkv[:, heads * D:(heads + kv_heads) * D].reshape(B, kv_heads, 1, D)
  v_new = qkv[:, (heads + kv_heads) * D:].reshape(B, kv_heads, 1, D)
  old_sum = cache.float().sum()   # built before the write: it reads the old cache
  update = CacheUpdate(k_new.lazydata, v_new.lazydata, Variable("slot", 0, S - 1).bind(slot))
  out, (written,) = flash_decoding(q.lazydata, cache[0].lazydata, cache[1].lazydata, scale=D ** -0.5, update=update)
  cache.written_by_kernel(written)
  attended = Tensor(out)
  Tensor.realize(attended, old_sum, cache)
  np.testing.assert_allclose(old_sum.item(), cache_values.astype(np.float64).sum(), rtol=1e-4)
  expected_cache = cache_values.copy()
  expected_cache[0, :, :, slot] = qkv_values[:, heads * D:(heads + kv_heads) * D].reshape(B, kv_heads, D)
  expected_cache[1, :, :, slot] = qkv_values[:, (heads + kv_heads) * D:].reshape(B, kv_heads, D)
  np.testing.assert_array_equal(cache.numpy(), expected_cache)
  f64 = lambda x: x.astype(np.float64)
  expected = reference(f64(qkv_values[:, :heads * D].reshape(B, heads, 1, D)), f64(expected_cache[0]),
                       f64(expected_cache[1]), D ** -0.5, False)
  np.testing.assert_allclose(attended.numpy().astype(np.float64), expected, rtol=2e-3, atol=2e-3)
