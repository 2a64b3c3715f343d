"""Prefill attention on the GPU: tgrad's flash-attention kernel vs its default graph vs torch's SDPA, and Gemma's
prefill with and without the kernel.

`--mode sdpa` (default): gemma-3-270m's attention shape (4 query heads, 1 kv head, head dim 256, causal, float16) at
each prompt length (512 and 4096): GPU time (CUDA events around back-to-back launches of the lowered schedule on
realized inputs) of tgrad with FLASH_ATTENTION=1 (one kernel), with FLASH_ATTENTION=0 (the default graph: scores,
softmax and the weighted sum as separate kernels, the score matrix stored), the flash kernel with a sliding window of
512 (Gemma's local layers), and torch.nn.functional.scaled_dot_product_attention (is_causal, GQA through enable_gqa,
else the kv head repeated), with TFLOP/s of the causal work and the max difference from torch.
`--mode gemma`: the jitted prefill of gemma-3-270m (random weights of its shapes, float16; last logits only) at
`--prefill-tokens`, GPU time per call with FLASH_ATTENTION=0 and =1 (alternating, best of ROUNDS), tokens/s.
`--mode decode`: one query position (a decode step's) over `--keys` keys (100, 1000, 4000), same heads and dims, no
mask: GPU time of tgrad's flash-decoding kernel alone (the keys split over blocks, the partials combined by the last
block; its schedule also has the zero fill of its scratch, which a whole decode step makes once for all its layers:
timed with it too), of the default graph (FLASH_ATTENTION=0: a scores kernel and a softmax·V row kernel), and of
torch's SDPA, with the max difference from torch.
Usage: python bench/attention.py [--mode sdpa|gemma|decode|both] [--lengths 512 4096] [--prefill-tokens 512]
       [--keys 100 1000 4000]
"""
from __future__ import annotations
import argparse, json, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import event_seconds  # noqa: E402
from tgrad import Tensor, dtypes  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402
from tgrad.realize import lower_schedule, run  # noqa: E402
from tgrad.models.gemma3 import Gemma3, Gemma3Config, PRESETS  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 1, 256    # gemma-3-270m
SCALE = 256 ** -0.5                      # query_pre_attn_scalar 256
WINDOW = 512                             # its sliding layers
LENGTHS = (512, 4096)
REPEATS = 50
ROUNDS = 3                               # gemma mode: alternating rounds, the best of each setting
SEED = 0

DECODE_KEYS = (100, 1000, 4000)

def tgrad_attention_seconds(q: Tensor, k: Tensor, v: Tensor, flash: bool, window=None, causal: bool = True,
                            last_only: bool = False) -> tuple[float, int, np.ndarray]:
  """GPU seconds of the lowered schedule of one attention (with last_only, of its last kernel alone), its kernel
  count and its output (as float32)."""
  with Context(FLASH_ATTENTION=int(flash), FLASH_DECODING=int(flash)):   # one query row: the flash-decoding kernel
    out = q.scaled_dot_product_attention(k, v, is_causal=causal, scale=SCALE, enable_gqa=True, window=window)
  exec_items = lower_schedule(create_schedule([out.lazydata]))
  run(exec_items)
  timed = exec_items[-1:] if last_only else exec_items
  seconds = event_seconds(lambda: run(timed), REPEATS)
  values = exec_items[-1].bufs[0].copyout()   # the last kernel writes the output
  return seconds, len(exec_items), values.astype(np.float32)[:out.numel()].reshape(out.shape)

def torch_attention_seconds(q, k, v, causal: bool = True) -> tuple[float, np.ndarray]:
  """GPU seconds of torch's SDPA (GQA by enable_gqa where torch has it, else the kv head repeated) and its output."""
  import torch
  import torch.nn.functional as F
  def gqa(): return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=SCALE, enable_gqa=True)
  kr, vr = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
  def repeated(): return F.scaled_dot_product_attention(q, kr, vr, is_causal=causal, scale=SCALE)
  try: call, out = gqa, gqa()
  except TypeError: call, out = repeated, repeated()   # torch before 2.5: no enable_gqa
  torch.cuda.synchronize()
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  start.record()
  for _ in range(REPEATS): call()
  end.record()
  end.synchronize()
  return start.elapsed_time(end) / 1e3 / REPEATS, out.float().cpu().numpy()

def sdpa(lengths) -> list[dict]:
  import torch
  rows = []
  rng = np.random.default_rng(SEED)
  for length in lengths:
    q = rng.standard_normal((1, HEADS, length, HEAD_DIM)).astype(np.float16)
    k, v = (rng.standard_normal((1, KV_HEADS, length, HEAD_DIM)).astype(np.float16) for _ in range(2))
    tq, tk, tv = (Tensor(x, device="CUDA").realize() for x in (q, k, v))
    causal_flops = 4 * HEADS * length * length * HEAD_DIM / 2   # two matmuls, half the scores kept
    flash, flash_kernels, flash_out = tgrad_attention_seconds(tq, tk, tv, True)
    default, default_kernels, _ = tgrad_attention_seconds(tq, tk, tv, False)
    windowed, _, _ = tgrad_attention_seconds(tq, tk, tv, True, WINDOW)
    torch_seconds, torch_out = torch_attention_seconds(*(torch.from_numpy(x).cuda() for x in (q, k, v)))
    difference = float(np.abs(flash_out - torch_out).max())
    rows.append({"length": length, "tgrad_flash_us": round(flash * 1e6, 2), "flash_kernels": flash_kernels,
                 "tgrad_default_us": round(default * 1e6, 2), "default_kernels": default_kernels,
                 f"tgrad_flash_window{WINDOW}_us": round(windowed * 1e6, 2),
                 "torch_sdpa_us": round(torch_seconds * 1e6, 2),
                 "flash_tflops": round(causal_flops / flash / 1e12, 1),
                 "torch_tflops": round(causal_flops / torch_seconds / 1e12, 1),
                 "torch_over_flash": round(torch_seconds / flash, 3), "max_abs_difference_vs_torch": difference})
    print(json.dumps(rows[-1]), flush=True)
  return rows

def decode(key_counts) -> list[dict]:
  import torch
  rows = []
  rng = np.random.default_rng(SEED)
  for keys in key_counts:
    q = rng.standard_normal((1, HEADS, 1, HEAD_DIM)).astype(np.float16)
    k, v = (rng.standard_normal((1, KV_HEADS, keys, HEAD_DIM)).astype(np.float16) for _ in range(2))
    tq, tk, tv = (Tensor(x, device="CUDA").realize() for x in (q, k, v))
    alone, kernels, flash_out = tgrad_attention_seconds(tq, tk, tv, True, causal=False, last_only=True)
    with_fill, _, _ = tgrad_attention_seconds(tq, tk, tv, True, causal=False)
    default, default_kernels, _ = tgrad_attention_seconds(tq, tk, tv, False, causal=False)
    torch_seconds, torch_out = torch_attention_seconds(*(torch.from_numpy(x).cuda() for x in (q, k, v)), causal=False)
    rows.append({"keys": keys, "tgrad_flash_decoding_us": round(alone * 1e6, 2),
                 "with_scratch_fill_us": round(with_fill * 1e6, 2), "flash_schedule_kernels": kernels,
                 "tgrad_default_us": round(default * 1e6, 2), "default_kernels": default_kernels,
                 "torch_sdpa_us": round(torch_seconds * 1e6, 2), "torch_over_flash": round(torch_seconds / alone, 3),
                 "max_abs_difference_vs_torch": float(np.abs(flash_out - torch_out).max())})
    print(json.dumps(rows[-1]), flush=True)
  return rows

def gemma(prefill_tokens: int) -> dict:
  config = Gemma3Config.from_dict(PRESETS["270m"])
  model = Gemma3.random(config, dtype=dtypes.float16, device="CUDA", seed=SEED)
  rng = np.random.default_rng(SEED)
  ids = Tensor(rng.integers(1000, 200_000, (1, prefill_tokens)).astype(np.int32), device="CUDA")
  best: dict[int, float] = {}
  for _ in range(ROUNDS):
    for flash in (0, 1):
      with Context(FLASH_ATTENTION=flash):
        model.reset_cache(1, prefill_tokens)
        model._prefill_jit = None   # capture again under this setting
        model(ids, 0, last_only=True, jit=True)
        seconds = event_seconds(lambda: model(ids, 0, last_only=True, jit=True), REPEATS // 5)
      best[flash] = min(best.get(flash, float("inf")), seconds)
  out = {"prefill_tokens": prefill_tokens, **{f"prefill_ms_flash{f}": round(s * 1e3, 3) for f, s in best.items()},
         **{f"tokens_per_second_flash{f}": round(prefill_tokens / s, 1) for f, s in best.items()}}
  print(json.dumps(out), flush=True)
  return out

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--mode", choices=("sdpa", "gemma", "decode", "both"), default="sdpa")
  parser.add_argument("--keys", type=int, nargs="+", default=list(DECODE_KEYS))
  parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
  parser.add_argument("--prefill-tokens", type=int, default=512)
  args = parser.parse_args()
  if args.mode in ("sdpa", "both"): sdpa(args.lengths)
  if args.mode in ("gemma", "both"): gemma(args.prefill_tokens)
  if args.mode == "decode": decode(args.keys)

if __name__ == "__main__":
  main()
