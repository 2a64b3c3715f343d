"""Gemma 3 decoding with the TinyJit-captured step equals decoding without it: the same greedy ids and bitwise the
same logits at every step (tiny preset, seeded random weights; no Hugging Face needed)."""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.models.gemma3 import Gemma3, Gemma3Config, generate

PROMPT = [2, 17, 301, 5, 88, 412, 9]
STEPS = 12   # past the tiny preset's sliding window (8): the ring cache wraps while the JIT replays

@pytest.fixture(scope="module")
def model() -> Gemma3:
  return Gemma3.random(Gemma3Config.preset("tiny"), seed=3, progress=False)

def decode_logits(model: Gemma3, jit: bool) -> list[np.ndarray]:
  model.reset_cache(1, 64)
  logits = model(Tensor(np.array([PROMPT], np.int32)), 0, last_only=True).numpy()[0, -1]
  out = [logits]
  for k in range(STEPS):
    token = int(out[-1].argmax())
    step = model(Tensor(np.array([[token]], np.int32)), len(PROMPT) + k, last_only=True, jit=jit)
    out.append(step.numpy()[0, -1])
  return out

def test_jit_decode_logits_are_identical(model: Gemma3):
  eager = decode_logits(model, jit=False)
  jitted = decode_logits(model, jit=True)
  assert model._decode_jit is not None and model._decode_jit.captured is not None   # later steps were replays
  for step, (a, b) in enumerate(zip(eager, jitted)): np.testing.assert_array_equal(a, b, err_msg=f"step {step}")

def test_generate_with_and_without_jit(model: Gemma3):
  without = generate(model, PROMPT, STEPS, jit=False)
  with_jit = generate(model, PROMPT, STEPS, jit=True)
  assert with_jit.ids == without.ids and len(with_jit.ids) == STEPS
  graph = model._decode_jit.captured
  parts = graph.memory_breakdown()[model.device]
  cache_bytes = sum(t.nbytes() for t in model.cache.tensors())
  assert parts["state"] >= cache_bytes and parts["activation"] <= parts["activations unplanned"]
