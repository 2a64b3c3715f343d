"""What Hugging Face transformers computes from a Gemma 3 GGUF file: the reference of test_gemma_gguf.py and
bench/gemma_gguf_parity.py.

`load_hf(path)` is transformers' own GGUF loader (`from_pretrained(folder, gguf_file=name)`, dequantized to float32 by
the gguf package, its own tensor names and norm handling), the file parsed once (`one_gguf_parse`); `greedy(model, ids,
n)` runs n greedy tokens with its KV cache and no stop token; `logits(model, ids)` is one forward pass. As a script it
reads a JSON request on stdin ({"path", "prompts": [[ids]], "new_tokens"}) and prints {"ids": [[...]], "last_logits":
[[...]], "seconds": {...}}, so a test can run it in a child process while it loads its own model.
"""
from __future__ import annotations
import contextlib, json, os, sys, time, unittest.mock
import numpy as np

NEEDS = ("torch", "transformers", "gguf", "accelerate")   # transformers' GGUF loading needs gguf and accelerate
LAST_LOGITS_KEPT = 16   # the script returns the largest logits of each prompt's last position (ids and values)
SCRIPT_TORCH_THREADS = 1   # as a test's child it shares CI's 2 cores with tgrad's side: more threads only contend

@contextlib.contextmanager
def one_gguf_parse():
  """Share one gguf.GGUFReader per file inside the block, parsed from the file's bytes in memory. transformers' legacy
  GGUF path (Gemma 3's) builds a reader for the config and another for the tensors, and each one parses every metadata
  field: ~20-30 s apiece for the 262,144-piece vocabulary, about half of it numpy.memmap's per-slice overhead (the
  reader slices its memmap ~10^6 times). Same bytes, same parser: only the copies and the repeat go."""
  import gguf
  fresh, readers = gguf.GGUFReader, {}
  def in_memory(path, mode="r"): return np.fromfile(path, dtype=np.uint8)
  def shared(path, mode="r"):
    key = (os.path.abspath(path), mode)
    if key not in readers:
      with unittest.mock.patch.object(gguf.gguf_reader.np, "memmap", in_memory): readers[key] = fresh(path, mode)
    return readers[key]
  gguf.GGUFReader = shared
  try: yield
  finally: gguf.GGUFReader = fresh

def load_hf(path: str):
  import torch
  from transformers import AutoModelForCausalLM
  folder, name = os.path.split(os.path.abspath(path))
  with one_gguf_parse(): model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
  return model.eval()

def logits(model, ids: list[int]) -> np.ndarray:
  """[T, V] float32 logits of one forward pass over ids."""
  import torch
  with torch.no_grad(): return model(torch.tensor([ids])).logits[0].float().numpy()

def greedy(model, ids: list[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
  """n greedy tokens (no stop token) and the prompt's last logits row."""
  import torch
  out, tokens = [], torch.tensor([ids])
  cache, first = None, None
  with torch.no_grad():
    for _ in range(new_tokens):
      result = model(input_ids=tokens, past_key_values=cache, use_cache=True)
      cache, row = result.past_key_values, result.logits[0, -1].float()
      if first is None: first = row.numpy()
      out.append(int(row.argmax()))
      tokens = torch.tensor([[out[-1]]])
  return out, first

def main() -> None:
  import torch
  torch.set_num_threads(SCRIPT_TORCH_THREADS)
  request = json.loads(sys.stdin.readline())
  began = time.perf_counter()
  model = load_hf(request["path"])
  loaded = time.perf_counter()
  ids, last = [], []
  for prompt in request["prompts"]:
    generated, row = greedy(model, prompt, request["new_tokens"])
    ids.append(generated)
    top = np.argsort(-row)[:LAST_LOGITS_KEPT]
    last.append([[int(i), float(row[i])] for i in top])
  seconds = {"load": round(loaded - began, 2), "generate": round(time.perf_counter() - loaded, 2)}
  print(json.dumps({"ids": ids, "last_logits": last, "seconds": seconds}))

if __name__ == "__main__":
  main()
