"""Why generate() is slower for a model when other models are alive in the process: the same model's greedy loop timed
alone, then with more models loaded, then with Python's cyclic garbage collector off, and profiled.

Loads the GGUF file once per `--modes` entry (`packed:float16` ...), in order. After each load, as the benchmark
does: one generate() that compiles and captures, then a timed one, logging the collector's collections during it
(generation, milliseconds). Then generate() of
NEW_TOKENS tokens after an 8-token prompt on the FIRST model (its first call compiles and captures; then the best of
GENERATE_RUNS), so the first model's tok/s is seen with 1, 2, ... models alive. Then, with every model alive: the
first model again with `gc.disable()`, the time of one full `gc.collect()` and the number of objects the collector
tracks, and a cProfile of one generate() (the host functions by their own time). Prints JSON lines and the profile;
writes them to $OUT/models_alive.txt when OUT is set. Needs a GPU and pycuda (or `--device LLVM`).
Usage: python bench/probes/models_alive.py --model FILE.gguf [--modes packed:float16 dequant:float16 ...]
"""
from __future__ import annotations
import argparse, cProfile, gc, io, json, os, pstats, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from greedy_host import GENERATE_RUNS, NEW_TOKENS, PROMPT  # noqa: E402   (the greedy loop that probe times)
from model_file import gguf_path  # noqa: E402
from tgrad.models.gemma3_gguf import load_gemma3_gguf  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402

PROFILE_LINES = 30

class CollectionLog:
  """The cyclic collector's collections while it is on (gc.callbacks): (generation, milliseconds) each."""
  def __init__(self): self.collections: list[tuple[int, float]] = []; self.began = 0.0
  def __call__(self, phase: str, info: dict) -> None:
    if phase == "start": self.began = time.perf_counter()
    else: self.collections.append((info["generation"], round((time.perf_counter() - self.began) * 1e3, 2)))
  def __enter__(self): gc.callbacks.append(self); return self
  def __exit__(self, *exc): gc.callbacks.remove(self)

SLOW_STEP_SECONDS = 1e-3

def first_timed_rate(model) -> tuple[float, list, dict]:
  """As the benchmark does: one generate() that compiles and captures, then the timed one, with the collections
  that ran during the timed one and its slowest steps (ms: the three slowest, and where steps took over
  SLOW_STEP_SECONDS)."""
  generate(model, PROMPT, NEW_TOKENS, eos_ids=())
  with CollectionLog() as log: result = generate(model, PROMPT, NEW_TOKENS, eos_ids=())
  steps = result.step_seconds
  slow = {"slowest_ms": [round(t * 1e3, 2) for t in sorted(steps)[-3:]],
          "slow_steps_at": [i for i, t in enumerate(steps) if t > SLOW_STEP_SECONDS],
          "median_step_us": round(sorted(steps)[len(steps) // 2] * 1e6, 1)}
  return round(result.decode_tokens_per_second, 1), log.collections, slow

def best_rate(model) -> float:
  """The best decode tok/s of GENERATE_RUNS generate() calls (after one that compiles and captures, if needed)."""
  return max(generate(model, PROMPT, NEW_TOKENS, eos_ids=()).decode_tokens_per_second for _ in range(GENERATE_RUNS))

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--model", default=None)
  parser.add_argument("--device", default="CUDA")
  parser.add_argument("--modes", nargs="+", default=["packed:float16", "dequant:float16", "packed:float32",
                                                     "packed:float16"])
  args = parser.parse_args()
  path = gguf_path(args.model)
  lines: list[str] = []
  def say(record: dict) -> None:
    lines.append(json.dumps(record))
    print(lines[-1], flush=True)
  models = []
  for mode in args.modes:
    quant, dtype = mode.split(":")
    models.append(load_gemma3_gguf(path, quant, dtype, args.device)[0])
    rate, collections, slow = first_timed_rate(models[-1])
    say({"models_alive": len(models), "loaded": mode, "timed_after_capture_tok_s": rate,
         "collections_ms": collections, **slow, "first_model_tok_s": round(best_rate(models[0]), 1),
         "newest_model_tok_s": round(best_rate(models[-1]), 1), "gc_tracked_objects": len(gc.get_objects()),
         "gc_counts": gc.get_count()})
  began = time.perf_counter()
  gc.collect()
  say({"full_gc_collect_ms": round((time.perf_counter() - began) * 1e3, 2),
       "gc_tracked_objects": len(gc.get_objects())})
  gc.disable()
  say({"gc_disabled_first_model_tok_s": round(best_rate(models[0]), 1),
       "gc_disabled_newest_model_tok_s": round(best_rate(models[-1]), 1)})
  gc.enable()
  gc.freeze()   # every object alive now leaves the collector's generations (what a server does after loading)
  say({"gc_frozen_first_model_tok_s": round(best_rate(models[0]), 1),
       "gc_frozen_newest_model_tok_s": round(best_rate(models[-1]), 1)})
  gc.unfreeze()
  profile = cProfile.Profile()
  profile.enable()
  generate(models[0], PROMPT, NEW_TOKENS, eos_ids=())
  profile.disable()
  text = io.StringIO()
  pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(PROFILE_LINES)
  lines.append(text.getvalue())
  print(lines[-1])
  if (out := os.environ.get("OUT")): open(os.path.join(out, "models_alive.txt"), "w").write("\n".join(lines))

if __name__ == "__main__":
  main()
