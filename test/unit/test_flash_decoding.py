"""The flash-decoding CUDA kernel (tgrad/runtime/cuda/flash_decoding.py): NVRTC compiles it for sm_80 and sm_90, and the
CPU emulator (test/cuda_on_cpu.py) runs it against numpy in float64: key counts around a split's and the block's
edges (one split, several, the most), GQA groups, odd head dims, a sliding window, a softcap, the qk-norm and RoPE
prologue, and the in-place cache update (the slot written, the rest of the cache untouched, the counter reset so a
second launch gives the same output)."""
from __future__ import annotations
import math
import numpy as np
import pytest
from tgrad.custom import device_values
from tgrad.dtype import bfloat16_to_float32, dtypes
from tgrad.runtime.cuda.flash_decoding import (MAX_SPLITS, MIN_KEYS_PER_SPLIT, DecodeConfig,
                                               flash_decoding_source, grid, scratch_words, splits)
from tgrad.runtime.cuda.nvrtc import nvrtc_available
from test.cuda_on_cpu import cpu_available, run_on_cpu

TOLERANCE = {"float16": 2e-3, "bfloat16": 1.5e-2, "float32": 1e-5}   # the output's rounding (float32 inside)
ELEMENTS = {"float16": dtypes.float16, "bfloat16": dtypes.bfloat16, "float32": dtypes.float32}
# the new key's error in the cache (rtol, atol): a unit of the cache's type; float32's is its norm and rotation in
# float32 (a rotated value near 0 keeps the absolute error of its two products)
CACHE_ERROR = {"float16": (2 ** -10, 2 ** -24), "bfloat16": (2 ** -7, 2 ** -24), "float32": (2 ** -20, 2 ** -20)}

def as_float(bits: np.ndarray, dtype: str) -> np.ndarray:
  if dtype == "float32": return bits.astype(np.float64)
  if dtype == "bfloat16": return bfloat16_to_float32(bits).astype(np.float64)
  return bits.view(np.float16).astype(np.float64)

def rounded(x: np.ndarray, dtype: str) -> np.ndarray: return as_float(device_values(x, ELEMENTS[dtype]), dtype)

def prologue(x, config: DecodeConfig, weight, cos, sin):
  """qk-norm and RoPE of rows x [..., D], float64."""
  if config.norm: x = x / np.sqrt((x * x).mean(-1, keepdims=True) + config.norm_eps) * (config.norm_offset + weight)
  if config.rotary:
    half = x.shape[-1] // 2
    x = x * cos + np.concatenate([x[..., half:], x[..., :half]], -1) * sin
  return x

def run_on_gpu(source: str, name: str, global_size, local_size, buffers: list[np.ndarray],
               variables: list[int]) -> list:
  """run_on_cpu's launch on the CUDA device: the numpy buffers copied in as bytes (one device buffer for views of the
  same memory, as the k and v caches are here), written back in place. No prefetch addresses come back (an empty
  list)."""
  from tgrad.device import Buffer, Device
  program = Device["CUDA"].load_program(name, source)
  address = lambda b: (b.__array_interface__["data"][0], b.nbytes)
  on_device = {address(b): Buffer("CUDA", b.nbytes, dtypes.uint8).copyin(b.view(np.uint8).reshape(-1))
               for b in buffers}
  program(*[on_device[address(b)].handle for b in buffers], global_size=tuple(global_size),
          local_size=tuple(local_size), vals=tuple(variables), wait=True)
  for b in buffers: b.view(np.uint8).reshape(-1)[:] = on_device[address(b)].copyout()
  return []

def run_case(dtype, batch, heads, kv_heads, keys, head_dim, window=None, softcap=None, norm=False, rotary=False,
             update=False, slots=None, seed=0, launches=1, dependent_launch=False, float32_norms=False, cluster=0,
             launch=run_on_cpu, values_pointer=False):
  rng = np.random.default_rng(seed)
  D, group = head_dim, heads // kv_heads
  slots = slots or keys
  config = DecodeConfig(dtype, D, group, kv_heads, 1 / math.sqrt(D), window, softcap, norm, 1e-6, 1.0 if norm else 0.0,
                        rotary, update, "float32" if float32_norms else dtype, dtype)
  width = (heads + 2 * kv_heads) * D   # q, the new k and v side by side, as a fused projection stores them
  qkv = device_values(rng.standard_normal((batch, width)), ELEMENTS[dtype])
  cache = device_values(rng.standard_normal((2, batch, kv_heads, slots, D)), ELEMENTS[dtype])
  weights = (rng.standard_normal((2, D)) * 0.3).astype(np.float32) if float32_norms else \
    device_values(rng.standard_normal((2, D)) * 0.3, ELEMENTS[dtype])
  angles = rng.uniform(0, 6, D // 2)
  tables = device_values(np.concatenate([np.cos(angles), np.cos(angles), -np.sin(angles), np.sin(angles)]),
                         ELEMENTS[dtype])
  slot = keys - 1 if update else 0
  scratch = np.zeros(scratch_words(config, batch), np.float32)
  cache_size = batch * kv_heads * slots * D
  sizes = {"S": "n_keys", "SLOT": "slot",
           "q_offset": "0", "q_batch": str(width), "q_head": str(D), "q_pos": "0",
           "k_new_offset": str(heads * D), "k_new_batch": str(width), "k_new_head": str(D), "k_new_pos": "0",
           "v_new_offset": str((heads + kv_heads) * D), "v_new_batch": str(width), "v_new_head": str(D),
           "v_new_pos": "0",
           "k_cache_offset": "0", "k_cache_batch": str(kv_heads * slots * D), "k_cache_head": str(slots * D),
           "k_cache_pos": str(D),
           "v_cache_offset": str(cache_size), "v_cache_batch": str(kv_heads * slots * D),
           "v_cache_head": str(slots * D), "v_cache_pos": str(D),
           "q_weight_offset": "0", "k_weight_offset": str(D), "cos_offset": "0", "sin_offset": str(D)}
  roles = config.roles()
  arrays = {"q": qkv, "k_cache": cache, "v_cache": cache, "k_new": qkv, "v_new": qkv, "q_weight": weights,
            "k_weight": weights, "cos": tables, "sin": tables, "scratch": scratch}
  # the values from device memory: slots 3 and 1 of a table (out of order, as a device's table may give them)
  source = flash_decoding_source(config, "decode", sizes, ("n_keys", "slot"), roles, batch, dependent_launch, cluster,
                                 (3, 1) if values_pointer else None)
  before = cache.copy()
  outputs = []
  for _ in range(launches):   # again: the last block reset the counter, so a second launch combines the same way
    # NaN bits: every element must be written
    out = np.full((batch, heads, 1, D), np.nan, np.float32) if dtype == "float32" else \
      np.full((batch, heads, 1, D), 0x7E00, np.uint16)
    buffers = [out if r == "out" else arrays[r].reshape(-1) for r in roles]
    # the variables as kernel arguments, or in memory the last pointer argument points at (the device values)
    if values_pointer: buffers, variables = buffers + [np.array([-7, slot, -7, keys], np.int64)], []
    else: variables = [keys, slot]
    prefetched = launch(source, "decode", grid(config, keys, batch, cluster), (config.block_threads,), buffers,
                        variables)
    outputs.append(as_float(out, dtype))
  if dependent_launch and launch is run_on_cpu:
    # every line of the visible keys' and values' cached rows, and nothing else, asked of L2 (the emulator records it)
    first_key = keys - window if window and keys > window else 0
    rows = cache.reshape(2, batch, kv_heads, slots, D)[:, :, :, first_key:keys]
    base = cache.__array_interface__["data"][0]
    lines = {(base + offset) // 128 * 128 for offset in
             (np.arange(cache.size).reshape(cache.shape)[:, :, :, first_key:keys] * cache.itemsize).reshape(-1)}
    assert rows.size and set(prefetched) == lines
  assert not scratch[-batch * kv_heads:].any(), "the counters are reset"
  # numpy: the prologue, the new key rounded as the cache stores it, the slot's key and value replaced
  values = as_float(qkv, dtype)
  q = values[:, :heads * D].reshape(batch, heads, D)
  new_k = values[:, heads * D:(heads + kv_heads) * D].reshape(batch, kv_heads, D)
  new_v = values[:, (heads + kv_heads) * D:].reshape(batch, kv_heads, D)
  w = weights.astype(np.float64) if float32_norms else as_float(weights, dtype)
  tab = as_float(tables, dtype)
  cos, sin = tab[:D], tab[D:]
  q = prologue(q, config, w[0], cos, sin)
  cached = as_float(before, dtype)
  k_all, v_all = cached[0, :, :, :keys].copy(), cached[1, :, :, :keys].copy()
  if update:
    new_k = rounded(prologue(new_k, config, w[1], cos, sin), dtype)
    k_all[:, :, slot], v_all[:, :, slot] = new_k, new_v
    written = cached.copy()
    written[0, :, :, slot], written[1, :, :, slot] = new_k, new_v
    got, others = as_float(cache, dtype), np.arange(slots) != slot
    np.testing.assert_array_equal(got[:, :, :, others], written[:, :, :, others])   # the rest of the cache untouched
    # the new key, normed and rotated in float32 (contracted to FMAs on a GPU), then rounded to the cache's type: a
    # unit of that type from float64's rounding at most
    np.testing.assert_allclose(got[:, :, :, slot], written[:, :, :, slot], rtol=CACHE_ERROR[dtype][0],
                               atol=CACHE_ERROR[dtype][1])
  else: np.testing.assert_array_equal(cache, before)
  first = keys - window if window and keys > window else 0
  k_all, v_all = np.repeat(k_all[:, :, first:], group, 1), np.repeat(v_all[:, :, first:], group, 1)
  scores = np.einsum("bhd,bhsd->bhs", q, k_all) * config.scale
  if softcap: scores = softcap * np.tanh(scores / softcap)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  expected = np.einsum("bhs,bhsd->bhd", p / p.sum(-1, keepdims=True), v_all)[:, :, None]
  for got in outputs: np.testing.assert_allclose(got, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
  np.testing.assert_array_equal(outputs[0], outputs[-1])

needs_emulator = pytest.mark.skipif(not cpu_available(), reason="no g++ for the CUDA-on-CPU emulator")

SLOW = pytest.mark.slow   # the emulator's barriers: ~10 s a case on two busy cores

@needs_emulator
@pytest.mark.parametrize("dtype,keys", [("float16", 1), ("float16", 63), ("float16", 64), ("float16", 65),
                                        ("float16", 300), ("bfloat16", 2), ("bfloat16", 65), ("float32", 1),
                                        ("float32", 65)])   # (2,500: below)
def test_key_counts(dtype, keys):   # GQA 4:1, D 64 (2 elements a lane); one split up to MIN_KEYS_PER_SPLIT
  run_case(dtype, 1, 4, 1, keys, 64, seed=keys, launches=2 if keys == 300 else 1)

@needs_emulator
@pytest.mark.parametrize("dtype,batch,heads,kv_heads,keys,head_dim,window,softcap", [
  ("float16", 2, 4, 2, 77, 96, None, None),     # batch 2, group 2, an odd head dim (3 elements a lane)
  ("float16", 1, 2, 2, 200, 32, 50, None),      # sliding window: the last 50 keys, no GQA
  ("bfloat16", 1, 8, 2, 45, 128, None, 30.0),   # softcap, group 4, D 128
  ("float32", 2, 4, 2, 77, 96, 50, None),       # float32: 3 elements a lane (scalar loads), a window
  ("float32", 1, 8, 2, 45, 128, None, 30.0),    # float32: 4 a lane (one 16-byte chunk), a softcap
  pytest.param("float16", 1, 1, 1, 2500, 64, None, None, marks=SLOW),   # 40 splits: the combine over many partials
])
def test_shapes_and_masks(dtype, batch, heads, kv_heads, keys, head_dim, window, softcap):
  run_case(dtype, batch, heads, kv_heads, keys, head_dim, window, softcap)

@needs_emulator
@pytest.mark.parametrize("dtype,keys,slots", [("float16", 300, 512), ("bfloat16", 37, 40), ("float16", 1, 8),
                                              ("float32", 300, 512), ("float32", 1, 8)])
def test_norm_rotary_and_cache_update(dtype, keys, slots):   # Gemma 3's decode: D 256 (16-byte loads), group 4
  run_case(dtype, 1, 4, 1, keys, 256, norm=True, rotary=True, update=True, slots=slots, seed=keys, launches=2)

@needs_emulator
@pytest.mark.parametrize("keys", [5, 77])
def test_float32_norm_weights(keys):   # a GGUF model's norms are F32, its rotary tables the compute dtype
  run_case("float16", 1, 4, 1, keys, 256, norm=True, rotary=True, update=True, slots=128, seed=keys,
           float32_norms=True)

@needs_emulator
@pytest.mark.parametrize("keys", [1, 40, 300])
def test_dependent_launch_form(keys):   # sm_90 with PDL: the split's cached rows prefetched, then the wait
  run_case("float16", 1, 4, 1, keys, 256, norm=True, rotary=True, update=True, slots=512, seed=keys,
           dependent_launch=True)

@needs_emulator
@pytest.mark.parametrize("keys,cluster", [(1, 8), (40, 8), (100, 2), (300, 8), (700, 8), (1100, 8), (1300, 4),
                                          (512, 16), (2500, 16)])
def test_cluster_combine(keys, cluster):
  """Splits combined through the cluster's shared memory (blocks of a cluster emulated at once, each with its own
  shared arrays): one split (the other blocks leave), 2 of 2, 8 of 8 (of 88 keys at 700); past a cluster's keys,
  each cluster's splits combined on chip into one partial and the clusters' partials by the last block (1,100 keys:
  18 splits, two full clusters and one of 2 splits and 6 idle blocks; 1,300: 21 splits in 6 clusters of 4). Clusters
  of 16 (non-portable): 512 keys in 16 splits of 32; 2,500 in 40 splits of 64, two full clusters and one of 8. Launched
  twice (the counter reset), in the PDL form."""
  run_case("float16", 1, 4, 1, keys, 256, norm=True, rotary=True, update=True, slots=max(2048, keys), seed=keys,
           launches=2, dependent_launch=True, cluster=cluster)

@needs_emulator
@pytest.mark.parametrize("keys,cluster", [(40, 0), (300, 8), (1100, 8)])
def test_values_read_from_device_memory(keys, cluster):
  """With value slots the key count and slot come from an int64 table (the last pointer argument; slots 3 and 1 of
  it, the others garbage), read before the wait: the same outputs and cache update as with them as arguments (one
  split, a cluster, clusters and the scratch), launched twice."""
  run_case("float16", 1, 4, 1, keys, 256, norm=True, rotary=True, update=True, slots=max(2048, keys), seed=keys,
           launches=2, dependent_launch=True, cluster=cluster, values_pointer=True)

@pytest.mark.gpu
@pytest.mark.parametrize("keys", [1, 513, 2500])
def test_values_read_from_device_memory_on_the_gpu(keys):
  run_case("float16", 1, 4, 1, keys, 256, norm=True, rotary=True, update=True, slots=max(2048, keys), seed=keys,
           launches=2, dependent_launch=True, cluster=16, values_pointer=True, launch=run_on_gpu)

@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [0, 2, 8, 16])
@pytest.mark.parametrize("keys", [1, 32, 33, 40, 100, 256, 257, 511, 512, 513, 2000, 2500])
def test_on_the_gpu(cluster, keys):
  """The kernel on the device (sm_90+ for clusters): splits combined in one cluster's shared memory up to
  cluster · CLUSTER_MAX_KEYS_PER_SPLIT keys (blocks past the splits only helping the combine), in several clusters and
  the scratch past that, against numpy; launched twice (the scratch's counters reset), Gemma 3's decode form with
  PDL."""
  from tgrad.device import Device
  if cluster and not getattr(Device["CUDA"].renderer, "thread_block_clusters", False): pytest.skip("needs sm_90")
  run_case("float16", 1, 4, 1, keys, 256, norm=True, rotary=True, update=True, slots=max(2048, keys), seed=keys,
           launches=2, dependent_launch=bool(cluster), cluster=cluster, launch=run_on_gpu)

@pytest.mark.gpu
@pytest.mark.parametrize("keys", [1, 100, 513, 2500])
def test_float32_on_the_gpu(keys):   # a float32 model's decode: 4 floats a 16-byte chunk, clusters of 16 and several
  run_case("float32", 1, 4, 1, keys, 256, norm=True, rotary=True, update=True, slots=max(2048, keys), seed=keys,
           launches=2, dependent_launch=True, cluster=16, float32_norms=True, launch=run_on_gpu)

@pytest.mark.gpu
def test_cluster_with_a_window_and_batch_on_the_gpu():   # one cluster a (batch, kv head): 2 × 2 clusters
  run_case("bfloat16", 2, 8, 2, 700, 128, window=300, softcap=30.0, cluster=8, launch=run_on_gpu, launches=2)

def test_cluster_split_counts():
  assert [splits(k, 8) for k in (1, 32, 33, 100, 256, 257, 512, 513, 1024)] == [1, 1, 2, 4, 8, 8, 8, 8, 8]
  assert splits(1025, 8) == splits(1025) == 17   # past one cluster's keys: the scratch path's splits
  config = DecodeConfig("float16", 64, 4, 2, 1.0, window=300)
  assert grid(config, 40, 3, 8) == (8, 2, 3) and grid(config, 5000, 1, 8) == (8, 2, 1)
  assert grid(config, 5000, 1) == (5, 2, 1) and grid(DecodeConfig("float16", 64, 4, 2, 1.0), 5000, 1, 8) == (80, 2, 1)
  with pytest.raises(ValueError, match="cluster of 3"):
    flash_decoding_source(config, "decode", {"S": "1"}, (), config.roles(), 1, cluster=3)
  with pytest.raises(ValueError, match="cluster of 32"):
    flash_decoding_source(config, "decode", {"S": "1"}, (), config.roles(), 1, cluster=32)
  assert [splits(k, 16) for k in (32, 33, 512, 513, 2048, 2049)] == [1, 2, 16, 16, 16, 33]

def test_split_counts():
  assert splits(1) == 1 and splits(MIN_KEYS_PER_SPLIT) == 1 and splits(MIN_KEYS_PER_SPLIT + 1) == 2
  assert splits(MAX_SPLITS * MIN_KEYS_PER_SPLIT) == MAX_SPLITS and splits(10 ** 6) == MAX_SPLITS

@pytest.mark.skipif(not nvrtc_available(), reason="no NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_compiles_with_nvrtc(arch, dtype):
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  for head_dim, group, update in ((64, 1, False), (256, 4, True), (96, 8, False), (128, 2, True)):
    config = DecodeConfig(dtype, head_dim, group, 1, 0.125, 512, 50.0, update, 1e-6, 1.0, update, update)
    sizes = {"S": "n", "SLOT": "n - 1"}
    source = flash_decoding_source(config, "decode", sizes, ("n",), config.roles(), 1)
    assert len(compile_cuda(source, arch)) > 0
    if arch == "sm_90":
      waiting = flash_decoding_source(config, "decode", sizes, ("n",), config.roles(), 1, dependent_launch=True)
      assert "decode_waits_for_prior_grids" in waiting and "griddepcontrol.wait" in waiting
      assert len(compile_cuda(waiting, arch)) > 0
      clustered = flash_decoding_source(config, "decode", sizes, ("n",), config.roles(), 1, True, cluster=8)
      assert "__cluster_dims__(8, 1, 1)" in clustered and "mapa.u64" in clustered
      assert len(compile_cuda(clustered, arch)) > 0
      large = flash_decoding_source(config, "decode", sizes, ("n",), config.roles(), 1, True, cluster=16)
      assert "__cluster_dims__(16, 1, 1)" in large and "decode_non_portable_cluster" in large
      assert "non_portable" not in clustered and len(compile_cuda(large, arch)) > 0
      from_memory = flash_decoding_source(config, "decode", sizes, ("n",), config.roles(), 1, True, cluster=16,
                                          value_slots=(2,))
      assert "const long long* __restrict__ step_values" in from_memory and "long long n)" not in from_memory
      assert len(compile_cuda(from_memory, arch)) > 0

def test_bad_configs_raise():
  with pytest.raises(ValueError, match="head dim 100"): DecodeConfig("float16", 100, 1, 1, 1.0)
  with pytest.raises(ValueError, match="group 17"): DecodeConfig("float16", 64, 17, 1, 1.0)
  with pytest.raises(ValueError, match="dtypes"): DecodeConfig("float64", 64, 1, 1, 1.0)
  with pytest.raises(ValueError, match="no buffer"):
    flash_decoding_source(DecodeConfig("float16", 64, 1, 1, 1.0), "decode", {"S": "1"}, (), ("out", "q"), 1)

def test_fitting_cluster_halves_until_the_device_places_one():
  """The runner's cluster size: the kernel's, or halved until the device can place a cluster of it (a GPU with smaller
  GPCs, or a slice of one, may hold no 16-block cluster); 0 (the scratch's combine) where none fits; an unknown count
  (a driver without the query) keeps the size."""
  from tgrad.attention_kernel import fitting_cluster
  asked: list[int] = []
  def places(limit: int):
    def count(size: int):
      asked.append(size)
      return 132 // size if size <= limit else 0
    return count
  assert fitting_cluster(16, places(16)) == 16 and asked == [16]
  asked.clear()
  assert fitting_cluster(16, places(8)) == 8 and asked == [16, 8]
  asked.clear()
  assert fitting_cluster(16, places(1)) == 0 and asked == [16, 8, 4, 2]
  assert fitting_cluster(16, lambda size: None) == 16
  assert fitting_cluster(0, places(16)) == 0 and fitting_cluster(8, places(4)) == 4

def test_scratch_is_filled_once_and_then_shared():
  """attention_kernel._scratch: graphs share one scratch per (device, size) once a fill of it ran (every kernel
  leaves the counters at zero); one scheduled but never run (a TinyJit capture's recording, a traced schedule) may
  hold anything, and a graph built then gets a scratch of its own, with its own fill. No device is touched."""
  from tgrad.attention_kernel import _scratch, _scratches
  from tgrad.device import Buffer
  words = 4099   # a size no real launch asks for
  _scratches.pop(("CUDA", words), None)
  first = _scratch("CUDA", words)
  assert _scratch("CUDA", words) is first, "two graphs built before it runs share the unrealized fill"
  assert first.base.op is not None and first.base.buffer is None
  buffer = Buffer("CUDA", words, dtypes.float32)   # committed as a schedule does, never allocated nor run
  first.base.commit(buffer)
  second = _scratch("CUDA", words)
  assert second is not first and second.base.buffer is None, "a fill that never ran is not trusted"
  second.base.commit(Buffer("CUDA", words, dtypes.float32))
  second.base.buffer.wrote()   # its fill ran
  assert _scratch("CUDA", words) is second, "after its fill ran, later graphs read it as it is"
  _scratches.pop(("CUDA", words), None)

def test_staged_values_merge_per_table_and_refuse_two_values_of_one_name():
  """device_values.stage_all (no device): one call's values go to each table as one list, a name given twice at the
  same value once; a name at two values in one call is a ValueError naming it (two launches of one graph can't read
  one slot at different values), and nothing is staged then."""
  from tgrad.runtime.cuda.device_values import stage_all
  class Table:
    def __init__(self): self.slots, self.staged = {}, []
    def slot_of(self, name): return self.slots.setdefault(name, len(self.slots))
    def stage(self, values): self.staged.append(sorted(values))
  a, b = Table(), Table()
  stage_all([(a, "position", 9), (a, "ring_slot", 9), (b, "position", 4), (a, "position", 9)])
  assert a.staged == [[(0, 9), (1, 9)]] and b.staged == [[(0, 4)]]
  with pytest.raises(ValueError, match="'position'.*two values"):
    stage_all([(a, "position", 10), (a, "position", 11)])
  assert len(a.staged) == 1
