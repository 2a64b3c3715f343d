"""Gemma 3's decode step (after a prompt) on a GPU through the flash-decoding kernel, its splits combined in thread
block clusters (FLASH_CLUSTER=16, the default, and 8; sm_90+) and through the global scratch (FLASH_CLUSTER=0),
against the plain graph (FLASH_ATTENTION=0), in float16 and float32: a random 2-layer model (a sliding layer of window
300 and a full layer, head dim 128, GQA), the jitted step at key counts with one split, one cluster of splits, several
clusters, and the sliding layer's full window."""
from __future__ import annotations
import numpy as np
import pytest
from tgrad import Tensor, dtypes
from tgrad.helpers import Context
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS

pytestmark = pytest.mark.gpu
# 1,051 keys: 17 splits of 64 in the full layer (3 clusters of 8) or 16 of 66 (one cluster of 16); 2,101 keys: 33
# splits of 64, 3 clusters of 16 (the last of one split) and the scratch's combine
POSITIONS = (3, 40, 100, 300, 600, 1050, 2100)

def decode_logits(dtype=dtypes.float16, positions=POSITIONS, **settings) -> list[np.ndarray]:
  config = Gemma3Config.from_dict({**PRESETS["tiny"], "head_dim": 128, "sliding_window": 300, "num_hidden_layers": 2,
                                   "layer_types": ["sliding_attention", "full_attention"],
                                   "max_position_embeddings": 4096})
  with Context(**settings):
    model = Gemma3.random(config, dtype=dtype, device="CUDA", seed=11)
    rng = np.random.default_rng(12)
    out = []
    for position in positions:   # a prompt of `position` tokens, then the jitted decode step after it
      model.reset_cache(1, max(POSITIONS) + 1)
      tokens = rng.integers(0, config.vocab_size, (1, position + 1)).astype(np.int32)
      model.forward(Tensor(tokens[:, :position], device="CUDA"), 0, last_only=True, jit=True)
      step = Tensor(tokens[:, position:], device="CUDA")
      out.append(model.forward(step, start_pos=position, last_only=True, jit=True).numpy().astype(np.float64))
  return out

def test_cluster_and_scratch_combines_match_the_plain_graph():
  plain = decode_logits(FLASH_ATTENTION=0)
  for cluster in (16, 8, 0):
    for position, got, want in zip(POSITIONS, decode_logits(FLASH_CLUSTER=cluster), plain):
      scale = np.abs(want).max()
      assert np.abs(got - want).max() <= 2e-2 * scale, (cluster, position, np.abs(got - want).max() / scale)

def test_values_in_device_memory_give_the_same_logits():
  """FLASH_DEVICE_VALUES=1 (the key count and slot written to device memory before each launch, the replayed nodes'
  arguments unchanged) against 0 (kernel arguments set each step): bit-identical logits, the positions in a seeded
  random order (the replays' values go down as well as up)."""
  order = [int(i) for i in np.random.default_rng(5).permutation(len(POSITIONS))]
  positions = [POSITIONS[i] for i in order]
  for got, want in zip(decode_logits(positions=positions, FLASH_DEVICE_VALUES=1),
                       decode_logits(positions=positions, FLASH_DEVICE_VALUES=0)):
    np.testing.assert_array_equal(got, want)

def test_float32_matches_the_plain_graph():
  """A float32 model's step through the kernel (float32 caches, 16-byte loads of 4 floats) against its plain graph."""
  plain = decode_logits(dtypes.float32, FLASH_ATTENTION=0)
  for position, got, want in zip(POSITIONS, decode_logits(dtypes.float32), plain):
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-4 * scale, (position, np.abs(got - want).max() / scale)

def test_cluster_falls_back_where_the_device_cannot_place_it(monkeypatch):
  """The driver's count of placeable 16-block clusters of the decode kernel is positive on this GPU; where it is 0 (as
  on a GPU with smaller GPCs), the runner compiles the kernel with clusters of 8 instead, and the step still matches
  the plain graph."""
  from tgrad.attention_kernel import FlashAttentionRunner
  from tgrad.custom import _runners
  from tgrad.realize import _runner_cache
  import tgrad.runtime.cuda.runtime as cuda_runtime
  def forget_runners() -> None:
    _runners.clear()
    _runner_cache.clear()
  runners: list[FlashAttentionRunner] = []
  real_init = FlashAttentionRunner.__init__
  def remembered(self, *args, **kwargs):
    real_init(self, *args, **kwargs)
    runners.append(self)
  monkeypatch.setattr(FlashAttentionRunner, "__init__", remembered)
  forget_runners()
  decode_logits()
  decoding = [r for r in runners if r.cluster]
  assert decoding and all(r.cluster == 16 for r in decoding)
  assert all(r.program.clusters_that_fit(16, r.kernel.config.block_threads) > 0 for r in decoding)
  real_fit = cuda_runtime.CUDAProgram.clusters_that_fit
  monkeypatch.setattr(cuda_runtime.CUDAProgram, "clusters_that_fit",
                      lambda self, cluster, threads: 0 if cluster > 8 else real_fit(self, cluster, threads))
  runners.clear()
  forget_runners()
  plain = decode_logits(FLASH_ATTENTION=0)
  got = decode_logits()
  decoding = [r for r in runners if r.cluster]
  assert decoding and all(r.cluster == 8 for r in decoding)
  for position, logits, want in zip(POSITIONS, got, plain):
    scale = np.abs(want).max()
    assert np.abs(logits - want).max() <= 2e-2 * scale, (position, np.abs(logits - want).max() / scale)
  forget_runners()
