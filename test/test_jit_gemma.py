"""Gemma 3 decoding with the TinyJit-captured step equals decoding without it: the same greedy ids and bitwise the
same logits at every step (tiny preset, seeded random weights; no Hugging Face needed)."""
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.models.gemma3 import Gemma3, Gemma3Config
from tgrad.models.generation import generate
from tgrad.nn.quant import recomputes_rows

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

def test_decode_greedy_is_the_argmax_of_the_jitted_logits(model: Gemma3):
  """decode_greedy (argmax on the device inside the captured step) picks the token np.argmax picks from the logits
  of the same step run without the JIT, for a batch of two sequences; bad calls raise before anything runs."""
  prompts = np.array([PROMPT, PROMPT[::-1]], np.int32)
  model.reset_cache(2, 64)
  first = model(Tensor(prompts), 0, last_only=True).numpy()[:, -1].argmax(-1)
  model.reset_cache(2, 64)
  model(Tensor(prompts), 0, last_only=True)
  with pytest.raises(ValueError, match="one int token per sequence"): model.decode_greedy([1])
  with pytest.raises(ValueError, match="outside the vocabulary"): model.decode_greedy([1, model.config.vocab_size])
  greedy_tokens, tokens = [], first.tolist()
  for _ in range(STEPS):
    tokens = model.decode_greedy(tokens)
    greedy_tokens.append(tokens)
  model.reset_cache(2, 64)
  model(Tensor(prompts), 0, last_only=True)
  tokens = first.tolist()
  for k in range(STEPS):
    logits = model(Tensor(np.array(tokens, np.int32).reshape(2, 1)), len(PROMPT) + k, last_only=True).numpy()
    tokens = logits[:, -1].argmax(-1).tolist()
    assert tokens == greedy_tokens[k], f"step {k}"
  model.reset_cache(1, 64)
  with pytest.raises(ValueError, match="run its prompt"): model.decode_greedy([1])

def test_pipelined_greedy_generate_stops_at_eos_like_the_plain_loop(model: Gemma3):
  """generate's jitted greedy loop queues a step ahead of the one it reads; with an EOS id met mid-way it returns
  the same ids as the plain loop and drops the extra step's token; a count past the cache raises first."""
  plain = generate(model, PROMPT, STEPS, jit=False)
  eos = plain.ids[STEPS // 2]
  first_eos = plain.ids.index(eos)
  without = generate(model, PROMPT, STEPS, jit=False, eos_ids=[eos])
  with_jit = generate(model, PROMPT, STEPS, jit=True, eos_ids=[eos])
  assert with_jit.ids == without.ids == plain.ids[:first_eos + 1] and with_jit.stopped_at_eos
  assert len(with_jit.step_seconds) == len(with_jit.ids) - 1
  model.reset_cache(1, 16)
  model(Tensor(np.array([PROMPT], np.int32)), 0, last_only=True)
  with pytest.raises(ValueError, match="do not fit a cache of 16"): model.greedy_tokens([1], 10)
  with pytest.raises(ValueError, match="count must be"): model.greedy_tokens([1], -1)
  assert list(model.greedy_tokens([1], 0)) == []

def test_decode_step_kernels_per_layer(model: Gemma3):
  """The captured decode step runs at most 8 kernels per decoder layer (issue target), plus a fixed few: the head (the
  final norm inside it) and the argmax (the rotary tables are rows of the cache's bank, read in place: no kernel); the
  embedding lookup is computed inside the kernels that read it on a GPU, and is one kernel more on a CPU, which would
  otherwise recompute it for every row of those kernels (gemma3._fuse_into_consumer)."""
  model.reset_cache(1, 64)
  model(Tensor(np.array([PROMPT], np.int32)), 0, last_only=True)
  for _ in range(3): model.decode_greedy([5])
  instructions = model._decode_jit.captured.instructions
  layers = model.config.num_hidden_layers
  fixed = len(instructions) - 8 * layers
  assert fixed <= (3 if recomputes_rows(model.model.embed_tokens.weight) else 4), [ins.name for ins in instructions]
