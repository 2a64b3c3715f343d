"""Gemma's decode step along the paths the benchmark database selects, at several tolerances.

For float16 and float32: profile the graphs of a short generate() (the prefill and the first decode step, with every
path of their composite regions: gelu, tanh, exp, ...) into the database, then for TOLERANCE 1e-2, 1e-4 and 1e-6 load
the model fresh, generate NEW_TOKENS tokens with the JIT (the decode step is captured along the selected path) and
report the lowerings chosen, decode tok/s (end to end, and of the replayed steps), and the max logit error of the
decode steps against HF float32's logits.
Input: a directory written by gemma_reference.py (as bench/gemma_gpu.py). Uses the database at TGRAD_CACHE.
Usage: python bench/gemma_paths.py REFERENCE_DIR [--new-tokens 128] [--budget 120] [--max-paths 24] [--device CUDA]
"""
from __future__ import annotations
import argparse, json, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor, dtypes  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.models.gemma3 import Gemma3  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402
from tgrad.paths import select as path_select  # noqa: E402
from tgrad.paths.profile import Profiler, watching  # noqa: E402

TOLERANCES = (1e-2, 1e-4, 1e-6)

def decode_logit_error(model: Gemma3, ref: str, device: str) -> float:
  """Max abs difference of the decode steps' logits (teacher-forced with HF's ids) from HF float32's."""
  prompt = np.load(os.path.join(ref, "prompt_ids.npy")).astype(np.int32)
  want_ids, want = np.load(os.path.join(ref, "decode_ids.npy")), np.load(os.path.join(ref, "decode_logits.npy"))
  model.reset_cache(1, len(prompt) + len(want_ids) + 8)
  got = [model(Tensor(prompt[None], device=device), 0, last_only=True).numpy()[0, -1]]
  for k in range(1, len(want_ids)):
    step = Tensor(np.array([[want_ids[k - 1]]], np.int32), device=device)
    got.append(model(step, len(prompt) + k - 1, last_only=True, jit=True).numpy()[0, -1])
  return float(np.abs(np.stack(got).astype(np.float64) - want).max())

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("reference_dir")
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--budget", type=float, default=120.0, help="profiling seconds per dtype")
  parser.add_argument("--max-paths", type=int, default=24)
  parser.add_argument("--device", default="CUDA")
  args = parser.parse_args()
  ref, device = args.reference_dir, args.device
  prompt = [int(t) for t in np.load(os.path.join(ref, "prompt_ids.npy"))]
  report: dict = {}
  for name in ("float16", "float32"):
    dtype = getattr(dtypes, name)
    model = Gemma3.from_pretrained(ref, dtype, device, progress=False)
    start = time.perf_counter()
    profiler = Profiler(budget=args.budget, max_paths=args.max_paths)
    with watching(profiler): generate(model, prompt, 3, eos_ids=(), jit=True)
    report[name] = {"profiling_s": time.perf_counter() - start, "graphs": len(profiler.graphs_seen),
                    "paths_measured": profiler.measured, "paths_failed": profiler.failed}
    for tolerance in TOLERANCES:
      path_select.forget()
      with Context(TOLERANCE=tolerance):
        model = Gemma3.from_pretrained(ref, dtype, device, progress=False)
        generate(model, prompt, 4, eos_ids=(), jit=True)   # compile along the selected path
        result = generate(model, prompt, args.new_tokens, eos_ids=(), jit=True)
        error = decode_logit_error(model, ref, device)
      replayed = result.step_seconds[2:]   # steps 1 and 2 run the step normally and capture it
      report[name][f"tolerance_{tolerance:g}"] = {
        "decode_tok_s": (len(result.ids) - 1) / result.decode_seconds,
        "steady_decode_tok_s": len(replayed) / sum(replayed) if replayed else 0.0,
        "max_logit_error_vs_hf_float32": error,
        "chosen": dict(path_select.applied)}
      print(json.dumps(report), flush=True)
  print(json.dumps(report, indent=1))

if __name__ == "__main__":
  main()
