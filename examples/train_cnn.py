"""Train a small CNN to tell oriented bars apart: `python examples/train_cnn.py [--steps N] [--seed S] [--devices D]`.

The data is made here: 1×16×16 images, each with one bright bar — horizontal, vertical, diagonal or anti-diagonal
(the four classes) — of random length, thickness, position and brightness, on Gaussian noise. A
conv → batchnorm → relu → maxpool → conv → relu → maxpool → linear network trained with AdamW classifies them; the
script prints the held-out accuracy and exits with status 1 if it is below --min-accuracy.
"""
from __future__ import annotations
import sys
from pathlib import Path
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))       # and when loaded from elsewhere (the tests)
from tgrad import Tensor  # noqa: E402
import tgrad.nn as nn  # noqa: E402
from tgrad.nn.optim import AdamW  # noqa: E402
from tgrad.nn.state import get_parameters  # noqa: E402
from classifier_training import TrainResult, command_line, fit, replicate  # noqa: E402

IMAGE_SIZE = 16
CLASSES = 4                        # 0 horizontal, 1 vertical, 2 diagonal (↘), 3 anti-diagonal (↙)
BAR_LENGTH = (6, 12)               # inclusive range of bar lengths in pixels
BAR_BRIGHTNESS = (0.6, 1.2)
NOISE_STD = 0.25
TRAIN_IMAGES, TEST_IMAGES = 2048, 512
CHANNELS = (8, 16)
BATCH_SIZE = 64
LEARNING_RATE = 0.005
DEFAULT_STEPS = 150
DEFAULT_MIN_ACCURACY = 0.95
DIRECTIONS = {0: (0, 1), 1: (1, 0), 2: (1, 1), 3: (1, -1)}   # (row step, column step) along the bar

def make_bars(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """(images (count, 1, 16, 16) float32, labels (count,) int32)."""
  images = rng.normal(0, NOISE_STD, (count, 1, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
  labels = rng.integers(0, CLASSES, count).astype(np.int32)
  for image, label in zip(images, labels):
    row_step, col_step = DIRECTIONS[int(label)]
    length = int(rng.integers(BAR_LENGTH[0], BAR_LENGTH[1] + 1))
    thick = int(rng.integers(1, 3))
    brightness = rng.uniform(*BAR_BRIGHTNESS)
    # a start point from which the whole bar (and its thickness) stays inside the image
    rows = range(0, IMAGE_SIZE - row_step * (length - 1) - (thick - 1) * (row_step == 0))
    cols = range(max(0, -col_step * (length - 1)), IMAGE_SIZE - max(0, col_step * (length - 1)) - (thick - 1))
    row, col = int(rng.choice(rows)), int(rng.choice(cols))
    for k in range(length):
      for t in range(thick):   # thickness across the bar: down for horizontal bars, right for the others
        r, c = row + k * row_step + (t if row_step == 0 else 0), col + k * col_step + (t if row_step != 0 else 0)
        image[0, r, c] = brightness
  return images, labels

class BarNet:
  def __init__(self):
    first, second = CHANNELS
    self.conv1, self.norm1 = nn.Conv2d(1, first, 3, padding=1), nn.BatchNorm2d(first)
    self.conv2 = nn.Conv2d(first, second, 3, padding=1)
    self.head = nn.Linear(second * (IMAGE_SIZE // 4) ** 2, CLASSES)
  def __call__(self, x: Tensor) -> Tensor:
    x = self.norm1(self.conv1(x)).relu().max_pool2d(2)
    x = self.conv2(x).relu().max_pool2d(2)
    return self.head(x.flatten(1))

def train(steps: int = DEFAULT_STEPS, seed: int = 0, progress: bool = True, devices=None) -> TrainResult:
  """Train and test; `devices` (a tuple of device names) trains data-parallel over them."""
  rng = np.random.default_rng(seed)
  Tensor.manual_seed(seed)
  train_images, train_labels = make_bars(TRAIN_IMAGES, rng)
  test_images, test_labels = make_bars(TEST_IMAGES, rng)
  model = BarNet()
  # the parameters include BatchNorm's running stats, realized each step
  opt = AdamW(replicate(get_parameters(model), devices), lr=LEARNING_RATE)
  def next_batch() -> tuple[np.ndarray, np.ndarray]:
    batch = rng.choice(TRAIN_IMAGES, BATCH_SIZE, replace=False)
    return train_images[batch], train_labels[batch]
  return fit(model, opt, lambda logits, y: logits.cross_entropy(y), next_batch, (test_images, test_labels), steps,
             "cnn", progress, devices)

def main(argv: list[str] | None = None) -> int:
  return command_line(__doc__.splitlines()[0], train, DEFAULT_STEPS, DEFAULT_MIN_ACCURACY,
                      "seed for the data and the weights", argv)

if __name__ == "__main__":
  sys.exit(main())
