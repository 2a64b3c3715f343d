"""Gemma 3 from a GGUF file against Hugging Face transformers loading the same file (float32), on the CPU.

1. Weights dequantized at load, float32: greedy continuations of PROMPTS (NEW_TOKENS each, no stop token) must equal
   HF's, and the max abs error of the prompts' prefill logits (every position) is reported.
2. Weights kept packed, float16 compute: a teacher-forced prefill of a long text (LONG_TOKENS tokens, past the
   512-token sliding window); top-1 (argmax) agreement with HF float32 at every position, and the max abs error.
   The same for dequant float32 as a baseline.
Usage: python bench/gemma_gguf_parity.py [GGUF] (default: the gemma-3-270m Q4_K_M package's file). Prints one JSON
object and writes it to $OUT/gemma_gguf_parity.json when OUT is set. Runs a few minutes on 2 cores.
"""
from __future__ import annotations
import json, os, sys, time
from pathlib import Path
import numpy as np
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "test"))
import gemma_gguf_hf_reference as hf_reference  # noqa: E402
from tgrad.tensor import Tensor  # noqa: E402
from tgrad.nn.gguf import GGUFFile  # noqa: E402
from tgrad.models.gemma3_gguf import load_gemma3_gguf  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402
from tgrad.models.tokenizer import GGUFTokenizer  # noqa: E402
from model_file import gguf_path  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "Water boils at a temperature of", "import numpy as np\n\nx ="]
NEW_TOKENS = 32
LONG_TOKENS = 560                            # > the 512-token sliding window, so the window binds
LONG_TEXT_FILES = ("docs/architecture.md", "docs/jit.md", "README.md")   # natural text, first one found
TOP1_TARGET = 0.99

def long_text_ids(tokenizer: GGUFTokenizer) -> tuple[list[int], str]:
  for name in LONG_TEXT_FILES:
    path = Path(name) if Path(name).is_absolute() else REPO / name
    if path.is_file():
      ids = tokenizer.encode(path.read_text())[:LONG_TOKENS]
      if len(ids) == LONG_TOKENS: return ids, str(path)
  raise FileNotFoundError(f"none of {LONG_TEXT_FILES} has {LONG_TOKENS} tokens")

def full_logits(model, ids: list[int]) -> np.ndarray:
  return model(Tensor(np.array([ids], dtype=np.int32), device=model.device), 0).numpy()[0].astype(np.float32)

def main() -> None:
  path = gguf_path(sys.argv[1] if len(sys.argv) > 1 else None)
  report: dict = {"file": path, "new_tokens": NEW_TOKENS}
  began = time.perf_counter()
  tokenizer = GGUFTokenizer.from_metadata(GGUFFile(path).metadata)
  prompts = [tokenizer.encode(text) for text in PROMPTS]
  long_ids, source = long_text_ids(tokenizer)
  report["long_text"] = {"source": source, "tokens": len(long_ids)}
  hf = hf_reference.load_hf(path)
  report["hf_load_seconds"] = round(time.perf_counter() - began, 1)
  want_ids, want_prefill = zip(*(hf_reference.greedy(hf, ids, NEW_TOKENS) for ids in prompts))
  want_prefill_all = [hf_reference.logits(hf, ids) for ids in prompts]
  want_long = hf_reference.logits(hf, long_ids)
  del hf

  model, _ = load_gemma3_gguf(path, "dequant", "float32")
  rows = []
  for text, ids, want, want_logits in zip(PROMPTS, prompts, want_ids, want_prefill_all):
    got = generate(model, ids, NEW_TOKENS).ids
    error = float(np.abs(full_logits(model, ids) - want_logits).max())
    rows.append({"prompt": text, "tokens": len(ids), "ids_equal": got == list(want), "prefill_max_abs": error,
                 "first_difference": next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None),
                 "text": tokenizer.decode(got, skip_special_tokens=True)})
  print(json.dumps(rows), flush=True)   # each part as it is done: a later failure leaves these on stdout
  report["dequant_float32"] = {"prompts": rows, "all_ids_equal": all(r["ids_equal"] for r in rows),
                               "prefill_max_abs": max(r["prefill_max_abs"] for r in rows)}
  report["teacher_forced"] = {"dequant_float32": agreement(full_logits(model, long_ids), want_long)}
  del model
  model, _ = load_gemma3_gguf(path, "packed", "float16")
  report["teacher_forced"]["packed_float16"] = agreement(full_logits(model, long_ids), want_long)
  report["packed_float16_top1_ok"] = report["teacher_forced"]["packed_float16"]["top1_agreement"] >= TOP1_TARGET
  report["seconds"] = round(time.perf_counter() - began, 1)
  text = json.dumps(report, indent=1)
  print(text)
  if os.environ.get("OUT"): Path(os.environ["OUT"], "gemma_gguf_parity.json").write_text(text)

def agreement(got: np.ndarray, want: np.ndarray) -> dict:
  same = got.argmax(-1) == want.argmax(-1)
  return {"positions": int(same.size), "top1_agreement": round(float(same.mean()), 5),
          "max_abs": round(float(np.abs(got - want).max()), 5),
          "mean_abs": round(float(np.abs(got - want).mean()), 6)}

if __name__ == "__main__":
  main()
