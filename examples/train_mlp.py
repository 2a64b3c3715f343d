"""Train an MLP on 2-D spirals: `python examples/train_mlp.py [--steps N] [--seed S] [--min-accuracy A] [--devices D]`.

The data is made here: three interleaved spiral arms (CS231n's toy set), 300 noisy points each; a fifth is held out.
A 2→64→64→3 ReLU network trained with Adam on minibatches separates them; the script prints the held-out accuracy
and exits with status 1 if it is below --min-accuracy. Each step is one schedule: the loss, the accuracy and the
optimizer update are realized together (`Tensor.realize(loss, accuracy, *opt.schedule_step())`).
"""
from __future__ import annotations
import math, sys
from pathlib import Path
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))       # and when loaded from elsewhere (the tests)
from tgrad import Tensor  # noqa: E402
import tgrad.nn as nn  # noqa: E402
from tgrad.nn.optim import Adam  # noqa: E402
from tgrad.nn.state import get_parameters  # noqa: E402
from classifier_training import TrainResult, command_line, fit, replicate  # noqa: E402

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

def train(steps: int = DEFAULT_STEPS, seed: int = 0, progress: bool = True, devices=None) -> TrainResult:
  """Train and test; `devices` (a tuple of device names) trains data-parallel over them."""
  rng = np.random.default_rng(seed)
  Tensor.manual_seed(seed)
  points, labels = make_spirals(rng)
  order = rng.permutation(len(points))
  test_count = math.ceil(len(points) * TEST_FRACTION)
  test, train_rows = order[:test_count], order[test_count:]
  model = MLP()
  opt = Adam(replicate(get_parameters(model), devices), lr=LEARNING_RATE)
  def next_batch() -> tuple[np.ndarray, np.ndarray]:
    batch = rng.choice(train_rows, BATCH_SIZE, replace=False)
    return points[batch], labels[batch]
  return fit(model, opt, lambda logits, y: logits.sparse_categorical_crossentropy(y), next_batch,
             (points[test], labels[test]), steps, "mlp", progress, devices)

def main(argv: list[str] | None = None) -> int:
  return command_line(__doc__.splitlines()[0], train, DEFAULT_STEPS, DEFAULT_MIN_ACCURACY,
                      "seed for the data, the split and the weights", argv)

if __name__ == "__main__":
  sys.exit(main())
