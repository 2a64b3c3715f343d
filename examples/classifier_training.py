"""What the training examples share: a minibatch loop for a classifier whose every step is one schedule (the loss,
the batch accuracy and the optimizer update realized together), the held-out accuracy afterwards, and the command
line that reports it and exits with status 1 below --min-accuracy. With `--devices LLVM:0,LLVM:1` (or CUDA:0,CUDA:1)
training is data-parallel: the parameters are replicated on every device, each batch is split along its first axis,
and the sharding rules make the mean loss's gradients all-reduced, so every replica takes the same optimizer step
(docs/multi_device.md)."""
from __future__ import annotations
import argparse, sys, time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence
import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
from tgrad import Tensor  # noqa: E402

@dataclass
class TrainResult:
  losses: list[float]
  test_accuracy: float
  seconds: float

def replicate(parameters: list[Tensor], devices: Optional[Sequence[str]]) -> list[Tensor]:
  """The parameters replicated on `devices` in place (before an optimizer is made from them), or left as they are."""
  if devices:
    for p in parameters: p.shard_(tuple(devices))
  return parameters

def accuracy(logits: Tensor, labels: Tensor) -> Tensor: return (logits.argmax(-1) == labels).float().mean()

def fit(model: Callable[[Tensor], Tensor], opt, loss_of: Callable[[Tensor, Tensor], Tensor],
        next_batch: Callable[[], tuple[np.ndarray, np.ndarray]], test: tuple[np.ndarray, np.ndarray], steps: int,
        name: str, progress: bool, devices: Optional[Sequence[str]] = None) -> TrainResult:
  """`steps` optimizer steps on minibatches from next_batch(), then the accuracy on the held-out (inputs, labels)
  outside train mode (BatchNorm uses its running statistics there). With `devices` (the model's parameters replicated
  on them by `replicate`), each batch is split over them along its first axis and the held-out set is replicated."""
  def batch(data: np.ndarray) -> Tensor: return Tensor(data).shard(tuple(devices), 0) if devices else Tensor(data)
  losses: list[float] = []
  start = time.perf_counter()
  bar = tqdm(range(steps), desc=name, disable=not progress)
  with Tensor.train():
    for _ in bar:
      inputs, labels = next_batch()
      x, y = batch(inputs), batch(labels)
      opt.zero_grad()
      logits = model(x)
      loss = loss_of(logits, y)
      loss.backward()
      batch_accuracy = accuracy(logits.detach(), y)
      Tensor.realize(loss, batch_accuracy, *opt.schedule_step())
      losses.append(loss.item())
      bar.set_postfix(loss=f"{losses[-1]:.3f}", acc=f"{batch_accuracy.item():.2f}")
  with Tensor.no_grad():
    where = tuple(devices) if devices else None
    test_accuracy = accuracy(model(Tensor(test[0], device=where)), Tensor(test[1], device=where)).item()
  return TrainResult(losses, test_accuracy, time.perf_counter() - start)

def parse_devices(text: Optional[str]) -> Optional[tuple[str, ...]]:
  """'LLVM:0,LLVM:1' → ('LLVM:0', 'LLVM:1'); None or '' → None (one device)."""
  return tuple(d.strip() for d in text.split(",") if d.strip()) if text else None

def command_line(description: str, train: Callable[..., TrainResult], default_steps: int,
                 default_min_accuracy: float, seed_help: str, argv: list[str] | None) -> int:
  """Parse --steps/--seed/--min-accuracy, train, print the result; 0 if the held-out accuracy reached the target."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--steps", type=int, default=default_steps, help=f"optimizer steps (default {default_steps})")
  parser.add_argument("--seed", type=int, default=0, help=seed_help)
  parser.add_argument("--min-accuracy", type=float, default=default_min_accuracy,
                      help=f"held-out accuracy to reach (default {default_min_accuracy})")
  parser.add_argument("--devices", default=None,
                      help="train data-parallel over these devices, e.g. LLVM:0,LLVM:1 or CUDA:0,CUDA:1")
  args = parser.parse_args(argv)
  result = train(args.steps, args.seed, devices=parse_devices(args.devices))
  reached = result.test_accuracy >= args.min_accuracy
  print(f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}; held-out accuracy {result.test_accuracy:.3f} "
        f"(target {args.min_accuracy}): {'reached' if reached else 'NOT reached'} in {result.seconds:.1f} s")
  return 0 if reached else 1
