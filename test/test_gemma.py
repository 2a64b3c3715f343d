"""Gemma 3 on tgrad (tgrad/models/gemma3.py, examples/gemma.py) against Hugging Face transformers.

A module fixture runs the reference harness (shared/reference/gemma_reference.py, 'tiny' preset: W = 8, a 24-token
prompt so the sliding window binds) once; the tests then load its checkpoint with tgrad and compare, in float32,
every hidden state, the prefill logits, cached decode logits and greedy ids (1e-4 max abs). A failing prefill names
the first stage that differs. Also: bad checkpoints fail with the tensor's name, config parsing, sampling, the chat
template, and the example script end to end (with the checkpoint and with random weights).
"""
import importlib.util, json, math, shutil, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
from tgrad.tensor import Tensor
from tgrad.nn.state import safe_load, safe_save
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS, FULL, SLIDING, choose_token, format_chat, generate

REPO = Path(__file__).resolve().parents[1]
HARNESS = Path(__file__).resolve().parents[2] / "shared/reference/gemma_reference.py"
EXAMPLE = REPO / "examples/gemma.py"
PROMPT = [2, 5, 9, 17, 33, 65, 129, 257, 300, 301, 302, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]  # T=24 > W=8
DECODE_TOKENS = 8
FP32_TOLERANCE = 1e-4     # max abs logit / hidden-state difference for a float32 implementation (spec section 12)
BF16_TOLERANCE = 0.15     # bf16 weights and activations vs the float32 reference (spec section 5)
HARNESS_TIMEOUT_S = 300
EXAMPLE_TIMEOUT_S = 300

@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
  """The harness's output directory: config.json, model.safetensors and HF's logits / hidden states / ids."""
  if not HARNESS.is_file(): pytest.skip(f"reference harness not found at {HARNESS}")
  missing = [m for m in ("torch", "transformers", "safetensors") if importlib.util.find_spec(m) is None]
  if missing: pytest.skip(f"the reference harness needs {missing}")
  out = tmp_path_factory.mktemp("gemma_tiny_reference")
  command = [sys.executable, str(HARNESS), "--preset", "tiny", "--out", str(out),
             "--tokens", ",".join(map(str, PROMPT)), "--decode", str(DECODE_TOKENS), "--dtype", "float32"]
  done = subprocess.run(command, capture_output=True, text=True, timeout=HARNESS_TIMEOUT_S)
  if done.returncode != 0: pytest.fail(f"reference harness failed ({done.returncode}):\n{done.stderr[-3000:]}")
  return out

@pytest.fixture(scope="module")
def model(reference) -> Gemma3:
  return Gemma3.from_pretrained(str(reference), "float32", progress=False)

def _stage_name(index: int, layers: int) -> str:
  if index == 0: return "0 (scaled embedding)"
  return f"{index} (final norm)" if index == layers + 1 else f"{index} (output of decoder layer {index - 1})"

def test_prefill_matches_hf_layer_by_layer(reference, model):
  logits, hidden = model(Tensor(np.array([PROMPT], np.int32)), 0, return_hidden=True)
  want_hidden = np.load(reference / "prefill_hidden.npy")
  errors = [float(np.abs(h.numpy()[0] - want).max()) for h, want in zip(hidden, want_hidden)]
  assert len(hidden) == len(want_hidden) == model.config.num_hidden_layers + 2
  first_bad = next((i for i, e in enumerate(errors) if not e <= FP32_TOLERANCE), None)
  assert first_bad is None, (f"first differing stage of prefill_hidden.npy: "
                             f"{_stage_name(first_bad, model.config.num_hidden_layers)}; max abs per stage {errors}")
  want_logits = np.load(reference / "prefill_logits.npy")
  got = logits.numpy()[0]
  assert got.shape == want_logits.shape
  assert np.abs(got - want_logits).max() <= FP32_TOLERANCE

def test_decode_matches_hf(reference, model):
  """Greedy decode with the KV cache: prefill's last row, then one cached step per token at positions T, T+1, ..."""
  want_ids, want_logits = np.load(reference / "decode_ids.npy"), np.load(reference / "decode_logits.npy")
  rows = [model(Tensor(np.array([PROMPT], np.int32)), 0, last_only=True).numpy()[0, -1]]
  for k in range(1, DECODE_TOKENS):
    step = model(Tensor(np.array([[want_ids[k - 1]]], np.int32)), len(PROMPT) + k - 1, last_only=True)
    rows.append(step.numpy()[0, -1])
  got = np.stack(rows)
  assert got.argmax(-1).tolist() == want_ids.tolist()
  assert np.abs(got - want_logits).max() <= FP32_TOLERANCE
  assert generate(model, PROMPT, DECODE_TOKENS).ids == want_ids.tolist()

def test_chunked_prefill_matches_hf(reference, model):
  """Several tokens after a filled cache: the second chunk (12 > W = 8) overwrites sliding-ring slots it also reads."""
  ids = np.array([PROMPT], np.int32)
  chunks = [model(Tensor(ids[:, a:b]), a).numpy()[0] for a, b in [(0, 12), (12, 24)]]
  assert np.abs(np.concatenate(chunks) - np.load(reference / "prefill_logits.npy")).max() <= FP32_TOLERANCE

def test_bfloat16_close_to_reference(reference):
  bf16 = Gemma3.from_pretrained(str(reference), "bfloat16", progress=False)
  got = bf16(Tensor(np.array([PROMPT], np.int32)), 0).numpy()[0]
  want = np.load(reference / "prefill_logits.npy")
  assert np.abs(got - want).max() <= BF16_TOLERANCE
  assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9

def _broken_checkpoint(reference: Path, tmp_path: Path, edit) -> Path:
  directory = tmp_path / "broken"
  directory.mkdir()
  shutil.copy(reference / "config.json", directory / "config.json")
  tensors = safe_load(str(reference / "model.safetensors"))
  edit(tensors)
  safe_save(tensors, str(directory / "model.safetensors"))
  return directory

def test_missing_tensor_is_named(reference, tmp_path):
  name = "model.layers.1.mlp.up_proj.weight"
  directory = _broken_checkpoint(reference, tmp_path, lambda t: t.pop(name))
  with pytest.raises(ValueError, match=f"missing tensors.*{name}"):
    Gemma3.from_pretrained(str(directory), progress=False)

def test_wrong_shape_is_named(reference, tmp_path):
  name = "model.layers.2.self_attn.k_proj.weight"
  def shrink(tensors): tensors[name] = tensors[name][:16]
  directory = _broken_checkpoint(reference, tmp_path, shrink)
  with pytest.raises(ValueError, match=rf"{name}: expected \(32, 80\), got \(16, 80\)"):
    Gemma3.from_pretrained(str(directory), progress=False)

def _run_example(*args: str) -> dict:
  done = subprocess.run([sys.executable, str(EXAMPLE), *args, "--json"], capture_output=True, text=True,
                        timeout=EXAMPLE_TIMEOUT_S, cwd=REPO)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])

def test_example_json_matches_reference_ids(reference):
  summary = _run_example("--model", str(reference), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "4")
  assert summary["ids"] == np.load(reference / "decode_ids.npy")[:4].tolist()
  assert summary["prompt_ids"] == PROMPT and not summary["random_weights"]
  assert summary["prefill_tokens_per_second"] > 0 and summary["decode_tokens"] == 3

def test_example_random_weights_tiny():
  summary = _run_example("--preset", "tiny", "--max-new-tokens", "3")
  assert summary["random_weights"] and len(summary["ids"]) == 3
  assert all(0 <= t < PRESETS["tiny"]["vocab_size"] for t in summary["ids"])
  assert summary["decode_tokens_per_second"] > 0

def test_example_missing_model_is_a_clear_error(tmp_path):
  done = subprocess.run([sys.executable, str(EXAMPLE), "--model", str(tmp_path / "nothing")], capture_output=True,
                        text=True, timeout=EXAMPLE_TIMEOUT_S, cwd=REPO)
  assert done.returncode == 2 and "no such directory" in done.stderr and "Traceback" not in done.stderr

def test_config_legacy_and_new_rope_keys_agree():
  legacy = Gemma3Config.from_dict(PRESETS["270m"])
  new = dict(PRESETS["270m"])
  for key in ("rope_theta", "rope_local_base_freq", "rope_scaling", "layer_types"): new.pop(key)
  new["sliding_window_pattern"] = 6
  new["rope_parameters"] = {FULL: {"rope_type": "default", "rope_theta": 1e6},
                            SLIDING: {"rope_type": "default", "rope_theta": 1e4}}
  assert Gemma3Config.from_dict(new) == legacy
  assert legacy.layer_types.count(FULL) == 3 and legacy.layer_types[5] == FULL
  assert legacy.rope_theta == {FULL: 1e6, SLIDING: 1e4} and legacy.query_pre_attn_scalar == 256
  scaled = Gemma3Config.from_dict({**PRESETS["270m"], "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                                   "eos_token_id": [1, 106]})
  assert scaled.rope_factor == {FULL: 8.0, SLIDING: 1.0} and scaled.eos_token_ids == (1, 106)
  with pytest.raises(ValueError, match="yarn"):
    Gemma3Config.from_dict({**PRESETS["270m"], "rope_scaling": {"rope_type": "yarn"}})
  with pytest.raises(ValueError, match="gelu"): Gemma3Config.from_dict({**PRESETS["270m"], "hidden_activation": "gelu"})

def test_choose_token():
  logits = np.array([0.0, 3.0, 2.9, -1.0], np.float32)
  assert choose_token(logits) == 1
  assert choose_token(logits, temperature=1.0, top_k=1, rng=np.random.default_rng(0)) == 1
  assert choose_token(logits, temperature=1.0, top_p=0.01, rng=np.random.default_rng(0)) == 1
  draws = [choose_token(logits, temperature=1.0, top_k=2, rng=np.random.default_rng(s)) for s in range(200)]
  assert set(draws) == {1, 2} and abs(draws.count(1) / len(draws) - 1 / (1 + math.exp(-0.1))) < 0.1
  first = [choose_token(logits, 0.7, rng=np.random.default_rng(7)) for _ in range(3)]
  assert first == [choose_token(logits, 0.7, rng=np.random.default_rng(7)) for _ in range(3)]

def test_chat_template_matches_spec_example():
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": " Why? "}]
  want = ("<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
          "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n")   # the spec's rendered example
  assert "<bos>" + format_chat(messages) == want
  with pytest.raises(ValueError, match="alternate"): format_chat([{"role": "assistant", "content": "x"}])
