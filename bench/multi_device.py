"""Sharded tensors on a device set: checks against numpy and data-parallel training steps per second.

  python bench/multi_device.py --devices CUDA:0,CUDA:1 [--steps 50]
  python bench/multi_device.py --devices LLVM:0,LLVM:1

Prints the largest error of a few sharded ops (elementwise, a reduce and a matmul over the split axis, a column
parallel matmul) against numpy, then times a jitted data-parallel MLP training step (batch split on axis 0, weights
replicated) on the device set and on its first device alone, and checks the weights after the steps agree.
"""
from __future__ import annotations
import argparse, sys, time
from pathlib import Path
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tgrad import Tensor, TinyJit  # noqa: E402
import tgrad.nn as nn  # noqa: E402
from tgrad.nn.optim import SGD  # noqa: E402
from tgrad.nn.state import get_parameters  # noqa: E402

BATCH, FEATURES, HIDDEN, CLASSES = 4096, 256, 1024, 16
WARMUP_STEPS = 3   # the first call runs, the second captures, the third replays

def check_ops(devices: tuple[str, ...]) -> float:
  rng = np.random.default_rng(0)
  a, w = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 48)).astype(np.float32)
  n = len(devices)
  x_rows, x_cols = Tensor(a).shard(devices, 0), Tensor(a).shard(devices, 1)
  errors = [np.abs((x_rows * 2 + 1).numpy() - (a * 2 + 1)).max(),
            np.abs(x_cols.sum(1).numpy() - a.sum(1)).max() / np.abs(a).sum(1).max(),
            np.abs((x_cols @ Tensor(w).shard(devices, 0)).numpy() - a @ w).max() / np.abs(a @ w).max()]
  if 48 % n == 0:
    errors.append(np.abs((Tensor(a).shard(devices) @ Tensor(w).shard(devices, 1)).numpy() - a @ w).max() /
                  np.abs(a @ w).max())
  return float(max(errors))

def train(devices: tuple[str, ...], steps: int) -> tuple[float, list[np.ndarray]]:
  """Seconds per step after warm-up, and the weights after `steps` steps."""
  Tensor.manual_seed(0)
  rng = np.random.default_rng(0)
  layers = [nn.Linear(FEATURES, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, CLASSES)]
  params = get_parameters(layers)
  for p in params: p.shard_(devices) if len(devices) > 1 else p.to_(devices[0])
  opt = SGD(params, lr=0.01)   # plain SGD: Adam would amplify reassociation noise in near-zero gradients
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    h = x
    for layer in layers[:-1]: h = layer(h).relu()
    loss = layers[-1](h).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize(loss, *opt.schedule_step())
    return loss
  batches = [(rng.standard_normal((BATCH, FEATURES)).astype(np.float32),
              rng.integers(0, CLASSES, BATCH).astype(np.int32)) for _ in range(4)]
  def place(data: np.ndarray) -> Tensor:
    t = Tensor(data, device=devices[0])
    return t.shard(devices, 0).realize() if len(devices) > 1 else t.realize()
  placed = [(place(x), place(y)) for x, y in batches]
  start = 0.0
  for i in range(steps):
    if i == WARMUP_STEPS:
      for s in params[0].lazydata.shards if len(devices) > 1 else [params[0].lazydata]: Tensor(s).numpy()
      start = time.perf_counter()
    loss = step(*placed[i % len(placed)])
  loss.numpy()
  return (time.perf_counter() - start) / max(steps - WARMUP_STEPS, 1), [p.numpy() for p in params]

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", required=True, help="e.g. CUDA:0,CUDA:1")
  parser.add_argument("--steps", type=int, default=30)
  args = parser.parse_args()
  devices = tuple(d.strip() for d in args.devices.split(","))
  print(f"sharded ops on {devices}: largest relative error vs numpy {check_ops(devices):.2e}")
  multi_seconds, multi_weights = train(devices, args.steps)
  one_seconds, one_weights = train(devices[:1], args.steps)
  difference = max(float(np.abs(a - b).max()) for a, b in zip(multi_weights, one_weights))
  print(f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH}: {BATCH / one_seconds:,.0f} samples/s on "
        f"{devices[0]}, {BATCH / multi_seconds:,.0f} on {len(devices)} devices ({one_seconds / multi_seconds:.2f}x); "
        f"largest weight difference after {args.steps} steps {difference:.2e}")

if __name__ == "__main__":
  main()
