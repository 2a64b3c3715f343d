"""What the training examples share: a minibatch loop for a classifier whose every step is one schedule (the loss,
the batch accuracy and the optimizer update realized together), the held-out accuracy afterwards, and the command
line that reports it and exits with status 1 below --min-accuracy."""
from __future__ import annotations
import argparse, sys, time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
from tgrad import Tensor  # noqa: E402

@dataclass
class TrainResult:
  losses: list[float]
  test_accuracy: float
  seconds: float

def accuracy(logits: Tensor, labels: Tensor) -> Tensor: return (logits.argmax(-1) == labels).float().mean()

def fit(model: Callable[[Tensor], Tensor], opt, loss_of: Callable[[Tensor, Tensor], Tensor],
        next_batch: Callable[[], tuple[np.ndarray, np.ndarray]], test: tuple[np.ndarray, np.ndarray], steps: int,
        name: str, progress: bool) -> TrainResult:
  """`steps` optimizer steps on minibatches from next_batch(), then the accuracy on the held-out (inputs, labels)
  outside train mode (BatchNorm uses its running statistics there)."""
  losses: list[float] = []
  start = time.perf_counter()
  bar = tqdm(range(steps), desc=name, disable=not progress)
  with Tensor.train():
    for _ in bar:
      inputs, labels = next_batch()
      x, y = Tensor(inputs), Tensor(labels)
      opt.zero_grad()
      logits = model(x)
      loss = loss_of(logits, y)
      loss.backward()
      batch_accuracy = accuracy(logits.detach(), y)
      Tensor.realize(loss, batch_accuracy, *opt.schedule_step())
      losses.append(loss.item())
      bar.set_postfix(loss=f"{losses[-1]:.3f}", acc=f"{batch_accuracy.item():.2f}")
  with Tensor.no_grad():
    test_accuracy = accuracy(model(Tensor(test[0])), Tensor(test[1])).item()
  return TrainResult(losses, test_accuracy, time.perf_counter() - start)

def command_line(description: str, train: Callable[[int, int], TrainResult], default_steps: int,
                 default_min_accuracy: float, seed_help: str, argv: list[str] | None) -> int:
  """Parse --steps/--seed/--min-accuracy, train, print the result; 0 if the held-out accuracy reached the target."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--steps", type=int, default=default_steps, help=f"optimizer steps (default {default_steps})")
  parser.add_argument("--seed", type=int, default=0, help=seed_help)
  parser.add_argument("--min-accuracy", type=float, default=default_min_accuracy,
                      help=f"held-out accuracy to reach (default {default_min_accuracy})")
  args = parser.parse_args(argv)
  result = train(args.steps, args.seed)
  reached = result.test_accuracy >= args.min_accuracy
  print(f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}; held-out accuracy {result.test_accuracy:.3f} "
        f"(target {args.min_accuracy}): {'reached' if reached else 'NOT reached'} in {result.seconds:.1f} s")
  return 0 if reached else 1
