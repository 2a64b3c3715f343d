"""Gemma 3 with symbolic shapes: prefill compiles per prompt length, and decode step time against the position.

Prints one JSON report: for each prompt length (7, 100, 333, 520 by default) the kernels compiled by its first prefill,
the seconds of its first and second (warm) prefill, and the captured programs the model holds; then a
greedy decode step's time at a small and a large position of one big cache (the pipelined greedy loop, ROUNDS rounds
of STEPS steps from each position: host wall clock per step, and on CUDA the device time between two events around
each round).
Before symbolic shapes a new prompt length compiled new kernels and a decode step read the whole cache; after, one
compile serves every length and a step reads the filled part only.
Usage: python bench/gemma_symbolic.py [CHECKPOINT_DIR] [--preset tiny] [--device LLVM] [--dtype float32]
       [--cache 4096] [--positions 100 2000] [--prefill-cache 1024] [--lengths 7 100 333 520]
Without a checkpoint the preset's seeded random weights are used (timings only: the output is meaningless).
"""
from __future__ import annotations
import argparse, json, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor, dtypes  # noqa: E402
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS  # noqa: E402
import tgrad.realize as realize_module  # noqa: E402

STEPS = 16          # greedy decode steps per timed round
ROUNDS = 5          # timed rounds from each position (the machine may be shared: the best round is the cleanest)
WARMUP_STEPS = 4    # steps run first at each position (the first two run the step normally and capture it)
PROMPT_SEED = 0

def compiled_kernels() -> int: return realize_module._kernel_counter

def synchronize(device: str) -> None:
  if device == "CUDA":
    import pycuda.driver as cuda
    cuda.Context.synchronize()

def load(args) -> Gemma3:
  dtype = getattr(dtypes, args.dtype)
  if args.checkpoint: return Gemma3.from_pretrained(args.checkpoint, dtype, args.device, progress=False)
  longest = max(args.cache, args.prefill_cache)
  raw = {**PRESETS[args.preset], "max_position_embeddings": max(PRESETS[args.preset]["max_position_embeddings"],
                                                                 longest)}
  return Gemma3.random(Gemma3Config.from_dict(raw), dtype, args.device, seed=0, progress=False)

def captures(model: Gemma3) -> dict:
  """How many captured programs the model holds now (0 or 1 each; a new capture replaces the old one)."""
  out = {}
  for name in ("_decode_jit", "_prefill_jit"):
    jit = getattr(model, name, None)
    if jit is not None: out[name.strip("_")] = id(jit.captured) if jit.captured is not None else None
  return out

def prefill_compiles(model: Gemma3, lengths: list[int], cache: int, device: str) -> list[dict]:
  """Each prompt length prefilled twice (each call a new sequence, as generate() starts one): the kernels compiled by
  the first call, and the seconds of both (the second is warm: compiled, and for the first length captured by the
  prefill's TinyJit, which happens at its second call)."""
  rng = np.random.default_rng(PROMPT_SEED)
  rows = []
  for length in lengths:
    prompt = rng.integers(3, model.config.vocab_size, size=(1, length), dtype=np.int32)
    row: dict = {"prompt_len": length}
    for call in ("first", "second"):
      model.reset_cache(1, cache)
      before = compiled_kernels()
      synchronize(device)
      start = time.perf_counter()
      model(Tensor(prompt, device=device), 0, last_only=True, jit=True).numpy()
      row[f"{call}_call_s"] = round(time.perf_counter() - start, 4)
      row[f"{call}_call_kernels_compiled"] = compiled_kernels() - before
    row["captures"] = captures(model)
    rows.append(row)
  return rows

def decode_step_time(model: Gemma3, position: int, cache: int, device: str) -> dict:
  """Greedy decode steps from `position` in a cache of `cache` positions, ROUNDS rounds of STEPS: host wall seconds
  per step of the pipelined loop (generate's), the best and the median round, and on CUDA the device seconds per step
  between two events around each round (best round)."""
  rng = np.random.default_rng(PROMPT_SEED)
  model.reset_cache(1, cache)
  prompt = rng.integers(3, model.config.vocab_size, size=(1, position), dtype=np.int32)
  token = int(model(Tensor(prompt, device=device), 0, last_only=True).numpy()[0, -1].argmax())
  for (token,) in model.greedy_tokens([token], WARMUP_STEPS): pass
  compiled = compiled_kernels()
  walls, gpu = [], []
  for _ in range(ROUNDS):
    synchronize(device)
    events = None
    if device == "CUDA":
      import pycuda.driver as cuda
      events = (cuda.Event(), cuda.Event())
      events[0].record()
    start = time.perf_counter()
    for (token,) in model.greedy_tokens([token], STEPS): pass
    if events is not None: events[1].record()
    synchronize(device)
    walls.append((time.perf_counter() - start) / STEPS)
    if events is not None: gpu.append(events[0].time_till(events[1]) / 1e3 / STEPS)
  out = {"position": position, "cache": cache, "step_wall_s_best": min(walls),
         "step_wall_s_median": float(np.median(walls)), "tok_s_best": 1 / min(walls),
         "kernels_compiled_while_timed": compiled_kernels() - compiled}
  if gpu: out["step_gpu_s_best"] = min(gpu)
  return out

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("checkpoint", nargs="?", default=None)
  parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
  parser.add_argument("--device", default="LLVM")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--cache", type=int, default=4096, help="cache length for the decode timings")
  parser.add_argument("--positions", type=int, nargs="+", default=[100, 2000])
  parser.add_argument("--prefill-cache", type=int, default=1024, help="cache length for the prefill compiles")
  parser.add_argument("--lengths", type=int, nargs="+", default=[7, 100, 333, 520])
  parser.add_argument("--skip-prefill", action="store_true")
  args = parser.parse_args()
  model = load(args)
  report: dict = {"device": args.device, "dtype": args.dtype, "weights": args.checkpoint or f"random {args.preset}"}
  if not args.skip_prefill:
    report["prefill"] = prefill_compiles(model, args.lengths, args.prefill_cache, args.device)
    print(json.dumps(report), flush=True)
  report["decode"] = [decode_step_time(model, p, args.cache, args.device) for p in args.positions]
  print(json.dumps(report, indent=1))

if __name__ == "__main__":
  main()
