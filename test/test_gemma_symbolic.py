"""Gemma 3 with symbolic shapes (issue 13, must-have 6): a prompt of any length runs one compiled and captured prefill,
and a decode step reads only the filled part of the cache, one capture for every position.

The tiny preset (W = 8) against Hugging Face's logits for one 40-token prompt (gemma_hf_reference.py): by causality
the prefill of any prefix of it gives HF's row of the prefix's last position, and a decode step fed the next prompt
token gives the next row, so each prefix length checks the prefill's masks and cache writes (the sliding ring filled
by fewer and by more than W tokens) and the decode step after it. Kernel compiles are counted with
realize._kernel_counter (one per new kernel AST).
"""
import importlib.util
import numpy as np
import pytest
from tgrad import Tensor
from tgrad.models.gemma3 import Gemma3, PRESETS
from tgrad.models.gemma3_cache import DECODE, EXTEND
import tgrad.realize as realize_module

PROMPT = [2] + [int(t) for t in np.random.default_rng(5).integers(3, 512, size=39)]   # 40 tokens, 5 windows
CACHE = 96                  # a length that is none of the tiny model's sizes (see the last test)
DECODE_TOKENS = 20          # HF's greedy ids after the prompt: positions 40..58 fed back
FP32_TOLERANCE = 1e-4       # max abs logit difference against HF in float32 (as test_gemma.py)
SAME_MATH_TOLERANCE = 1e-5  # two tgrad paths that compute the same sums in another order

def compiles() -> int: return realize_module._kernel_counter

@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  import gemma_hf_reference
  missing = [m for m in gemma_hf_reference.NEEDS if importlib.util.find_spec(m) is None]
  if missing: pytest.skip(f"the Hugging Face reference needs {missing}")
  out = gemma_hf_reference.write_reference(tmp_path_factory.mktemp("gemma_symbolic"), PRESETS["tiny"], PROMPT,
                                           DECODE_TOKENS)
  return {"dir": out, "prefill": np.load(out / "prefill_logits.npy"), "ids": np.load(out / "decode_ids.npy"),
          "decode": np.load(out / "decode_logits.npy")}

@pytest.fixture(scope="module")
def model(reference) -> Gemma3:
  return Gemma3.from_pretrained(str(reference["dir"]), "float32", progress=False)

def prefill(model: Gemma3, length: int, jit: bool) -> np.ndarray:
  model.reset_cache(1, CACHE)
  return model(Tensor(np.array([PROMPT[:length]], np.int32)), 0, last_only=True, jit=jit).numpy()[0, -1]

def test_prefill_of_every_length_runs_one_compiled_and_captured_program(model, reference):
  prefill(model, 6, jit=True)
  prefill(model, 11, jit=True)   # the second call captures
  captured, compiled = model._prefill_jit.captured, compiles()
  assert captured is not None
  for length in (1, 3, 8, 9, 23, 40):   # below, at and past the sliding window
    got = prefill(model, length, jit=True)
    assert np.abs(got - reference["prefill"][length - 1]).max() <= FP32_TOLERANCE, f"length {length}"
    np.testing.assert_array_equal(got, prefill(model, length, jit=False), err_msg=f"length {length}: jit vs eager")
  assert compiles() == compiled, "a new prompt length compiled kernels"
  assert model._prefill_jit.captured is captured, "a new prompt length captured again"

def test_prefill_returns_symbolic_hidden_states_and_logits(model, reference):
  model.reset_cache(1, CACHE)
  logits, hidden = model(Tensor(np.array([PROMPT[:13]], np.int32)), 0, return_hidden=True)
  assert not isinstance(logits.shape[1], int) and logits.numpy().shape == (1, 13, model.config.vocab_size)
  assert np.abs(logits.numpy()[0] - reference["prefill"][:13]).max() <= FP32_TOLERANCE
  assert all(h.numpy().shape == (1, 13, model.config.hidden_size) for h in hidden)

@pytest.mark.parametrize("length", [2, 7, 8, 9, 17, 30])
def test_decode_after_a_prefill_of_any_length(model, reference, length):
  """The ring and full caches as a prefill of `length` left them: the decode step of the next prompt token gives
  HF's logits of that position, and then of the one after."""
  prefill(model, length, jit=True)
  for position in (length, length + 1):
    step = model(Tensor(np.array([[PROMPT[position]]], np.int32)), position, last_only=True, jit=True).numpy()[0, -1]
    assert np.abs(step - reference["prefill"][position]).max() <= FP32_TOLERANCE, f"prefill {length}, {position}"

def test_decode_at_every_position_replays_one_capture(model, reference):
  """Greedy decode from position 40 to 58 (the sliding ring wrapped five times): HF's ids and logits, every step after
  the capture a replay of the same program, whose attention kernels take the position Variables."""
  want_ids, want_logits = reference["ids"], reference["decode"]
  prefill(model, len(PROMPT), jit=True)
  rows, captures = [], set()
  for k in range(1, DECODE_TOKENS):
    position = len(PROMPT) + k - 1
    step = model(Tensor(np.array([[want_ids[k - 1]]], np.int32)), position, last_only=True, jit=True)
    rows.append(step.numpy()[0, -1])
    if k == 3: compiled = compiles()
    if k >= 3: captures.add(id(model._decode_jit.captured))
  assert np.abs(np.stack(rows) - want_logits[1:]).max() <= FP32_TOLERANCE
  assert np.stack(rows).argmax(-1).tolist() == want_ids[1:].tolist()
  assert compiles() == compiled and len(captures) == 1
  graph = model._decode_jit.captured
  variables = {name for ins in graph.instructions for name in ins.var_vals}
  assert {"position", "ring_slot", "ring_filled"} <= variables
  assert graph.var_vals["position"] == len(PROMPT) + DECODE_TOKENS - 2

def test_decode_equals_the_masked_full_cache_attention(model):
  """A decode step (a write of one slot, attention over the filled slots) against the previous implementation's
  math: attention over every slot of the cache with a mask from host positions (what an EXTEND call still does).
  Two steps at positions 40 and 41 against one EXTEND call of the same two tokens."""
  tokens = [17, 301]
  prefill(model, len(PROMPT), jit=False)
  assert model._step_data(np.arange(40, 42, dtype=np.int32), model.cache)[0] == EXTEND
  extended = model(Tensor(np.array([tokens], np.int32)), len(PROMPT)).numpy()[0]
  prefill(model, len(PROMPT), jit=False)
  assert model._step_data(np.array([40], np.int32), model.cache)[0] == DECODE
  steps = [model(Tensor(np.array([[t]], np.int32)), len(PROMPT) + i, last_only=True).numpy()[0, -1]
           for i, t in enumerate(tokens)]
  np.testing.assert_allclose(np.stack(steps), extended, atol=SAME_MATH_TOLERANCE, rtol=0)

def test_decode_kernels_loop_over_the_filled_slots(model):
  """The decode step's attention loops run to the filled slots: kernels of the full-attention layers take the
  `position` Variable (the write and the reads), those of the sliding layers `ring_filled`, and no kernel has the
  cache's length among its loop sizes (its name lists them: before, `r_2_1_2_<slots>_16` read every slot)."""
  prefill(model, 10, jit=True)
  for _ in range(3): model.decode_greedy([5])
  graph = model._decode_jit.captured
  full_layers = model.config.layer_types.count("full_attention")
  sliding_layers = model.config.num_hidden_layers - full_layers
  assert sum("position" in ins.var_vals for ins in graph.instructions) >= 3 * full_layers
  assert sum("ring_filled" in ins.var_vals for ins in graph.instructions) >= 2 * sliding_layers
  for ins in graph.instructions:
    assert str(CACHE) not in ins.name.split("_"), f"{ins.name} loops over the whole cache"

def test_cache_shorter_than_the_sliding_window(model, reference):
  """A cache of 6 positions (< W = 8): the sliding layers' cache is no ring (slot = position, as the full layers'),
  written by region and read to position + 1; prefill of 3 and decode to the last slot give HF's logits."""
  model.reset_cache(1, 6)
  assert not model.cache.is_ring("sliding_attention")
  first = model(Tensor(np.array([PROMPT[:3]], np.int32)), 0, last_only=True, jit=True).numpy()[0, -1]
  rows = [first] + [model(Tensor(np.array([[PROMPT[p]]], np.int32)), p, last_only=True, jit=True).numpy()[0, -1]
                    for p in range(3, 6)]
  assert np.abs(np.stack(rows) - reference["prefill"][2:6]).max() <= FP32_TOLERANCE
