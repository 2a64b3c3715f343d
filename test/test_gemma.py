"""Gemma 3 on tgrad (tgrad/models/gemma3.py, examples/gemma.py) against Hugging Face transformers.

A module fixture (gemma_hf_reference.py, in this folder) writes a random 'tiny' checkpoint (W = 8; a 24-token prompt
so the sliding window binds) and what transformers computes from it, once per test session; the tests then load the
checkpoint with tgrad and compare, in float32, every hidden state, the prefill logits, cached decode logits and greedy
ids (1e-4 max abs). A failing prefill names the first stage that differs. Also: bad checkpoints fail with the tensor's
name, config parsing, sampling, the chat template, and the example script end to end (with the checkpoint, with
random weights, and every bad argument as one `error:` line with exit status 2 before any weights load).
"""
import gc, importlib.util, json, math, os, shutil, subprocess, sys, textwrap, time
from pathlib import Path
import numpy as np
import pytest
from tgrad.tensor import Tensor
from tgrad.nn.state import safe_load, safe_save
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS, FULL, SLIDING
from tgrad.models.generation import choose_token, format_chat, generate

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples/gemma.py"
PROMPT = [2, 5, 9, 17, 33, 65, 129, 257, 300, 301, 302, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]  # T=24 > W=8
DECODE_TOKENS = 8
FP32_TOLERANCE = 1e-4     # max abs logit / hidden-state difference for a float32 implementation (spec section 12)
BF16_TOLERANCE = 0.15     # bf16 weights and activations vs the float32 reference (spec section 5)
EXAMPLE_TIMEOUT_S = 300

@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
  """A directory with the random checkpoint (config.json, model.safetensors) and HF's logits / hidden states / ids."""
  import gemma_hf_reference
  missing = [m for m in gemma_hf_reference.NEEDS if importlib.util.find_spec(m) is None]
  if missing: pytest.skip(f"the Hugging Face reference needs {missing}: pip install -e '.[test]'")
  began = time.perf_counter()
  out = gemma_hf_reference.write_reference(tmp_path_factory.mktemp("gemma_tiny_reference"), PRESETS["tiny"], PROMPT,
                                           DECODE_TOKENS)
  print(f"HF reference for the tiny preset written in {time.perf_counter() - began:.1f} s")
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

# ---- examples/gemma.py: every bad argument is one `error:` line and exit status 2, before any weights load

def _run_example_raw(*args: str, pythonpath: str = "") -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != "DEVICE"}
  if pythonpath: env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
  return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True,
                        timeout=EXAMPLE_TIMEOUT_S, cwd=REPO, env=env)

def _assert_one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> None:
  assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
  for fragment in fragments: assert fragment in lines[0], lines[0]
  assert "RANDOM weights" not in done.stdout and "loading" not in done.stdout   # nothing was loaded

BAD_ARGUMENTS = [
  (["--device", "NOPE"], ["--device NOPE", "unknown device 'NOPE'", "CUDA, LLVM"]),
  (["--max-new-tokens", "-1"], ["--max-new-tokens must be >= 0, got -1"]),
  (["--max-new-tokens", "many"], ["--max-new-tokens", "invalid int value: 'many'"]),
  (["--top-p", "0"], ["--top-p must be in (0, 1]", "got 0.0"]),
  (["--top-p", "1.5"], ["--top-p must be in (0, 1]", "got 1.5"]),
  (["--temperature", "-0.5"], ["--temperature must be a finite number >= 0", "got -0.5"]),
  (["--temperature", "nan"], ["--temperature must be a finite number >= 0", "got nan"]),
  (["--top-k", "-3"], ["--top-k must be >= 0", "got -3"]),
  (["--seed", "-1"], ["--seed must be >= 0"]),
  (["--preset", "huge"], ["--preset", "invalid choice: 'huge'"]),
  (["--dtype", "int8"], ["--dtype", "invalid choice: 'int8'"]),
  (["--prompt-ids", "1,x"], ["--prompt-ids must be comma-separated ints, got '1,x'"]),
  (["--preset", "tiny", "--prompt-ids", "2,512"], ["--prompt-ids outside the vocabulary [0, 512): [512]"]),
  (["--preset", "tiny", "--max-new-tokens", "1024"], ["+ --max-new-tokens (1024) exceeds the model's 1024 positions"]),
  (["--prompt", "hi", "--prompt-ids", "2"], ["give --prompt or --prompt-ids, not both"]),
  (["--system", "be brief"], ["--system needs --chat"]),
  (["--devices", "LLVM:0"], ["--devices needs two or more devices, got 'LLVM:0'"]),
  (["--device", "LLVM", "--devices", "LLVM:0,LLVM:1"], ["give --device or --devices, not both"]),
  (["--preset", "tiny", "--devices", "LLVM:0,LLVM:1,LLVM:2"],
   ["--devices LLVM:0,LLVM:1,LLVM:2", "{'num_attention_heads': 2, 'intermediate_size': 128} divisible by 3"]),
  (["--model", "/no/such/dir"], ["--model /no/such/dir: no such directory"]),
  (["--model", ".", "--config", "c.json"], ["--config is for random weights"]),
  (["--config", "/no/such/config.json"], ["--config /no/such/config.json: no such file"]),
  (["--config", "README.md"], ["--config README.md: not valid JSON"]),
  (["--config", "pytest.ini"], ["--config pytest.ini: not valid JSON"]),
]

@pytest.mark.parametrize("args,fragments", BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_example_bad_argument_is_one_error_line(args, fragments):
  _assert_one_line_error(_run_example_raw(*args), *fragments)

def test_example_config_that_is_not_gemma(tmp_path):
  for text, why in (("{}", "config is missing"), ("[1, 2]", "not a Gemma 3 config")):
    (tmp_path / "config.json").write_text(text)
    _assert_one_line_error(_run_example_raw("--config", str(tmp_path / "config.json")), "not a Gemma 3 config", why)

@pytest.mark.parametrize("key, value", [("num_hidden_layers", 0), ("vocab_size", -5), ("hidden_size", 1.5),
                                        ("num_attention_heads", True), ("max_position_embeddings", "many")])
def test_example_config_sizes_must_be_positive_ints(tmp_path, key, value):
  (tmp_path / "config.json").write_text(json.dumps({**PRESETS["tiny"], key: value}))
  _assert_one_line_error(_run_example_raw("--config", str(tmp_path / "config.json")),
                         f"config {key} must be a positive int, got {value!r}")
  with pytest.raises(ValueError, match=f"config {key} must be a positive int"):
    Gemma3Config.from_dict({**PRESETS["tiny"], key: value})

def _model_folder(root: Path, index=None, tokenizer: str = "") -> Path:
  """A checkpoint folder with the tiny config and, as asked, an index file and a tokenizer.json."""
  folder = root / "model"
  folder.mkdir()
  (folder / "config.json").write_text(json.dumps(PRESETS["tiny"]))
  if index is not None: (folder / "model.safetensors.index.json").write_text(json.dumps(index))
  if tokenizer: (folder / "tokenizer.json").write_text(tokenizer)
  return folder

def _assert_one_error_line_after_loading(done: subprocess.CompletedProcess, *fragments: str) -> None:
  assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr[-2000:]
  for fragment in fragments: assert fragment in lines[0], lines[0]

@pytest.mark.parametrize("index, fragments", [
  ({"metadata": {}}, ["model.safetensors.index.json: needs a non-empty 'weight_map'"]),
  ({"weight_map": {"a": 5}}, ["weight_map entries must be file names, not 5"]),
  ({"weight_map": {"model.embed_tokens.weight": "../outside.safetensors"}},
   ["shard '../outside.safetensors' is outside the model folder"])])
def test_example_bad_index_file(tmp_path, index, fragments):
  safe_save({"model.embed_tokens.weight": Tensor.zeros(2, 2)}, str(tmp_path / "outside.safetensors"))
  folder = _model_folder(tmp_path, index)
  done = _run_example_raw("--model", str(folder), "--device", "LLVM", "--prompt-ids", "2")
  _assert_one_error_line_after_loading(done, "cannot load", *fragments)

def test_index_shard_through_a_link_out_of_the_folder_is_refused(tmp_path):
  from tgrad.models.gemma3_weights import checkpoint_files as _checkpoint_files
  safe_save({"x": Tensor.zeros(1)}, str(tmp_path / "outside.safetensors"))
  folder = _model_folder(tmp_path, {"weight_map": {"x": "shard.safetensors"}})
  (folder / "shard.safetensors").symlink_to(tmp_path / "outside.safetensors")
  with pytest.raises(ValueError, match="'shard.safetensors' is outside the model folder"):
    _checkpoint_files(str(folder))
  (folder / "shard.safetensors").unlink()
  safe_save({"x": Tensor.zeros(1)}, str(folder / "shard.safetensors"))
  assert _checkpoint_files(str(folder)) == [os.path.realpath(folder / "shard.safetensors")]

@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None, reason="needs the tokenizers package")
def test_example_corrupt_tokenizer_is_one_error_line(tmp_path):
  folder = _model_folder(tmp_path, tokenizer="{not json")
  done = _run_example_raw("--model", str(folder), "--device", "LLVM", "--prompt-ids", "2")
  _assert_one_line_error(done, "tokenizer.json: not a tokenizer the `tokenizers` package can read")

def _stub_pycuda(root: Path, driver_source: str) -> str:
  (root / "pycuda").mkdir()
  (root / "pycuda/__init__.py").write_text("")
  (root / "pycuda/driver.py").write_text(textwrap.dedent(driver_source))
  return str(root)

def test_example_cuda_without_pycuda(tmp_path):
  """As on a machine without pycuda (a stand-in package that fails to import, as a missing one does)."""
  (tmp_path / "pycuda").mkdir()
  (tmp_path / "pycuda/__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'pycuda'\", name='pycuda')")
  done = _run_example_raw("--device", "CUDA", pythonpath=str(tmp_path))
  _assert_one_line_error(done, "--device CUDA", "pycuda", "pip install -e '.[cuda]'")

def test_example_cuda_without_a_gpu(tmp_path):
  """pycuda installed, no GPU visible: a stand-in driver whose cuInit fails as the real one does."""
  stub = _stub_pycuda(tmp_path, """
    class Error(Exception): pass
    class LogicError(Error): pass
    class MemoryError(Error): pass
    def init(): raise LogicError("cuInit failed: no CUDA-capable device is detected")
  """)
  _assert_one_line_error(_run_example_raw("--device", "CUDA", pythonpath=stub), "--device CUDA",
                         "no GPU is visible", "DEVICE=LLVM")

def test_example_zero_new_tokens_generates_none():
  summary = _run_example("--preset", "tiny", "--max-new-tokens", "0")
  assert summary["ids"] == [] and summary["decode_tokens"] == 0

def test_generate_zero_and_negative_new_tokens(reference, model):
  result = generate(model, PROMPT, 0)
  assert result.ids == [] and result.decode_tokens == 0 and result.prompt_tokens == len(PROMPT)
  with pytest.raises(ValueError, match="max_new_tokens must be >= 0, got -1"): generate(model, PROMPT, -1)

@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generate_pauses_the_collector(reference, model, temperature):
  """generate() makes its tokens with Python's cyclic collector paused (a full collection took 52-241 ms with a few
  models loaded, stalling the decode) and gives it back as it found it, also when on_token raises."""
  seen: list[bool] = []
  result = generate(model, PROMPT, 4, temperature=temperature, seed=0, on_token=lambda t: seen.append(gc.isenabled()))
  assert seen == [False] * len(result.ids) and len(seen) == 4 and gc.isenabled()
  class Stop(Exception): pass
  def stop(token: int) -> None: raise Stop(token)
  with pytest.raises(Stop): generate(model, PROMPT, 4, temperature=temperature, seed=0, on_token=stop)
  assert gc.isenabled()
  gc.disable()
  try:
    generate(model, PROMPT, 2, temperature=temperature, seed=0)
    assert not gc.isenabled()
  finally: gc.enable()
