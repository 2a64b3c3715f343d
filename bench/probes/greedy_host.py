"""Where the greedy loop's wall time goes beyond the GPU's: the host's work per replayed decode step.

Loads a GGUF file (`--mode packed` or `dequant`, float16) on CUDA, then measures
- generate() of NEW_TOKENS tokens after an 8-token prompt, three times (the first compiles and captures): decode tok/s
  and the median step's host seconds (the loop keeps one step queued ahead, so a step's wall time is the GPU's once
  the host keeps up);
- the captured step's GPU time replayed at one position (CUDA events, bench/gpu.py's event_seconds), and over
  MOVING_STEPS consecutive positions (every step rebinds the position Variables: kernel nodes' arguments and grids
  set in the instantiated graph), with the host's seconds per replay for the same calls;
- the host's seconds for one replay with the GPU idle, at a new position and at the same one;
- a cProfile of the moving replays (the host functions by their own time).
Prints one JSON line, then the profile; writes both to $OUT/greedy_host.txt when OUT is set. Needs a GPU and pycuda.
Usage: python bench/probes/greedy_host.py --model FILE.gguf [--mode packed]
"""
from __future__ import annotations
import argparse, cProfile, io, json, os, pstats, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpu import event_seconds  # noqa: E402
from model_file import gguf_path  # noqa: E402
from tgrad.device import Device  # noqa: E402
from tgrad.models.gemma3_gguf import load_gemma3_gguf  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402

NEW_TOKENS = 128
GENERATE_RUNS = 3
PROMPT = [2] + list(range(1000, 1007))   # BOS and 7 ordinary ids
CACHE_CONTEXT = 512
FIXED_POSITION, MOVING_STEPS, IDLE_STEPS = 100, 200, 100
FIXED_REPLAYS = 100
PROFILE_LINES = 18

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default=None, help="the GGUF file (default: the installed gemma-3-270m package's)")
  parser.add_argument("--mode", default="packed", choices=("packed", "dequant"))
  args = parser.parse_args()
  import pycuda.driver as cuda
  model, _ = load_gemma3_gguf(gguf_path(args.model), args.mode, "float16", "CUDA")
  sync = Device["CUDA"].synchronize
  out: dict = {"mode": args.mode, "generate_tokens_per_second": [], "generate_step_us_median": []}
  for _ in range(GENERATE_RUNS):
    result = generate(model, PROMPT, NEW_TOKENS, eos_ids=())
    out["generate_tokens_per_second"].append(round(result.decode_tokens_per_second, 1))
    out["generate_step_us_median"].append(round(statistics.median(result.step_seconds) * 1e6, 1))
  model.reset_cache(1, CACHE_CONTEXT)
  cache = model.cache
  def replay(position: int) -> None: model._replay_decode(None, cache.decode_variables(position))
  for _ in range(3): replay(FIXED_POSITION)   # runs, captures, replays
  sync()
  out["gpu_us_fixed_position"] = round(event_seconds(lambda: replay(FIXED_POSITION), FIXED_REPLAYS) * 1e6, 2)
  out["gpu_us_moving"], out["host_us_moving"] = [], []
  positions = range(FIXED_POSITION, FIXED_POSITION + MOVING_STEPS)
  for _ in range(3):
    sync()
    start, end = cuda.Event(), cuda.Event()
    began = time.perf_counter()
    start.record()
    for position in positions: replay(position)
    queued = time.perf_counter()
    end.record()
    end.synchronize()
    out["gpu_us_moving"].append(round(start.time_till(end) * 1e3 / MOVING_STEPS, 2))
    out["host_us_moving"].append(round((queued - began) * 1e6 / MOVING_STEPS, 2))
  for name, position_of in (("host_us_idle_gpu_new_position", lambda p: p), ("host_us_idle_gpu_same_position",
                                                                              lambda p: FIXED_POSITION)):
    seconds = []
    for step in range(IDLE_STEPS):
      sync()
      began = time.perf_counter()
      replay(position_of(FIXED_POSITION + MOVING_STEPS + step))
      seconds.append(time.perf_counter() - began)
    out[name] = round(statistics.median(seconds) * 1e6, 2)
  profile = cProfile.Profile()
  profile.enable()
  for position in positions: replay(position)
  profile.disable()
  sync()
  text = io.StringIO()
  pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(PROFILE_LINES)
  report = json.dumps(out) + "\n" + text.getvalue()
  print(report)
  if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "greedy_host.txt"), "w") as f: f.write(report)

if __name__ == "__main__":
  main()
