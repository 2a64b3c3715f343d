"""Train an MLP on 2-D spirals: `python examples/train_mlp.py [--steps N] [--seed S] [--min-accuracy A]`.

The data is made here: three interleaved spiral arms (CS231n's toy set), 300 noisy points each; a fifth is held out.
A 2→64→64→3 ReLU network trained with Adam on minibatches separates them; the script prints the held-out accuracy
and exits with status 1 if it is below --min-accuracy. Each step is one schedule: the loss, the accuracy and the
optimizer update are realized together (`Tensor.realize(loss, accuracy, *opt.schedule_step())`).
"""
from __future__ import annotations
import argparse, math, sys, time
from dataclasses import dataclass
from pathlib import Path
import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
from tgrad import Tensor  # noqa: E402
import tgrad.nn as nn  # noqa: E402
from tgrad.nn.optim import Adam  # noqa: E402
from tgrad.nn.state import get_parameters  # noqa: E402

CLASSES = 3
POINTS_PER_CLASS = 300
ARM_TURN = 4.0            # radians each arm turns from the center to the rim
ANGLE_NOISE = 0.2         # std of the noise added to each point's angle (radians)
TEST_FRACTION = 0.2
HIDDEN = 64
BATCH_SIZE = 128
LEARNING_RATE = 0.01
DEFAULT_STEPS = 400
DEFAULT_MIN_ACCURACY = 0.95

def make_spirals(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """(points (N, 2) float32, labels (N,) int32): arm k runs from the center outwards, starting at angle k·ARM_TURN."""
  radius = np.tile(np.linspace(0.0, 1.0, POINTS_PER_CLASS), CLASSES)
  labels = np.repeat(np.arange(CLASSES), POINTS_PER_CLASS)
  angle = labels * ARM_TURN + radius * ARM_TURN + rng.normal(0, ANGLE_NOISE, radius.shape)
  points = np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1)
  return points.astype(np.float32), labels.astype(np.int32)

class MLP:
  def __init__(self):
    self.layers = [nn.Linear(2, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, CLASSES)]
  def __call__(self, x: Tensor) -> Tensor:
    for layer in self.layers[:-1]: x = layer(x).relu()
    return self.layers[-1](x)

@dataclass
class TrainResult:
  losses: list[float]
  test_accuracy: float
  seconds: float

def accuracy(logits: Tensor, labels: Tensor) -> Tensor: return (logits.argmax(-1) == labels).float().mean()

def train(steps: int = DEFAULT_STEPS, seed: int = 0, progress: bool = True) -> TrainResult:
  rng = np.random.default_rng(seed)
  Tensor.manual_seed(seed)
  points, labels = make_spirals(rng)
  order = rng.permutation(len(points))
  test_count = math.ceil(len(points) * TEST_FRACTION)
  test, train_rows = order[:test_count], order[test_count:]
  model = MLP()
  opt = Adam(get_parameters(model), lr=LEARNING_RATE)
  losses: list[float] = []
  start = time.perf_counter()
  bar = tqdm(range(steps), desc="mlp", disable=not progress)
  with Tensor.train():
    for _ in bar:
      batch = rng.choice(train_rows, BATCH_SIZE, replace=False)
      x, y = Tensor(points[batch]), Tensor(labels[batch])
      opt.zero_grad()
      logits = model(x)
      loss = logits.sparse_categorical_crossentropy(y)
      loss.backward()
      batch_accuracy = accuracy(logits.detach(), y)
      Tensor.realize(loss, batch_accuracy, *opt.schedule_step())
      losses.append(loss.item())
      bar.set_postfix(loss=f"{losses[-1]:.3f}", acc=f"{batch_accuracy.item():.2f}")
  with Tensor.no_grad():
    test_accuracy = accuracy(model(Tensor(points[test])), Tensor(labels[test])).item()
  return TrainResult(losses, test_accuracy, time.perf_counter() - start)

def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"optimizer steps (default {DEFAULT_STEPS})")
  parser.add_argument("--seed", type=int, default=0, help="seed for the data, the split and the weights")
  parser.add_argument("--min-accuracy", type=float, default=DEFAULT_MIN_ACCURACY,
                      help=f"held-out accuracy to reach (default {DEFAULT_MIN_ACCURACY})")
  args = parser.parse_args(argv)
  result = train(args.steps, args.seed)
  reached = result.test_accuracy >= args.min_accuracy
  print(f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}; held-out accuracy {result.test_accuracy:.3f} "
        f"(target {args.min_accuracy}): {'reached' if reached else 'NOT reached'} in {result.seconds:.1f} s")
  return 0 if reached else 1

if __name__ == "__main__":
  sys.exit(main())
